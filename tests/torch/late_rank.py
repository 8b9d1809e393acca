"""A rank that reaches its first collective long after the others, as a slow data loader or import
makes it (issue: ranks more than 5 s apart broke init).

    torchrun --standalone --nproc_per_node=2 tests/torch/late_rank.py --delay 12 [--hostid-per-rank]

init_process_group("nccl") without a device id: PyTorch creates the communicator lazily at the first
collective, so the last rank starts its ncclCommInitRank `--delay` seconds after the others. Every
rank all-reduces 1M floats holding rank+1 and checks every element against the sum; the result is
one line per rank, "RESULT rank=R ok=yes waited_s=W", and the exit code.

--hostid-per-rank sets NCCL_HOSTID per rank, so NVIDIA's NCCL accepts two ranks on one GPU (it then
treats them as two hosts and connects them over sockets).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import dist_env, nccl_lib_check, pick_device_index  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay", type=float, default=12.0, help="seconds the last rank sleeps first")
    ap.add_argument("--hostid-per-rank", action="store_true")
    args = ap.parse_args()
    rank, world, local_rank = dist_env()
    if args.hostid_per_rank:
        os.environ["NCCL_HOSTID"] = f"late-rank-check-host-{rank}"

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(pick_device_index(torch, local_rank))
    dist.init_process_group("nccl")
    ok, line = nccl_lib_check(rank)
    print(line, flush=True)

    n = 1 << 20
    x = torch.full((n,), float(rank + 1), device="cuda")
    if rank == world - 1:
        time.sleep(args.delay)
    t0 = time.time()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    waited = time.time() - t0
    want = float(world * (world + 1) // 2)
    wrong = int((x != want).sum().item())
    good = wrong == 0 and ok
    print(f"RESULT rank={rank} ok={'yes' if good else 'no'} wrong={wrong} waited_s={waited:.1f} "
          f"delay_s={args.delay}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
