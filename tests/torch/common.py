"""Helpers shared by the PyTorch tests in tests/torch/ (no torch import at module level beyond
what the callers already did, so that `python3 -m py_compile` works anywhere).

- which libnccl is mapped into this process (/proc/self/maps), checked against $EXPECT_NCCL_LIB
- rank/world/device from torchrun's environment
- the c10d store (to exchange small results between ranks without using the library under test)
"""

import os
import re
import sys

_NCCL_BASENAME = re.compile(r"^libnccl\.so(\.\d+)*$")


def mapped_nccl_libs():
    """Paths of every libnccl.so* file mapped into this process, in order of first mapping.

    Only the core library counts (libnccl.so, libnccl.so.2, libnccl.so.2.28.9); plugins such as
    libnccl-net.so do not match."""
    libs = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            if _NCCL_BASENAME.match(os.path.basename(path)) and path not in libs:
                libs.append(path)
    return libs


def nccl_lib_check(rank):
    """Returns (ok, line). ok is False when $EXPECT_NCCL_LIB is set and the one mapped libnccl is
    not that file (compared by realpath), or when no libnccl or more than one is mapped."""
    libs = mapped_nccl_libs()
    expect = os.environ.get("EXPECT_NCCL_LIB", "")
    real = [os.path.realpath(p) for p in libs]
    if not libs:
        return False, f"NCCL_LIB rank={rank} match=no path=<none mapped> expect={expect or '-'}"
    if len(set(real)) > 1:
        return False, (f"NCCL_LIB rank={rank} match=no path={','.join(libs)} "
                       f"(several libnccl mapped) expect={expect or '-'}")
    if not expect:
        return True, f"NCCL_LIB rank={rank} match=unchecked path={libs[0]} real={real[0]}"
    ok = real[0] == os.path.realpath(expect)
    return ok, (f"NCCL_LIB rank={rank} match={'yes' if ok else 'no'} path={libs[0]} "
                f"real={real[0]} expect={os.path.realpath(expect)}")


def dist_env():
    """(rank, world_size, local_rank) from torchrun's environment."""
    try:
        return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    except KeyError as e:
        sys.exit(f"missing {e}: run under torchrun (torchrun --standalone --nproc_per_node=2 ...)")


def pick_device_index(torch, local_rank):
    """local_rank, or local_rank modulo the visible GPUs when there are fewer GPUs than ranks
    (only ferronickel accepts several ranks on one GPU; NVIDIA's NCCL refuses)."""
    n = torch.cuda.device_count()
    if n == 0:
        sys.exit("no CUDA device visible")
    return local_rank % n


def default_store(dist):
    """The default group's store (a PrefixStore over torchrun's TCPStore), or None."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # private API: tolerate its absence
        return None


def nccl_version_str(torch):
    try:
        v = torch.cuda.nccl.version()
        return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception as e:
        return f"unknown ({type(e).__name__})"
