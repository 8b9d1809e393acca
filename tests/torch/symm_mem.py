"""PyTorch symmetric memory on the NCCL backend, with our library: --ranks ranks on GPU 0.

Each rank is a process with --lib preloaded (LD_PRELOAD) and checks that its NCCL calls bind to it.
It then calls torch.distributed._symmetric_memory.set_backend("NCCL"), takes a tensor from
symm_mem.empty (ncclMemAlloc), fills it with values of its own, and rendezvous it on the world
group (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC for the buffer and a signal pad,
ncclDevCommCreate with LSA and GIN barrier counts, peer pointers read through the windows). After a
barrier it reads every peer's buffer through get_buffer and compares it element by element with
what that peer wrote; then an all_reduce on the symmetric tensor, checked the same way. Prints
"SYMM_MEM: PASS|FAIL ..." last.

usage: python3 tests/torch/symm_mem.py [--ranks 2] [--lib target/release/libnccl.so]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import free_port, nccl_lib_check, rank_env, run_ranks  # noqa: E402

N = (1 << 18) + 3


def values(torch, rank: int):
    """Rank `rank`'s data: exact in float32, different on every rank and element."""
    return torch.arange(N, dtype=torch.float32) % 1021 + 10000.0 * (rank + 1)


def rank_main(rank: int, world: int, port: int) -> int:
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    ok, line = nccl_lib_check(rank)
    print(line, flush=True)
    if not ok:
        return 1
    torch.cuda.set_device(0)
    dev = torch.device("cuda:0")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    symm_mem.set_backend("NCCL")
    t = symm_mem.empty(N, dtype=torch.float32, device=dev)
    t.copy_(values(torch, rank).to(dev))
    handle = symm_mem.rendezvous(t, dist.group.WORLD.group_name)
    torch.cuda.synchronize(dev)
    dist.barrier()
    bad = 0
    for p in range(world):
        got = handle.get_buffer(p, [N], torch.float32).cpu()
        wrong = int((got != values(torch, p)).sum().item())
        if wrong:
            print(f"r{rank} FAIL: peer {p}'s buffer read through the handle has {wrong} of {N} wrong elements", flush=True)
            bad += 1
    dist.barrier()  # every rank has read its peers' buffers before they change
    dist.all_reduce(t)
    want = sum(values(torch, p) for p in range(world))
    wrong = int((t.cpu() != want).sum().item())
    if wrong:
        print(f"r{rank} FAIL: all_reduce on symmetric memory has {wrong} of {N} wrong elements", flush=True)
        bad += 1
    dist.destroy_process_group()
    print(f"r{rank} {'FAIL' if bad else 'PASS'}", flush=True)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--lib", default=os.environ.get("LD_PRELOAD", "target/release/libnccl.so"))
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    if a.rank >= 0:
        return rank_main(a.rank, a.ranks, a.port)
    env = rank_env(os.path.realpath(a.lib), TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--ranks", str(a.ranks), "--port", str(free_port())]
    failed = run_ranks(cmd, a.ranks, env, timeout=150)
    print(f"SYMM_MEM: {'FAIL' if failed else 'PASS'} {a.ranks} ranks on GPU 0, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
