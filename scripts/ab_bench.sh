#!/usr/bin/env bash
# A/B benchmark: the same nccl_bench binary against NVIDIA's reference NCCL (A) and ours (B).
#
# Why this shape (docs/ARCHITECTURE.md, "Testing on GPUs"): small-message times without CUDA
# graphs are bimodal per process, so small sizes run A B A B A B (--reps) and medians are compared; from 8 MB up one run each
# is within ±1 %.  Every collective, with and without CUDA graphs (-G).
#
# usage: scripts/ab_bench.sh [--bin build/gpu/nccl_bench] [--max 1G] [--small-max 4M]
#            [--colls all_reduce,all_gather,...] [--reps 3] [--no-graph | --graph-only]
#            [-g NGPUS | --devs 0,1] [--ours target/release/libnccl.so] [--ref-dir DIR]
#            [--timeout 120] [--parse-only]
# Raw logs: ${OUT:-./ab-out}/ab/*.log; the table: ${OUT}/ab/summary.txt (also printed).
set -u
export NCCL_NVLS_ENABLE=0

BIN=${BIN:-build/gpu/nccl_bench}
MAX=1G
SMALL_MAX=4M
COLLS=all_reduce,all_gather,reduce_scatter,broadcast,reduce,sendrecv,alltoall
REPS=3
MODES="nograph graph"
GPUS=""
OURS=${OURS:-$PWD/target/release/libnccl.so}
REF_DIR=${REF_DIR:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib}
TMO=120
PARSE_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift ;;
    --max) MAX=$2; shift ;;
    --small-max) SMALL_MAX=$2; shift ;;
    --colls) COLLS=$2; shift ;;
    --reps) REPS=$2; shift ;;
    --no-graph) MODES="nograph" ;;
    --graph-only) MODES="graph" ;;
    -g) GPUS="-g $2"; shift ;;
    --devs) GPUS="--devs $2"; shift ;;
    --ours) OURS=$2; shift ;;
    --ref-dir) REF_DIR=$2; shift ;;
    --timeout) TMO=$2; shift ;;
    --parse-only) PARSE_ONLY=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "ab_bench: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

OUTDIR=${OUT:-./ab-out}/ab
mkdir -p "$OUTDIR"
OURS_DIR=$(dirname "$OURS")

to_bytes() { python3 -c "import sys;s=sys.argv[1];m={'K':1<<10,'M':1<<20,'G':1<<30};print(int(float(s[:-1])*m[s[-1].upper()]) if s[-1].upper() in m else int(s))" "$1"; }
SMALL_B=$(to_bytes "$SMALL_MAX")
MAX_B=$(to_bytes "$MAX")

# run LIB(A|B) LOG ARGS...
run() {
  local lib=$1 log=$2; shift 2
  if [ "$lib" = A ]; then
    env LD_LIBRARY_PATH="$REF_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout -k 5 "$TMO" "$BIN" "$@" >"$log" 2>&1
  else
    # LD_PRELOAD wins over any RPATH; the library path keeps NEEDED libnccl.so.2 resolvable too.
    env LD_PRELOAD="$OURS" LD_LIBRARY_PATH="$OURS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout -k 5 "$TMO" "$BIN" "$@" >"$log" 2>&1
  fi
  local rc=$?
  [ $rc -ne 0 ] && echo "ab_bench: $(basename "$log") exited $rc (tail below)" && tail -n 3 "$log"
  if [ "$lib" = B ] && ! grep -q "library .*$(basename "$OURS")" "$log" 2>/dev/null; then
    grep -m1 "library" "$log" | sed 's/^/ab_bench: WARNING ours? /'
  fi
  return 0
}

