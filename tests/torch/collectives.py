#!/usr/bin/env python3
"""Every torch.distributed collective that ProcessGroupNCCL maps onto NCCL, checked element by
element against a reference computed on the CPU (float64, or exact int64).

    torchrun --standalone --nproc_per_node=2 tests/torch/collectives.py --init eager
    torchrun --standalone --nproc_per_node=2 tests/torch/collectives.py --init lazy

--init eager: init_process_group("nccl", device_id=cuda:LOCAL_RANK): the communicator is created
              inside init_process_group (PyTorch then uses a nonblocking ncclConfig and splits
              new groups from the default communicator with ncclCommSplit).
--init lazy:  init_process_group("nccl") without a device: communicators are created at the first
              collective on each group (ncclCommInitRank / ncclCommInitRankConfig).

Inputs are deterministic per rank: each (case, rank) seeds its own CPU torch.Generator, so every
rank rebuilds every other rank's input and computes the reference itself. Outputs that the
library writes are pre-filled with NaN (floats) or a sentinel (int64), so an unwritten element
fails. Tolerances (|got - want| <= atol + rtol * scale, where scale is the sum of the magnitudes
of the terms, the natural bound for a rounded sum): float32 rtol 1e-5, bfloat16 2e-2, float16
2e-3; exact for int64, and for MIN/MAX, broadcast, gathers, all-to-all and send/recv (pure data
movement or selection).

One line per case (PASS/FAIL/SKIP, after gathering every rank's verdict through the c10d store,
so the library under test does not report on itself), then a SUMMARY line; exit status 1 on any
failure. $EXPECT_NCCL_LIB, when set, must be the libnccl mapped into every rank.
"""

import argparse
import inspect
import json
import os
import sys
import time
import traceback
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist

from common import default_store, dist_env, nccl_lib_check, nccl_version_str, pick_device_index

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int64": torch.int64}
# (rtol, atol); atol only matters for results within a few ulps of zero
TOL = {torch.float32: (1e-5, 1e-7), torch.bfloat16: (2e-2, 1e-5), torch.float16: (2e-3, 1e-4)}
SIZES = [1, 7, 1023, 1048579]
INT_SENTINEL = -0x5A5A5A5A5A5A5A5A
PREMUL_FACTOR = 0.75          # exactly representable in every float type
PREMUL_TENSOR_FACTOR = 1.5

OPS_FLOAT = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM", "PREMUL_SUM_TENSOR"]
OPS_INT = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]


def is_float(dtype):
    return dtype != torch.int64


# ---------------------------------------------------------------------------------------------
# deterministic inputs and references

