#!/usr/bin/env bash
# NET benchmark on one GPU: the nine collectives of nccl-tests between processes on GPU 0 that
# each claim a host of their own (NCCL_HOSTID), so both libraries move every byte over their NET
# transport and sockets: ours (proxy thread + built-in Socket net) against NVIDIA's NCCL
# (NET/Socket), the same binary (benches/net_bench.cu: every call timed alone, p50/p99 per size,
# outputs checked) under each. CUDA MPS runs during the benchmark (processes sharing a GPU are
# otherwise time-sliced, 2-5 ms per exchange for both libraries) and is stopped after.
# Then the ceiling under our figures without a GPU: examples/net_ceiling (proxy + net + sockets,
# both directions at once, as a two-rank all-reduce), if it was built.
# --runs N: each library N times, alternating (ours, ref, ref, ours, ours, ref, ...: each goes first
# in every other pair), so drift of the machine and the first run's handicap fall on both; a table's p50 (p99) is the median over the runs of each run's p50 (p99), and
# worst is the smallest of the runs' ratios (run k of ours against run k of ref). An odd N puts
# ours first once more than ref: to compare two builds of ours (--ours, --ref-dir), use an even N
# and a collective the change leaves alone as a control (docs/NOTES.md: in three rounds with one
# build first twice, an unchanged all-reduce moved 7-13 %).
# --uts: each process is a host by its host name (a UTS namespace of its own, no NCCL_HOSTID), as
# production tells hosts apart; both libraries then run NET/Socket. Needs `unshare -u`.
# --per-host R: R consecutive ranks share each host (NET between hosts, P2P or SHM inside one);
# NCCL needs a GPU per rank of a host, so its runs want --gpus R or more (they are skipped below).
# --shm: the processes share one host identity and NCCL_P2P_DISABLE=1, so both libraries use SHM;
# ours is also run once without it (P2P) for comparison. NCCL refuses two ranks on one GPU, so its
# SHM run needs --gpus >= --nranks (a machine with that many GPUs); no ceiling is run.
# --plugin LIB --net NAME: both libraries carry NET through this net plugin (NCCL_NET_PLUGIN=LIB)
# and no other net (NCCL_NET=NAME, the plugin's name: init fails where it did not load), e.g. the
# test plugin tests/c/net_plugin_tcp.c (FnTcp11) built as a vendor's would be. No ceiling is run.
# --gap-us G: G us of compute (a spinning kernel) on each rank's stream before every timed call, as
# in a training step, so the library sees each launch G us before its data moves.
# (Not NCCL_DEBUG to show it: NCCL's logging calls cudaGetDevice, which breaks the forked ranks.)
# --root R: the root of the rooted collectives (broadcast, reduce, gather, scatter), 0 by default.
# --pin K: each rank process on K CPUs of its own (benches/net_bench.cu), as a launcher that binds
# ranks places them; the same for both libraries.
# --cpu: scripts/thread_cpu.py samples each run's threads by kind (NAME.K.cpu), and the summary
# ends with each run's mean cores per kind (proxies, helpers, main threads), the machine's busy
# cores and its host's steal: what a library's threads cost the machine beside its times.
# --syscalls: benches/syscall_time.c in every rank process (LD_PRELOAD): each run's socket calls
# (NAME.K.sys/), and the summary ends with each process's medians per call of the time its sends
# and receives took (scripts/syscall_time.py); timing each call costs a little, so its tables are
# not the ones to compare speeds with.
#
# usage: scripts/net_bench.sh [--nranks 2] [--gpus 1] [--shm | --uts] [--per-host 1] [--runs 1] [--colls all|a,b,c]
#            [--min 8] [--max 512M] [--iters 200] [--budget-s 0.25] [--no-mps] [--run-timeout 300]
#            [--gap-us 0] [--pin K] [--root 0] [--ours target/release/libnccl.so] [--ref-dir DIR] [--ceiling-channels 8] [--plugin LIB --net NAME]
#            [--also "VAR=VALUE ..."]   (ours once more with these settings, up to 4M, e.g. NCCL_MAX_NCHANNELS=1) [--cpu] [--syscalls]
#            [--ref-env "VAR=VALUE ..."]   (settings for the ref runs only: with --ref-dir holding our own build,
#            two settings of one build in turns, e.g. --ref-env FERRONICKEL_NET_PROXY_THREADS=1)
# collectives: all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter
# Output: ${OUT:-./net-out}/net/: one log per run ({ours,ref}.K.log, ours_p2p.1.log, ours_also.1.log),
# ceiling.log, summary.txt (printed last: per collective bytes, p50 and p99 in us of each side,
# ratio = ref p50 / ours p50, >1 = ours faster) and summary.tsv (the same with bus bandwidths,
# tab-separated; summary_ours_p2p.tsv and summary_ours_also.tsv for the other comparisons).
# Exit status 1 when a run failed (its log's last line: NET_BENCH: FAIL ...).
set -u
export NCCL_NVLS_ENABLE=0

