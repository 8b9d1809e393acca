#!/usr/bin/env bash
# NET benchmark on one GPU: all-reduce between processes on GPU 0 that each claim a host
# of their own (NCCL_HOSTID), so both libraries move every byte over their NET transport and
# sockets: ours (proxy thread + built-in Socket net) against NVIDIA's NCCL (NET/Socket), the same
# binary (benches/net_bench.cu) under each. CUDA MPS runs during the benchmark (processes sharing
# a GPU are otherwise time-sliced, 2-5 ms per exchange for both libraries) and is stopped after.
# Then the ceiling under our figures without a GPU: examples/net_ceiling (proxy + net + sockets,
# both directions at once, as a two-rank all-reduce), if it was built.
# --uts: each process is a host by its host name (a UTS namespace of its own, no NCCL_HOSTID), as
# production tells hosts apart; both libraries then run NET/Socket. Needs `unshare -u`.
# --shm: the processes share one host identity and NCCL_P2P_DISABLE=1, so both libraries use SHM;
# ours is also run without it (P2P) for comparison. NCCL refuses two ranks on one GPU, so its SHM
# run needs --gpus >= --nranks (a machine with that many GPUs); no ceiling is run.
#
# usage: scripts/net_bench.sh [--nranks 2] [--gpus 1] [--shm | --uts] [--max 512M] [--budget-s 0.25] [--no-mps]
#            [--ours target/release/libnccl.so] [--ref-dir DIR] [--ceiling-channels 8]
#            [--also "VAR=VALUE ..."]   (ours once more with these settings, e.g. NCCL_MAX_NCHANNELS=1)
# Output: ${OUT:-./net-out}/net/{ours,ref,ours_p2p,ceiling}.log and summary.txt (printed last).
set -u
export NCCL_NVLS_ENABLE=0

NRANKS=2; GPUS=1; SHM=0; UTS=0; MAX=512M; BUDGET=0.25; MPS=1; CH=8; ALSO=""
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OURS=$ROOT/target/release/libnccl.so
REF_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
while [ $# -gt 0 ]; do
  case "$1" in
    --nranks) NRANKS=$2; shift ;;
    --gpus) GPUS=$2; shift ;;
    --shm) SHM=1 ;;
    --uts) UTS=1 ;;
    --max) MAX=$2; shift ;;
    --budget-s) BUDGET=$2; shift ;;
    --no-mps) MPS=0 ;;
    --ours) OURS=$2; shift ;;
    --ref-dir) REF_DIR=$2; shift ;;
    --ceiling-channels) CH=$2; shift ;;
    --also) ALSO=$2; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "net_bench: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUTDIR=${OUT:-$ROOT/net-out}/net
mkdir -p "$OUTDIR"
CUDA=${CUDA_HOME:-/usr/local/cuda}
BIN=$OUTDIR/net_bench
INC=$ROOT/include; [ -f "$INC/nccl.h" ] || INC=$REF_DIR/include
# Linked against NVIDIA's library by name only (libnccl.so.2); LD_LIBRARY_PATH picks the one run.
mkdir -p "$OUTDIR/ours" && ln -sf "$OURS" "$OUTDIR/ours/libnccl.so.2" && ln -sf "$OURS" "$OUTDIR/ours/libnccl.so"
ARCH=sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)
timeout 120 "$CUDA/bin/nvcc" -O2 -std=c++17 -arch="$ARCH" -I"$INC" -o "$BIN" "$ROOT/benches/net_bench.cu" \
  -L"$OUTDIR/ours" -lnccl || { echo "net_bench: build failed"; exit 1; }

if [ $MPS = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=$OUTDIR/mps-pipe CUDA_MPS_LOG_DIRECTORY=$OUTDIR/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "net_bench: CUDA MPS started" || { echo "net_bench: could not start MPS"; MPS=0; }
  trap 'echo quit | nvidia-cuda-mps-control; echo "net_bench: CUDA MPS stopped"' EXIT
fi

LAYOUT=(--gpus "$GPUS"); WHAT="each its own NCCL_HOSTID"
[ $SHM = 1 ] && LAYOUT+=(--one-host) && WHAT="one host, SHM (NCCL_P2P_DISABLE=1)"
[ $UTS = 1 ] && LAYOUT+=(--uts) && WHAT="each its own host name (UTS namespace)"
run() {  # run NAME LIBDIR [VAR=VALUE...]
  echo "net_bench: $1 ${*:3}"
  env LD_LIBRARY_PATH="$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "${@:3}" timeout -k 5 150 \
    "$BIN" --nranks "$NRANKS" "${LAYOUT[@]}" --max "$MAX" --budget-s "$BUDGET" >"$OUTDIR/$1.log" 2>&1
  echo "net_bench:   -> exit $? ($(tail -n 1 "$OUTDIR/$1.log"))"
}
if [ $SHM = 1 ]; then
  run ours "$OUTDIR/ours" NCCL_P2P_DISABLE=1
  run ours_p2p "$OUTDIR/ours"
  if [ "$GPUS" -ge "$NRANKS" ]; then run ref "$REF_DIR/lib" NCCL_P2P_DISABLE=1
  else echo "NCCL refuses two ranks on one GPU: no reference run with --gpus $GPUS" >"$OUTDIR/ref.log"; fi
else
  run ours "$OUTDIR/ours"
  run ref "$REF_DIR/lib"
fi
# shellcheck disable=SC2086  # ALSO is a list of assignments
[ -n "$ALSO" ] && MAX=4M run ours_also "$OUTDIR/ours" $ALSO   # small sizes: latency

CEIL=$ROOT/target/release/examples/net_ceiling
if [ $SHM = 1 ]; then
  echo "not run: --shm moves no byte through sockets" >"$OUTDIR/ceiling.log"
elif [ -x "$CEIL" ]; then
  timeout -k 5 60 "$CEIL" "$CH" 3 512 >"$OUTDIR/ceiling.log" 2>&1
else
  echo "net_ceiling not built (cargo build --release --example net_ceiling)" >"$OUTDIR/ceiling.log"
fi

{
  echo "# all_reduce, $NRANKS processes on $GPUS GPU(s), $WHAT, MPS=$MPS"
  table() {  # table A B: A's and B's time and busbw per size, and A's bandwidth over B's
    printf "%12s %12s %12s %10s %10s %8s\n" bytes "$1_us" "$2_us" "$1_busbw" "$2_busbw" ratio_bw
    join <(awk '$1 ~ /^[0-9]+$/ {print $1, $2, $4}' "$OUTDIR/$1.log" | sort -k1,1) \
         <(awk '$1 ~ /^[0-9]+$/ {print $1, $2, $4}' "$OUTDIR/$2.log" | sort -k1,1) | sort -n |
      awk '{printf "%12d %12.1f %12.1f %10.3f %10.3f %8.2f\n", $1, $2, $4, $3, $5, ($5 > 0 ? $3 / $5 : 0)}'
  }
  table ours ref
  [ $SHM = 1 ] && echo "# ours over SHM against ours over P2P:" && table ours ours_p2p
  if [ -n "$ALSO" ]; then
    echo "# ours with $ALSO:"
    awk '$1 ~ /^[0-9]+$/ {printf "#   %12d %12.1f us %10.3f GB/s\n", $1, $2, $4}' "$OUTDIR/ours_also.log"
  fi
  echo "# ceiling without a GPU (examples/net_ceiling, $CH channels, 512 KiB slots):"
  sed 's/^/#   /' "$OUTDIR/ceiling.log"
} >"$OUTDIR/summary.txt"
cat "$OUTDIR/summary.txt"
