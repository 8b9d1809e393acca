#!/usr/bin/env python3
"""The NCCL symbols PyTorch 2.11 binds beyond the collectives, each reached
through the PyTorch API that calls it, on 2 GPUs: does it work, or does PyTorch turn the library's
error into a Python exception the program survives?

    torchrun --standalone --nproc_per_node=2 tests/torch/symbols.py                  # NVIDIA's
    LD_PRELOAD=$PWD/target/release/libnccl.so EXPECT_NCCL_LIB=$PWD/target/release/libnccl.so \
      torchrun --standalone --nproc_per_node=2 tests/torch/symbols.py --only window,shrink

case           symbols                                   PyTorch API (sources: tests/torch/README.md)
time_estimate  ncclGroupSimulateEnd                      dist.distributed_c10d._time_estimator
mempool        ncclMemAlloc/Free, ncclCommRegister/      torch.cuda.MemPool(ProcessGroupNCCL.mem_allocator),
               Deregister                                register_mem_pool(pool) / deregister_mem_pool
alloc_hook     ncclCommRegister/Deregister               TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1
scalable_init  ncclCommInitRankScalable                  TORCH_NCCL_RANKS_PER_ROOT=1 (< world size)
shrink         ncclCommShrink                            dist.shrink_group
window         ncclCommWindowRegister/Deregister         register_mem_pool(pool, symm=True)
symm_mem       ncclMemAlloc, ncclCommWindowRegister,     torch.distributed._symmetric_memory with
               ncclDevCommCreate/Destroy, ncclMemFree    set_backend("NCCL"): empty, rendezvous

The torchrun workers only orchestrate: each group of cases runs in a child process per rank with a
store and NCCL process group of its own, under a timeout, so a case that crashes or hangs becomes
a FAIL and the others still run (and the environment-triggered paths get a process group created
under their variable). Inputs are fresh per run (a seed from rank 0) and identical on every rank,
which rebuilds all of them for a float64 CPU reference; outputs are poisoned with NaN first.

Per case (merged over the ranks by rank 0, through the store):
  WORKS    the API ran and the collectives on its memory or communicator match the reference
  HANDLED  the PyTorch call that reaches the symbol raised a Python exception (its text is shown)
           and a checked all_reduce on the default group still passes afterwards
  ABSENT   the API is not in this PyTorch, or PyTorch refuses it before calling NCCL
  FAIL     anything else: a wrong result, an exception from the checks, the default group broken
           afterwards, a crash, a hang, an unclean exit
then a SYMBOL line per symbol (the case status, HANDLED where PyTorch raised on it, NOT REACHED
past that) and `SYMBOLS: n works, n handled, n absent, n fail`; exit status 1 on any FAIL.
$EXPECT_NCCL_LIB, when set, must be the libnccl mapped into every worker and child.
"""

import argparse
import gc
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from collectives import compare, gen_all, merge, reduce_ref, sentinel
from common import dist_env, nccl_lib_check, nccl_version_str, pick_device_index

WORKS, HANDLED, ABSENT, FAIL = "WORKS", "HANDLED", "ABSENT", "FAIL"
F32 = torch.float32
N = 262147          # elements per buffer: 1 MiB and a bit, not a multiple of anything


class Absent(Exception):
    """The API is not in this PyTorch, or PyTorch refused it before calling NCCL."""


class Handled(Exception):
    """A PyTorch call that reaches an NCCL symbol raised."""


def one_line(e, limit=500):
    """An exception as one bounded line, for a result line."""
    return " ".join(f"{type(e).__name__}: {e}".split())[:limit]


