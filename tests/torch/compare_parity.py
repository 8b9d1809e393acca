#!/usr/bin/env python3
"""Compare training runs made with NVIDIA's NCCL (reference) and with ferronickel (ours).

    python3 tests/torch/compare_parity.py REF.pt OURS.pt [REF2.pt OURS2.pt ...]

Files come in (reference, ours) pairs, as written by ddp_parity.py or fsdp2.py. Every "ours" run
is compared with the first reference run (losses of every step and every final parameter);
every further reference run is compared with the first one too, to show whether the test itself
is deterministic on this machine. Timing: the median of each run's per-step median, ours/ref.

Tolerances (|ours - ref| <= atol + rtol * |ref|, on losses and on parameters):
  ddp:  rtol 1e-5, atol 1e-7.  Both runs do the same fp32 arithmetic except inside the
        all-reduce, and a 2-rank all-reduce adds a+b: IEEE addition is commutative and DDP's
        1/world scaling is exact, so a correct library gives bitwise-identical results; the
        tolerance admits a few ulps per step over 50 steps, nothing a wrong element could hide in.
  fsdp2 (bf16 compute, fp32 reduce): rtol 1e-4, atol 1e-6.  Bitwise is expected for the same
        reason, but one ulp of fp32 in a gradient can flip the bf16 rounding of a parameter's
        compute copy (2^-8 relative in one weight), which moves later losses slightly.
Whether the runs are bitwise equal is reported in any case. Override with --rtol/--atol.
Exit status 1 when a comparison fails, when a run did not map the library it expected, or when
the reference and ours mapped the same libnccl file (LD_PRELOAD did not take).
--max-time-ratio R also fails when ours/ref exceeds R (default: timing is only reported).
"""

import argparse
import re
import statistics
import sys

import torch

DEFAULT_TOL = {"ddp": (1e-5, 1e-7), "fsdp2": (1e-4, 1e-6)}


