"""A PyTorch job that ends without destroy_process_group, as many training scripts do.

Runs --runs jobs of --world ranks on GPU 0, each rank a process with our library preloaded
(LD_PRELOAD=--lib): init_process_group("nccl"), an all-reduce checked element by element, and then
the interpreter simply ends with the process group alive. Every rank must exit 0, and must prove
that its NCCL calls bound to --lib. Prints "TORCH EXIT: PASS|FAIL ..." last.

usage: python3 tests/torch/exit_live.py --runs 20 --lib target/release/libnccl.so [--world 2]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import free_port, nccl_lib_check, rank_env, run_ranks  # noqa: E402


def rank_main(rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    ok, line = nccl_lib_check(rank)
    if not ok:
        print(f"r{rank} FAIL: {line}", flush=True)
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
    env = rank_env(os.path.realpath(a.lib))
    failed, worst = 0, 0.0
    for run in range(a.runs):
        t0 = time.monotonic()
        cmd = [sys.executable, __file__, "--world", str(a.world), "--port", str(free_port())]
        failed += run_ranks(cmd, a.world, env, timeout=120, label=f"run {run}: ")
        worst = max(worst, time.monotonic() - t0)
    print(f"TORCH EXIT: {'FAIL' if failed else 'PASS'} {a.runs} runs x {a.world} ranks, {failed} failure(s), slowest {worst:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