class Case:
    """One case on one rank: what became of each symbol its steps reached ("ok" or "raised"),
    and the clean-ups to run whatever happens."""

    def __init__(self):
        self.symbols = {}
        self.cleanups = []

    def step(self, symbols, fn, *args, **kwargs):
        """Calls the PyTorch API fn, which reaches `symbols` in that order. Its exception becomes
        Absent when it reaches no symbol, else Handled, charged to the last symbol the message
        names (PyTorch quotes the failing NCCL call), or the first; the ones before it are ok."""
        try:
            out = fn(*args, **kwargs)
        except Exception as e:
            text = one_line(e)
            if not symbols:
                raise Absent(f"PyTorch refused: {text}") from e
            named = [s for s in symbols if s in text]
            at = symbols.index(named[-1]) if named else 0
            self.symbols.update({s: "ok" for s in symbols[:at]})
            self.symbols[symbols[at]] = "raised"
            raise Handled(text) from e
        self.reached(*symbols)
        return out

    def reached(self, *symbols):
        self.symbols.update({s: "ok" for s in symbols})

    def cleanup(self, symbols, fn, *args):
        """A step run after the case body however it ended (before the default-group check)."""
        self.cleanups.append((symbols, fn, args))


class Ctx(NamedTuple):
    rank: int
    world: int
    dev: torch.device
    seed: str
    backend: object     # the default group's ProcessGroupNCCL


def fresh(ctx, key, n=N):
    """Every rank's float32 input for `key`, new in each run, the same on every rank."""
    return gen_all(f"{ctx.seed}/{key}", ctx.world, n, F32)


def all_reduce_checked(ctx, key, group=None, members=None, n=N):
    """all_reduce SUM on `group` (global ranks `members`), checked against float64."""
    members = members if members is not None else list(range(ctx.world))
    xs = fresh(ctx, key, n)
    t = xs[ctx.rank].to(ctx.dev)
    dist.all_reduce(t, group=group)
    ref, scale, exact = reduce_ref([xs[m] for m in members], "SUM", F32, len(members))
    return compare(t, ref, F32, exact, scale)


def all_gather_checked(ctx, key, group, members, n=N):
    """all_gather_into_tensor into a NaN-poisoned output: proves the communicator moves data even
    when it has one rank (where an in-place all_reduce would pass without doing anything)."""
    xs = fresh(ctx, key, n)
    out = sentinel(len(members) * n, F32, ctx.dev)
    dist.all_gather_into_tensor(out, xs[ctx.rank].to(ctx.dev), group=group)
    return compare(out, torch.cat([xs[m] for m in members]), F32, True)


# ---------------------------------------------------------------------------------------------
# the cases: each returns (ok, detail) or raises Absent / Handled

def case_time_estimate(ctx, c):
    """Inside _time_estimator ProcessGroupNCCL opens an NCCL group; leaving it ends the group with
    ncclGroupSimulateEnd, so the collective is costed, not run."""
    estimator = getattr(dist.distributed_c10d, "_time_estimator", None)
    if estimator is None:
        raise Absent("torch.distributed.distributed_c10d._time_estimator is not in this PyTorch")
    for flag in ("supports_time_estimate", "_supports_time_estimate"):
        if getattr(ctx.backend, flag, True) is False:
            raise Absent(f"ProcessGroupNCCL.{flag} is False")
    xs = fresh(ctx, "time_estimate")
    t = xs[ctx.rank].to(ctx.dev)

    def simulate():
        with estimator(group=dist.group.WORLD, device=ctx.dev) as cm:
            dist.all_reduce(t)
        return cm.estimated_time

    est = c.step(["ncclGroupSimulateEnd"], simulate)
    ok, d = compare(t, xs[ctx.rank], F32, True)
    if not ok:
        return False, f"the simulated all_reduce ran: its buffer changed ({d})"
    if not (isinstance(est, float) and math.isfinite(est) and est > 0):
        return False, f"estimated_time {est!r} is not a positive time"
    return True, f"estimated_time {est:.2f} us for an all_reduce of {N} float32; buffer untouched"


