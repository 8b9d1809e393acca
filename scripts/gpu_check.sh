#!/usr/bin/env bash
# The whole GPU check in one call on the device machine (docs/ARCHITECTURE.md, "Testing on
# GPUs"): build the checker, the benchmark and the examples there (no Rust there; our library comes prebuilt in
# target/release), run the correctness matrix in every process layout, graph / leak / watchdog
# tests, the examples, optionally the A/B benchmark, and end with a summary table as the LAST
# lines printed.  Every step runs under `timeout`, and a global budget keeps the whole call
# inside the device's 10-minute limit: steps past the budget are reported as SKIP, and a step
# whose own timeout the budget shortened and that ran into it as CUT (not a failure of the
# library, but not a pass: the call's verdict is then INCOMPLETE, exit status 3).
#
# usage: scripts/gpu_check.sh [options]
#   --quick            reduced matrix everywhere, fewer graph/leak iterations
#   --only LIST        only these steps or groups (comma list): build,check,ptx,protos,ce,procs,onegpu,
#                      shm,net,tree,mpi,graph,leak,watchdog,faults,exit,windows,examples,device,plugins,torch,bench
#                      (e.g. --only check,graph)
#   --skip LIST        everything except these
#   --bench            also run the A/B benchmark (scripts/ab_bench.sh) at the end
#   --bench-only       build + the A/B benchmark only
#   --bench-args "..." extra arguments for ab_bench.sh (e.g. "--max 256M --colls all_reduce")
#   --lib ours|ref     library the correctness steps use (default ours; ref = NVIDIA's NCCL,
#                      to validate the checker itself: single-GPU multi-rank steps are skipped
#                      since NCCL refuses two ranks on one GPU, and so is the watchdog)
#   --budget SECONDS   stop starting steps after this much wall time (default 540)
#   --no-build         reuse binaries in $BUILD
# env: OUT (default ./gpu-out), BUILD (default build/gpu), CUDA_ARCH (default from nvidia-smi),
#      CUDA_VISIBLE_DEVICES (the GPUs the steps may use; instances side by side, each with its own:
#      the leak steps read a GPU's free memory, so no other instance may use their GPUs, and the
#      exit steps, which start hundreds of processes, ran 2.7x slower with two instances on one GPU),
#      NCCL_REF (reference NCCL root), CUDA_HOME (default /usr/local/cuda),
#      NCCL_TESTS_SRC (a copy of NVIDIA's nccl-tests sources: adds the step nccl_tests_p1)
set -u
export NCCL_NVLS_ENABLE=0

T_START=$(date +%s)
QUICK=0; ONLY=""; SKIP=""; BENCH=0; BENCH_ONLY=0; BENCH_ARGS=""; LIB=ours; BUDGET=540; NOBUILD=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --only) ONLY=",$2,"; shift ;;
    --skip) SKIP=",$2,"; shift ;;
    --bench) BENCH=1 ;;
    --bench-only) BENCH=1; BENCH_ONLY=1 ;;
    --bench-args) BENCH_ARGS=$2; shift ;;
    --lib) LIB=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --no-build) NOBUILD=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/logs
BUILD=${BUILD:-$ROOT/build/gpu}
mkdir -p "$BUILD"
# Absolute, as OUT: steps that change directory (nccl-tests' make) are handed paths under it.
BUILD=$(cd "$BUILD" && pwd)
CUDA=${CUDA_HOME:-/usr/local/cuda}
NVCC=$CUDA/bin/nvcc
REF=${NCCL_REF:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl}
OURLIB=$ROOT/target/release/libnccl.so
export PATH=$CUDA/bin:$PATH

# --- what the build links against and what the runs load ---------------------------------------
INC=$ROOT/include
if [ ! -f "$INC/nccl.h" ]; then
  echo "gpu_check: NOTE include/nccl.h missing; compiling against NVIDIA's header (same ABI)"
  INC=$REF/include
fi
if [ -f "$OURLIB" ]; then
  LINK="-L$ROOT/target/release -lnccl"
  # NEEDED is libnccl.so.2 (our SONAME): give the loader a file by that name.
  mkdir -p "$BUILD/ourlib"
  ln -sf "$OURLIB" "$BUILD/ourlib/libnccl.so.2"
  ln -sf "$OURLIB" "$BUILD/ourlib/libnccl.so"
else
  echo "gpu_check: NOTE $OURLIB missing; linking against the reference library"
  mkdir -p "$BUILD/reflib"
  ln -sf "$REF/lib/libnccl.so.2" "$BUILD/reflib/libnccl.so"
  LINK="-L$BUILD/reflib -lnccl"
  [ "$LIB" = ours ] && { echo "gpu_check: no library of ours to test; use --lib ref"; }
fi
if [ "$LIB" = ref ]; then RUNLIB=$REF/lib; else RUNLIB=$BUILD/ourlib; fi
export LD_LIBRARY_PATH="$RUNLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

NG=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
[ "$NG" -ge 1 ] 2>/dev/null || NG=0
# nvidia-smi lists every GPU; the steps see only those CUDA_VISIBLE_DEVICES names (so one instance can run
# on GPU 1 beside another's benchmark on GPU 0).
if [ "$NG" -ge 1 ] && [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then NG=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .); fi
CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
ARCH=${CUDA_ARCH:-sm_${CC:-90}}
HAVE_MPI=0; command -v mpicc >/dev/null && command -v mpirun >/dev/null && HAVE_MPI=1
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x NCCL_DEBUG -x NCCL_WATCHDOG_TIMEOUT_MS"

echo "gpu_check: $(date -u +%FT%TZ) lib=$LIB ($RUNLIB) gpus=$NG arch=$ARCH quick=$QUICK out=$OUT"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu_check:   /'
[ "$NG" -ge 2 ] && nvidia-smi topo -m 2>/dev/null | head -4 | sed 's/^/gpu_check:   /'

# --- step runner -------------------------------------------------------------------------------
NAMES=(); RESULTS=(); TIMES=(); DETAILS=()
wanted() {  # wanted NAME GROUP
  if [ $BENCH_ONLY = 1 ]; then [ "$2" = bench ] || [ "$2" = build ]; return; fi
  [ "$2" = bench ] && [ $BENCH = 0 ] && return 1
  if [ -n "$ONLY" ]; then case "$ONLY" in *",$1,"*|*",$2,"*) ;; *) [ "$2" = build ] || return 1 ;; esac; fi
  if [ -n "$SKIP" ]; then case "$SKIP" in *",$1,"*|*",$2,"*) return 1 ;; esac; fi
  return 0
}
record() { NAMES+=("$1"); RESULTS+=("$2"); TIMES+=("$3"); DETAILS+=("$4"); }
# step NAME GROUP TIMEOUT CMD...   (output to $LOG/NAME.log)
step() {
  local name=$1 group=$2 tmo=$3; shift 3
  wanted "$name" "$group" || return 0
  local now=$(date +%s); local left=$((BUDGET - (now - T_START)))
  if [ $left -lt 15 ]; then record "$name" SKIP 0 "over the ${BUDGET}s budget"; return 0; fi
  local own=$tmo cut=0
  [ $tmo -gt $left ] && { tmo=$left; cut=1; }
  echo "gpu_check: [$(($(date +%s) - T_START))s] $name (timeout ${tmo}s): $*"
  local t0=$(date +%s)
  timeout -k 10 "$tmo" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  local dt=$(($(date +%s) - t0))
  local res=PASS
  case $rc in 0) ;; 124|137) res=TIMEOUT; [ $cut = 1 ] && res=CUT ;; *) res="FAIL($rc)" ;; esac
  local det
  # A graph step's verdict is its GRAPH: line (replays checked); the SUMMARY after it counts no matrix cases.
  det=$(grep -E "^GRAPH:" "$LOG/$name.log" | tail -n 1 | cut -c1-70)
  [ -n "$det" ] || det=$(grep -E "^(OVERALL|SUMMARY|SHM:|GRAPH:|LEAK:|WATCHDOG:|FAULTS:|EXIT_LIVE:|exit:|TORCH EXIT:|single_process:|mpi_per_gpu:|device_allreduce:|WINDOWS:|SYMM_MEM:|build_device_example:|TORCH CHECK:|PROFILER TRACE:|NVTX:|HANG|TIMEOUT|FATAL)" "$LOG/$name.log" | tail -n 1 | cut -c1-70)
  [ $res = CUT ] && det="stopped by the ${BUDGET}s budget (its own timeout ${own}s)"
  record "$name" "$res" "$dt" "$det"
  echo "gpu_check:   -> $res in ${dt}s ${det}"
}
skip() { wanted "$1" "$2" && record "$1" SKIP 0 "$3"; return 0; }