def gen(key, r, n, dtype, small=False):
    """Rank r's input for case `key`: n elements, identical on every rank that builds it."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(f"{key}|{r}".encode()))
    if dtype == torch.int64:
        lo, hi = (-20, 21) if small else (-1000, 1001)   # small: products of up to 8 ranks fit
        return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64)
    return torch.randn(n, generator=g, dtype=torch.float32).to(dtype)


def gen_all(key, world, n, dtype, small=False):
    return [gen(key, r, n, dtype, small) for r in range(world)]


def sentinel(n, dtype, device):
    if dtype == torch.int64:
        return torch.full((n,), INT_SENTINEL, dtype=dtype, device=device)
    return torch.full((n,), float("nan"), dtype=dtype, device=device)


def reduce_ref(xs, op, dtype, world):
    """(reference, scale, exact) for reducing the per-rank inputs xs with `op`."""
    if dtype == torch.int64:
        X = torch.stack(xs)
        if op == "SUM":
            return X.sum(0), None, True
        if op == "PRODUCT":
            return X.prod(0), None, True
        if op == "MIN":
            return X.min(0).values, None, True
        if op == "MAX":
            return X.max(0).values, None, True
        if op == "AVG":   # NCCL: integer sum, then division rounding toward zero
            return torch.div(X.sum(0), world, rounding_mode="trunc"), None, True
        raise ValueError(op)
    X = torch.stack([x.double() for x in xs])
    A = X.abs()
    if op == "SUM":
        return X.sum(0), A.sum(0), False
    if op == "PRODUCT":
        ref = X.prod(0)
        return ref, ref.abs(), False
    if op == "MIN":
        return X.min(0).values, None, True
    if op == "MAX":
        return X.max(0).values, None, True
    if op == "AVG":
        return X.sum(0) / world, A.sum(0) / world, False
    if op == "PREMUL_SUM":
        return (X * PREMUL_FACTOR).sum(0), A.sum(0) * PREMUL_FACTOR, False
    if op == "PREMUL_SUM_TENSOR":
        return (X * PREMUL_TENSOR_FACTOR).sum(0), A.sum(0) * PREMUL_TENSOR_FACTOR, False
    raise ValueError(op)


def compare(out, ref, dtype, exact, scale=None):
    """(ok, detail): element-by-element comparison of a device/CPU tensor with a CPU reference."""
    out = out.detach().reshape(-1).cpu()
    ref = ref.reshape(-1)
    if out.numel() != ref.numel():
        return False, f"numel {out.numel()} != expected {ref.numel()}"
    n = ref.numel()
    if dtype == torch.int64:
        bad = out != ref
        o = out
        err = None
    else:
        o = out.double()
        r = ref.double()
        diff = (o - r).abs()
        if exact:
            bad = ~(o == r)           # NaN (an unwritten element) compares unequal
        else:
            rtol, atol = TOL[dtype]
            s = scale.double().reshape(-1) if scale is not None else r.abs()
            bad = ~(diff <= atol + rtol * s)
        err = diff.max().item() if n else 0.0
    nbad = int(bad.sum().item())
    if nbad == 0:
        return True, ("exact" if (exact or dtype == torch.int64) else f"max_abs_err={err:.3g}")
    i = int(bad.nonzero()[0].item())
    msg = f"{nbad}/{n} wrong, first [{i}] got {o[i].item()!r} want {ref[i].item()!r}"
    if err is not None:
        msg += f", max_abs_err={err:.3g}"
    return False, msg


def merge(results):
    """AND of several (ok, detail) pairs."""
    bad = [d for ok, d in results if not ok]
    if bad:
        return False, "; ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
    return True, results[0][1] if results else "ok"


def splits_unequal(world, n):
    """s[r][j]: elements rank r sends to rank j. Uneven, and one zero-size pair when n == 7."""
    s = [[n + 3 * r + 5 * j + ((r + j) % 2) for j in range(world)] for r in range(world)]
    if n == 7 and world > 1:
        s[0][world - 1] = 0
    return s


# ---------------------------------------------------------------------------------------------

class Runner:
    def __init__(self, rank, world, dev, variant, only):
        self.rank, self.world, self.dev, self.variant = rank, world, dev, variant
        self.only = only
        self.results = []   # [name, status, detail]

    def case(self, name, fn):
        """Run one case; fn returns (ok, detail) or (None, reason) for a SKIP."""
        if self.only and not any(o in name for o in self.only):
            return
        t0 = time.perf_counter()
        try:
            ok, detail = fn()
        except Exception as e:
            msg = " ".join(str(e).split())[:300]
            ok, detail = False, f"exception {type(e).__name__}: {msg}"
            if os.environ.get("COLL_TRACEBACK"):
                traceback.print_exc()
        dt = (time.perf_counter() - t0) * 1e3
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        self.results.append([name, status, f"{detail} ({dt:.1f} ms)"])
        if status == "FAIL":   # right away, in case a later case hangs or the process dies
            print(f"[r{self.rank}] FAIL {name} {detail}", flush=True)


def make_op(name, dtype, dev):
    """ReduceOp for a case name; returns (op, note)."""
    R = dist.ReduceOp
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR), "scalar factor"
    if name == "PREMUL_SUM_TENSOR":
        return dist._make_nccl_premul_sum(
            torch.tensor([PREMUL_TENSOR_FACTOR], dtype=dtype, device=dev)), f"{dtype} tensor factor"
    return getattr(R, name), ""


def upstream_issue(name, dtype):
    """A reason to skip a case that fails identically with NVIDIA's NCCL (a PyTorch/NCCL issue,
    not the library under test), or None."""
    if name.startswith("PREMUL_SUM") and dtype == torch.bfloat16:
        return ("PyTorch 2.11 hands NCCL a float32 factor with ncclBfloat16 and NCCL 2.28.9 reads 2 bytes "
                "of it; NVIDIA's NCCL fails these cases identically (2x H200, 2026-11-22)")
    return None


def run_reduction(fn_call, name, dtype, dev):
    """Calls fn_call(op). PyTorch builds the NCCL premul op from a tensor factor with the element
    type it expects (some versions take float32 for bfloat16): when the factor's dtype is
    refused by PyTorch (a TypeError/RuntimeError raised before any NCCL call, on every rank
    alike), retry with a float32 factor. Returns a note saying which path ran."""
    op, note = make_op(name, dtype, dev)
    if name != "PREMUL_SUM_TENSOR" or dtype == torch.float32:
        fn_call(op)
        return note
    try:
        fn_call(op)
        return note
    except (TypeError, RuntimeError) as e:
        if "expected scalar type" not in str(e) and "data type" not in str(e).lower():
            raise
        op = dist._make_nccl_premul_sum(
            torch.tensor([PREMUL_TENSOR_FACTOR], dtype=torch.float32, device=dev))
        fn_call(op)
        return "float32 tensor factor (PyTorch refused a matching-dtype factor)"


def collective_cases(R, dtn, dtype, n):
    rank, world, dev = R.rank, R.world, R.dev
    fl = is_float(dtype)
    tag = f"{dtn} n={n}"

    # --- all_reduce (in place) ---
    for opn in (OPS_FLOAT if fl else OPS_INT):
        def c(opn=opn):
            if upstream_issue(opn, dtype):
                return None, upstream_issue(opn, dtype)
            key = f"all_reduce/{dtn}/{opn}/{n}"
            xs = gen_all(key, world, n, dtype, small=(opn == "PRODUCT"))
            t = xs[rank].to(dev)
            note = run_reduction(lambda op: dist.all_reduce(t, op=op), opn, dtype, dev)
            ref, scale, exact = reduce_ref(xs, opn, dtype, world)
            ok, d = compare(t, ref, dtype, exact, scale)
            return ok, (d + (f" [{note}]" if note else ""))
        R.case(f"all_reduce {opn} {tag}", c)

    if n == 1023:
        def c_async():
            key = f"all_reduce_async/{dtn}/{n}"
            xs = gen_all(key, world, n, dtype)
            t = xs[rank].to(dev)
            w = dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True)
            w.wait()
            ref, scale, exact = reduce_ref(xs, "SUM", dtype, world)
            return compare(t, ref, dtype, exact, scale)
        R.case(f"all_reduce_async SUM {tag}", c_async)

    # --- broadcast (each root) ---
    for root in range(world):
        def c(root=root):
            xs = gen_all(f"broadcast/{dtn}/{root}/{n}", world, n, dtype)
            t = xs[rank].to(dev) if rank == root else sentinel(n, dtype, dev)
            dist.broadcast(t, src=root)
            return compare(t, xs[root], dtype, True)
        R.case(f"broadcast root={root} {tag}", c)

    # --- reduce (each root): root gets the result, the others' buffers stay as they were ---
    for root in range(world):
        for opn in ("SUM", "MAX") + (("AVG",) if fl else ()):
            def c(root=root, opn=opn):
                xs = gen_all(f"reduce/{dtn}/{opn}/{root}/{n}", world, n, dtype)
                t = xs[rank].to(dev)
                dist.reduce(t, root, op=getattr(dist.ReduceOp, opn))
                if rank == root:
                    ref, scale, exact = reduce_ref(xs, opn, dtype, world)
                    return compare(t, ref, dtype, exact, scale)
                ok, d = compare(t, xs[rank], dtype, True)
                return ok, ("non-root buffer unchanged" if ok else "non-root buffer modified: " + d)
            R.case(f"reduce {opn} root={root} {tag}", c)

    # --- all_gather (list) ---
    def c_ag():
        xs = gen_all(f"all_gather/{dtn}/{n}", world, n, dtype)
        outs = [sentinel(n, dtype, dev) for _ in range(world)]
        dist.all_gather(outs, xs[rank].to(dev))
        return merge([compare(outs[j], xs[j], dtype, True) for j in range(world)])
    R.case(f"all_gather {tag}", c_ag)

    # --- all_gather_into_tensor ---
    def c_agt():
        xs = gen_all(f"all_gather_into_tensor/{dtn}/{n}", world, n, dtype)
        out = sentinel(world * n, dtype, dev)
        dist.all_gather_into_tensor(out, xs[rank].to(dev))
        return compare(out, torch.cat(xs), dtype, True)
    R.case(f"all_gather_into_tensor {tag}", c_agt)

    # --- reduce_scatter (list) ---
    def c_rs():
        xs = gen_all(f"reduce_scatter/{dtn}/{n}", world, world * n, dtype)
        inp = [c.to(dev) for c in xs[rank].split(n)]
        out = sentinel(n, dtype, dev)
        dist.reduce_scatter(out, inp, op=dist.ReduceOp.SUM)
        mine = [x[rank * n:(rank + 1) * n] for x in xs]
        ref, scale, exact = reduce_ref(mine, "SUM", dtype, world)
        return compare(out, ref, dtype, exact, scale)
    R.case(f"reduce_scatter SUM {tag}", c_rs)

    # --- reduce_scatter_tensor ---
    for opn in (("SUM", "MIN", "AVG", "PREMUL_SUM", "PREMUL_SUM_TENSOR") if fl else ("SUM", "MIN", "AVG")):
        def c(opn=opn):
            if upstream_issue(opn, dtype):
                return None, upstream_issue(opn, dtype)
            xs = gen_all(f"reduce_scatter_tensor/{dtn}/{opn}/{n}", world, world * n, dtype)
            inp = xs[rank].to(dev)
            out = sentinel(n, dtype, dev)
            note = run_reduction(lambda op: dist.reduce_scatter_tensor(out, inp, op=op), opn, dtype, dev)
            mine = [x[rank * n:(rank + 1) * n] for x in xs]
            ref, scale, exact = reduce_ref(mine, opn, dtype, world)
            ok, d = compare(out, ref, dtype, exact, scale)
            return ok, (d + (f" [{note}]" if note else ""))
        R.case(f"reduce_scatter_tensor {opn} {tag}", c)

    # --- all_to_all (lists): equal and unequal chunk sizes ---
    def c_a2a(unequal):
        s = splits_unequal(world, n) if unequal else [[n] * world for _ in range(world)]
        # rank r's chunk for rank j: a slice of xs[r] at offset j*stride
        stride = max(max(row) for row in s)
        xs = gen_all(f"all_to_all/{dtn}/{unequal}/{n}", world, world * stride, dtype)

        def chunk(r, j):
            return xs[r][j * stride: j * stride + s[r][j]]
        inp = [chunk(rank, j).to(dev) for j in range(world)]
        outs = [sentinel(s[j][rank], dtype, dev) for j in range(world)]
        dist.all_to_all(outs, inp)
        return merge([compare(outs[j], chunk(j, rank), dtype, True) for j in range(world)])
    R.case(f"all_to_all equal {tag}", lambda: c_a2a(False))
    R.case(f"all_to_all unequal {tag}", lambda: c_a2a(True))

    # --- all_to_all_single: equal splits (no split sizes) and unequal splits ---
    def c_a2as_eq():
        xs = gen_all(f"all_to_all_single/eq/{dtn}/{n}", world, world * n, dtype)
        out = sentinel(world * n, dtype, dev)
        dist.all_to_all_single(out, xs[rank].to(dev))
        ref = torch.cat([xs[j][rank * n:(rank + 1) * n] for j in range(world)])
        return compare(out, ref, dtype, True)
    R.case(f"all_to_all_single equal {tag}", c_a2as_eq)

    def c_a2as_uneq():
        s = splits_unequal(world, n)
        xs = gen_all(f"all_to_all_single/uneq/{dtn}/{n}", world, max(sum(row) for row in s), dtype)

        def chunk(r, j):
            off = sum(s[r][:j])
            return xs[r][off: off + s[r][j]]
        in_splits = list(s[rank])
        out_splits = [s[j][rank] for j in range(world)]
        inp = xs[rank][:sum(in_splits)].to(dev)
        out = sentinel(sum(out_splits), dtype, dev)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        ref = torch.cat([chunk(j, rank) for j in range(world)])
        ok, d = compare(out, ref, dtype, True)
        return ok, f"{d} in_splits={in_splits} out_splits={out_splits}"
    R.case(f"all_to_all_single unequal {tag}", c_a2as_uneq)

    # --- send/recv: one ordered pair at a time, so blocking order cannot deadlock ---
    for src in range(world):
        for dst in range(world):
            if src == dst:
                continue

            def c(src=src, dst=dst):
                x = gen(f"sendrecv/{dtn}/{src}/{dst}/{n}", src, n, dtype)
                if rank == src:
                    dist.send(x.to(dev), dst)
                    torch.cuda.synchronize(dev)
                    return True, "sent"
                if rank == dst:
                    t = sentinel(n, dtype, dev)
                    dist.recv(t, src)
                    return compare(t, x, dtype, True)
                return True, "not involved"
            R.case(f"send_recv {src}->{dst} {tag}", c)

    # --- batch_isend_irecv: ring shift, two messages to the same peer in one batch ---
    def c_batch():
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        a = [gen(f"batch/a/{dtn}/{n}", r, n, dtype) for r in range(world)]
        b = [gen(f"batch/b/{dtn}/{n}", r, n + 5, dtype) for r in range(world)]
        ra, rb = sentinel(n, dtype, dev), sentinel(n + 5, dtype, dev)
        ops = [dist.P2POp(dist.isend, a[rank].to(dev), nxt),
               dist.P2POp(dist.isend, b[rank].to(dev), nxt),
               dist.P2POp(dist.irecv, ra, prv),
               dist.P2POp(dist.irecv, rb, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return merge([compare(ra, a[prv], dtype, True), compare(rb, b[prv], dtype, True)])
    R.case(f"batch_isend_irecv ring {tag}", c_batch)


def group_cases(R, args):
    rank, world, dev = R.rank, R.world, R.dev
    dtype, n = torch.float32, 1023

    def allreduce_on(group, members, key):
        """all_reduce SUM on `group` whose global ranks are `members`; checks the members' sum."""
        xs = gen_all(key, world, n, dtype)
        t = xs[rank].to(dev)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        ref, scale, exact = reduce_ref([xs[m] for m in members], "SUM", dtype, len(members))
        return compare(t, ref, dtype, exact, scale)

    # --- barrier ---
    def c_barrier():
        if args.init == "eager":
            dist.barrier()
        else:   # without a bound device PyTorch guesses cuda:rank; name ours explicitly
            dist.barrier(device_ids=[dev.index])
        torch.cuda.synchronize(dev)
        return True, "returned"
    R.case("barrier", c_barrier)

    # --- new_group: the full set, and a subset (ranks not in it must get no group) ---
    def c_ng_full():
        g = dist.new_group(ranks=list(range(world)))
        ok, d = allreduce_on(g, list(range(world)), "new_group/full")
        r2 = allreduce_on(g, list(range(world)), "new_group/full/2")   # reuse the communicator
        return merge([(ok, d), r2])
    R.case("new_group full all_reduce", c_ng_full)

    subsets = [[0]] + ([[world - 1]] if world > 1 else []) + ([list(range(world // 2))] if world >= 4 else [])
    for sub in subsets:
        def c(sub=sub):
            g = dist.new_group(ranks=sub)
            if rank not in sub:
                if g not in (None, dist.GroupMember.NON_GROUP_MEMBER):
                    return False, f"non-member got a group: {g!r}"
                return True, "non-member: no group"
            return allreduce_on(g, sub, f"new_group/{sub}")
        R.case(f"new_group subset={sub} all_reduce", c)

    # --- split_group ---
    if not hasattr(dist, "split_group"):
        R.case("split_group", lambda: (None, "torch.distributed.split_group absent in this PyTorch"))
    elif args.init != "eager":
        R.case("split_group", lambda: (None, "lazy init: PyTorch's split_group requires "
                                            "init_process_group(device_id=...)"))
    else:
        try:
            params = list(inspect.signature(dist.split_group).parameters)
        except (TypeError, ValueError):
            params = []
        if rank == 0:
            print(f"split_group signature: {params}", flush=True)

        def do_split(split_ranks):
            if "split_ranks" in params:
                return dist.split_group(split_ranks=split_ranks), "split_group(split_ranks=...)"
            if params and params[0] == "parent_pg" and len(params) > 1:
                return dist.split_group(None, split_ranks), f"split_group(None, split_ranks) {params}"
            raise RuntimeError(f"unknown split_group signature {params}")

        for split in ([list(range(world))], [[r] for r in range(world)], [[0]]):
            def c(split=split):
                g, how = do_split(split)
                mine = next((s for s in split if rank in s), None)
                if mine is None:
                    if g is not None and g != dist.GroupMember.NON_GROUP_MEMBER:
                        return False, f"{how}: non-member got a group {g!r}"
                    return True, f"{how}: non-member (NOCOLOR split) -> None"
                if g is None:
                    return False, f"{how}: member got None"
                ok, d = allreduce_on(g, sorted(mine), f"split/{split}")
                return ok, f"{d} via {how}"
            R.case(f"split_group {split} all_reduce", c)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init", choices=["eager", "lazy"], default="eager")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--only", default="", help="comma list of substrings: run only matching cases")
    ap.add_argument("--timeout", type=float, default=120, help="process-group timeout, seconds")
    args = ap.parse_args()

    rank, world, local_rank = dist_env()
    t_start = time.perf_counter()
    dev = torch.device("cuda", pick_device_index(torch, local_rank))
    torch.cuda.set_device(dev)
    tmo = timedelta(seconds=args.timeout)
    if args.init == "eager":
        dist.init_process_group(backend="nccl", device_id=dev, timeout=tmo)
    else:
        dist.init_process_group(backend="nccl", timeout=tmo)
    store = default_store(dist)
    if rank == 0:
        print(f"collectives: init={args.init} world={world} torch={torch.__version__} "
              f"nccl={nccl_version_str(torch)} device={torch.cuda.get_device_name(dev)} "
              f"gpus={torch.cuda.device_count()}", flush=True)

    R = Runner(rank, world, dev, args.init, [o for o in args.only.split(",") if o])
    for dtn in args.dtypes.split(","):
        dtype = DTYPES[dtn]
        for n in (int(s) for s in args.sizes.split(",")):
            collective_cases(R, dtn, dtype, n)
    group_cases(R, args)

    # Which library is mapped: checked after the collectives, when every lazy load has happened.
    lib_ok, lib_line = nccl_lib_check(rank)
    print(lib_line, flush=True)
    R.case("library_loaded", lambda: (lib_ok, lib_line.split(" ", 2)[2]))

    def c_destroy():
        dist.destroy_process_group()
        return True, "destroyed"
    R.case("destroy_process_group", c_destroy)
    elapsed = time.perf_counter() - t_start

    # --- gather verdicts through the store (not through the library under test) ---
    my_fail = any(s == "FAIL" for _, s, _ in R.results)
    prefix = f"collectives_results/{args.init}"
    gathered = None
    if store is not None:
        try:
            store.set(f"{prefix}/{rank}", json.dumps(R.results))
            if rank == 0:
                keys = [f"{prefix}/{r}" for r in range(world)]
                store.wait(keys, timedelta(seconds=60))
                gathered = [json.loads(store.get(k)) for k in keys]
        except Exception as e:
            print(f"[r{rank}] could not exchange results through the store: {e}", flush=True)
            gathered = None
    if rank != 0:
        # Rank 0 prints the table; this rank's failures were printed as they came. Wait for rank
        # 0 to finish before exiting: torchrun stops every worker as soon as one exits non-zero.
        if store is not None:
            try:
                store.wait([f"{prefix}/done"], timedelta(seconds=90))
            except Exception:
                pass
        sys.exit(1 if my_fail else 0)

    if gathered is None:   # fallback: this rank's view only
        gathered = [R.results]
        print("NOTE: other ranks' results unavailable; table shows rank 0 only", flush=True)
    npass = nfail = nskip = 0
    by_name = {}
    for r, res in enumerate(gathered):
        for name, status, detail in res:
            by_name.setdefault(name, []).append((r, status, detail))
    for name, entries in by_name.items():
        statuses = {s for _, s, _ in entries}
        if "FAIL" in statuses:
            status = "FAIL"
            detail = " | ".join(f"r{r}: {d}" for r, s, d in entries if s == "FAIL")
        elif statuses == {"SKIP"}:
            status, detail = "SKIP", entries[0][2]
        else:
            status = "PASS"
            detail = next((d for r, s, d in entries if r == 0), entries[0][2])
        if len(entries) != len(gathered):
            status, detail = "FAIL", f"ran on {len(entries)} of {len(gathered)} ranks; " + detail
        npass += status == "PASS"
        nfail += status == "FAIL"
        nskip += status == "SKIP"
        print(f"{status} {name}: {detail}", flush=True)
    print(f"SUMMARY collectives init={args.init} world={world}: {npass} pass, {nfail} fail, "
          f"{nskip} skip in {elapsed:.1f}s; {lib_line.split(' ', 2)[2]}", flush=True)
    if store is not None:
        try:
            store.set(f"{prefix}/done", "1")
        except Exception:
            pass
    sys.exit(1 if nfail else 0)


if __name__ == "__main__":
    main()