NRANKS=2; GPUS=1; PERHOST=1; SHM=0; UTS=0; MIN=8; MAX=512M; BUDGET=0.25; MPS=1; CH=8; ALSO=""
RUNS=1; COLLS=all; ITERS=200; RUN_TMO=300; PLUGIN=""; PLUGIN_NET=""; GAP=0; CPU=0; SYS=0; REF_ENV=""; PIN=0; ROOT_RANK=0
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OURS=$ROOT/target/release/libnccl.so
REF_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
while [ $# -gt 0 ]; do
  case "$1" in
    --nranks) NRANKS=$2; shift ;;
    --gpus) GPUS=$2; shift ;;
    --shm) SHM=1 ;;
    --uts) UTS=1 ;;
    --per-host) PERHOST=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --colls) COLLS=$2; shift ;;
    --min) MIN=$2; shift ;;
    --max) MAX=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --gap-us) GAP=$2; shift ;;
    --pin) PIN=$2; shift ;;
    --root) ROOT_RANK=$2; shift ;;
    --budget-s) BUDGET=$2; shift ;;
    --run-timeout) RUN_TMO=$2; shift ;;
    --no-mps) MPS=0 ;;
    --ours) OURS=$2; shift ;;
    --ref-dir) REF_DIR=$2; shift ;;
    --ceiling-channels) CH=$2; shift ;;
    --also) ALSO=$2; shift ;;
    --ref-env) REF_ENV=$2; shift ;;
    --plugin) PLUGIN=$2; shift ;;
    --net) PLUGIN_NET=$2; shift ;;
    --cpu) CPU=1 ;;
    --syscalls) SYS=1 ;;
    -h|--help) sed -n '2,50p' "$0"; exit 0 ;;
    *) echo "net_bench: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# Absolute, as the library is linked through a symlink elsewhere and found through LD_LIBRARY_PATH.