# --- build (parallel nvcc) ---------------------------------------------------------------------
NVFLAGS="-O2 -std=c++17 -arch=$ARCH -I$INC -Xcompiler -Wall"
build() {
  local pids=() rc=0 TO="timeout -k 5 300"
  $TO $NVCC $NVFLAGS -o "$BUILD/check" tests/gpu/check.cu $LINK -lpthread -ldl >"$LOG/build_check.log" 2>&1 & pids+=($!)
  $TO $NVCC $NVFLAGS -o "$BUILD/nccl_bench" benches/nccl_bench.cu $LINK -ldl >"$LOG/build_bench.log" 2>&1 & pids+=($!)
  $TO $NVCC $NVFLAGS -o "$BUILD/faults" tests/gpu/faults.cu $LINK -lpthread >"$LOG/build_faults.log" 2>&1 & pids+=($!)
  $TO $NVCC $NVFLAGS -o "$BUILD/exit_live" tests/gpu/exit_live.cu $LINK >"$LOG/build_exit_live.log" 2>&1 & pids+=($!)
  $TO $NVCC $NVFLAGS -o "$BUILD/windows" tests/gpu/windows.cu $LINK >"$LOG/build_windows.log" 2>&1 & pids+=($!)
  $TO $NVCC $NVFLAGS -o "$BUILD/symmetric" tests/gpu/symmetric.cu $LINK >"$LOG/build_symmetric.log" 2>&1 & pids+=($!)
  if [ $HAVE_MPI = 1 ]; then
    $TO $NVCC -ccbin mpicxx -DCHECK_MPI $NVFLAGS -o "$BUILD/check_mpi" tests/gpu/check.cu $LINK -lpthread -ldl >"$LOG/build_check_mpi.log" 2>&1 & pids+=($!)
    $TO mpicc -O2 -Wall -I"$INC" -I"$CUDA/include" -o "$BUILD/mpi_per_gpu" examples/mpi_per_gpu.c $LINK -L"$CUDA/lib64" -lcudart >"$LOG/build_mpi_example.log" 2>&1 & pids+=($!)
  fi
  $TO gcc -O2 -Wall -I"$INC" -I"$CUDA/include" -o "$BUILD/single_process" examples/single_process.c $LINK -L"$CUDA/lib64" -lcudart >"$LOG/build_single_example.log" 2>&1 & pids+=($!)
  # The test net plugins, built apart from the library as a vendor's would be (tests/net.rs builds
  # the same sources in CI): one exporting ncclNetPlugin_v11, one only _v8.
  for v in 11 8; do
    $TO gcc -shared -fPIC -O2 -Wall -Isrc/transport/net -DPLUGIN_VERSION=$v -o "$BUILD/libnccl-net-fntcp$v.so" tests/c/net_plugin_tcp.c >"$LOG/build_plugin$v.log" 2>&1 & pids+=($!)
  done
  # And v11 reporting a fast link (100 Gbps, 5 us, 65536 comms), which prices the link (its channels stay two).
  $TO gcc -shared -fPIC -O2 -Wall -Isrc/transport/net -DPLUGIN_VERSION=11 -DPLUGIN_SPEED=100000 -DPLUGIN_LATENCY=5 -DPLUGIN_MAX_COMMS=65536 -o "$BUILD/libnccl-net-fntcpfast.so" tests/c/net_plugin_tcp.c >"$LOG/build_pluginfast.log" 2>&1 & pids+=($!)
  # The test profiler plugin (tests/c/profiler_plugin.c, ABI v5), for the plugins group.
  $TO gcc -shared -fPIC -O2 -Wall -Isrc/plugin -pthread -DPROFILER_VERSION=5 -o "$BUILD/libnccl-profiler-fnprof5.so" tests/c/profiler_plugin.c >"$LOG/build_profiler.log" 2>&1 & pids+=($!)
  # The timing profiler plugin for proxy timelines (benches/proxy_timeline.c, docs/NET.md).
  $TO gcc -shared -fPIC -O2 -Wall -Isrc/plugin -o "$BUILD/libproxy_timeline.so" benches/proxy_timeline.c >"$LOG/build_timeline.log" 2>&1 & pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  for f in "$LOG"/build_*.log; do [ -s "$f" ] && { echo "== $f"; cat "$f"; }; done
  return $rc
}
if [ $NOBUILD = 0 ]; then
  # A shell function cannot run under `timeout`; each compiler call has its own instead.
  echo "gpu_check: [$(($(date +%s) - T_START))s] build ($ARCH, -I$INC, $LINK)"
  t0=$(date +%s)
  if build >"$LOG/build.log" 2>&1; then res=PASS; else res=FAIL; fi
  record build $res $(($(date +%s) - t0)) "$(ls "$BUILD" | grep -v ourlib | tr '\n' ' ')"
  echo "gpu_check:   -> $res"
  [ $res = FAIL ] && cat "$LOG/build.log" | head -n 40
else
  record build SKIP 0 "--no-build"
fi

# --- correctness -------------------------------------------------------------------------------
Q=""; [ $QUICK = 1 ] && Q="--quick"
GI=100; LI=100; [ $QUICK = 1 ] && { GI=20; LI=20; }
CHK=$BUILD/check
ONE_GPU_OK=1; [ "$LIB" = ref ] && ONE_GPU_OK=0   # NCCL refuses two ranks on one GPU

if [ "$NG" -ge 2 ]; then
  step check_threads_2gpu check 300 "$CHK" --mode threads --devs 0,1 $Q
  step check_procs_2gpu procs 240 "$CHK" --mode procs --devs 0,1 --quick --failures-only
  step graph_2gpu graph 120 "$CHK" --graph --devs 0,1 --graph-iters $GI
  step leak_2gpu leak 240 "$CHK" --leak --devs 0,1 --leak-iters $LI
  PAIR=0,1
else
  PAIR=0,0
fi
# Every GPU at once where there are more than two: one process for all, a process per GPU, a graph.
if [ "$NG" -gt 2 ]; then
  ALL=$(seq -s, 0 $((NG - 1)))
  step check_threads_${NG}gpu check 300 "$CHK" --mode threads --devs "$ALL" $Q --failures-only
  step check_procs_${NG}gpu procs 240 "$CHK" --mode procs --devs "$ALL" --quick --failures-only
  step graph_${NG}gpu graph 120 "$CHK" --graph --devs "$ALL" --graph-iters $GI
fi
# One thread makes every rank's communicator with ncclCommInitRank inside a group, as nccl-tests
# -g N and single-process multi-GPU programs do: the inits must run at the group's end, together.
# Splits inside a group likewise (the tests then run on the children).
if [ "$NG" -ge 2 ]; then
  step check_group_init_2gpu check 200 "$CHK" --mode threads --init group --devs 0,1 --quick --failures-only
  step check_group_split_2gpu check 200 "$CHK" --mode threads --init group-split --devs 0,1 --quick --failures-only
elif [ $ONE_GPU_OK = 1 ] && [ "$NG" -ge 1 ]; then
  step check_group_init_1gpu_2 check 200 "$CHK" --mode threads --init group --devs 0,0 --quick --failures-only
  step check_group_split_1gpu_2 check 200 "$CHK" --mode threads --init group-split --devs 0,0 --quick --failures-only
