#!/usr/bin/env bash
# Builds examples/device_allreduce twice, both linking -lnccl from our target/release: once against
# ferronickel's include/ (device_allreduce_ours) and once against NVIDIA's 2.28.9 headers
# (device_allreduce_nvhdr), so that the same kernel source is held to both header sets and both
# binaries run on our library (README.md, "The device API").
#
# usage: scripts/build_device_example.sh [--out DIR] [--arch sm_XX] [--nvidia-include DIR] [--compile-only]
#   --out DIR             where the binaries go (default build/device)
#   --arch sm_XX          GPU architecture (default sm_90)
#   --nvidia-include DIR  NVIDIA's headers (default $NCCL_REF/include if it has nccl_device.h,
#                         else .deps/nvidia-nccl/include)
#   --compile-only        compile to objects only (no library needed; what the CPU tests do)
# env: NVCC (default $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc, then nvcc on PATH)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "build_device_example: ERROR: $*" >&2; exit 1; }

out="$root/build/device" arch=sm_90 nvinc="" compile_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out="$2"; shift 2 ;;
    --arch) [ $# -ge 2 ] || die "--arch needs a value"; arch="$2"; shift 2 ;;
    --nvidia-include) [ $# -ge 2 ] || die "--nvidia-include needs a directory"; nvinc="$2"; shift 2 ;;
    --compile-only) compile_only=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

nvcc="${NVCC:-}"
if [ -z "$nvcc" ]; then
  for c in "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then nvcc="$c"; break; fi
  done
fi
[ -n "$nvcc" ] || die "nvcc not found (set NVCC or CUDA_HOME)"
if [ -z "$nvinc" ]; then
  nvinc="$root/.deps/nvidia-nccl/include"
  if [ -n "${NCCL_REF:-}" ] && [ -f "$NCCL_REF/include/nccl_device.h" ]; then nvinc="$NCCL_REF/include"; fi
fi
[ -f "$nvinc/nccl_device.h" ] || die "$nvinc has no nccl_device.h (NVIDIA's headers; see --nvidia-include)"
[ -f "$root/include/nccl_device.h" ] || die "$root/include/nccl_device.h is missing"
echo "build_device_example: NVIDIA's headers $nvinc ($(sed -n 's/^#define NCCL_VERSION_CODE //p' "$nvinc/nccl.h"))"
lib="$root/target/release"
if [ $compile_only = 0 ]; then
  [ -f "$lib/libnccl.so" ] || die "$lib/libnccl.so is missing (cargo build --release)"
fi

mkdir -p "$out"
src="$root/examples/device_allreduce/device_allreduce.cu"
flags=(-std=c++17 -O2 "-arch=$arch" -Xcompiler -Wall)
pids=()
for variant in ours:"$root/include" nvhdr:"$nvinc"; do
  name="device_allreduce_${variant%%:*}" inc="${variant#*:}"
  if [ $compile_only = 1 ]; then
    "$nvcc" "${flags[@]}" -I"$inc" -c "$src" -o "$out/$name.o" &
  else
    "$nvcc" "${flags[@]}" -I"$inc" "$src" -L"$lib" -lnccl -lpthread -o "$out/$name" &
  fi
  pids+=("$!:$name:$inc")
done
rc=0
for p in "${pids[@]}"; do
  if wait "${p%%:*}"; then
    echo "build_device_example: ${p#*:}"
  else
    echo "build_device_example: FAILED ${p#*:}" >&2; rc=1
  fi
done
exit $rc
