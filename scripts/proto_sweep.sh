#!/usr/bin/env bash
# Protocol sweep: our library with each protocol (and algorithm) forced, in CUDA-graph mode, to
# measure the tuner's cost constants (src/tuner.rs) and to see where each protocol wins. Runs on
# the GPU machine after `scripts/gpu_check.sh --only build`. With --no-graph it also runs the copy
# engines forced (CE) and never used (kernels): they are not used under stream capture.
#
# usage: scripts/proto_sweep.sh [--bin build/gpu/nccl_bench] [--devs 0,1] [--colls all_reduce,...]
#            [--max 64M] [--ours target/release/libnccl.so] [--no-graph]
# Logs: ${OUT:-./sweep-out}/sweep/*.log; the table (out-of-place µs per size and setting):
# ${OUT}/sweep/summary.txt, also printed.
set -u
export NCCL_NVLS_ENABLE=0
BIN=build/gpu/nccl_bench; DEVS=0,1; COLLS=all_reduce,all_gather,reduce_scatter,broadcast; MAX=64M
OURS=$PWD/target/release/libnccl.so
GRAPH="-G 1"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift ;;
    --devs) DEVS=$2; shift ;;
    --colls) COLLS=$2; shift ;;
    --max) MAX=$2; shift ;;
    --ours) OURS=$2; shift ;;
    --no-graph) GRAPH="" ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "proto_sweep: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
D=${OUT:-./sweep-out}/sweep
mkdir -p "$D"
# setting name -> environment. The ring* settings only differ for all_reduce (no one-shot).
SETTINGS="free: LL:NCCL_PROTO=LL LL128:NCCL_PROTO=LL128 Simple:NCCL_PROTO=Simple"
RING="ringLL:NCCL_PROTO=LL,NCCL_ALGO=Ring ringLL128:NCCL_PROTO=LL128,NCCL_ALGO=Ring ringSimple:NCCL_PROTO=Simple,NCCL_ALGO=Ring"
[ -z "$GRAPH" ] && SETTINGS="$SETTINGS CE:FERRONICKEL_COPY_ENGINE=1 kernels:FERRONICKEL_COPY_ENGINE=0"
MODE="graph mode"; [ -z "$GRAPH" ] && MODE="no graph"
for coll in ${COLLS//,/ }; do
  ALL=$SETTINGS; [ "$coll" = all_reduce ] && ALL="$SETTINGS $RING"
  for s in $ALL; do
    name=${s%%:*}; envs=${s#*:}
    env ${envs//,/ } LD_PRELOAD="$OURS" LD_LIBRARY_PATH="$(dirname "$OURS")" timeout -k 5 120 \
      "$BIN" --coll "$coll" --devs "$DEVS" -b 8 -e "$MAX" -f 2 -n 50 -w 10 $GRAPH >"$D/${coll}__${name}.log" 2>&1 \
      || echo "proto_sweep: $coll $name exited $? ($(tail -n 1 "$D/${coll}__${name}.log"))"
  done
done
python3 - "$D" "$SETTINGS $RING" "$MODE" <<'PY' | tee "$D/summary.txt"
import glob, os, sys
d, settings, mode = sys.argv[1], [s.split(":")[0] for s in sys.argv[2].split()], sys.argv[3]
t = {}
for path in glob.glob(os.path.join(d, "*.log")):
    coll, name = os.path.basename(path)[:-4].split("__")
    for line in open(path, errors="replace"):
        f = line.split()
        if line.startswith("#") or len(f) < 9 or not f[0].isdigit(): continue
        try: t[(coll, name, int(f[0]))] = (float(f[5]), f[8])
        except ValueError: pass
for coll in sorted({k[0] for k in t}):
    print("# %s, %s, out-of-place time in us (wrong elements flagged with !)" % (coll, mode))
    names = [s for s in settings if any(k[0] == coll and k[1] == s for k in t)]
    print("%10s" % "bytes" + "".join("%10s" % s for s in names) + "   best")
    for size in sorted({k[2] for k in t if k[0] == coll}):
        cells, best = "", None
        for s in names:
            v = t.get((coll, s, size))
            cells += "%10s" % ("-" if v is None else "%.2f%s" % (v[0], "" if v[1] in ("0", "N/A") else "!"))
            if v and s != "free" and (best is None or v[0] < best[1]): best = (s, v[0])
        print("%10d%s   %s" % (size, cells, best[0] if best else "-"))
PY