fi
# Each protocol forced (NCCL_PROTO), and the ring alone (NCCL_ALGO=Ring: no one-shot all-reduce,
# so small all-reduces run the ring over LL); 2 GPUs (or 2 ranks on one) and 4 ranks on one GPU.
if [ "$NG" -ge 1 ]; then
  DEVS2=0,1; [ "$NG" -lt 2 ] && DEVS2=0,0
  for P in LL LL128 Simple; do
    step check_${P}_2 protos 240 env NCCL_PROTO=$P "$CHK" --mode threads --devs $DEVS2 $Q --failures-only
  done
  step check_ring_LL_2 protos 240 env NCCL_ALGO=Ring NCCL_PROTO=LL "$CHK" --mode threads --devs $DEVS2 --quick --failures-only
  # The kernels' PTX, as a GPU newer than the SASS would run it: the driver ignores the SASS and
  # compiles the embedded PTX at load (README, "Building"; a unit without PTX fails to load here).
  # Group `ptx` (--only ptx).
  step check_ptx_jit_2 ptx 400 env CUDA_FORCE_PTX_JIT=1 "$CHK" --mode threads --devs $DEVS2 --quick --failures-only
  if [ $ONE_GPU_OK = 1 ]; then
    for P in LL LL128; do
      step check_${P}_1gpu_4 protos 200 env NCCL_PROTO=$P "$CHK" --mode threads --devs 0,0,0,0 --quick --failures-only
    done
  fi
fi
# Tree all-reduce forced (NCCL_ALGO=Tree; docs/ARCHITECTURE.md, "Tree"): ranks as threads on GPU 0,
# where the tree is one chain. Each step also counts the all-reduces the tuner sent to the tree
# (NCCL_DEBUG=INFO TUNING lines), so it fails if none did. NCCL_ALGO=Tree leaves the other
# collectives no algorithm (ncclInvalidUsage, as in NCCL): tree_refuse_4 checks that, and the
# full matrix runs with NCCL_ALGO=allreduce:tree. Across hosts (processes on GPU 0 that each
# claim a host by NCCL_HOSTID: check --hosts, with the NET transport) the trees join the hosts'
# chains: 2 hosts of 2 ranks (a chain link and a link between hosts) and 4 hosts of 1 (the
# double binary tree alone).
tree_step() {  # tree_step NAME TIMEOUT ALGO [ENV=VALUE...] -- CHECK ARGS...
  local name=$1 tmo=$2 algo=$3; shift 3
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  step "$name" tree "$tmo" bash -c '"${@:2}"; rc=$?; n=$(grep -c "AllReduce: .* -> algo Tree" "$1")
    echo "tree all-reduces: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' _ "$LOG/$name.log" \
    env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING NCCL_ALGO="$algo" "${envs[@]}" "$CHK" "$@"
}
if [ "$LIB" = ours ] && [ $ONE_GPU_OK = 1 ] && [ "$NG" -ge 1 ]; then
  for D in 0,0 0,0,0,0 0,0,0,0,0,0,0,0; do
    N=$(echo $D | tr ',' '\n' | wc -l)
    tree_step tree_$N 200 Tree -- --mode threads --devs $D --colls AllReduce --quick --failures-only
  done
  for P in LL LL128 Simple; do
    tree_step tree_${P}_4 200 Tree NCCL_PROTO=$P -- --mode threads --devs 0,0,0,0 --colls AllReduce --quick --failures-only
  done
  tree_step tree_graph_4 120 Tree -- --graph --devs 0,0,0,0 --graph-iters 20
  tree_step tree_matrix_4 240 allreduce:tree -- --mode threads --devs 0,0,0,0 --failures-only
  tree_step tree_hosts_2x2 240 allreduce:tree -- --mode procs --devs 0,0,0,0 --hosts 2 --quick --failures-only
  for P in LL LL128 Simple; do
    tree_step tree_hosts_4_$P 200 Tree NCCL_PROTO=$P -- --mode procs --devs 0,0,0,0 --hosts 4 --colls AllReduce --quick --failures-only
  done
  step tree_refuse_4 tree 60 bash -c '"${@:2}"; rc=$?; grep -m1 "no algorithm available for AllGather" "$1"
    [ $rc != 0 ] && grep -q "no algorithm available for AllGather" "$1"' _ "$LOG/tree_refuse_4.log" \
    env NCCL_DEBUG=WARN NCCL_ALGO=Tree "$CHK" --mode threads --devs 0,0,0,0 --colls AllGather --counts 7 --large-bytes 0
fi
# Copy engines forced (FERRONICKEL_COPY_ENGINE=1: every group of broadcasts between two ranks,
# all-gathers and sends/receives runs as cuMemcpyAsync copies, at every size); the step also
# counts the groups that did (NCCL_DEBUG=INFO lines), so it fails if none did.
ce_step() {  # ce_step NAME TIMEOUT DEVS ARGS...
  local name=$1 tmo=$2 devs=$3; shift 3
  step "$name" ce "$tmo" bash -c '"${@:2}"; rc=$?; n=$(grep -c "copy engines:" "$1")
    echo "copy-engine groups: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' _ "$LOG/$name.log" \
    env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL FERRONICKEL_COPY_ENGINE=1 "$CHK" --mode threads --devs "$devs" "$@" --failures-only
}
if [ "$LIB" = ours ] && [ "$NG" -ge 1 ]; then
  ce_step check_ce_2 240 $DEVS2 $Q
  [ $ONE_GPU_OK = 1 ] && ce_step check_ce_1gpu_4 200 0,0,0,0 --quick
fi
if [ $ONE_GPU_OK = 1 ] && [ "$NG" -ge 1 ]; then
  step graph_1gpu_4 graph 120 "$CHK" --graph --devs 0,0,0,0 --graph-iters 20
  if [ "$NG" -lt 2 ]; then
    step check_threads_1gpu_2 check 300 "$CHK" --mode threads --devs 0,0 $Q --failures-only
    step leak_1gpu_2 leak 240 "$CHK" --leak --devs 0,0 --leak-iters $LI
  fi
  # The hang report must name the rank that never entered the collective (rank 1).
  [ "$LIB" = ours ] && step watchdog watchdog 90 bash -c '"${@:2}"; rc=$?; r=$(grep -h "hang report:" "$1" | tail -n 2); echo "$r"
    [ $rc = 0 ] && grep -q "hang report: .*rank 1 (host .*never entered it" "$1" &&
    grep -q "NCCL_WATCHDOG_TIMEOUT_MS) for a peer.*rank 1 (host .*never entered it" "$1"' _ "$LOG/watchdog.log" \
    env NCCL_DEBUG=WARN NCCL_WATCHDOG_TIMEOUT_MS=2000 "$CHK" --watchdog --devs $PAIR
  # Over the ring (no one-shot), the report also says which neighbour rank 0's channels wait for.
  [ "$LIB" = ours ] && step watchdog_ring watchdog 90 bash -c '"${@:2}"; rc=$?; grep -h "hang report:" "$1" | tail -n 1 | cut -c1-300
    [ $rc = 0 ] && grep -q "hang report: .*rank 0 waits for rank 1 (" "$1"' _ "$LOG/watchdog_ring.log" \
    env NCCL_DEBUG=WARN NCCL_ALGO=Ring NCCL_WATCHDOG_TIMEOUT_MS=2000 "$CHK" --watchdog --devs $PAIR
  # A report asked for (FERRONICKEL_HANG_REPORT_FILE touched) while rank 0's kernel still spins: its
  # FIFO counters are read without waiting behind the kernel, before the 10 s watchdog fires.
  [ "$LIB" = ours ] && step hang_report_touch watchdog 90 bash -c 'f=$(mktemp -u); FERRONICKEL_HANG_REPORT_FILE=$f "${@:2}" &
    p=$!; sleep 5; touch "$f"; wait $p; rc=$?; rm -f "$f"; grep -h "hang report:" "$1" | head -n 1 | cut -c1-300
    [ $rc = 0 ] && grep -q "hang report: .*rank(s) 0 wait in it.*rank 0 waits for rank 1 (" "$1"' _ "$LOG/hang_report_touch.log" \
    env NCCL_DEBUG=WARN NCCL_ALGO=Ring NCCL_WATCHDOG_TIMEOUT_MS=10000 "$CHK" --watchdog --devs $PAIR
