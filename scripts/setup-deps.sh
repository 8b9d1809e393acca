#!/usr/bin/env bash
# Installs what building and testing ferronickel needs beyond rustup/cargo, gcc and python3+pip,
# on a fresh Debian 12 machine as root (or anywhere the pieces are already present).
# Idempotent, and fast when everything is already there. One line of output per step.
#
#   libclang          bindgen (build.rs) needs it              -> apt-get install libclang-dev
#   g++               the C++ half of tests/abi.rs             -> apt-get install g++
#   cmake, pkg-config tests/install.rs finds the installed lib -> apt-get install cmake pkg-config
#   zstd              the fatbin test in src/cuda/module.rs    -> apt-get install zstd
#   iproute2 (ip), util-linux (unshare)  tests/hosts.rs' hosts -> apt-get install iproute2
#   nvcc 13.0 + CUDA headers   build.rs kernels, tests' C code -> pip install nvidia-cuda-* 13.0
#   NVIDIA's nccl.h 2.28.9     reference for tests/abi.rs      -> .deps/nvidia-nccl/include/
#   .deps/cuda-include         symlink to the CUDA headers the tests compile against
#
# Environment: CUDA_HOME or NVCC to use an installed toolkit; FERRONICKEL_CACHE (default
# ~/.cache/ferronickel) keeps the downloaded NCCL wheel so fresh clones don't fetch it again.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$root/.deps"
cache="${FERRONICKEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferronickel}"
PY="${PYTHON:-python3}"
NCCL_WHEEL_VERSION="2.28.9"
mkdir -p "$deps" "$cache"

say() { echo "setup-deps: $*"; }
die() { echo "setup-deps: ERROR: $*" >&2; exit 1; }

