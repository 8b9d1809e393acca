#!/usr/bin/env bash
# Installs ferronickel where C, C++, CMake, pkg-config and PyTorch's FindNCCL look for NCCL:
#
#   PREFIX/include/nccl.h
#   PREFIX/include/nccl_device.h, PREFIX/include/nccl_device/*.h   the device API (CUDA)
#   PREFIX/lib/libnccl.so.2.28.9      the library (SONAME libnccl.so.2)
#   PREFIX/lib/libnccl.so.2           -> libnccl.so.2.28.9   (what programs load)
#   PREFIX/lib/libnccl.so             -> libnccl.so.2        (what -lnccl finds)
#   PREFIX/lib/pkgconfig/nccl.pc
#   PREFIX/bin/ferronickel
#
# Usage: scripts/install.sh --prefix DIR [--from DIR] [--cuda-include DIR]
#   --prefix DIR        where to install (created if missing)
#   --from DIR          take libnccl.so and ferronickel from DIR; default: run
#                       `cargo build --release` (a no-op when up to date) and use target/release
#   --cuda-include DIR  CUDA headers for nccl.pc's Cflags (nccl.h includes cuda_runtime.h);
#                       default: $CUDA_HOME/include, /usr/local/cuda/include, then the
#                       .deps/cuda-include that scripts/setup-deps.sh made; none found: no -I for
#                       CUDA in Cflags (and a warning)
# One line of output per step.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "install: $*"; }
die() { echo "install: ERROR: $*" >&2; exit 1; }

prefix="" from="" cuda_inc=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; prefix="$2"; shift 2 ;;
    --from) [ $# -ge 2 ] || die "--from needs a directory"; from="$2"; shift 2 ;;
    --cuda-include) [ $# -ge 2 ] || die "--cuda-include needs a directory"; cuda_inc="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[ -n "$prefix" ] || die "--prefix DIR is required (see --help)"

if [ -z "$from" ]; then
  say "building (cargo build --release)"
  (cd "$root" && cargo build --release --quiet) || die "cargo build --release failed"
  from="$root/target/release"
fi
lib="$from/libnccl.so" bin="$from/ferronickel" header="$root/include/nccl.h"
for f in "$lib" "$bin" "$header" "$root/include/nccl_device.h"; do
  [ -f "$f" ] || die "$f is missing (build with cargo build --release, or point --from at the build)"
done

# The version is the header's: the same numbers ncclGetVersion reports.
ver() { sed -n "s/^#define NCCL_$1 \([0-9][0-9]*\)\$/\1/p" "$header"; }
version="$(ver MAJOR).$(ver MINOR).$(ver PATCH)"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "cannot read NCCL_MAJOR/MINOR/PATCH from $header"

if [ -z "$cuda_inc" ]; then
  for d in "${CUDA_HOME:+$CUDA_HOME/include}" /usr/local/cuda/include "$root/.deps/cuda-include"; do
    if [ -n "$d" ] && [ -f "$d/cuda_runtime.h" ]; then cuda_inc="$(cd "$d" && pwd -P)"; break; fi
  done
fi
if [ -n "$cuda_inc" ]; then
  [ -f "$cuda_inc/cuda_runtime.h" ] || die "--cuda-include $cuda_inc has no cuda_runtime.h"
else
  echo "install: WARNING: no CUDA headers found; nccl.pc's Cflags will not make nccl.h's #include <cuda_runtime.h> work (use --cuda-include)" >&2
fi

mkdir -p "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/bin"
prefix="$(cd "$prefix" && pwd -P)"
install -m 0644 "$header" "$prefix/include/nccl.h"
say "header: $prefix/include/nccl.h"
mkdir -p "$prefix/include/nccl_device"
install -m 0644 "$root/include/nccl_device.h" "$prefix/include/nccl_device.h"
install -m 0644 "$root"/include/nccl_device/*.h "$prefix/include/nccl_device/"
say "device API headers: $prefix/include/nccl_device.h and $prefix/include/nccl_device/"
install -m 0755 "$lib" "$prefix/lib/libnccl.so.$version"
ln -sfn "libnccl.so.$version" "$prefix/lib/libnccl.so.2"
ln -sfn "libnccl.so.2" "$prefix/lib/libnccl.so"
say "library: $prefix/lib/libnccl.so.$version, libnccl.so.2 and libnccl.so links"
install -m 0755 "$bin" "$prefix/bin/ferronickel"
say "command: $prefix/bin/ferronickel"

cflags='-I${includedir}'
[ -z "$cuda_inc" ] || cflags="$cflags -I$cuda_inc"
cat > "$prefix/lib/pkgconfig/nccl.pc" <<EOF
prefix=$prefix
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include

Name: nccl
Description: ferronickel, a drop-in replacement for NVIDIA NCCL (collective communication for GPUs)
Version: $version
Libs: -L\${libdir} -lnccl
Cflags: $cflags
EOF
say "pkg-config: $prefix/lib/pkgconfig/nccl.pc (version $version)"
say "done: PKG_CONFIG_PATH=$prefix/lib/pkgconfig, CMAKE_PREFIX_PATH=$prefix or NCCL_ROOT=$prefix; at run time $prefix/lib on LD_LIBRARY_PATH"