if [ $PARSE_ONLY = 0 ]; then
  [ -x "$BIN" ] || { echo "ab_bench: $BIN not built" >&2; exit 2; }
  [ -f "$OURS" ] || { echo "ab_bench: $OURS missing" >&2; exit 2; }
  [ -f "$REF_DIR/libnccl.so.2" ] || { echo "ab_bench: reference $REF_DIR/libnccl.so.2 missing" >&2; exit 2; }
  for coll in ${COLLS//,/ }; do
    for mode in $MODES; do
      G=""; [ $mode = graph ] && G="-G 1"
      # small sizes: A B A B A B, many iterations
      smax=$SMALL_B; [ $smax -gt $MAX_B ] && smax=$MAX_B
      for rep in $(seq 1 "$REPS"); do
        for lib in A B; do
          run $lib "$OUTDIR/${coll}__${mode}__small__${lib}__${rep}.log" --coll "$coll" $GPUS -b 8 -e "$smax" -f 2 -n 100 -w 20 $G
        done
      done
      # large sizes: one run each
      if [ $MAX_B -gt $SMALL_B ]; then
        for lib in A B; do
          run $lib "$OUTDIR/${coll}__${mode}__large__${lib}__1.log" --coll "$coll" $GPUS -b $((SMALL_B * 2)) -e "$MAX_B" -f 2 -n 20 -w 5 $G
        done
      fi
      echo "ab_bench: $coll $mode done"
    done
  done
fi

python3 - "$OUTDIR" <<'PY' | tee "$OUTDIR/summary.txt"
import glob, os, re, statistics, sys
d = sys.argv[1]
rows = {}     # (coll, mode, lib, size) -> list of (time_us, busbw, wrong)
inits = {}    # lib -> list of init seconds
for path in sorted(glob.glob(os.path.join(d, "*.log"))):
    parts = os.path.basename(path)[:-4].split("__")
    if len(parts) != 5: continue
    coll, mode, _rng, lib, _rep = parts
    for line in open(path, errors="replace"):
        m = re.match(r"# ncclCommInitAll: ([0-9.]+) s", line)
        if m: inits.setdefault(lib, []).append(float(m.group(1))); continue
        f = line.split()
        if len(f) < 9 or line.startswith("#") or not f[0].isdigit(): continue
        try:
            size, t, bus = int(f[0]), float(f[5]), float(f[7])
        except ValueError:
            continue
        wrong = 0 if f[8] in ("N/A",) else int(f[8]) if f[8].isdigit() else -1
        if len(f) >= 13 and f[12].isdigit(): wrong += int(f[12])
        rows.setdefault((coll, mode, lib, size), []).append((t, bus, wrong))
def med(v): return statistics.median(v) if v else float("nan")
def hs(b):
    for u, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= s and b % s == 0: return "%d%s" % (b // s, u)
    return str(b)
print("# A = NVIDIA NCCL (reference), B = ours.  Medians over runs.  out-of-place.  ratio = A_time / B_time (>1: ours faster)")
for lib, v in sorted(inits.items()):
    print("# init (ncclCommInitAll) %s: median %.3f s over %d runs" % ("NCCL" if lib == "A" else "ours", med(v), len(v)))
print("%-15s %-7s %8s %10s %10s %9s %9s %7s %7s %s" % ("collective", "mode", "size", "NCCL_us", "ours_us",
      "NCCL_bus", "ours_bus", "ratio", "runs", "wrong(A/B)"))
keys = sorted({(c, m, s) for (c, m, l, s) in rows}, key=lambda k: (k[0], k[1], k[2]))
worst = {}
for c, m, s in keys:
    a = rows.get((c, m, "A", s), []); b = rows.get((c, m, "B", s), [])
    ta, tb = med([x[0] for x in a]), med([x[0] for x in b])
    ba, bb = med([x[1] for x in a]), med([x[1] for x in b])
    wa = sum(x[2] for x in a); wb = sum(x[2] for x in b)
    ratio = ta / tb if a and b and tb > 0 else float("nan")
    flag = " <" if ratio == ratio and ratio < 1.0 else ""
    print("%-15s %-7s %8s %10.2f %10.2f %9.2f %9.2f %7.2f %3d/%-3d %d/%d%s" % (c, m, hs(s), ta, tb, ba, bb, ratio, len(a), len(b), wa, wb, flag))
    if ratio == ratio:
        w = worst.setdefault((c, m), [ratio, s, None])
        if ratio < w[0]: w[0], w[1] = ratio, s
        if s == 8: w[2] = (ta, tb)
print()
print("%-15s %-7s %10s %10s %14s" % ("collective", "mode", "min_ratio", "at_size", "8B us (A/B)"))
for (c, m), (r, s, t8) in sorted(worst.items()):
    print("%-15s %-7s %10.2f %10s %14s" % (c, m, r, hs(s), "%.1f/%.1f" % t8 if t8 else "-"))
PY