else
  skip watchdog watchdog "reference NCCL has no device-side timeout"
fi
# A rank killed mid-collective: survivors see ncclRemoteError naming it within 2 s, shrink without
# it and all-reduce, and abort within 1 s; and revoke then shrink around a rank that never joins
# (tests/gpu/faults.cu). One process per rank, over P2P here; the shm and net groups run it over
# SHM and NET.
if [ "$LIB" = ours ] && [ "$NG" -ge 1 ]; then
  DEVS4=0,0,0,0; [ "$NG" -ge 4 ] && DEVS4=0,1,2,3
  step faults_2 faults 90 "$BUILD/faults" --devs $DEVS2
  step faults_4 faults 90 "$BUILD/faults" --devs $DEVS4
  step revoke_4 faults 90 "$BUILD/faults" --devs $DEVS4 --revoke
fi
# Jobs that end with their communicators alive (no ncclCommDestroy: return from main, exit(0),
# after ncclMemFree, after a barrier; random 0-5 ms skews), 50 times per layout, over P2P, SHM
# and NET, 2 and 4 processes and one process of 4 ranks (tests/gpu/exit_live.cu): every process
# must exit 0, and nothing may print a WARN (a peer that ended after its last operation is no
# loss) or a panic. Then a PyTorch job of 2 ranks on GPU 0 that ends without
# destroy_process_group, 20 times (tests/torch/exit_live.py).
exit_step() {  # exit_step NAME TIMEOUT ENV=VALUE... -- EXIT_LIVE ARGS...
  local name=$1 tmo=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  step "$name" exit "$tmo" bash -c '"${@:2}"; rc=$?; w=$(grep -cE "NCCL WARN|panicked" "$1")
    echo "exit: $w WARN/panic lines (rc $rc)"; [ $rc = 0 ] && [ "$w" = 0 ]' _ "$LOG/$name.log" \
    env NCCL_DEBUG=WARN "${envs[@]}" "$BUILD/exit_live" --iters 50 "$@"
}
if [ "$LIB" = ours ] && [ "$NG" -ge 1 ]; then
  exit_step exit_p2p_2 120 -- --procs 2
  exit_step exit_p2p_4 150 -- --procs 4
  exit_step exit_threads_4 120 -- --procs 1 --ranks 4
  exit_step exit_shm_2 120 NCCL_P2P_DISABLE=1 -- --procs 2
  exit_step exit_shm_4 150 NCCL_P2P_DISABLE=1 -- --procs 4
  exit_step exit_net_2 120 NCCL_SOCKET_IFNAME=lo -- --procs 2 --hosts 2
  exit_step exit_net_4 150 NCCL_SOCKET_IFNAME=lo -- --procs 4 --hosts 4
  step exit_leaver_4 exit 90 "$BUILD/exit_live" --procs 4 --iters 5 --leaver
  step exit_leaver_net_4 exit 90 env NCCL_SOCKET_IFNAME=lo "$BUILD/exit_live" --procs 4 --hosts 4 --iters 5 --leaver
  if python3 -c 'import torch' >/dev/null 2>&1; then
    step exit_torch exit 200 bash -c 'python3 tests/torch/exit_live.py --runs 20 --lib "$1"; rc=$?
      w=$(grep -cE "NCCL WARN|panicked" "$2"); echo "exit: $w WARN/panic lines (rc $rc)"; [ $rc = 0 ] && [ "$w" = 0 ]' \
      _ "$OURLIB" "$LOG/exit_torch.log"
  else
    skip exit_torch exit "no PyTorch"
  fi
  # NVIDIA's nccl-tests, when its sources are given (NCCL_TESTS_SRC, e.g. a copy of
  # github.com/NVIDIA/nccl-tests): all_reduce_perf in parallel-init mode (-p 1), where it never
  # destroys its communicators and returns from main after MPI_Finalize, as many training scripts
  # end. Built against NVIDIA's headers and linked with ours, 2 MPI ranks on GPU 0, 5 runs: every
  # run must exit 0 with every size correct (#wrong 0) and nothing printing a WARN or a panic.
  # NVIDIA's 2.28.9 headers as setup-deps.sh extracts them (with nccl_device.h), else the NCCL's.
  REFINC=$REF/include; [ -f .deps/nvidia-nccl/include/nccl_device.h ] && REFINC=$ROOT/.deps/nvidia-nccl/include
  if [ -n "${NCCL_TESTS_SRC:-}" ] && [ $HAVE_MPI = 1 ]; then
    step nccl_tests_p1 exit 240 bash -c 'set -e; src=$1 b=$2 ref=$3 lib=$4 arch=$5
      mkdir -p "$b/home/lib"; ln -sfn "$ref" "$b/home/include"
      ln -sf "$lib" "$b/home/lib/libnccl.so"; ln -sf "$lib" "$b/home/lib/libnccl.so.2"
      # nccl-tests wants MPI_HOME/include/mpi.h and MPI_HOME/lib: the directories mpicc names that hold them.
      mpiinc=$(for d in $(mpicc --showme:incdirs); do [ -f "$d/mpi.h" ] && echo "$d"; done | head -n 1)
      mpilib=$(for d in $(mpicc --showme:libdirs); do ls "$d"/libmpi.so* >/dev/null 2>&1 && echo "$d"; done | head -n 1)
      [ -n "$mpiinc" ] && [ -n "$mpilib" ] || { echo "nccl-tests: no mpi.h or libmpi.so where mpicc says"; exit 1; }
      mkdir -p "$b/mpi"; ln -sfn "$mpiinc" "$b/mpi/include"; ln -sfn "$mpilib" "$b/mpi/lib"
      make -s -j16 -C "$src/src" MPI=1 MPI_HOME="$b/mpi" \
        NCCL_HOME="$b/home" CUDA_HOME="$6" BUILDDIR="$b/bin" \
        NVCC_GENCODE="-gencode=arch=compute_${arch#sm_},code=$arch" "$b/bin/all_reduce_perf" >/dev/null
      fails=0
      for i in 1 2 3 4 5; do
        rc=0; LD_LIBRARY_PATH="$b/home/lib:${LD_LIBRARY_PATH:-}" mpirun --allow-run-as-root -np 2 \
          -x LD_LIBRARY_PATH -x NCCL_DEBUG=WARN -x NCCL_TESTS_DEVICE=0 "$b/bin/all_reduce_perf" -b 8 -e 1M -f 8 -g 1 -c 1 -p 1 >"$b/run$i.txt" 2>&1 || rc=$?
        wrong=$(awk "/Out of bounds values/{print \$(NF-1)}" "$b/run$i.txt"); w=$(grep -cE "NCCL WARN|panicked" "$b/run$i.txt" || true)
        echo "run $i: rc $rc, out of bounds ${wrong:-?}, $w WARN/panic lines"; cat "$b/run$i.txt"
        [ $rc = 0 ] && [ "${wrong:-x}" = 0 ] && [ "$w" = 0 ] || fails=$((fails + 1))
      done
      echo "exit: nccl-tests -p 1, $fails of 5 runs failed"; [ $fails = 0 ]' _ \
      "$NCCL_TESTS_SRC" "$BUILD/nccl-tests" "$REFINC" "$OURLIB" "$ARCH" "$CUDA"
  else
    skip nccl_tests_p1 exit "NCCL_TESTS_SRC not set or no MPI"
  fi