def alloc_in_pool(ctx, pool, xs, ys):
    """Three buffers from `pool`: t (this rank's xs), u (its ys), out (NaN, world * N)."""
    with torch.cuda.use_mem_pool(pool):
        bufs = {"t": torch.empty(N, dtype=F32, device=ctx.dev),
                "u": torch.empty(N, dtype=F32, device=ctx.dev),
                "out": sentinel(ctx.world * N, F32, ctx.dev)}
    bufs["t"].copy_(xs[ctx.rank])
    bufs["u"].copy_(ys[ctx.rank])
    return bufs


def release(*holders):
    """Drops the tensors and pools held, so their memory goes back through the allocator that
    gave it (ncclMemFree for a pool of ProcessGroupNCCL.mem_allocator or symmetric memory)."""
    for h in holders:
        h.clear()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def pool_case(ctx, c, symm):
    """register_mem_pool registers every segment of the pool with the communicator:
    NCCLComm::registerSegment calls ncclCommRegister, or ncclCommWindowRegister when symm;
    deregister_mem_pool undoes it. The pool's allocator is ncclMemAlloc/ncclMemFree."""
    b = ctx.backend
    missing = [a for a in ("mem_allocator", "register_mem_pool", "deregister_mem_pool") if not hasattr(b, a)]
    missing += [f"torch.cuda.{a}" for a in ("MemPool", "use_mem_pool") if not hasattr(torch.cuda, a)]
    if missing:
        raise Absent(f"not in this PyTorch: {', '.join(missing)}")
    if symm and "symm" not in (b.register_mem_pool.__doc__ or ""):
        raise Absent("ProcessGroupNCCL.register_mem_pool takes no symm argument in this PyTorch")
    reg, dereg = (("ncclCommWindowRegister", "ncclCommWindowDeregister") if symm
                  else ("ncclCommRegister", "ncclCommDeregister"))
    tag = "window" if symm else "mempool"
    xs, ys = fresh(ctx, f"{tag}/x"), fresh(ctx, f"{tag}/y")

    allocator = c.step([], lambda: b.mem_allocator)
    pools = {"pool": c.step([], torch.cuda.MemPool, allocator)}
    bufs = c.step(["ncclMemAlloc"], alloc_in_pool, ctx, pools["pool"], xs, ys)
    c.cleanup(["ncclMemFree"], release, bufs, pools)
    c.step([reg], b.register_mem_pool, pools["pool"], **({"symm": True} if symm else {}))

    dist.all_reduce(bufs["t"])
    dist.all_gather_into_tensor(bufs["out"], bufs["u"])
    ref, scale, exact = reduce_ref(xs, "SUM", F32, ctx.world)
    ok, d = merge([compare(bufs["t"], ref, F32, exact, scale),
                   compare(bufs["out"], torch.cat(ys), F32, True)])
    c.step([dereg], b.deregister_mem_pool, pools["pool"])
    return ok, f"all_reduce + all_gather_into_tensor on pool memory: {d}"


def case_mempool(ctx, c):
    return pool_case(ctx, c, symm=False)


def case_window(ctx, c):
    return pool_case(ctx, c, symm=True)


def case_alloc_hook(ctx, c):
    """With TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 the caching allocator's trace hook
    registers every new segment with every communicator (ncclCommRegister) and deregisters it
    when the segment is freed (ncclCommDeregister); nothing of it shows in Python."""
    if "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower():
        raise Absent("ProcessGroupNCCL ignores the hook with expandable segments (PYTORCH_CUDA_ALLOC_CONF)")
    n = 8 * 2**20 + 3     # 32 MiB: more than any block cached so far, so a new segment
    xs = fresh(ctx, "alloc_hook", n)
    held = {"t": c.step(["ncclCommRegister"], torch.empty, n, dtype=F32, device=ctx.dev)}
    held["t"].copy_(xs[ctx.rank])
    dist.all_reduce(held["t"])
    ref, scale, exact = reduce_ref(xs, "SUM", F32, ctx.world)
    ok, d = compare(held["t"], ref, F32, exact, scale)
    c.step(["ncclCommDeregister"], release, held)
    return ok, f"all_reduce on a new 32 MiB segment (registered by the hook, unseen from Python): {d}"


