"""A PyTorch job that ends without destroy_process_group, as many training scripts do.

Runs --runs jobs of --world ranks on GPU 0, each rank a process with our library preloaded
(LD_PRELOAD=--lib): init_process_group("nccl"), an all-reduce checked element by element, and then
the interpreter simply ends with the process group alive. Every rank must exit 0, and must prove
that its NCCL calls bound to --lib. Prints "TORCH EXIT: PASS|FAIL ..." last.

usage: python3 tests/torch/exit_live.py --runs 20 --lib target/release/libnccl.so [--world 2]
"""

import argparse
import os
import socket
import subprocess
import sys
import time


def rank_main(rank: int, world: int, port: int) -> None:
    import ctypes

    import torch
    import torch.distributed as dist

    addr = ctypes.cast(ctypes.CDLL(None).ncclCommInitRankConfig, ctypes.c_void_p).value
    with open("/proc/self/maps") as maps:
        owner = next(
            line.split()[-1]
            for line in maps
            if int(line.split("-")[0], 16) <= addr < int(line.split()[0].split("-")[1], 16)
        )
    if os.path.realpath(owner) != os.path.realpath(os.environ["EXIT_LIVE_LIB"]):
        print(f"r{rank} FAIL: NCCL calls bind to {owner}, not {os.environ['EXIT_LIVE_LIB']}", flush=True)
        sys.exit(1)
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=torch.device("cuda:0")
    )
    n = 1 << 16
    t = torch.full((n,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    want = world * (world + 1) / 2
    bad = int((t != want).sum().item())
    if bad:
        print(f"r{rank} FAIL: {bad} wrong elements", flush=True)
        sys.exit(1)
    torch.cuda.synchronize()
    # No destroy_process_group: the interpreter ends with the communicator alive.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--lib", required=False)
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    if a.rank >= 0:
        rank_main(a.rank, a.world, a.port)
        return 0
    lib = os.path.realpath(a.lib)
    env = dict(os.environ, LD_PRELOAD=lib, EXIT_LIVE_LIB=lib, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    env.setdefault("NCCL_DEBUG", "WARN")
    failed, worst = 0, 0.0
    for run in range(a.runs):
        port = free_port()
        t0 = time.monotonic()
        procs = [
            subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world", str(a.world), "--port", str(port)], env=env)
            for r in range(a.world)
        ]
        for r, p in enumerate(procs):
            try:
                rc = p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = "timeout"
            if rc != 0:
                print(f"run {run}: rank {r} ended with {rc}", flush=True)
                failed += 1
        worst = max(worst, time.monotonic() - t0)
    print(f"TORCH EXIT: {'FAIL' if failed else 'PASS'} {a.runs} runs x {a.world} ranks, {failed} failure(s), slowest {worst:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