apt_updated=0
apt_install() {
  command -v apt-get >/dev/null || die "need $* but apt-get is not available; install it by hand"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq >/dev/null
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# pip refuses to touch a distribution's python (PEP 668) unless told to.
pip_install() {
  local extra=()
  if "$PY" -c 'import sys,sysconfig,os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"],"EXTERNALLY-MANAGED")) else 1)'; then
    extra+=(--break-system-packages)
  fi
  "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "${extra[@]}" "$@"
}

# --- libclang (bindgen) -------------------------------------------------------------------
# libclang.so or libclang-<version>.so, not libclang-cpp (a different library, which some
# machines have without libclang itself).
find_libclang() {
  local names='libclang(-[0-9.]+)?\.so'
  if [ -n "${LIBCLANG_PATH:-}" ] && ls "$LIBCLANG_PATH" 2>/dev/null | grep -Eq "^$names"; then return 0; fi
  ldconfig -p 2>/dev/null | grep -Eq "[[:space:]]$names" && return 0
  ls /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu 2>/dev/null | grep -Eq "^$names"
}
if find_libclang; then
  say "libclang: found"
else
  say "libclang: not found, installing libclang-dev (apt-get)"
  apt_install libclang-dev
  find_libclang || die "libclang-dev installed but libclang still not found"
fi

# --- C and C++ compilers, binutils (tests compile C/C++ and run nm/readelf), zstd (the -----
# --- fatbin test decompresses the kernel images nvcc compressed) ----------------------------
missing=()
command -v cc >/dev/null || missing+=(gcc)
command -v c++ >/dev/null || missing+=(g++)
{ command -v nm >/dev/null && command -v readelf >/dev/null; } || missing+=(binutils)
command -v zstd >/dev/null || missing+=(zstd)
if [ ${#missing[@]} -eq 0 ]; then
  say "cc, c++, nm, readelf, zstd: found"
else
  say "installing ${missing[*]} (apt-get)"
  apt_install "${missing[@]}"
fi

# --- ip and unshare (tests/hosts.rs makes hosts of network and UTS namespaces) --------------
missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v unshare >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -eq 0 ]; then
  say "ip, unshare: found"
else
  say "installing ${missing[*]} (apt-get)"
  apt_install "${missing[@]}"
fi

# --- cmake and pkg-config (tests/install.rs builds tests/cmake and a pkg-config program) -------
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v pkg-config >/dev/null || missing+=(pkg-config)
if [ ${#missing[@]} -eq 0 ]; then
  say "cmake, pkg-config: found"
else
  say "installing ${missing[*]} (apt-get)"
  apt_install "${missing[@]}"
fi

# --- nvcc 13.0 and the CUDA headers --------------------------------------------------------
# Same search order as build.rs: $NVCC, $CUDA_HOME, /usr/local/cuda, PATH, this python's wheels.
pip_cuda_dirs() {
  "$PY" -c 'import nvidia, os; print("\n".join(os.path.join(p, "cu13") for p in nvidia.__path__))' 2>/dev/null || true
}
find_nvcc() {
  local c
  for c in "${NVCC:-}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  while read -r d; do
    [ -n "$d" ] && [ -x "$d/bin/nvcc" ] && { echo "$d/bin/nvcc"; return 0; }
  done < <(pip_cuda_dirs)
  return 1
}
find_cuda_include() {
  local d
  for d in "${CUDA_HOME:+$CUDA_HOME/include}" /usr/local/cuda/include; do
    [ -n "$d" ] && [ -f "$d/cuda_runtime.h" ] && [ -f "$d/cuda_fp8.h" ] && { echo "$d"; return 0; }
  done
  while read -r d; do
    [ -n "$d" ] && [ -f "$d/include/cuda_runtime.h" ] && [ -f "$d/include/cuda_fp8.h" ] && { echo "$d/include"; return 0; }
  done < <(pip_cuda_dirs)
  return 1
}
if nvcc="$(find_nvcc)" && cuda_inc="$(find_cuda_include)"; then
  say "nvcc: found $nvcc"
else
  say "nvcc 13.0 or CUDA headers not found, installing them from PyPI (pip)"
  pip_install nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
    nvidia-cuda-runtime==13.0.96 'nvidia-cuda-cccl>=13.0,<13.1'
  nvcc="$(find_nvcc)" || die "pip installed nvidia-cuda-nvcc but no nvcc was found under $("$PY" -c 'import nvidia;print(list(nvidia.__path__))' 2>&1)"
  cuda_inc="$(find_cuda_include)" || die "pip installed nvidia-cuda-runtime but cuda_runtime.h was not found"
  say "nvcc: installed $nvcc"
fi
ln -sfn "$cuda_inc" "$deps/cuda-include"
say "CUDA headers: .deps/cuda-include -> $cuda_inc"

# --- NVIDIA's reference nccl.h (tests/abi.rs compares ours against it) ---------------------
ref="$deps/nvidia-nccl/include"
if [ -f "$ref/nccl.h" ] && grep -q "^#define NCCL_VERSION_CODE 22809" "$ref/nccl.h"; then
  say "reference nccl.h $NCCL_WHEEL_VERSION: present in .deps/nvidia-nccl/include"
else
  wheel="$(ls "$cache"/nvidia_nccl_cu13-"$NCCL_WHEEL_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$wheel" ]; then
    say "reference nccl.h: downloading nvidia-nccl-cu13==$NCCL_WHEEL_VERSION (about 200 MB) into $cache (pip download)"
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --dest "$cache" "nvidia-nccl-cu13==$NCCL_WHEEL_VERSION"
    wheel="$(ls "$cache"/nvidia_nccl_cu13-"$NCCL_WHEEL_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    [ -n "$wheel" ] || die "pip download did not leave nvidia_nccl_cu13-$NCCL_WHEEL_VERSION-*.whl in $cache"
  fi
  rm -rf "$deps/nvidia-nccl"
  "$PY" - "$wheel" "$deps/nvidia-nccl" <<'PYEOF'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "nvidia/nccl/include/"
n = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if info.filename.startswith(prefix) and not info.is_dir():
            rel = info.filename[len("nvidia/nccl/"):]
            out = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                dst.write(src.read())
            n += 1
if n == 0:
    sys.exit(f"{wheel} has no {prefix}")
PYEOF
  grep -q "^#define NCCL_VERSION_CODE 22809" "$ref/nccl.h" || die "$ref/nccl.h is not NCCL 2.28.9"
  say "reference nccl.h $NCCL_WHEEL_VERSION: extracted from $(basename "$wheel") into .deps/nvidia-nccl/include"
fi
say "done"