def case_scalable_init(ctx, c):
    """ProcessGroupNCCL::initNCCLComm uses ncclCommInitRankScalable (one unique id per root)
    when the group has more ranks than TORCH_NCCL_RANKS_PER_ROOT (default 128); the child's
    init_process_group(device_id=...) created the default communicator that way."""
    per_root = int(os.environ.get("TORCH_NCCL_RANKS_PER_ROOT", "128"))
    if ctx.world <= per_root:
        return False, f"world {ctx.world} <= TORCH_NCCL_RANKS_PER_ROOT={per_root}: not the scalable path"
    c.reached("ncclCommInitRankScalable")
    ok, d = all_reduce_checked(ctx, "scalable_init")
    roots = -(-ctx.world // per_root)
    return ok, f"all_reduce on the communicator made from {roots} unique ids: {d}"


def case_shrink(ctx, c):
    """shrink_group -> ProcessGroupNCCL::shrink -> ncclCommShrink, called by the survivors only
    (the excluded ranks are presumed dead). Shrinks a full-size subgroup, not the default group,
    which must stay whole for the check that follows every case."""
    shrink = getattr(dist, "shrink_group", None) or getattr(dist.distributed_c10d, "shrink_group", None)
    if shrink is None:
        raise Absent("torch.distributed.shrink_group is not in this PyTorch")
    if getattr(ctx.backend, "supports_shrinking", True) is False:
        raise Absent("ProcessGroupNCCL.supports_shrinking is False")
    everyone = list(range(ctx.world))
    g = dist.new_group(everyone)
    ok, d = all_reduce_checked(ctx, "shrink/parent", group=g)
    if not ok:
        return False, f"the group to shrink does not work: {d}"
    gone = ctx.world - 1
    if ctx.rank == gone:
        return True, "excluded: does not call shrink_group"
    left = [r for r in everyone if r != gone]
    s = c.step(["ncclCommShrink"], shrink, [gone], group=g)
    if s.size() != len(left):
        return False, f"shrunk group has {s.size()} ranks, expected {len(left)}"
    results = [all_gather_checked(ctx, "shrink/gather", s, left)]
    if len(left) > 1:
        results.append(all_reduce_checked(ctx, "shrink/reduce", group=s, members=left))
    ok, d = merge(results)
    return ok, f"on the {len(left)}-rank group left after excluding rank {gone}: {d}"


def case_symm_mem(ctx, c):
    """NCCL symmetric memory: empty() takes ncclMemAlloc memory; the first rendezvous on a group
    registers it and a signal pad as windows (ncclCommWindowRegister) and creates the group's
    device communicator (ncclDevCommCreate, destroyed at exit by NCCLDevCommManager)."""
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:
        raise Absent(f"torch.distributed._symmetric_memory: {one_line(e)}") from e
    missing = [a for a in ("set_backend", "empty", "rendezvous") if not hasattr(symm_mem, a)]
    if missing:
        raise Absent(f"not in torch.distributed._symmetric_memory: {', '.join(missing)}")
    c.step([], symm_mem.set_backend, "NCCL")
    xs = fresh(ctx, "symm_mem")
    held = {"t": c.step(["ncclMemAlloc"], symm_mem.empty, N, dtype=F32, device=ctx.dev)}
    c.cleanup(["ncclMemFree"], release, held)
    t = held["t"]
    t.copy_(xs[ctx.rank])
    held["handle"] = c.step(["ncclCommWindowRegister", "ncclDevCommCreate"],
                            symm_mem.rendezvous, t, dist.group.WORLD.group_name)
    c.reached("ncclDevCommDestroy")   # at exit; the driver checks that the child exits cleanly
    torch.cuda.synchronize(ctx.dev)
    dist.barrier()
    results = [compare(held["handle"].get_buffer(p, [N], F32), xs[p], F32, True)
               for p in range(ctx.world)]
    dist.barrier()   # every rank has read its peers' buffers before they are overwritten
    dist.all_reduce(t)
    ref, scale, exact = reduce_ref(xs, "SUM", F32, ctx.world)
    results.append(compare(t, ref, F32, exact, scale))
    ok, d = merge(results)
    return ok, f"peers' buffers read through the handle + all_reduce on symmetric memory: {d}"


class Spec(NamedTuple):
    group: str               # cases of one group share a child process
    symbols: tuple           # the symbols it can reach, in call order
    api: str
    fn: Callable
    evidence: str = ""       # a word whose presence in the child's log confirms the path


CASES = {
    "time_estimate": Spec("basic", ("ncclGroupSimulateEnd",),
                          "with dist.distributed_c10d._time_estimator(group, device): all_reduce",
                          case_time_estimate),
    "mempool": Spec("basic", ("ncclMemAlloc", "ncclCommRegister", "ncclCommDeregister", "ncclMemFree"),
                    "torch.cuda.MemPool(pg.mem_allocator); pg.register_mem_pool / deregister_mem_pool",
                    case_mempool),
    "alloc_hook": Spec("hook", ("ncclCommRegister", "ncclCommDeregister"),
                       "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1, a new segment",
                       case_alloc_hook),
    "scalable_init": Spec("scalable", ("ncclCommInitRankScalable",),
                          "TORCH_NCCL_RANKS_PER_ROOT=1 at init_process_group(device_id=...)",
                          case_scalable_init, evidence="ncclCommInitRankScalable"),
    "shrink": Spec("shrink", ("ncclCommShrink",), "dist.shrink_group([world-1], group=g)", case_shrink),
    "window": Spec("window", ("ncclMemAlloc", "ncclCommWindowRegister", "ncclCommWindowDeregister",
                              "ncclMemFree"),
                   "pg.register_mem_pool(pool, symm=True) / deregister_mem_pool", case_window),
    "symm_mem": Spec("symm", ("ncclMemAlloc", "ncclCommWindowRegister", "ncclDevCommCreate",
                              "ncclDevCommDestroy", "ncclMemFree"),
                     "_symmetric_memory.set_backend('NCCL'); empty; rendezvous", case_symm_mem),
}
GROUP_ENV = {
    "hook": {"TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "1"},
    # NVIDIA's NCCL names the init call in its INIT log line: evidence for the path taken
    "scalable": {"TORCH_NCCL_RANKS_PER_ROOT": "1", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"},
}
SYMBOLS = ["ncclMemAlloc", "ncclMemFree", "ncclCommRegister", "ncclCommDeregister",
           "ncclCommWindowRegister", "ncclCommWindowDeregister", "ncclCommShrink",
           "ncclCommInitRankScalable", "ncclDevCommCreate", "ncclDevCommDestroy",
           "ncclGroupSimulateEnd"]


# ---------------------------------------------------------------------------------------------
# child: one group of cases on one rank

def run_case(ctx, name):
    """(status, detail, symbols) of one case, then a checked all_reduce on the default group."""
    c = Case()
    t0 = time.perf_counter()
    try:
        ok, detail = CASES[name].fn(ctx, c)
        status = WORKS if ok else FAIL
    except Absent as e:
        status, detail = ABSENT, str(e)
    except Handled as e:
        status, detail = HANDLED, f"PyTorch raised {e}"
    except Exception as e:
        status, detail = FAIL, f"check raised {one_line(e)}"
        traceback.print_exc()
    for symbols, fn, args in reversed(c.cleanups):
        try:
            c.step(symbols, fn, *args)
        except (Absent, Handled) as e:
            status = HANDLED if status == WORKS else status
            detail += f"; clean-up: PyTorch raised {e}"
    if status != ABSENT:
        try:
            ok, d = all_reduce_checked(ctx, f"after/{name}")
        except Exception as e:
            ok, d = False, one_line(e)
        if not ok:
            status, detail = FAIL, f"{detail}; default group broken afterwards: {d}"
        elif status == HANDLED:
            detail += "; the default group's all_reduce is still right afterwards"
    return status, f"{detail} ({time.perf_counter() - t0:.1f} s)", c.symbols


def child_main(args):
    rank, world, local_rank = dist_env()
    dev = torch.device("cuda", pick_device_index(torch, local_rank))
    torch.cuda.set_device(dev)
    names = args.cases.split(",")

    def emit(name, status, detail, symbols):
        print("SYMRESULT " + json.dumps({"case": name, "status": status, "detail": detail,
                                         "symbols": symbols}), flush=True)

    try:
        store = dist.TCPStore("127.0.0.1", args.port, world, is_master=False,
                              timeout=timedelta(seconds=args.pg_timeout))
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=dev,
                                timeout=timedelta(seconds=args.pg_timeout))
    except Exception as e:
        traceback.print_exc()
        for name in names:
            emit(name, FAIL, f"init_process_group raised {one_line(e)}", {})
        return 1
    lib_ok, lib_line = nccl_lib_check(rank)
    ctx = Ctx(rank, world, dev, args.seed, dist.group.WORLD._get_backend(dev))
    for name in names:
        if lib_ok:
            emit(name, *run_case(ctx, name))
        else:
            emit(name, FAIL, lib_line, {})
    dist.destroy_process_group()
    print("SYMTEARDOWN ok", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# driver: the torchrun workers

def run_child(args, rank, group, names, port, seed):
    """Runs one group's child for this rank; returns {case: result} and relays its output."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", group, "--cases", ",".join(names),
           "--port", str(port), "--seed", seed, "--pg-timeout", str(args.pg_timeout)]
    env = dict(os.environ, **GROUP_ENV.get(group, {}))
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=args.timeout)
        how = f"exit status {p.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)   # its own process group (setsid): it and anything it started
        out, _ = p.communicate()
        how = f"killed after {args.timeout:.0f} s"
    lines = out.splitlines()
    results, torn_down = {}, False
    for line in lines:
        print(f"[r{rank}:{group}] {line}", flush=True)
        if line.startswith("SYMRESULT "):
            r = json.loads(line[len("SYMRESULT "):])
            results[r["case"]] = r
        torn_down |= line == "SYMTEARDOWN ok"
    complete, clean = all(n in results for n in names), torn_down and p.returncode == 0
    first_missing = True
    for name in names:
        r = results.get(name)
        if r is None:
            what = f"no result: the child died in this case ({how})" if first_missing else "not run"
            results[name] = {"case": name, "status": FAIL, "detail": what, "symbols": {}}
            first_missing = False
            continue
        if complete and not clean:   # a crash or hang at teardown belongs to no one case
            r["status"] = FAIL
            r["detail"] += (f"; the child did not exit cleanly ({how}, "
                            f"{'after' if torn_down else 'in or before'} destroy_process_group)")
        word = CASES[name].evidence
        if word and r["status"] == WORKS:
            seen = any(word in l for l in lines if not l.startswith("SYMRESULT "))
            r["detail"] += (f"; the NCCL log names {word}" if seen
                            else f"; no NCCL log line names {word}")
    return results


def merge_ranks(per_rank):
    """One (status, detail) from every rank's result of a case."""
    statuses = [r["status"] for r in per_rank]
    if FAIL in statuses:
        status = FAIL
    elif all(s == ABSENT for s in statuses):
        status = ABSENT
    elif ABSENT in statuses:
        status = FAIL
    elif HANDLED in statuses:
        status = HANDLED
    else:
        status = WORKS
    views = {(r["status"], r["detail"]) for r in per_rank}
    if len(views) == 1:
        return status, per_rank[0]["detail"]
    return status, " | ".join(f"r{i}: {r['status']} {r['detail']}" for i, r in enumerate(per_rank))


def symbol_lines(merged, rank0):
    """SYMBOL lines: for each symbol, its status in every case that can reach it."""
    lines = []
    for sym in SYMBOLS:
        parts = []
        for name, spec in CASES.items():
            if sym not in spec.symbols or name not in merged:
                continue
            status, rec = merged[name][0], rank0[name]["symbols"].get(sym)
            if status in (ABSENT, FAIL):
                s = status
            elif rec is None:
                s = "NOT REACHED"
            else:
                s = HANDLED if rec == "raised" else WORKS
            parts.append(f"{s} ({name})")
        if parts:
            lines.append(f"SYMBOL {sym}: {', '.join(parts)}")
    return lines


def driver_main(args):
    rank, world, _ = dist_env()
    t_start = time.perf_counter()
    wait = timedelta(seconds=args.timeout + 60)
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world, timeout=wait))
    if rank == 0:
        store.set("symbols/seed", secrets.token_hex(4))
    seed = store.get("symbols/seed").decode()
    lib_ok, lib_line = nccl_lib_check(rank)
    print(lib_line, flush=True)
    only = [o for o in args.only.split(",") if o]
    names = [n for n, s in CASES.items() if not only or n in only or s.group in only]
    if rank == 0:
        print(f"symbols: world={world} torch={torch.__version__} nccl={nccl_version_str(torch)} "
              f"seed={seed} cases={','.join(names)}", flush=True)

    mine = {}
    for group in dict.fromkeys(CASES[n].group for n in names):
        host = None
        if rank == 0:   # a fresh store per child group: nothing left over from the last one
            host = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                                 timeout=wait)
            store.set(f"symbols/{group}/port", str(host.port))
        port = int(store.get(f"symbols/{group}/port").decode())
        cases = [n for n in names if CASES[n].group == group]
        mine.update(run_child(args, rank, group, cases, port, seed))
        store.set(f"symbols/{group}/done/{rank}", "1")
        if rank == 0:
            store.wait([f"symbols/{group}/done/{r}" for r in range(world)], wait)
            del host

    store.set(f"symbols/results/{rank}", json.dumps(mine))
    my_fail = not lib_ok or any(r["status"] == FAIL for r in mine.values())
    if rank != 0:
        # torchrun stops every worker once one exits non-zero: let rank 0 finish its report
        store.wait(["symbols/done"], wait)
        sys.exit(1 if my_fail else 0)

    store.wait([f"symbols/results/{r}" for r in range(world)], wait)
    every = [json.loads(store.get(f"symbols/results/{r}")) for r in range(world)]
    merged = {n: merge_ranks([e[n] for e in every]) for n in names}
    counts = dict.fromkeys((WORKS, HANDLED, ABSENT, FAIL), 0)
    for n, (status, detail) in merged.items():
        counts[status] += 1
        print(f"{status} {n} [{' '.join(CASES[n].symbols)}] via {CASES[n].api}: {detail}", flush=True)
    for line in symbol_lines(merged, every[0]):
        print(line, flush=True)
    if not lib_ok:
        counts[FAIL] += 1
        print(f"FAIL library_loaded: {lib_line}", flush=True)
    print(f"SYMBOLS: {counts[WORKS]} works, {counts[HANDLED]} handled, {counts[ABSENT]} absent, "
          f"{counts[FAIL]} fail in {time.perf_counter() - t_start:.1f}s; {lib_line.split(' ', 2)[2]}",
          flush=True)
    store.set("symbols/done", "1")
    sys.exit(1 if counts[FAIL] else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma list of case or group names: run only those")
    ap.add_argument("--timeout", type=float, default=30, help="seconds per child group")
    ap.add_argument("--pg-timeout", type=float, default=20, help="children's process-group timeout")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seed", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.exit(child_main(args))
    driver_main(args)


if __name__ == "__main__":
    main()