OURS=$(cd "$(dirname "$OURS")" && pwd)/$(basename "$OURS")
REF_DIR=$(cd "$REF_DIR" && pwd)
case "$RUNS" in ''|*[!0-9]*|0) echo "net_bench: --runs wants a count >= 1" >&2; exit 2 ;; esac
OUTDIR=${OUT:-$ROOT/net-out}/net
mkdir -p "$OUTDIR"
rm -f "$OUTDIR"/*.log "$OUTDIR"/*.cpu "$OUTDIR"/summary*.tsv "$OUTDIR/summary.txt"
rm -rf "$OUTDIR"/*.sys
CUDA=${CUDA_HOME:-/usr/local/cuda}
BIN=$OUTDIR/net_bench
INC=$ROOT/include; [ -f "$INC/nccl.h" ] || INC=$REF_DIR/include
# Linked against NVIDIA's library by name only (libnccl.so.2); LD_LIBRARY_PATH picks the one run.
mkdir -p "$OUTDIR/ours" && ln -sf "$OURS" "$OUTDIR/ours/libnccl.so.2" && ln -sf "$OURS" "$OUTDIR/ours/libnccl.so"
ARCH=sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)
timeout 120 "$CUDA/bin/nvcc" -O2 -std=c++17 -arch="$ARCH" -I"$INC" -o "$BIN" "$ROOT/benches/net_bench.cu" \
  -L"$OUTDIR/ours" -lnccl || { echo "net_bench: build failed"; exit 1; }
if [ $SYS = 1 ]; then
  gcc -shared -fPIC -O2 -o "$OUTDIR/libsyscall_time.so" "$ROOT/benches/syscall_time.c" -ldl \
    || { echo "net_bench: build of benches/syscall_time.c failed"; exit 1; }
fi

if [ $MPS = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=$OUTDIR/mps-pipe CUDA_MPS_LOG_DIRECTORY=$OUTDIR/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    echo "net_bench: CUDA MPS started"
    # The server numbers the GPUs of CUDA_VISIBLE_DEVICES from 0: the ranks, its clients, must not
    # name them again by the machine's numbers (NVIDIA's MPS guide: unset in clients).
    unset CUDA_VISIBLE_DEVICES
  else
    echo "net_bench: could not start MPS"; MPS=0
  fi
  trap 'echo quit | nvidia-cuda-mps-control; echo "net_bench: CUDA MPS stopped"' EXIT
fi

LAYOUT=(--gpus "$GPUS"); WHAT="each its own NCCL_HOSTID"
[ $SHM = 1 ] && LAYOUT+=(--one-host) && WHAT="one host, SHM (NCCL_P2P_DISABLE=1)"
[ $UTS = 1 ] && LAYOUT+=(--uts) && WHAT="each its own host name (UTS namespace)"
[ "$PERHOST" != 1 ] && LAYOUT+=(--per-host "$PERHOST") && WHAT="$PERHOST a host, hosts by ${WHAT#each its own }"
if [ -n "$PLUGIN" ]; then
  [ -f "$PLUGIN" ] || { echo "net_bench: no net plugin at $PLUGIN" >&2; exit 2; }
  [ -n "$PLUGIN_NET" ] || { echo "net_bench: --plugin wants --net NAME, the plugin's net name" >&2; exit 2; }
  PLUGIN=$(cd "$(dirname "$PLUGIN")" && pwd)/$(basename "$PLUGIN")
  export NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=$PLUGIN_NET
  WHAT="$WHAT, net $PLUGIN_NET of plugin $(basename "$PLUGIN")"
fi
FAILS=0
run() {  # run NAME.K LIBDIR [VAR=VALUE...]
  echo "net_bench: $1 ${*:3}"
  local sampler=""
  if [ $CPU = 1 ]; then python3 "$ROOT/scripts/thread_cpu.py" "$OUTDIR/$1.cpu" net_bench & sampler=$!; fi
  local shim=()
  if [ $SYS = 1 ]; then
    mkdir -p "$OUTDIR/$1.sys"
    shim=(LD_PRELOAD="$OUTDIR/libsyscall_time.so" SYSCALL_TIME_DIR="$OUTDIR/$1.sys")
  fi
  env LD_LIBRARY_PATH="$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "${shim[@]}" "${@:3}" timeout -k 5 "$RUN_TMO" \
    "$BIN" --nranks "$NRANKS" "${LAYOUT[@]}" --colls "$COLLS" --min "$MIN" --max "$MAX" --iters "$ITERS" \
    --budget-s "$BUDGET" --gap-us "$GAP" --pin "$PIN" --root "$ROOT_RANK" >"$OUTDIR/$1.log" 2>&1
  local rc=$?
  if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; fi
  echo "net_bench:   -> exit $rc ($(tail -n 1 "$OUTDIR/$1.log"))"
  [ $rc = 0 ] || FAILS=$((FAILS + 1))
}
REF_RUNS=1; [ $SHM = 1 ] && [ "$GPUS" -lt "$NRANKS" ] && REF_RUNS=0
[ "$GPUS" -lt "$PERHOST" ] && REF_RUNS=0
# The library that runs first in a pair was measured slower at small sizes, whichever it was
# (10-20 % under 16 KB, four processes through a plugin on one H200; docs/NOTES.md): the two
# take turns going first.
SHMV=(); [ $SHM = 1 ] && SHMV=(NCCL_P2P_DISABLE=1)
# shellcheck disable=SC2206  # REF_ENV is a list of assignments
REFV=("${SHMV[@]}" $REF_ENV)
for k in $(seq 1 "$RUNS"); do
  if [ $((k % 2)) = 1 ] || [ $REF_RUNS = 0 ]; then
    run "ours.$k" "$OUTDIR/ours" "${SHMV[@]}"
    [ $REF_RUNS = 1 ] && run "ref.$k" "$REF_DIR/lib" "${REFV[@]}"
  else
    run "ref.$k" "$REF_DIR/lib" "${REFV[@]}"
    run "ours.$k" "$OUTDIR/ours" "${SHMV[@]}"
  fi
done
[ $SHM = 1 ] && run ours_p2p.1 "$OUTDIR/ours"
# Small sizes, up to 4M (or --max if smaller): latency.
ALSO_MAX=$(awk -v m="$MAX" 'BEGIN { v = m + 0; u = substr(m, length(m))
  if (u ~ /[kK]/) v *= 1024; else if (u ~ /[mM]/) v *= 1048576; else if (u ~ /[gG]/) v *= 1073741824
  print (v < 4194304 ? m : "4M") }')
# shellcheck disable=SC2086  # ALSO is a list of assignments
# With --shm the settings come on top of NCCL_P2P_DISABLE=1, so that the comparison stays on SHM.
[ -n "$ALSO" ] && [ $SHM = 1 ] && ALSO="NCCL_P2P_DISABLE=1 $ALSO"
[ -n "$ALSO" ] && MAX=$ALSO_MAX run ours_also.1 "$OUTDIR/ours" $ALSO

CEIL=$ROOT/target/release/examples/net_ceiling
if [ $SHM = 1 ]; then
  echo "not run: --shm moves no byte through sockets" >"$OUTDIR/ceiling.log"
elif [ -n "$PLUGIN" ]; then
  echo "not run: the ceiling measures the built-in Socket net, not a plugin" >"$OUTDIR/ceiling.log"
elif [ -x "$CEIL" ]; then
  timeout -k 5 60 "$CEIL" "$CH" 3 512 >"$OUTDIR/ceiling.log" 2>&1
else
  echo "net_ceiling not built (cargo build --release --example net_ceiling)" >"$OUTDIR/ceiling.log"
fi

# table A B TSV: per collective and size, A's and B's p50 and p99 (medians over the runs) and
# B's p50 over A's (>1: A faster); with several runs also the worst run's ratio. The printed
# tables stay narrow, one column header for all (nine collectives to 16M print about 11 KB, so a
# tool that keeps only an output's last 12 KB keeps them); TSV gets every column.
table() {
  local f files=()
  for f in "$OUTDIR/$1".[0-9]*.log "$OUTDIR/$2".[0-9]*.log; do [ -f "$f" ] && files+=("$f"); done
  [ ${#files[@]} -gt 0 ] || { echo "# no logs for $1 or $2"; return; }
  awk -v A="$1" -v B="$2" -v tsv="$3" -v order="all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter" '
    function sortn(v, n,   i, j, t) { for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t } }
    function med(list,   v, n) { n = split(list, v, " "); if (n == 0) return ""; sortn(v, n); return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
    function us(x) { return x == "" ? "-" : x < 100 ? sprintf("%.1f", x) : sprintf("%.0f", x) }
    function hb(b) { return b >= 1048576 && b % 1048576 == 0 ? b / 1048576 "M" : b >= 1024 && b % 1024 == 0 ? b / 1024 "K" : b }
    FNR == 1 { side = FILENAME; sub(/.*\//, "", side); sub(/\.log$/, "", side); run = side; sub(/\.[0-9]+$/, "", side); sub(/.*\./, "", run) }
    NF == 9 && $1 ~ /^[a-z_]+$/ && $2 ~ /^[0-9]+$/ {
      k = $1 SUBSEP $2
      if (!((k) in seen)) { seen[k] = 1; sizes[$1] = sizes[$1] " " $2 }
      p50[side, k] = p50[side, k] " " $4; p99[side, k] = p99[side, k] " " $5; bw[side, k] = bw[side, k] " " $8
      one[side, k, run] = $4; runs[side, k]++; if (run + 0 > maxrun) maxrun = run + 0
    }
    END {
      many = maxrun > 1
      printf "coll\tbytes\t%s_p50_us\t%s_p99_us\t%s_busbw_GBs\t%s_p50_us\t%s_p99_us\t%s_busbw_GBs\tratio\tworst_ratio\t%s_runs\t%s_runs\n", A, A, A, B, B, B, A, B > tsv
      printf "%5s %7s %7s %7s %7s %5s%s\n", "bytes", A "_p50", A "_p99", B "_p50", B "_p99", "ratio", many ? " worst" : ""
      nc = split(order, colls, " ")
      for (c = 1; c <= nc; c++) {
        coll = colls[c]; ns = split(sizes[coll], sz, " ")
        if (ns == 0) continue
        sortn(sz, ns)
        printf "## %s\n", coll
        for (i = 1; i <= ns; i++) {
          k = coll SUBSEP sz[i]
          a = med(p50[A, k]); b = med(p50[B, k]); ratio = (a > 0 && b != "") ? b / a : ""
          worst = ""
          for (r = 1; r <= maxrun; r++)
            if (one[A, k, r] > 0 && one[B, k, r] != "" && (worst == "" || one[B, k, r] / one[A, k, r] < worst)) worst = one[B, k, r] / one[A, k, r]
          printf "%5s %7s %7s %7s %7s %5s%s\n", hb(sz[i]), us(a), us(med(p99[A, k])), us(b), us(med(p99[B, k])),
            ratio == "" ? "-" : sprintf("%.2f", ratio), many ? sprintf(" %5s", worst == "" ? "-" : sprintf("%.2f", worst)) : ""
          printf "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", coll, sz[i], a, med(p99[A, k]), med(bw[A, k]), b,
            med(p99[B, k]), med(bw[B, k]), ratio == "" ? "" : sprintf("%.4f", ratio), worst == "" ? "" : sprintf("%.4f", worst),
            runs[A, k], runs[B, k] > tsv
        }
      }
    }' "${files[@]}"
}

{
  echo "# $NRANKS processes on $GPUS GPU(s), $WHAT, MPS=$MPS, $RUNS run(s) each, budget ${BUDGET}s/size, up to $ITERS calls"
  # The machine: the same kind of lease has run NCCL's small hops up to a quarter faster on one host than
  # on another while ours did not move (docs/NOTES.md), so every table says where it ran.
  echo "# machine: $(uname -r); $(lscpu 2>/dev/null | awk -F: '/^Model name|^CPU\(s\)|^Thread|^Socket|^NUMA node\(s\)|^CPU max MHz/ { gsub(/^ +/, "", $2); printf "%s %s; ", $1, $2 }')$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
  echo "# p50/p99 in us (with several runs: medians over the runs); ratio = ref_p50/ours_p50, >1 = ours faster"
  [ -n "$REF_ENV" ] && echo "# ref: $REF_DIR with $REF_ENV"
  [ $REF_RUNS = 0 ] && echo "# no reference run: NCCL refuses two ranks of one host on one GPU (--gpus $GPUS)"
  table ours ref "$OUTDIR/summary.tsv"
  if [ $SHM = 1 ]; then
    echo "# ours over SHM against ours over P2P (ratio = p2p_p50/ours_p50):"
    table ours ours_p2p "$OUTDIR/summary_ours_p2p.tsv"
  fi
  if [ -n "$ALSO" ]; then
    echo "# ours against ours with $ALSO (ratio = also_p50/ours_p50):"
    table ours ours_also "$OUTDIR/summary_ours_also.tsv"
  fi
  if [ $CPU = 1 ]; then
    echo "# CPU per run (scripts/thread_cpu.py: mean cores and busy threads per kind):"
    python3 "$ROOT/scripts/thread_cpu.py" --summary "$OUTDIR"/*.cpu | sed 's/^/#   /'
  fi
  if [ $SYS = 1 ]; then
    echo "# socket calls per run and process (scripts/syscall_time.py: medians per call after the first 4):"
    for d in "$OUTDIR"/*.sys; do
      python3 "$ROOT/scripts/syscall_time.py" "$d" | awk -v run="$(basename "$d" .sys)" '/^==/ { p = $2; sub(/.*st\./, "", p); sub(/\.txt$/, "", p) } / calls, medians/ { print "#   " run " pid " p ":" $0 }'
    done
  fi
  echo "# ceiling without a GPU (examples/net_ceiling, $CH channels, 512 KiB slots):"
  sed 's/^/#   /' "$OUTDIR/ceiling.log"
  echo "# runs failed: $FAILS (logs and summary.tsv: $OUTDIR)"
} >"$OUTDIR/summary.txt"
cat "$OUTDIR/summary.txt"
[ $FAILS = 0 ]
