#!/usr/bin/env bash
# PyTorch on ferronickel, in one call on the GPU machine (docs/ARCHITECTURE.md, "Testing on
# GPUs"): torch.distributed collectives with our library (eager and lazy communicator init),
# the seeds' DDP example with NVIDIA's NCCL and with ours alternated (ref, ours, ref, ours) and compared (losses, parameters,
# time per step), FSDP2 in bf16 both ways and compared, and the rest of the NCCL symbols PyTorch
# binds (tests/torch/symbols.py) both ways, to see which path PyTorch takes to each with each
# library (works, or an error PyTorch handles). Ours is loaded with
# LD_PRELOAD=$OURLIB (SONAME libnccl.so.2 satisfies libtorch_cuda's NEEDED entry); every rank
# proves which libnccl it mapped from /proc/self/maps against $EXPECT_NCCL_LIB. Every step runs
# under `timeout`; a global budget keeps the call inside the device's 10-minute limit (steps past
# it are SKIP). Logs in $OUT/torch/; the summary table is printed LAST.
#
# usage: scripts/torch_check.sh [options]
#   --only LIST        only these steps or groups (comma list; groups: coll, late, ddp, fsdp, symbols)
#   --skip LIST        everything except these
#   --no-ref-coll      skip the collectives runs with NVIDIA's NCCL (they validate the test itself
#                      and tell failures of ours apart from PyTorch/test issues)
#   --one-gpu-ours     with one GPU, still run the collectives with ours, 2 ranks on GPU 0
#                      (NVIDIA's NCCL refuses that, so every reference step stays SKIP)
#   --budget SECONDS   stop starting steps after this much wall time (default 540)
#   --keep-pt          keep the .pt result files (about 200 MB per DDP run) in $PARITY_DIR
# env: OUT (default ./gpu-out), OURLIB (default target/release/libnccl.so), REFLIB (NVIDIA's
#      libnccl.so.2), PYTHON (python3), TORCHRUN (torchrun), NPROC (2), PARITY_DIR (default: a new
#      directory under /tmp; .pt files are NOT written under $OUT, they are too big to fetch)
# expected runtime on 2x H200: about 6 minutes (each torchrun launch costs ~10-20 s; the symbols
# steps about a minute each).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTHONUNBUFFERED=1

T_START=$(date +%s)
ONLY=""; SKIP=""; REFCOLL=1; ONEGPU=0; BUDGET=540; KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=",$2,"; shift ;;
    --skip) SKIP=",$2,"; shift ;;
    --no-ref-coll) REFCOLL=0 ;;
    --one-gpu-ours) ONEGPU=1 ;;
    --budget) BUDGET=$2; shift ;;
    --keep-pt) KEEP=1 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "torch_check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT/torch"
LOG=$(cd "$OUT/torch" && pwd)
OURLIB=${OURLIB:-$ROOT/target/release/libnccl.so}
REFLIB=${REFLIB:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2}
PY=${PYTHON:-python3}
TORCHRUN=${TORCHRUN:-torchrun}
NPROC=${NPROC:-2}
PT=${PARITY_DIR:-$(mktemp -d /tmp/torch_check.XXXXXX)}
mkdir -p "$PT"
T=tests/torch

if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  NG=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
else
  NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
echo "torch_check: $(date -u +%FT%TZ) gpus=$NG nproc=$NPROC out=$LOG pt=$PT"
echo "torch_check:   ours $OURLIB $( [ -f "$OURLIB" ] && echo present || echo MISSING)"
echo "torch_check:   ref  $REFLIB $( [ -f "$REFLIB" ] && echo present || echo MISSING)"
command -v readelf >/dev/null && [ -f "$OURLIB" ] && \
  echo "torch_check:   ours $(readelf -d "$OURLIB" | grep -o 'SONAME.*')"
$PY -c 'import torch; print("torch_check:   torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/torch_check:   /'