fi
# Symmetric windows and device communicators (tests/gpu/windows.cu): 2 and 4 processes on GPU 0
# write each other's windows through the flat mapping, re-register, see every refusal, and signal
# LSA barriers through a device communicator's resource window; then 2 non-dumpable processes,
# whose descriptors travel over a Unix socket where pidfd_getfd is refused; then P2P disabled,
# where each rank is an LSA team of its own and GIN barriers are refused. Then PyTorch's
# symmetric memory on the NCCL backend, 2 ranks on GPU 0 (tests/torch/symm_mem.py).
if [ "$LIB" = ours ] && [ "$NG" -ge 1 ]; then
  step windows_2 windows 90 "$BUILD/windows" --procs 2
  step windows_4 windows 120 "$BUILD/windows" --procs 4
  step windows_undumpable_2 windows 90 "$BUILD/windows" --procs 2 --undumpable
  step windows_nop2p_2 windows 90 env NCCL_P2P_DISABLE=1 "$BUILD/windows" --procs 2
  # Symmetric kernels (tests/gpu/symmetric.cu): every type and op, in place and not, at offsets
  # into the windows, and through a CUDA graph; then the timing table against the ordinary kernels
  # (for BENCHMARKS.md; timings never fail the step), on one GPU per rank where there are two.
  # symmetric_2 also counts the collectives the tuner gave the symmetric kernels (its log's INFO lines).
  step symmetric_2 windows 150 bash -c '"${@:2}"; rc=$?; n=$(grep -c -- "-> algo Symmetric" "$1")
    echo "symmetric collectives: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' _ "$LOG/symmetric_2.log" \
    env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING "$BUILD/symmetric" --procs 2
  step symmetric_4 windows 240 "$BUILD/symmetric" --procs 4
  # Two processes on one GPU are time-sliced (milliseconds a call) unless CUDA MPS runs, so the
  # step starts MPS for itself there, as scripts/net_bench.sh does, and stops it after.
  SPREAD=""; [ "$NG" -ge 2 ] && SPREAD=--spread
  step symmetric_bench_2 windows 150 bash -c 'if [ -z "$2" ] && command -v nvidia-cuda-mps-control >/dev/null; then
      export CUDA_MPS_PIPE_DIRECTORY=$1/mps-pipe CUDA_MPS_LOG_DIRECTORY=$1/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d && echo "CUDA MPS started" && trap "echo quit | nvidia-cuda-mps-control" EXIT
      # The server numbers the GPUs it was started with from 0: a client that names them again
      # by the numbers of the machine finds no device (the MPS guide: unset in clients).
      unset CUDA_VISIBLE_DEVICES
    fi
    "${@:3}"; rc=$?; exit $rc' _ "$BUILD" "$SPREAD" "$BUILD/symmetric" --procs 2 --bench --iters 50 $SPREAD
  TORCH_PY=/opt/torch/.venv/bin/python; [ -x "$TORCH_PY" ] || TORCH_PY=python3
  if "$TORCH_PY" -c 'import torch.distributed._symmetric_memory' >/dev/null 2>&1; then
    step windows_torch_symm windows 180 "$TORCH_PY" tests/torch/symm_mem.py --ranks 2 --lib "$OURLIB"
  else
    skip windows_torch_symm windows "no PyTorch with symmetric memory"
  fi
fi
# examples
if [ "$NG" -ge 1 ]; then
  step example_single examples 120 "$BUILD/single_process"
  if [ $HAVE_MPI = 1 ]; then
    NP=$NG; [ $NP -lt 2 ] && NP=2
    [ $NP -gt $NG ] && [ $ONE_GPU_OK = 0 ] && NP=$NG
    step example_mpi examples 120 $MPIRUN -np $NP "$BUILD/mpi_per_gpu"
  else
    skip example_mpi examples "no mpicc/mpirun"
  fi
fi
# The device API (README.md, "The device API"): examples/device_allreduce, an LSA all-reduce kernel
# with LSA barriers, built against our headers (_ours) and NVIDIA's 2.28.9 headers (_nvhdr), both
# linked with our library; run as 2 and 4 ranks on GPU 0, as processes and as threads, each rank
# checking every element. Then the build against our headers on NVIDIA's library, 1 rank (NVIDIA's
# refuses several ranks on one GPU), and one rank per GPU where there are several.
if [ "$NG" -ge 1 ]; then
  NVDEV=$ROOT/.deps/nvidia-nccl/include; [ -f "$NVDEV/nccl_device.h" ] || NVDEV=$REF/include
  step device_build device 300 env NVCC="$NVCC" bash scripts/build_device_example.sh --out "$BUILD" --arch "$ARCH" \
    --nvidia-include "$NVDEV"
  if [ "$LIB" = ours ]; then
    for V in ours nvhdr; do
      for N in 2 4; do
        step device_${V}_procs_$N device 120 "$BUILD/device_allreduce_$V" --procs $N --dev 0
        step device_${V}_threads_$N device 120 "$BUILD/device_allreduce_$V" --threads $N --dev 0
      done
    done
  fi
  step device_ours_on_nccl_1 device 120 env LD_LIBRARY_PATH="$REF/lib" "$BUILD/device_allreduce_ours" --procs 1 --dev 0
  # With several GPUs, one rank per GPU (NVLink or PCIe P2P): both builds on ours, and the build
  # against our headers on NVIDIA's NCCL with every GPU a rank.
  if [ "$NG" -ge 2 ]; then
    if [ "$LIB" = ours ]; then
      for V in ours nvhdr; do
        step device_${V}_spread_$NG device 120 "$BUILD/device_allreduce_$V" --procs $NG --spread
      done
    fi
    step device_ours_on_nccl_$NG device 120 env LD_LIBRARY_PATH="$REF/lib" "$BUILD/device_allreduce_ours" --procs $NG --spread
  fi
fi
# several ranks on one GPU (ours only)
if [ $ONE_GPU_OK = 1 ] && [ "$NG" -ge 1 ]; then
  # A group's sends and receives beyond one launch run as several, a round of NCCL's schedule
  # each here (FERRONICKEL_P2P_LAUNCH_WORKS=2): all-to-all, gather, scatter and every pair at once.
  step check_p2p_rounds_1gpu_4 onegpu 200 env FERRONICKEL_P2P_LAUNCH_WORKS=2 "$CHK" --mode threads --devs 0,0,0,0 \
    --colls AlltoAll,Gather,Scatter,SendRecv,AllPairs --quick --failures-only
  step check_p2p_rounds_procs_1gpu_4 onegpu 200 env FERRONICKEL_P2P_LAUNCH_WORKS=2 "$CHK" --mode procs --devs 0,0,0,0 \
    --colls AlltoAll,Gather,Scatter,SendRecv,AllPairs --quick --failures-only
  [ "$NG" -ge 2 ] && step check_threads_1gpu_2 onegpu 200 "$CHK" --mode threads --devs 0,0 --quick --failures-only
  step check_threads_1gpu_4 onegpu 200 "$CHK" --mode threads --devs 0,0,0,0 --quick --failures-only
  step check_threads_1gpu_8 onegpu 240 "$CHK" --mode threads --devs 0,0,0,0,0,0,0,0 --quick --failures-only
  step check_procs_1gpu_2 onegpu 200 "$CHK" --mode procs --devs 0,0 --quick --failures-only
  step check_procs_1gpu_4 onegpu 200 "$CHK" --mode procs --devs 0,0,0,0 --quick --failures-only
  step check_procs_1gpu_8 onegpu 240 "$CHK" --mode procs --devs 0,0,0,0,0,0,0,0 --quick --failures-only
else
  skip onegpu onegpu "reference NCCL refuses several ranks on one GPU"
