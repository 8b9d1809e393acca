#!/usr/bin/env python3
"""FSDP2 (torch.distributed.fsdp.fully_shard) on a small MLP in bfloat16 mixed precision, for
comparing NVIDIA's NCCL with ferronickel (same format as ddp_parity.py, same compare script):

    torchrun --standalone --nproc_per_node=2 tests/torch/fsdp2.py --out /tmp/fsdp_ref.pt
    LD_PRELOAD=$PWD/target/release/libnccl.so \
    torchrun --standalone --nproc_per_node=2 tests/torch/fsdp2.py --out /tmp/fsdp_ours.pt
    python3 tests/torch/compare_parity.py /tmp/fsdp_ref.pt /tmp/fsdp_ours.pt

Model: DEPTH nn.Linear(WIDTH, WIDTH) (default 4 x 1024) with ReLU between, each layer and the
root wrapped by fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32):
fp32 sharded master parameters, bf16 all-gathers and compute, fp32 reduce-scatters of the
gradients. --pure-bf16 instead keeps the parameters themselves in bf16 (bf16 reduce-scatter).
5 SGD steps; same init on every rank (seeded), per-rank data from a seeded CUDA generator.
Rank 0 saves the per-step losses, the full (gathered with DTensor.full_tensor()) parameters in
fp32, per-step times and which libnccl was mapped.
"""

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from common import dist_env, nccl_lib_check, nccl_version_str, pick_device_index

try:   # public home since PyTorch 2.6
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    FSDP_IMPORT = "torch.distributed.fsdp"
except ImportError:   # older location
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    FSDP_IMPORT = "torch.distributed._composable.fsdp"


class MLP(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x


def main():
    ap = argparse.ArgumentParser(description="FSDP2 bf16 parity run")
    ap.add_argument("--out", default=os.environ.get("PARITY_OUT", ""))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timed-from", type=int, default=1)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--pure-bf16", action="store_true")
    args = ap.parse_args()
    if not args.out:
        sys.exit("give --out PATH or $PARITY_OUT")
    if args.steps <= args.timed_from:
        sys.exit("--steps must exceed --timed-from")

    rank, world, local_rank = dist_env()
    dev = torch.device("cuda", pick_device_index(torch, local_rank))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)

    torch.manual_seed(args.seed)
    model = MLP(args.width, args.depth).to(dev)
    if args.pure_bf16:
        model = model.to(torch.bfloat16)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    else:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed * 1000 + 29 + rank)

    losses, events = [], []
    for step in range(args.steps):
        x = torch.randn(args.batch, args.width, device=dev, generator=gen)
        y = torch.randn(args.batch, args.width, device=dev, generator=gen)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        end.record()
        events.append((start, end))
        losses.append(loss.detach())
    torch.cuda.synchronize(dev)
    step_ms = [s.elapsed_time(e) for s, e in events]
    median_ms = statistics.median(step_ms[args.timed_from:])
    losses = torch.stack(losses).float().cpu()

    # full parameters: every rank takes part in the all-gathers, rank 0 keeps them
    full = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        full[name] = t.detach().float().cpu()
    lib_ok, lib_line = nccl_lib_check(rank)
    print(lib_line, flush=True)

    if rank == 0:
        result = {
            "kind": "fsdp2_pure_bf16" if args.pure_bf16 else "fsdp2_bf16_mixed",
            "losses": losses,
            "params": full,
            "step_ms": step_ms,
            "median_ms": median_ms,
            "timed_from": args.timed_from,
            "lib": lib_line,
            "lib_ok": lib_ok,
            "nccl_version": nccl_version_str(torch),
            "torch_version": torch.__version__,
            "fsdp_import": FSDP_IMPORT,
            "device": torch.cuda.get_device_name(dev),
            "world": world,
            "config": vars(args),
        }
        tmp = args.out + ".tmp"
        torch.save(result, tmp)
        os.replace(tmp, args.out)
        print(f"RESULT {result['kind']} world={world} steps={args.steps} median_ms={median_ms:.3f} "
              f"loss0={losses[0].item():.6f} loss_last={losses[-1].item():.6f} lib_ok={lib_ok} "
              f"nccl={nccl_version_str(torch)} fsdp={FSDP_IMPORT} saved={args.out}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if lib_ok else 1)


if __name__ == "__main__":
    main()