# --- step runner (as in gpu_check.sh) --------------------------------------------------------
NAMES=(); RESULTS=(); TIMES=(); DETAILS=()
wanted() {  # wanted NAME GROUP
  if [ -n "$ONLY" ]; then case "$ONLY" in *",$1,"*|*",$2,"*) ;; *) return 1 ;; esac; fi
  if [ -n "$SKIP" ]; then case "$SKIP" in *",$1,"*|*",$2,"*) return 1 ;; esac; fi
  return 0
}
record() { NAMES+=("$1"); RESULTS+=("$2"); TIMES+=("$3"); DETAILS+=("$4"); }
amend() { local i=$((${#NAMES[@]} - 1)); RESULTS[$i]=$1; DETAILS[$i]=$2; }  # amend last record
skip() { wanted "$1" "$2" && record "$1" SKIP 0 "$3"; return 0; }
RC=0
# step NAME GROUP TIMEOUT CMD...   (stdout+stderr to $LOG/NAME.log; sets RC; 0 = ran)
step() {
  local name=$1 group=$2 tmo=$3; shift 3
  RC=-1
  wanted "$name" "$group" || return 1
  local left=$((BUDGET - ($(date +%s) - T_START)))
  if [ $left -lt 20 ]; then record "$name" SKIP 0 "over the ${BUDGET}s budget"; return 1; fi
  [ "$tmo" -gt $left ] && tmo=$left
  echo "torch_check: [$(($(date +%s) - T_START))s] $name (timeout ${tmo}s)"
  local t0=$(date +%s)
  timeout -k 10 "$tmo" "$@" >"$LOG/$name.log" 2>&1
  RC=$?
  local dt=$(($(date +%s) - t0)) res=PASS
  case $RC in 0) ;; 124|137) res=TIMEOUT ;; *) res="FAIL($RC)" ;; esac
  record "$name" "$res" "$dt" ""
  echo "torch_check:   -> $res in ${dt}s"
  return 0
}
OURS_ENV=(env "LD_PRELOAD=$OURLIB" "EXPECT_NCCL_LIB=$OURLIB")
REF_ENV=(env -u LD_PRELOAD "EXPECT_NCCL_LIB=$REFLIB")
TR=("$TORCHRUN" --standalone --nproc_per_node="$NPROC")

# proof of the mapped library: "NCCL_LIB rank=R match=yes" from every rank
lib_proof() {  # lib_proof LOGFILE -> "n/NPROC"
  echo "$(grep -c 'NCCL_LIB rank=[0-9]* match=yes' "$1" 2>/dev/null)/$NPROC"
}

# --- (a) collectives ---------------------------------------------------------------------------
coll_step() {  # coll_step ours|ref eager|lazy
  local lib=$1 init=$2 name=collectives_$1_$2
  local envv=("${OURS_ENV[@]}" NCCL_DEBUG=INFO)
  [ "$lib" = ref ] && envv=("${REF_ENV[@]}" NCCL_DEBUG=WARN)
  step "$name" coll 240 "${envv[@]}" "${TR[@]}" $T/collectives.py --init "$init" || return 0
  local f=$LOG/$name.log
  local sum=$(grep -m1 '^SUMMARY' "$f" | sed -E 's/.*: ([0-9]+ pass, [0-9]+ fail, [0-9]+ skip in [0-9.]+s).*/\1/')
  local proof=$(lib_proof "$f") info=$(grep -c ' NCCL INFO ' "$f")
  local det="${sum:-no SUMMARY line}; lib proven $proof"
  [ "$lib" = ours ] && det="$det; $info 'NCCL INFO' lines"
  local res=${RESULTS[$((${#RESULTS[@]} - 1))]}
  if [ "$res" = PASS ] && [ "$proof" != "$NPROC/$NPROC" ]; then res="FAIL(lib)"; fi
  amend "$res" "$det"
}
if [ "$NG" -ge "$NPROC" ] || { [ "$NG" -ge 1 ] && [ $ONEGPU = 1 ]; }; then
  [ -f "$OURLIB" ] || { echo "torch_check: $OURLIB missing: the ours steps will fail"; }
  coll_step ours eager
  coll_step ours lazy
else
  skip collectives_ours coll "$NG GPU(s) for $NPROC ranks (--one-gpu-ours runs ours 2 ranks/GPU)"
fi
if [ "$NG" -ge "$NPROC" ] && [ $REFCOLL = 1 ]; then
  coll_step ref eager
  coll_step ref lazy
elif [ $REFCOLL = 1 ]; then
  skip collectives_ref coll "$NG GPU(s) for $NPROC ranks: NVIDIA's NCCL refuses 2 ranks on one GPU"
fi

# --- (a2) a rank 12 s late to its first collective (lazy init): both libraries must wait for it.
# With fewer GPUs than ranks, NVIDIA's run gives each rank its own NCCL_HOSTID so that it accepts
# them on one GPU (it then connects them over sockets).
late_step() {  # late_step ours|ref
  local lib=$1 name=late_rank_$1 hostid=()
  local envv=("${OURS_ENV[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP)
  if [ "$lib" = ref ]; then
    envv=("${REF_ENV[@]}" NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=lo)
    [ "$NG" -lt "$NPROC" ] && hostid=(--hostid-per-rank)
  fi
  step "$name" late 120 "${envv[@]}" "${TR[@]}" $T/late_rank.py --delay 12 "${hostid[@]}" || return 0
  local f=$LOG/$name.log
  local okn=$(grep -c '^RESULT rank=[0-9]* ok=yes' "$f") waited=$(grep -o 'waited_s=[0-9.]*' "$f" | sort -t= -k2 -n | tail -n 1)
  local proof=$(lib_proof "$f") res=${RESULTS[$((${#RESULTS[@]} - 1))]}
  if [ "$res" = PASS ] && [ "$okn" != "$NPROC" ]; then res="FAIL(result)"; fi
  if [ "$res" = PASS ] && [ "$proof" != "$NPROC/$NPROC" ]; then res="FAIL(lib)"; fi
  amend "$res" "$okn/$NPROC ranks ok; longest ${waited:-waited_s=?}; lib proven $proof"
}
if [ "$NG" -ge 1 ]; then
  late_step ours
  late_step ref
fi

# --- (b) DDP parity: ref, ours, ref, ours -----------------------------------------------------
run_parity() {  # run_parity NAME GROUP ours|ref SCRIPT OUTFILE [args...]
  local name=$1 group=$2 lib=$3 script=$4 out=$5; shift 5
  local envv=("${OURS_ENV[@]}" NCCL_DEBUG=WARN)
  [ "$lib" = ref ] && envv=("${REF_ENV[@]}" NCCL_DEBUG=WARN)
  rm -f "$out"
  step "$name" "$group" 180 "${envv[@]}" "${TR[@]}" "$script" --out "$out" "$@" || return 0
  local f=$LOG/$name.log
  local r=$(grep -m1 '^RESULT' "$f" | grep -oE '(median_ms|ranks_in_sync|loss_last)=[^ ]+' | tr '\n' ' ')
  local proof=$(lib_proof "$f") res=${RESULTS[$((${#RESULTS[@]} - 1))]}
  if [ "$res" = PASS ] && [ "$proof" != "$NPROC/$NPROC" ]; then res="FAIL(lib)"; fi
  if [ "$res" = PASS ] && [ ! -s "$out" ]; then res="FAIL(no output)"; fi
  amend "$res" "${r:-no RESULT line}lib proven $proof"
}
compare_step() {  # compare_step NAME GROUP FILES...   (pairs ref ours; incomplete pairs dropped)
  local name=$1 group=$2; shift 2
  local files=() missing=""
  while [ $# -ge 2 ]; do
    if [ -s "$1" ] && [ -s "$2" ]; then files+=("$1" "$2"); else missing="$missing $(basename "$1")/$(basename "$2")"; fi
    shift 2
  done
  if [ ${#files[@]} -eq 0 ]; then wanted "$name" "$group" && record "$name" FAIL 0 "no complete (ref, ours) pair:$missing"; return 0; fi
  step "$name" "$group" 120 "$PY" $T/compare_parity.py "${files[@]}" || return 0
  local f=$LOG/$name.log
  local par=$(grep -m1 '^PARITY' "$f" | sed -E 's/^PARITY: (PASS|FAIL) kind=[^ ]+ //; s/ time ours\/ref=.*//')
  local ratio=$(grep -m1 '^TIME' "$f" | grep -oE 'ours/ref = [0-9.]+' | sed 's/ = /=/')
  local det="$par; ${ratio:-no TIME line}"
  [ -n "$missing" ] && det="$det; incomplete pairs dropped:$missing"
  amend "${RESULTS[$((${#RESULTS[@]} - 1))]}" "$det"
}
if [ "$NG" -ge "$NPROC" ]; then
  for i in 1 2; do
    run_parity ddp_ref_$i ddp ref $T/ddp_parity.py "$PT/ddp_ref_$i.pt"
    run_parity ddp_ours_$i ddp ours $T/ddp_parity.py "$PT/ddp_ours_$i.pt"
  done
  if wanted ddp_compare ddp; then
    compare_step ddp_compare ddp "$PT/ddp_ref_1.pt" "$PT/ddp_ours_1.pt" "$PT/ddp_ref_2.pt" "$PT/ddp_ours_2.pt"
  fi
  # --- (c) FSDP2 bf16 --------------------------------------------------------------------------
  run_parity fsdp_ref fsdp ref $T/fsdp2.py "$PT/fsdp_ref.pt"
  run_parity fsdp_ours fsdp ours $T/fsdp2.py "$PT/fsdp_ours.pt"
  if wanted fsdp_compare fsdp; then
    compare_step fsdp_compare fsdp "$PT/fsdp_ref.pt" "$PT/fsdp_ours.pt"
  fi
else
  skip ddp ddp "$NG GPU(s) for $NPROC ranks: the reference (NVIDIA's NCCL) refuses 2 ranks on one GPU"
  skip fsdp fsdp "$NG GPU(s) for $NPROC ranks: the reference (NVIDIA's NCCL) refuses 2 ranks on one GPU"
fi
[ $KEEP = 0 ] && [ -z "${PARITY_DIR:-}" ] && rm -rf "$PT"

# --- (d) the rest of PyTorch's NCCL symbols: which path PyTorch takes, with each library ------
sym_step() {  # sym_step ours|ref
  local lib=$1 name=symbols_$1
  local envv=("${OURS_ENV[@]}" NCCL_DEBUG=WARN)
  [ "$lib" = ref ] && envv=("${REF_ENV[@]}" NCCL_DEBUG=WARN)
  # about a minute; the script bounds each of its 6 child groups by 30 s
  step "$name" symbols 200 "${envv[@]}" "${TR[@]}" $T/symbols.py || return 0
  local f=$LOG/$name.log
  local sum=$(grep -m1 '^SYMBOLS:' "$f" | sed -E 's/^SYMBOLS: ([^;]*);.*/\1/')
  local proof=$(lib_proof "$f") res=${RESULTS[$((${#RESULTS[@]} - 1))]}
  if [ "$res" = PASS ] && [ "$proof" != "$NPROC/$NPROC" ]; then res="FAIL(lib)"; fi
  # NVIDIA's run only shows which path PyTorch takes there: a case its library fails (on
  # 2026-11-22 its ncclCommShrink hung while the excluded rank did not call) is reported, not
  # counted as a failure of this check, once the run is proven to use NVIDIA's library.
  if [ "$lib" = ref ] && [ "$res" != PASS ] && [ "$proof" = "$NPROC/$NPROC" ] && [ -n "$sum" ]; then res=REF-FAILS; fi
  amend "$res" "${sum:-no SYMBOLS line}; lib proven $proof"
}
if [ "$NG" -ge "$NPROC" ]; then
  sym_step ours
  sym_step ref
else
  skip symbols symbols "$NG GPU(s) for $NPROC ranks: the reference (NVIDIA's NCCL) refuses 2 ranks on one GPU"
fi

# --- report --------------------------------------------------------------------------------------
NFAIL=0
for i in "${!NAMES[@]}"; do
  case "${RESULTS[$i]}" in PASS|SKIP|REF-FAILS) ;; *) NFAIL=$((NFAIL + 1))
    echo; echo "---- ${NAMES[$i]}: ${RESULTS[$i]} ($LOG/${NAMES[$i]}.log)"
    grep -E "^(\[r[0-9]+\] )?FAIL|Error|error:|Traceback|NCCL WARN|exceeds|outside|diverged|did not map|same library" \
      "$LOG/${NAMES[$i]}.log" 2>/dev/null | grep -v '^PASS' | head -n 15
    tail -n 5 "$LOG/${NAMES[$i]}.log" 2>/dev/null ;;
  esac
done
# Which collective failures are ours alone (the reference passes them) and which the reference
# shares (a PyTorch or test issue, not a ferronickel bug).
for init in eager lazy; do
  o=$LOG/collectives_ours_$init.log r=$LOG/collectives_ref_$init.log
  [ -f "$o" ] && [ -f "$r" ] || continue
  grep -q '^FAIL ' "$o" "$r" 2>/dev/null || continue
  echo; echo "---- collectives ($init): failures compared with NVIDIA's NCCL"
  comm -23 <(grep '^FAIL ' "$o" | sed 's/: .*//' | sort -u) <(grep '^FAIL ' "$r" | sed 's/: .*//' | sort -u) | sed 's/^FAIL /  ours only:  /'
  comm -12 <(grep '^FAIL ' "$o" | sed 's/: .*//' | sort -u) <(grep '^FAIL ' "$r" | sed 's/: .*//' | sort -u) | sed 's/^FAIL /  both libs:  /'
  comm -13 <(grep '^FAIL ' "$o" | sed 's/: .*//' | sort -u) <(grep '^FAIL ' "$r" | sed 's/: .*//' | sort -u) | sed 's/^FAIL /  ref only:   /'
  n_own=$(comm -23 <(grep '^FAIL ' "$o" | sed 's/: .*//' | sort -u) <(grep '^FAIL ' "$r" | sed 's/: .*//' | sort -u) | grep -c .)
  for i in "${!NAMES[@]}"; do
    [ "${NAMES[$i]}" = collectives_ours_$init ] && DETAILS[$i]="${DETAILS[$i]}; $n_own fail with ours only"
  done
done
# Which path PyTorch takes to each symbol with each library, side by side.
if [ -f "$LOG/symbols_ours.log" ] || [ -f "$LOG/symbols_ref.log" ]; then
  echo; echo "---- symbols: ours | NVIDIA's (HANDLED: PyTorch raised there and went on; NOT REACHED: an earlier step raised)"
  sym_lines() { grep '^SYMBOL ' "$1" 2>/dev/null | sed 's/^SYMBOL //; s/: /\t/' | LC_ALL=C sort; }
  LC_ALL=C join -t $'\t' -a1 -a2 -e '-' -o 0,1.2,2.2 \
    <(sym_lines "$LOG/symbols_ours.log") <(sym_lines "$LOG/symbols_ref.log") |
    awk -F'\t' '{ printf "  %-26s %s | %s\n", $1, $2, $3 }'
  for lib in ours ref; do
    grep -E '^(HANDLED|FAIL) ' "$LOG/symbols_$lib.log" 2>/dev/null | cut -c1-400 | sed "s/^/  $lib: /"
  done
fi
for c in ddp_compare fsdp_compare; do
  [ -f "$LOG/$c.log" ] && { echo; echo "---- $c"; grep -E "^(compare_parity|  |REF-DETERMINISM|TIME|PARITY)" "$LOG/$c.log" | head -n 30; }
done
echo
echo "==================== TORCH CHECK SUMMARY (gpus=$NG, nproc=$NPROC, logs $LOG) ===================="
printf "%-24s | %-10s | %6s | %s\n" step result time_s detail
for i in "${!NAMES[@]}"; do
  printf "%-24s | %-10s | %6s | %s\n" "${NAMES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}" "${DETAILS[$i]}"
done
TOTAL=$(($(date +%s) - T_START))
NRAN=0; for r in "${RESULTS[@]}"; do [ "$r" != SKIP ] && NRAN=$((NRAN + 1)); done
# A check whose every step was skipped checked nothing: say so, and do not pass.
if [ $NRAN = 0 ]; then echo "TORCH CHECK: NOTHING RAN (${#NAMES[@]} steps skipped, ${TOTAL}s)"; exit 3; fi
if [ $NFAIL = 0 ]; then echo "TORCH CHECK: PASS (${#NAMES[@]} steps, $NRAN run, ${TOTAL}s)"; exit 0; fi
echo "TORCH CHECK: FAIL ($NFAIL of ${#NAMES[@]} steps failed, ${TOTAL}s)"
exit 1