fi
# SHM: P2P disabled (NCCL_P2P_DISABLE=1), so ranks of one host connect through FIFOs in shared host
# memory; one process per rank (the memfd is opened through /proc), and two ranks as threads of
# one process. Each step also counts the INFO lines that name the transport of each peer and fails
# unless some say SHM and none says P2P. NCCL refuses two ranks on one GPU, so ours only.
shm_step() {  # shm_step NAME TIMEOUT ENV... -- CHECK_ARGS...
  local name=$1 tmo=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  step "$name" shm "$tmo" bash -c '"${@:2}"; rc=$?; n=$(grep -c "via SHM" "$1"); p=$(grep -c "via P2P" "$1")
    echo "SHM: $n connection lines via SHM, $p via P2P (rc $rc)"; [ $rc = 0 ] && [ "$n" -gt 0 ] && [ "$p" = 0 ]' \
    _ "$LOG/$name.log" env NCCL_P2P_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "${envs[@]}" "$@"
}
if [ $ONE_GPU_OK = 1 ] && [ "$NG" -ge 1 ]; then
  DEVS4=0,0,0,0; [ "$NG" -ge 4 ] && DEVS4=0,1,2,3
  shm_step shm_procs_2 240 -- "$CHK" --mode procs --devs $DEVS2 $Q --failures-only
  shm_step shm_procs_4 300 -- "$CHK" --mode procs --devs $DEVS4 $Q --failures-only
  for P in LL LL128 Simple; do
    shm_step shm_${P}_procs_2 150 NCCL_PROTO=$P -- "$CHK" --mode procs --devs $DEVS2 --quick --failures-only
  done
  shm_step shm_threads_2 150 -- "$CHK" --mode threads --devs $DEVS2 --quick --failures-only
  # A rank killed mid-collective over SHM, 2 and 4 ranks: the survivors are told within seconds
  # (tests/gpu/faults.cu).
  step shm_faults_2 shm 90 env NCCL_P2P_DISABLE=1 "$BUILD/faults" --devs $DEVS2
  step shm_faults_4 shm 90 env NCCL_P2P_DISABLE=1 "$BUILD/faults" --devs $DEVS4
else
  skip shm shm "reference NCCL refuses several ranks on one GPU"
