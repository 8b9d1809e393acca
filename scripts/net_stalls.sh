#!/usr/bin/env bash
# How often runs of ours stall over NET, variant against variant, on one machine in one call: the
# measure of docs/NOTES.md, "four hosts of two ranks: the stall is in the Socket net's helper
# path". A stall is a whole run whose calls of one size all take several times their usual time;
# NCCL's runs, and ours with every message under the Socket net's inline cut, never showed one,
# so each variant is counted over many runs, in turns with the others, beside that inline build as
# the control.
#
# Each run is benches/net_bench.cu over --nranks processes as hosts by host name (--per-host ranks
# a host, rank r on GPU r % --gpus), CUDA MPS on, outputs checked; beside every run
# scripts/thread_cpu.py samples the CPU use and run-queue waits of its threads by kind, and
# scripts/tcp_state.py the machine's TCP counters and every TCP socket's state.
# A run stalls where any size's p50 from --from on is more than --factor times the best run of
# its variant at that size (of the collectives in --colls but all-to-all, whose steps are
# per-peer).
#
# usage: scripts/net_stalls.sh [--runs 14] [--nranks 8] [--per-host 2] [--gpus 2]
#            [--colls all_reduce,all_gather,alltoall] [--min 1M] [--max 32M] [--from 4M] [--factor 1.5]
#            [--ours target/release/libnccl.so] [--hog N] [--timeline] [--variant NAME "VAR=VALUE ..."]...
# --hog N keeps N busy loops running for the whole call, a neighbour that takes N cores (beside 8
# on 32 cores, single runs of ours had their p99 at 3.5-7x p50 at 4 MB where NCCL's stayed within
# 1.9x: docs/NOTES.md, "four hosts of two ranks: the stall is the host's steal time, which our
# busy cores draw").
# --timeline loads benches/proxy_timeline.c in every run and writes NAME.K.chunks, what
# scripts/proxy_timeline.py --chunks says of the Socket net's helpers in it (how long chunks
# waited for a helper, how long they moved).
# The variants "default" (no setting) and "inline" (NCCL_BUFFSIZE=262144: 32 KiB slots, every
# message under the 128 KiB cut, so the proxy thread moves every byte) always run.
# Output: ${OUT:-./net-out}/stalls/: NAME.K.log, NAME.K.cpu and NAME.K.tcp per run (and
# NAME.K.chunks with --timeline), and
# summary.txt (printed last: per variant the runs that stalled, each run's worst ratio, the best
# p50 at --from, the range of the proxies' and helpers' cores and run-queue waits, and a few TCP
# counters, the machine's busy cores and its host's steal a run, stalled runs against steady ones).
set -u
export NCCL_NVLS_ENABLE=0