def load(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:   # older formats or types outside the weights_only allow-list
        return torch.load(path, map_location="cpu", weights_only=False)


def lib_real(run):
    m = re.search(r"real=(\S+)", run.get("lib", ""))
    return m.group(1) if m else None


def diff_stats(a, b, rtol, atol):
    """(bitwise_equal, max_abs_diff, max_rel_diff, n_outside_tol, n) for two tensors."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    d = (a64 - b64).abs()
    rel = d / b64.abs().clamp_min(1e-30)
    outside = int((~(d <= atol + rtol * b64.abs())).sum().item())
    return (bool(torch.equal(a, b)), d.max().item() if d.numel() else 0.0,
            rel.max().item() if rel.numel() else 0.0, outside, d.numel())


def compare_runs(ref, other, label, rtol, atol):
    """Prints the comparison; returns (ok, bitwise, max_abs_loss, max_abs_param)."""
    ok = True
    lr, lo = ref["losses"], other["losses"]
    if lr.shape != lo.shape:
        print(f"  {label}: losses shape {tuple(lo.shape)} != {tuple(lr.shape)}")
        return False, False, float("nan"), float("nan")
    beq, lmax, lrel, lout, n = diff_stats(lo, lr, rtol, atol)
    print(f"  {label}: losses ({n} steps) bitwise={'yes' if beq else 'no'} max_abs_diff={lmax:.3g} "
          f"max_rel_diff={lrel:.3g} outside_tol={lout}")
    if lout:
        ok = False
        bad = [i for i in range(n) if not abs(lo[i].item() - lr[i].item()) <= atol + rtol * abs(lr[i].item())]
        print(f"    first differing step {bad[0]}: ref {lr[bad[0]].item()!r} {label} {lo[bad[0]].item()!r}")
    bitwise = beq
    pr, po = ref["params"], other["params"]
    if set(pr) != set(po):
        print(f"  {label}: parameter names differ: only ref {sorted(set(pr) - set(po))}, "
              f"only {label} {sorted(set(po) - set(pr))}")
        return False, False, lmax, float("nan")
    pmax, pmax_name, nbit, nelem, nout = 0.0, "", 0, 0, 0
    for name in pr:
        a, b = po[name], pr[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            print(f"  {label}: {name}: {tuple(a.shape)}/{a.dtype} vs ref {tuple(b.shape)}/{b.dtype}")
            ok = False
            continue
        beq, m, _, out, n = diff_stats(a, b, rtol, atol)
        nbit += beq
        nelem += n
        nout += out
        if m > pmax or not pmax_name:
            pmax, pmax_name = m, name
        if out:
            print(f"    {name}: {out}/{n} elements outside tolerance, max_abs_diff={m:.3g}")
    bitwise = bitwise and nbit == len(pr)
    print(f"  {label}: params ({len(pr)} tensors, {nelem} elements) bitwise_equal_tensors={nbit}/{len(pr)} "
          f"max_abs_diff={pmax:.3g} ({pmax_name}) outside_tol={nout}")
    ok = ok and nout == 0
    return ok, bitwise, lmax, pmax


def main():
    ap = argparse.ArgumentParser(description="compare NCCL and ferronickel training runs")
    ap.add_argument("files", nargs="+", help="REF.pt OURS.pt [REF2.pt OURS2.pt ...]")
    ap.add_argument("--rtol", type=float)
    ap.add_argument("--atol", type=float)
    ap.add_argument("--max-time-ratio", type=float, default=0.0)
    args = ap.parse_args()
    if len(args.files) < 2 or len(args.files) % 2:
        sys.exit("give the runs in (reference, ours) pairs")
    refs = [load(p) for p in args.files[0::2]]
    ours = [load(p) for p in args.files[1::2]]
    kind = refs[0].get("kind", "?")
    family = "ddp" if kind.startswith("ddp") else "fsdp2" if kind.startswith("fsdp2") else "ddp"
    rtol, atol = DEFAULT_TOL[family]
    rtol = args.rtol if args.rtol is not None else rtol
    atol = args.atol if args.atol is not None else atol

    ok = True
    print(f"compare_parity: kind={kind} pairs={len(refs)} rtol={rtol} atol={atol}")
    for i, (p, r) in enumerate(zip(args.files, [x for pair in zip(refs, ours) for x in pair])):
        who = "ref " if i % 2 == 0 else "ours"
        print(f"  {who} {p}: {r.get('lib', '?')} nccl={r.get('nccl_version', '?')} "
              f"torch={r.get('torch_version', '?')} device={r.get('device', '?')} "
              f"median_ms={r.get('median_ms', float('nan')):.3f}"
              + (f" ranks_in_sync={r['ranks_in_sync']}" if "ranks_in_sync" in r else ""))
        if r.get("kind") != kind:
            print(f"    kind {r.get('kind')} != {kind}")
            ok = False
        if not r.get("lib_ok", False):
            print("    this run did not map the expected libnccl")
            ok = False
        if r.get("ranks_in_sync") is False:
            print("    the ranks' parameters diverged in this run")
            ok = False
    ref_libs = {lib_real(r) for r in refs} - {None}
    our_libs = {lib_real(r) for r in ours} - {None}
    if ref_libs & our_libs:
        print(f"  reference and ours mapped the same library {sorted(ref_libs & our_libs)}")
        ok = False

    bitwise_all, lmax_all, pmax_all = True, 0.0, 0.0
    for i, o in enumerate(ours):
        c_ok, bw, lm, pm = compare_runs(refs[0], o, f"ours#{i + 1}", rtol, atol)
        ok = ok and c_ok
        bitwise_all = bitwise_all and bw
        lmax_all, pmax_all = max(lmax_all, lm), max(pmax_all, pm)
    ref_det = "n/a (one reference run)"
    for i, r in enumerate(refs[1:]):
        _, bw, lm, pm = compare_runs(refs[0], r, f"ref#{i + 2}", rtol, atol)
        ref_det = ("bitwise" if bw else f"NOT bitwise (loss diff {lm:.3g}, param diff {pm:.3g}): "
                   "the reference itself is not deterministic here")

    ref_t = [r["median_ms"] for r in refs]
    our_t = [o["median_ms"] for o in ours]
    ratio = statistics.median(our_t) / statistics.median(ref_t)
    print(f"REF-DETERMINISM: {ref_det}")
    print(f"TIME: ours/ref = {ratio:.3f} per step (median of run medians: ref "
          f"{statistics.median(ref_t):.3f} ms {['%.3f' % t for t in ref_t]}, ours "
          f"{statistics.median(our_t):.3f} ms {['%.3f' % t for t in our_t]})")
    if args.max_time_ratio and ratio > args.max_time_ratio:
        print(f"  ours/ref {ratio:.3f} exceeds --max-time-ratio {args.max_time_ratio}")
        ok = False
    print(f"PARITY: {'PASS' if ok else 'FAIL'} kind={kind} bitwise={'yes' if bitwise_all else 'no'} "
          f"max_abs_diff loss={lmax_all:.3g} params={pmax_all:.3g} (rtol {rtol} atol {atol}) "
          f"time ours/ref={ratio:.3f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
