"""Helpers shared by the PyTorch tests in tests/torch/ (no torch import at module level beyond
what the callers already did, so that `python3 -m py_compile` works anywhere).

- which libnccl this process's NCCL calls bind to, checked against $EXPECT_NCCL_LIB
- rank/world/device from torchrun's environment
- the c10d store (to exchange small results between ranks without using the library under test)
- ranks launched as processes of a script itself (for the tests that run without torchrun)
"""

import os
import re
import socket
import subprocess
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


def _file_providing(symbol):
    """Path of the mapped file whose code the process-wide lookup of `symbol` lands in: the
    library libtorch_cuda's NCCL calls bind to (LD_PRELOAD comes first in that lookup)."""
    import ctypes
    try:
        addr = ctypes.cast(getattr(ctypes.CDLL(None), symbol), ctypes.c_void_p).value
    except AttributeError:
        return None
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi and len(parts) == 6:
                return parts[5].strip()
    return None


def nccl_lib_check(rank):
    """Returns (ok, line). ok is False when $EXPECT_NCCL_LIB is set and the library that the
    global symbol lookup of ncclCommInitRankConfig resolves to (or the only libnccl mapped, when
    none is global) is not that file (compared by realpath). Several libnccl files may be mapped
    (torch preloads NVIDIA's by path); only the one the calls bind to matters."""
    libs = mapped_nccl_libs()
    expect = os.environ.get("EXPECT_NCCL_LIB", "")
    # Without LD_PRELOAD, torch loads NVIDIA's library privately (RTLD_LOCAL): the global lookup
    # finds nothing, and the one libnccl mapped is the one its calls bind to.
    used = _file_providing("ncclCommInitRankConfig") or (libs[0] if len(libs) == 1 else None)
    if not used:
        return False, f"NCCL_LIB rank={rank} match=no path=<ncclCommInitRankConfig not found> mapped={','.join(libs) or '-'}"
    real = os.path.realpath(used)
    if not expect:
        return True, f"NCCL_LIB rank={rank} match=unchecked path={used} real={real} mapped={','.join(libs)}"
    ok = real == os.path.realpath(expect)
    return ok, (f"NCCL_LIB rank={rank} match={'yes' if ok else 'no'} path={used} real={real} "
                f"expect={os.path.realpath(expect)} mapped={','.join(libs)}")


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


def free_port():
    """A TCP port free on 127.0.0.1 now, for init_process_group's tcp:// rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(lib, **extra):
    """The environment of a rank process: `lib` preloaded and expected by nccl_lib_check, NVLS
    off, output unbuffered, NCCL_DEBUG=WARN unless set, plus `extra`."""
    env = dict(os.environ, LD_PRELOAD=lib, EXPECT_NCCL_LIB=lib, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1", **extra)
    env.setdefault("NCCL_DEBUG", "WARN")
    return env


def run_ranks(cmd, world, env, timeout, label=""):
    """Runs `cmd + ["--rank", r]` for every rank at once and waits for each up to `timeout`
    seconds (then kills it). Prints "<label>rank r ended with <rc>" for each that did not exit 0
    and returns how many."""
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env) for r in range(world)]
    failed = 0
    for r, p in enumerate(procs):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        if rc != 0:
            print(f"{label}rank {r} ended with {rc}", flush=True)
            failed += 1
    return failed