RUNS=14; NRANKS=8; PERHOST=2; GPUS=2; COLLS=all_reduce,all_gather,alltoall; MIN=1M; MAX=32M
FROM=4M; FACTOR=1.5; HOG=0; TIMELINE=0
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OURS=$ROOT/target/release/libnccl.so
NAMES=(default inline); SETS=("" "NCCL_BUFFSIZE=262144")
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift ;;
    --nranks) NRANKS=$2; shift ;;
    --per-host) PERHOST=$2; shift ;;
    --gpus) GPUS=$2; shift ;;
    --colls) COLLS=$2; shift ;;
    --min) MIN=$2; shift ;;
    --max) MAX=$2; shift ;;
    --from) FROM=$2; shift ;;
    --factor) FACTOR=$2; shift ;;
    --hog) HOG=$2; shift ;;
    --timeline) TIMELINE=1 ;;
    --ours) OURS=$2; shift ;;
    --variant) [ $# -ge 3 ] || { echo "net_stalls: --variant wants NAME and \"VAR=VALUE ...\"" >&2; exit 2; }
               NAMES+=("$2"); SETS+=("$3"); shift 2 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "net_stalls: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
case "$RUNS" in ''|*[!0-9]*|0) echo "net_stalls: --runs wants a count >= 1" >&2; exit 2 ;; esac
case "$HOG" in ''|*[!0-9]*) echo "net_stalls: --hog wants a count of busy loops" >&2; exit 2 ;; esac
OURS=$(cd "$(dirname "$OURS")" && pwd)/$(basename "$OURS")
OUTDIR=${OUT:-$ROOT/net-out}/stalls
mkdir -p "$OUTDIR/ours"
rm -rf "$OUTDIR"/*.log "$OUTDIR"/*.cpu "$OUTDIR"/*.tcp "$OUTDIR"/*.chunks "$OUTDIR"/*.tl "$OUTDIR/summary.txt"
ln -sf "$OURS" "$OUTDIR/ours/libnccl.so.2" && ln -sf "$OURS" "$OUTDIR/ours/libnccl.so"
CUDA=${CUDA_HOME:-/usr/local/cuda}
BIN=$OUTDIR/net_bench
ARCH=sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)
timeout 120 "$CUDA/bin/nvcc" -O2 -std=c++17 -arch="$ARCH" -I"$ROOT/include" -o "$BIN" "$ROOT/benches/net_bench.cu" \
  -L"$OUTDIR/ours" -lnccl || { echo "net_stalls: build failed"; exit 1; }

TL=()
if [ "$TIMELINE" = 1 ]; then
  gcc -shared -fPIC -O2 -I"$ROOT/src/plugin" -o "$OUTDIR/libproxy_timeline.so" "$ROOT/benches/proxy_timeline.c" \
    || { echo "net_stalls: the timeline plugin did not build"; exit 1; }
  TL=(NCCL_PROFILER_PLUGIN="$OUTDIR/libproxy_timeline.so")
fi

export CUDA_MPS_PIPE_DIRECTORY=$OUTDIR/mps-pipe CUDA_MPS_LOG_DIRECTORY=$OUTDIR/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
# The server numbers the GPUs of CUDA_VISIBLE_DEVICES from 0: its clients must not name them
# again by the numbers of the machine (the MPS guide: unset in clients).
nvidia-cuda-mps-control -d && echo "net_stalls: CUDA MPS started" && unset CUDA_VISIBLE_DEVICES \
  || echo "net_stalls: could not start MPS"
HOGS=()
trap '[ ${#HOGS[@]} = 0 ] || kill "${HOGS[@]}"; echo quit | nvidia-cuda-mps-control; echo "net_stalls: CUDA MPS stopped"' EXIT
for _ in $(seq 1 "$HOG"); do (while :; do :; done) & HOGS+=($!); done
[ "$HOG" = 0 ] || echo "net_stalls: $HOG busy loops beside every run"

FAILS=0
run() {  # run NAME.K SETTINGS
  python3 "$ROOT/scripts/thread_cpu.py" "$OUTDIR/$1.cpu" net_bench &
  local sampler=$!
  python3 "$ROOT/scripts/tcp_state.py" "$OUTDIR/$1.tcp" &
  local tcp=$!
  local tl=()
  if [ "$TIMELINE" = 1 ]; then mkdir -p "$OUTDIR/$1.tl"; tl=("${TL[@]}" PROXY_TIMELINE_DIR="$OUTDIR/$1.tl"); fi
  # shellcheck disable=SC2086  # SETTINGS is a list of assignments
  env LD_LIBRARY_PATH="$OUTDIR/ours" "${tl[@]}" $2 timeout -k 5 150 "$BIN" --nranks "$NRANKS" --uts \
    --per-host "$PERHOST" --gpus "$GPUS" --colls "$COLLS" --min "$MIN" --max "$MAX" --iters 200 --budget-s 0.1 \
    >"$OUTDIR/$1.log" 2>&1
  local rc=$?
  kill "$sampler" "$tcp" 2>/dev/null; wait "$sampler" "$tcp" 2>/dev/null
  if [ "$TIMELINE" = 1 ]; then
    python3 "$ROOT/scripts/proxy_timeline.py" "$OUTDIR/$1.tl" --chunks >"$OUTDIR/$1.chunks" 2>&1
    rm -rf "$OUTDIR/$1.tl"
  fi
  echo "net_stalls: $1 ${2:-(default)} -> exit $rc ($(tail -n 1 "$OUTDIR/$1.log"))"
  [ $rc = 0 ] || FAILS=$((FAILS + 1))
}
# Every variant in every position: the order turns by one each round.
NV=${#NAMES[@]}
for k in $(seq 1 "$RUNS"); do
  for i in $(seq 0 $((NV - 1))); do
    j=$(( (i + k) % NV ))
    run "${NAMES[$j]}.$k" "${SETS[$j]}"
  done
done

python3 - "$OUTDIR" "$FROM" "$FACTOR" "${NAMES[@]}" <<'EOF' | tee "$OUTDIR/summary.txt"
import glob, os, re, sys
out, frm, factor, names = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
frm = int(frm[:-1]) * unit[frm[-1].upper()] if frm[-1].upper() in unit else int(frm)
p50 = {}  # (name, run) -> {(coll, bytes): us}
for f in glob.glob(os.path.join(out, "*.log")):
    name, run = os.path.basename(f)[:-4].rsplit(".", 1)
    rows = {}
    for line in open(f):
        p = line.split()
        if len(p) == 9 and re.fullmatch(r"[a-z_]+", p[0]) and p[1].isdigit():
            rows[(p[0], int(p[1]))] = float(p[3])
    p50[(name, int(run))] = rows
def cpu(name):
    """(min, max) over the runs of the mean proxy and helper cores and waits (ms/s)."""
    per = {"proxy": [], "help": []}
    for f in glob.glob(os.path.join(out, name + ".*.cpu")):
        acc = {k: [0.0, 0.0, 0] for k in per}
        for line in open(f):
            for field in line.split()[1:]:
                kind, vals = field.split("=")
                if kind in acc:
                    v = vals.split("/")
                    acc[kind][0] += float(v[0]); acc[kind][1] += float(v[3]); acc[kind][2] += 1
        for k, (c, w, n) in acc.items():
            if n:
                per[k].append((c / n, w / n))
    return per
TCP = ("Tcp.RetransSegs", "TcpExt.TCPTimeouts", "TcpExt.TCPLossProbes", "TcpExt.DelayedACKs",
       "TcpExt.TCPRcvQDrop", "TcpExt.TCPBacklogDrop", "TcpExt.PruneCalled", "TcpExt.TCPOFOQueue",
       "TcpExt.TCPFastRetrans", "softnet.dropped", "softnet.squeezed", "ksoftirqd.run_us", "ksoftirqd.wait_us")
def tcp(name, run):
    """{counter or socket total: value} of one run's NAME.K.tcp ({} where there is none)."""
    out = {}
    try:
        lines = open(os.path.join(out_dir, f"{name}.{run}.tcp")).read().splitlines()
    except OSError:
        return out
    for line in lines:
        p = line.split()
        if p[:1] == ["count"] and p[1] in TCP:
            out[re.sub(r"^Tcp(Ext)?\.", "", p[1])] = int(p[2])
        elif p[:1] == ["sock"]:
            for f in p[3:]:
                m = re.fullmatch(r"(rwnd_limited|sndbuf_limited|busy):(\d+)ms.*", f)
                if m:
                    out[m[1] + "_ms"] = out.get(m[1] + "_ms", 0) + int(m[2])
        elif p[:2] == ["sysctl", "net.ipv4.tcp_congestion_control"]:
            out["cc:" + p[2]] = 1
    return out
out_dir = out
def machine(name, run):
    """Mean cores the whole machine used and its host stole, over one run's samples."""
    got = {"busy": [], "steal": []}
    try:
        for line in open(os.path.join(out_dir, f"{name}.{run}.cpu")):
            for field in line.split()[1:]:
                k, _, v = field.partition("=")
                if k in got:
                    got[k].append(float(v))
    except OSError:
        pass
    return {k: sum(v) / len(v) for k, v in got.items() if v}
print(f"# a run stalls where a size's p50 from {frm} B on is more than {factor}x its variant's best run there")
for name in names:
    runs = sorted(r for (n, r) in p50 if n == name)
    if not runs:
        continue
    points = {pt for r in runs for pt in p50[(name, r)] if pt[1] >= frm and pt[0] != "alltoall"}
    best = {pt: min(p50[(name, r)][pt] for r in runs if pt in p50[(name, r)]) for pt in points}
    worst = [max((p50[(name, r)][pt] / best[pt] for pt in points if pt in p50[(name, r)]), default=0) for r in runs]
    first = min(points, key=lambda pt: (pt[1], pt[0]), default=None)
    line = f"{name:12} stalled {sum(w > factor for w in worst)} of {len(runs)}; worst ratio per run " + " ".join(f"{w:.1f}" for w in worst)
    if first:
        line += f"; best {first[0]} {first[1]} B {best[first]:.0f} us"
    for kind, vals in cpu(name).items():
        if vals:
            line += f"; {kind} {min(v[0] for v in vals):.1f}-{max(v[0] for v in vals):.1f} cores, wait {min(v[1] for v in vals):.0f}-{max(v[1] for v in vals):.0f} ms/s"
    print(line)
    for label, pick in (("stalled", lambda w: w > factor), ("steady", lambda w: w <= factor)):
        got = [{**tcp(name, r), **machine(name, r)} for r, w in zip(runs, worst) if pick(w)]
        if got and any(got):
            keys = sorted({k for g in got for k in g})
            print(f"  tcp and machine, {label} runs ({len(got)}), mean a run: " + " ".join(f"{k}={sum(g.get(k, 0) for g in got) / len(got):.{ {'steal': 2, 'busy': 1}.get(k, 0) }f}" for k in keys))
EOF
[ $FAILS = 0 ] || { echo "net_stalls: $FAILS runs failed"; exit 1; }
