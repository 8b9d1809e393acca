#!/usr/bin/env python3
"""The seeds' DDP example (three nn.Linear(4000, 4000) with ReLU between, SGD lr 1e-3, MSELoss,
batch 1000), made deterministic, for comparing NVIDIA's NCCL with ferronickel:

    torchrun --standalone --nproc_per_node=2 tests/torch/ddp_parity.py --out /tmp/ddp_ref.pt
    LD_PRELOAD=$PWD/target/release/libnccl.so \
    torchrun --standalone --nproc_per_node=2 tests/torch/ddp_parity.py --out /tmp/ddp_ours.pt
    python3 tests/torch/compare_parity.py /tmp/ddp_ref.pt /tmp/ddp_ours.pt

- the same initial parameters on every rank (torch.manual_seed before building the model; DDP
  broadcasts rank 0's anyway), per-rank data from a CUDA torch.Generator seeded with seed+rank,
  so two runs on the same machine differ only in the all-reduces;
- 50 steps; per-step GPU time from CUDA events recorded on the training stream (no host sync
  inside the loop), plus a host-timed window over steps 10..49 bracketed by
  torch.cuda.synchronize(); both reported, the median of the per-step times over steps 10..49
  is the headline number;
- rank 0 writes (torch.save) the loss of every step, the final parameters, the timings and which
  libnccl was mapped; every rank's parameter checksum goes through the c10d store so rank 0 can
  check that the replicas stayed identical.
The output path comes from --out or $PARITY_OUT. $EXPECT_NCCL_LIB, when set, must be the mapped
libnccl (the run fails otherwise).
"""

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

from common import default_store, dist_env, nccl_lib_check, nccl_version_str, pick_device_index

SIZE = 4000


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(SIZE, SIZE)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(SIZE, SIZE)
        self.net3 = nn.Linear(SIZE, SIZE)

    def forward(self, x):
        return self.net3(self.relu(self.net2(self.relu(self.net1(x)))))


def checksum(params):
    """A bit-pattern checksum of a list of float32 tensors (on their device): equal parameters
    give equal checksums; any flipped bit almost surely changes them."""
    total = 0
    for i, p in enumerate(params):
        bits = p.detach().contiguous().view(torch.int32).reshape(-1).to(torch.int64)
        w = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 65521 + 1
        total += int(bits.sum().item()) * (2 * i + 1) + int((bits * w).sum().item())
    return str(total)


def main():
    ap = argparse.ArgumentParser(description="DDP parity run (seeds' example)")
    ap.add_argument("--out", default=os.environ.get("PARITY_OUT", ""))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--timed-from", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--eager", action="store_true", help="init_process_group(device_id=...)")
    args = ap.parse_args()
    if not args.out:
        sys.exit("give --out PATH or $PARITY_OUT")
    if args.steps <= args.timed_from:
        sys.exit("--steps must exceed --timed-from")

    rank, world, local_rank = dist_env()
    dev = torch.device("cuda", pick_device_index(torch, local_rank))
    torch.cuda.set_device(dev)
    if args.eager:
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("nccl")   # as in the seeds
    store = default_store(dist)

    torch.manual_seed(args.seed)
    model = ToyModel().to(dev)
    ddp_model = DDP(model, bucket_cap_mb=args.bucket_cap_mb, device_ids=[dev.index])
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed * 1000 + 17 + rank)

    losses = []
    events = []
    window_t0 = None
    for step in range(args.steps):
        x = torch.randn(args.batch, SIZE, device=dev, generator=gen)
        labels = torch.randn(args.batch, SIZE, device=dev, generator=gen)
        if step == args.timed_from:
            torch.cuda.synchronize(dev)
            window_t0 = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(x), labels)
        loss.backward()
        optimizer.step()
        end.record()
        events.append((start, end))
        losses.append(loss.detach())
    torch.cuda.synchronize(dev)
    window_s = time.perf_counter() - window_t0
    step_ms = [s.elapsed_time(e) for s, e in events]
    timed = step_ms[args.timed_from:]
    median_ms = statistics.median(timed)
    window_ms = window_s * 1e3 / (args.steps - args.timed_from)
    losses = torch.stack(losses).float().cpu()

    params = {name: p.detach() for name, p in model.named_parameters()}
    csum = checksum(list(params.values()))
    lib_ok, lib_line = nccl_lib_check(rank)
    print(lib_line, flush=True)

    in_sync = None
    if store is not None:
        try:
            store.set(f"ddp_parity/csum/{rank}", csum)
            if rank == 0:
                keys = [f"ddp_parity/csum/{r}" for r in range(world)]
                store.wait(keys, timedelta(seconds=60))
                sums = [store.get(k).decode() for k in keys]
                in_sync = len(set(sums)) == 1
        except Exception as e:
            print(f"[r{rank}] checksum exchange failed: {e}", flush=True)

    rc = 0 if lib_ok else 1
    if rank == 0:
        result = {
            "kind": "ddp",
            "losses": losses,
            "params": {k: v.cpu() for k, v in params.items()},
            "step_ms": step_ms,
            "median_ms": median_ms,
            "window_ms_per_step": window_ms,
            "timed_from": args.timed_from,
            "lib": lib_line,
            "lib_ok": lib_ok,
            "nccl_version": nccl_version_str(torch),
            "torch_version": torch.__version__,
            "device": torch.cuda.get_device_name(dev),
            "world": world,
            "ranks_in_sync": in_sync,
            "config": vars(args),
        }
        tmp = args.out + ".tmp"
        torch.save(result, tmp)
        os.replace(tmp, args.out)
        if in_sync is False:
            rc = 1
        print(f"RESULT ddp world={world} steps={args.steps} median_ms={median_ms:.3f} "
              f"window_ms_per_step={window_ms:.3f} loss0={losses[0].item():.6f} "
              f"loss_last={losses[-1].item():.6f} ranks_in_sync={in_sync} "
              f"lib_ok={lib_ok} nccl={nccl_version_str(torch)} saved={args.out}", flush=True)
    dist.destroy_process_group()
    sys.exit(rc)


if __name__ == "__main__":
    main()