fi
# NET transport: processes on GPU 0 split into "hosts" by NCCL_HOSTID (check --hosts), so peers
# on another host go through the proxy thread and the Socket net; each step also counts the
# ranks that connected over NET (NCCL_DEBUG=INFO lines) and fails if none did.
if [ $ONE_GPU_OK = 1 ] && [ "$NG" -ge 1 ]; then
  net_step() {  # net_step NAME TIMEOUT [VAR=VALUE...] CHECK ARGS...
    local name=$1 tmo=$2; shift 2
    step "$name" net "$tmo" bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "${@:2}"; rc=$?
      n=$(grep -c "through the proxy" "$1"); echo "ranks with NET connections: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' \
      _ "$LOG/$name.log" "$@"
  }
  net_step check_net_2 300 "$CHK" --mode procs --devs 0,0 --hosts 2 $Q --failures-only
  net_step check_net_4 300 "$CHK" --mode procs --devs 0,0,0,0 --hosts 4 $Q --failures-only
  # Ranks bound to two CPUs: every message of the Socket net goes inline, the helpers idle (the
  # rank's threads would take turns with them: docs/NET.md, "The Socket net").
  step check_net_2cpus_2 net 200 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET taskset -c 0,1 "${@:2}"; rc=$?
    n=$(grep -c "NET/Socket: helper threads: .*messages sent inline: all" "$1"); echo "processes sending every message inline: $n"
    [ $rc = 0 ] && [ "$n" -gt 0 ]' \
    _ "$LOG/check_net_2cpus_2.log" "$CHK" --mode procs --devs 0,0 --hosts 2 --quick --failures-only
  # Ring forced across hosts (Tree forced: the tree group's tree_hosts_4_* steps).
  net_step check_net_ring_4 150 NCCL_ALGO=Ring "$CHK" --mode procs --devs 0,0,0,0 --hosts 4 --quick --failures-only
  # NCCL_NCHANNELS_PER_NET_PEER=1: peers on other hosts that connect when first needed (recursive
  # doubling's partners, direct roots, send/recv peers off the ring) connect one channel, and every
  # send/recv across hosts runs on one.
  step check_net_peerch_4 net 200 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_NCHANNELS_PER_NET_PEER=1 "${@:2}"; rc=$?
    one=$(grep -c "Channel 00-00 : .*connected at runtime" "$1"); more=$(grep -cE "Channel 00-([0-9][1-9]|[1-9][0-9]) : .*connected at runtime" "$1")
    echo "peers connected at runtime on 1 channel: $one, on more: $more"; [ $rc = 0 ] && [ "$one" -gt 0 ] && [ "$more" = 0 ]' \
    _ "$LOG/check_net_peerch_4.log" "$CHK" --mode procs --devs 0,0,0,0 --hosts 4 --quick --failures-only
  for P in LL LL128 Simple; do
    net_step check_net_${P}_2 200 NCCL_PROTO=$P "$CHK" --mode procs --devs 0,0 --hosts 2 --quick --failures-only
  done
  net_step check_net_mixed_2x2 240 "$CHK" --mode procs --devs 0,0,0,0 --hosts 2 $Q --failures-only
  # Hosts told apart as in production, by host name and boot id, with no NCCL_HOSTID: each rank
  # process takes a UTS namespace of its own named after its host (check --uts; needs
  # CAP_SYS_ADMIN, so skipped where `unshare -u` is refused).
  if unshare -u true 2>/dev/null; then
    net_step check_net_uts_2 200 "$CHK" --mode procs --devs 0,0 --hosts 2 --uts --quick --failures-only
    net_step check_net_uts_2x2 240 "$CHK" --mode procs --devs 0,0,0,0 --hosts 2 --uts --quick --failures-only
  else
    skip check_net_uts net "unshare -u is refused here (no CAP_SYS_ADMIN)"
  fi
  # One host with P2P and SHM both off: NET between ranks of one host, as NCCL falls back.
  net_step check_net_noshm_2 150 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "$CHK" --mode procs --devs 0,0 --quick --failures-only
  # Runtime connections (NCCL_RUNTIME_CONNECT, default on): 4 hosts of 2 ranks, where all-to-all
  # and every pair's send/recv reach peers that init left unconnected; the log must show pairs
  # connected at runtime. Then everything connected at init (NCCL_RUNTIME_CONNECT=0).
  step check_net_runtime_8 net 240 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "${@:2}"; rc=$?
    n=$(grep -c "connected at runtime" "$1"); echo "pairs connected at runtime: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' \
    _ "$LOG/check_net_runtime_8.log" "$CHK" --mode procs --devs 0,0,0,0,0,0,0,0 --hosts 4 --quick --failures-only \
    --colls AlltoAll,AllPairs,SendRecv,Gather,Scatter,AllReduce
  # Recursive doubling between 8 and 4 hosts of one rank each (small all-reduces, all-gathers and
  # reduce-scatters, every protocol the tuner picks for them); the log must show it chosen.
  for H in 8 4; do
    step check_net_recdbl_$H net 240 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING "${@:2}"; rc=$?
      n=$(grep -c -- "-> algo RecDoubling" "$1"); echo "collectives by recursive doubling: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' \
      _ "$LOG/check_net_recdbl_$H.log" "$CHK" --mode procs --devs $(seq -s, 1 $H | sed 's/[0-9]*/0/g') --hosts $H \
      --quick --failures-only --colls AllReduce,AllGather,ReduceScatter
  done
  # Hosts of several ranks (ranks numbered host by host): recursive doubling pairs ranks of one
  # host in some exchanges and ranks of two hosts in the others, and across hosts of two ranks a
  # direct reduce's root takes in from its own host and the others (over four, a direct broadcast
  # enters each host once). The log must show recursive doubling, and direct collectives where
  # hosts hold two ranks and none where they hold four. RANKS:HOSTS:DIRECT.
  for L in 4:2:1 8:4:1 8:2:0; do
    IFS=: read -r R H D <<< "$L"
    step check_net_onehop_${R}r_${H}h net 240 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING "${@:3}"; rc=$?
      d=$(grep -c -- "-> algo RecDoubling" "$1"); r=$(grep -c -- "-> algo Direct" "$1")
      echo "collectives by recursive doubling: $d, direct: $r"; [ $rc = 0 ] && [ "$d" -gt 0 ] && [ $((r > 0)) = "$2" ]' \
      _ "$LOG/check_net_onehop_${R}r_${H}h.log" "$D" "$CHK" --mode procs --devs $(seq -s, 1 $R | sed 's/[0-9]*/0/g') \
      --hosts $H --quick --failures-only --colls AllReduce,AllGather,ReduceScatter,Broadcast,Reduce
  done
  # Direct broadcast and reduce between 3 hosts of one rank each, each protocol forced (LL and
  # LL128: one collective work; Simple: the broadcast as the root's sends); the log must show it.
  for P in LL LL128 Simple; do
    step check_net_direct_${P}_3 net 150 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING "${@:2}"; rc=$?
      n=$(grep -c -- "-> algo Direct" "$1"); echo "collectives run direct: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' \
      _ "$LOG/check_net_direct_${P}_3.log" env NCCL_PROTO=$P "$CHK" --mode procs --devs 0,0,0 --hosts 3 --quick \
      --failures-only --colls Broadcast,Reduce
  done
  # The direct broadcast from every root, each protocol forced: across three hosts of two ranks
  # the root's sends to each host's entry, the chain inside each host, forwarding as steps arrive;
  # across eight hosts of one, in LL and LL128, the root's seven sends, one after another from one
  # CTA. RANKS:HOSTS:PROTOCOLS.
  for L in 6:3:LL,LL128,Simple 8:8:LL,LL128; do
    IFS=: read -r R H PS <<< "$L"
    for P in ${PS//,/ }; do
      step check_net_bcast_${P}_${R}r_${H}h net 150 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING "${@:2}"; rc=$?
        n=$(grep -c -- "Broadcast: .* -> algo Direct" "$1"); echo "broadcasts run direct: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' \
        _ "$LOG/check_net_bcast_${P}_${R}r_${H}h.log" env NCCL_PROTO=$P "$CHK" --mode procs \
        --devs $(seq -s, 1 $R | sed 's/[0-9]*/0/g') --hosts $H --quick --roots all --failures-only --colls Broadcast
    done
  done
  net_step check_net_eager_4 150 NCCL_RUNTIME_CONNECT=0 "$CHK" --mode procs --devs 0,0,0,0 --hosts 4 --quick --failures-only
  # CUDA graphs over NET: an all-reduce, and every rank sending to and receiving from every other
  # (connections a group makes while the stream is capturing).
  net_step graph_net_4 120 "$CHK" --mode procs --devs 0,0,0,0 --hosts 4 --graph --graph-iters 20
  net_step graph_net_pairs_4 120 "$CHK" --mode procs --devs 0,0,0,0 --hosts 4 --graph --graph-coll AllPairs --graph-iters 20 --graph-count 1M
  # The matrix carried by an external net plugin (tests/c/net_plugin_tcp.c) loaded by
  # NCCL_NET_PLUGIN as a path: v11 (the full matrix unless --quick), and v8 through the adapters
  # (quick). The log must name the plugin's net.
  if [ "$LIB" = ours ]; then
    for v in 11 8; do
      step plugin_net_v${v}_2 net 200 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "${@:2}"; rc=$?
        n=$(grep -c "via NET/FnTcp" "$1"); echo "connections through the plugin: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' \
        _ "$LOG/plugin_net_v${v}_2.log" env NCCL_NET_PLUGIN="$BUILD/libnccl-net-fntcp$v.so" \
        "$CHK" --mode procs --devs 0,0 --hosts 2 $([ $v = 11 ] && echo "$Q" || echo --quick) --failures-only
    done
    # Four hosts through it: forwarded ring steps, direct broadcast and reduce, each small step
    # one message (docs/NET.md, "One message per small step").
    step plugin_net_v11_4 net 240 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "${@:2}"; rc=$?
      n=$(grep -c "via NET/FnTcp" "$1"); echo "connections through the plugin: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' \
      _ "$LOG/plugin_net_v11_4.log" env NCCL_NET_PLUGIN="$BUILD/libnccl-net-fntcp11.so" \
      "$CHK" --mode procs --devs 0,0,0,0 --hosts 4 --quick --failures-only
    # A plugin's NIC gets two NET channels whatever speed it reports (docs/NET.md): the fast
    # link's communicators too, not the six its 100 Gbps would take at 2.3 GB/s a channel.
    step plugin_net_fast_2 net 200 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "${@:2}"; rc=$?
      n=$(grep -c "ready: 2 channels" "$1"); echo "communicators on 2 channels: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' \
      _ "$LOG/plugin_net_fast_2.log" env NCCL_NET_PLUGIN="$BUILD/libnccl-net-fntcpfast.so" \
      "$CHK" --mode procs --devs 0,0 --hosts 2 --quick --failures-only
    # Ranks bound to two CPUs: a plugin's connections get one proxy thread, not one for each
    # half, which would take turns with the rank's own (docs/NET.md, "Two progress threads").
    step plugin_net_2cpus_2 net 200 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET taskset -c 0,1 "${@:2}"; rc=$?
      n=$(grep -c "NET: proxy of device [0-9]*: one thread on" "$1"); echo "proxies of one thread: $n"; [ $rc = 0 ] && [ "$n" -gt 0 ]' \
      _ "$LOG/plugin_net_2cpus_2.log" env NCCL_NET_PLUGIN="$BUILD/libnccl-net-fntcp11.so" \
      "$CHK" --mode procs --devs 0,0 --hosts 2 --quick --failures-only
    # NCCL_MIN_NCHANNELS raises the NET channels past what the link needs, as in NCCL, and large
    # ring collectives run on all of them: four through the 10 Gbps plugin (alone: two), four hosts.
    step plugin_net_minch_4 net 240 bash -c 'env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING NCCL_MIN_NCHANNELS=4 "${@:2}"; rc=$?
      n=$(grep -c "ready: 4 channels" "$1"); m=$(grep -c "proto Simple channels 4" "$1")
      echo "communicators on 4 channels: $n, collectives on 4: $m"; [ $rc = 0 ] && [ "$n" -gt 0 ] && [ "$m" -gt 0 ]' \
      _ "$LOG/plugin_net_minch_4.log" env NCCL_NET_PLUGIN="$BUILD/libnccl-net-fntcp11.so" \
      "$CHK" --mode procs --devs 0,0,0,0 --hosts 4 --quick --failures-only
    # The p2p collectives through it with several Simple slots a peer, where the proxy sends
    # pairs (docs/NET.md, "Two Simple steps a message"), ending in a whole slot and in a part of one;
    # and parts of 64-128 KiB, which run in two steps (24577 float32, 131072 int8: docs/NET.md,
    # "Sends and receives").
    step plugin_net_p2p_4 net 200 env NCCL_NET_PLUGIN="$BUILD/libnccl-net-fntcp11.so" \
      "$CHK" --mode procs --devs 0,0,0,0 --hosts 4 --colls AlltoAll,Gather,Scatter,SendRecv,AllPairs \
      --counts 1048576,1500007,24577,131072 --dtypes float32,int8 --failures-only
    # Two hosts of two ranks through it: parts to the other host in two steps, to the rank beside
    # in one, the two ends of each agreeing.
    step plugin_net_mixed_2x2 net 200 env NCCL_NET_PLUGIN="$BUILD/libnccl-net-fntcp11.so" \
      "$CHK" --mode procs --devs 0,0,0,0 --hosts 2 --colls AlltoAll,Gather,Scatter,SendRecv,AllPairs,Broadcast \
      --counts 7,24577,131072 --dtypes float32,int8 --failures-only
  fi
  [ "$LIB" = ours ] && net_step faults_net_2 90 "$BUILD/faults" --devs 0,0 --hosts 2
  [ "$LIB" = ours ] && net_step faults_net_4 90 "$BUILD/faults" --devs 0,0,0,0 --hosts 4
fi
# Tool plugins (docs/PLUGINS.md): the test profiler plugin records an all-reduce, an all-gather and
# send/recv between 2 ranks on GPU 0, over P2P (one process) and over NET (two "hosts" by
# NCCL_HOSTID); tests/gpu/profiler_trace.py checks that every event stopped, the collectives' and
# sends' events, and over NET the proxy's op and step events. Then, where nsys is installed, an
# NVTX capture whose summary must list our ncclAllReduce ranges.
if [ "$LIB" = ours ] && [ $ONE_GPU_OK = 1 ] && [ "$NG" -ge 1 ]; then
  prof_step() {  # prof_step NAME TIMEOUT [--net] CHECK ARGS...
    local name=$1 tmo=$2 net=""; shift 2
    [ "$1" = --net ] && { net=--net; shift; }
    rm -f "$OUT/$name.trace"
    step "$name" plugins "$tmo" bash -c 'env NCCL_PROFILER_PLUGIN="$2" TEST_PROFILER_OUT="$3" "${@:5}" || exit 1
      python3 tests/gpu/profiler_trace.py "$3" $4' _ "$LOG/$name.log" "$BUILD/libnccl-profiler-fnprof5.so" \
      "$OUT/$name.trace" "$net" "$@"
  }
  # A few cases, so that the plugin's table of events (65536) holds the whole trace.
  PCASES="--colls AllReduce,AllGather,SendRecv --dtypes float32 --ops sum --counts 1000,300000 --no-unaligned"
  prof_step profiler_p2p_2 150 "$CHK" --mode threads --devs 0,0 --quick $PCASES --failures-only
  prof_step profiler_net_2 200 --net "$CHK" --mode procs --devs 0,0 --hosts 2 --quick $PCASES --failures-only
  # The timing profiler and its reader (docs/NET.md, "A proxy's timeline"): an all-gather over NET
  # between two hosts, whose calls the reader must find, with sends on the wire.
  step proxy_timeline_net_2 plugins 150 bash -c 'rm -rf "$1"; mkdir -p "$1"
    env PROXY_TIMELINE_DIR="$1" NCCL_PROFILER_PLUGIN="$2" "${@:3}" || exit 1
    python3 scripts/proxy_timeline.py "$1" > "$1/read.txt" || exit 1
    cat "$1/read.txt"; grep -q "ours: [0-9]* calls" "$1/read.txt" && grep -q "on the wire" "$1/read.txt" \
      && echo "PROFILER TRACE: PASS (timeline read)" || { echo "PROFILER TRACE: FAIL (no call read)"; exit 1; }' _ \
    "$OUT/timeline" "$BUILD/libproxy_timeline.so" "$CHK" --mode procs --devs 0,0 --hosts 2 --quick --colls AllGather \
    --dtypes float32 --counts 1048576 --no-unaligned --failures-only
  if command -v nsys >/dev/null 2>&1; then
    step nvtx_nsys plugins 240 bash -c 'rm -f "$1".nsys-rep "$1".sqlite
      nsys profile -t nvtx,cuda -o "$1" --force-overwrite true "$2" --mode threads --devs 0,0 --quick --colls AllReduce --dtypes float32 --failures-only || exit 1
      # nvtx_sum, named nvtxsum by older nsys.
      { nsys stats --report nvtx_sum --force-export true "$1".nsys-rep || nsys stats --report nvtxsum --force-export true "$1".nsys-rep; } | tee "$1".nvtx.txt
      n=$(grep -c "ncclAllReduce" "$1".nvtx.txt); echo "NVTX: ncclAllReduce rows: $n"; [ "$n" -gt 0 ]' _ "$OUT/nvtx_trace" "$CHK"
  else
    skip nvtx_nsys plugins "nsys is not on PATH: no NVTX capture"
  fi
else
  skip plugins plugins "needs our library and ranks sharing GPU 0"
fi
if [ $HAVE_MPI = 1 ] && [ "$NG" -ge 1 ]; then
  NP=2; MDEVS=""; [ "$NG" -lt 2 ] && { [ $ONE_GPU_OK = 1 ] || NP=1; MDEVS="--devs 0"; }
  step check_mpi mpi 200 $MPIRUN -np $NP "$BUILD/check_mpi" --mode mpi $MDEVS --quick --failures-only \
       --colls AllReduce,Reduce,Broadcast,AllGather,ReduceScatter,AlltoAll,SendRecv
else
  skip check_mpi mpi "no mpi build"
fi

# --- PyTorch drop-in (LD_PRELOAD under torchrun; scripts/torch_check.sh has its own summary) ----
# With one GPU: our collectives as 2 ranks on it, and the late-rank steps (both libraries: each rank
# gets its own NCCL_HOSTID there); the parity steps need 2 GPUs for NVIDIA's library.
if [ "$LIB" = ours ] && [ "$NG" -ge 1 ] && python3 -c 'import torch' >/dev/null 2>&1; then
  now=$(date +%s); left=$((BUDGET - (now - T_START) - 20))
  ONEGPU_ARG=""; [ "$NG" -lt 2 ] && ONEGPU_ARG=--one-gpu-ours
  # Its steps take 5 to 100 s each: with less left than its longest, none would start.
  if [ $left -lt 120 ]; then
    skip torch torch "over the ${BUDGET}s budget (${left}s left; the PyTorch check needs 120)"
  else
    step torch torch $left env OUT="$OUT" bash scripts/torch_check.sh --budget $((left - 10)) $ONEGPU_ARG
  fi
else
  skip torch torch "needs our library, a GPU and PyTorch"
fi

# --- A/B benchmark -----------------------------------------------------------------------------
if [ $BENCH = 1 ] && [ "$NG" -ge 1 ]; then
  BDEVS=0,1; [ "$NG" -lt 2 ] && BDEVS=0
  now=$(date +%s); left=$((BUDGET - (now - T_START) - 10))
  step bench bench $left env OUT="$OUT" scripts/ab_bench.sh --bin "$BUILD/nccl_bench" --devs $BDEVS --ours "$OURLIB" \
       --timeout 150 $BENCH_ARGS
fi

# --- report ------------------------------------------------------------------------------------
NFAIL=0; NCUT=0
for i in "${!NAMES[@]}"; do
  case "${RESULTS[$i]}" in PASS|SKIP) ;; CUT) NCUT=$((NCUT + 1)) ;; *) NFAIL=$((NFAIL + 1))
    echo; echo "---- ${NAMES[$i]}: ${RESULTS[$i]} (last lines of $LOG/${NAMES[$i]}.log)"
    grep -vE "^(r[0-9]+ )?#" "$LOG/${NAMES[$i]}.log" 2>/dev/null | grep -E "FAIL|ERROR|HANG|TIMEOUT|FATAL|error|rank [0-9]+ \[" | head -n 12
    tail -n 6 "$LOG/${NAMES[$i]}.log" 2>/dev/null ;;
  esac
done
if [ -f "$OUT/ab/summary.txt" ] && wanted bench bench; then
  echo; echo "---- A/B benchmark (full table: $OUT/ab/summary.txt)"
  sed -n '/min_ratio/,$p' "$OUT/ab/summary.txt"
fi
echo
echo "==================== GPU CHECK SUMMARY (lib=$LIB, gpus=$NG, quick=$QUICK, logs $LOG) ===================="
printf "%-22s %-12s %7s  %s\n" step result "time_s" detail
for i in "${!NAMES[@]}"; do
  printf "%-22s %-12s %7s  %s\n" "${NAMES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}" "${DETAILS[$i]}"
done
TOTAL=$(($(date +%s) - T_START))
if [ $NFAIL = 0 ] && [ $NCUT = 0 ]; then echo "GPU CHECK: PASS (${#NAMES[@]} steps, ${TOTAL}s)"; exit 0; fi
if [ $NFAIL = 0 ]; then
  echo "GPU CHECK: INCOMPLETE (none failed; $NCUT of ${#NAMES[@]} steps stopped by the budget, ${TOTAL}s)"
  exit 3
fi
echo "GPU CHECK: FAIL ($NFAIL of ${#NAMES[@]} steps failed, ${TOTAL}s)"
exit 1
