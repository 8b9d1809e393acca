#!/usr/bin/env python3
"""Checks a trace written by the test profiler plugin (tests/c/profiler_plugin.c) on GPUs
(scripts/gpu_check.sh, group plugins): every event stopped once, collectives named AllReduce and
AllGather with algorithm and protocol (the all-gather counted in bytes as NCCL counts it), sends and receives, and with --net the NET proxy's op and
step events, steps that moved bytes under an op.

usage: profiler_trace.py TRACE [--net]
"""
import re
import sys


def main():
    args = sys.argv[1:]
    net = "--net" in args
    paths = [a for a in args if not a.startswith("--")]
    if len(paths) != 1:
        print(__doc__)
        return 2
    events = {}
    kinds = {}
    errors = []
    order = []
    for n, line in enumerate(open(paths[0]), 1):
        m = re.match(r"(\d+) (\S+) (\w+) (.*) stopped=(\d+) states=(\d+) bytes=(\d+)$", line.strip())
        if not m:
            errors.append(f"line {n}: not an event: {line.strip()!r}")
            continue
        ev = {
            "parent": m[2],
            "kind": m[3],
            "fields": dict(kv.split("=", 1) for kv in m[4].split() if "=" in kv),
            "stopped": int(m[5]),
            "states": int(m[6]),
            "bytes": int(m[7]),
            "line": n,
        }
        order.append(ev)
        kinds.setdefault(ev["kind"], []).append(ev)
        if ev["stopped"] != 1:
            errors.append(f"line {n}: {ev['kind']} stopped {ev['stopped']} times: {line.strip()}")
    colls = kinds.get("Coll", [])
    funcs = {c["fields"].get("func") for c in colls}
    for f in ("AllReduce", "AllGather"):
        if f not in funcs:
            errors.append(f"no Coll event with func={f} (funcs seen: {sorted(x for x in funcs if x)})")
    for c in colls:
        if c["fields"].get("algo") in (None, "(null)") or c["fields"].get("proto") in (None, "(null)"):
            errors.append(f"line {c['line']}: Coll without algo/proto")
        if c["parent"] == "-":
            errors.append(f"line {c['line']}: Coll without a parent group")
        # NCCL plans an all-gather as bytes, and its events say so; an all-reduce keeps its type.
        want = {"AllGather": "ncclInt8", "AllReduce": "ncclFloat32"}.get(c["fields"].get("func"))
        if want and c["fields"].get("dtype") != want:
            errors.append(f"line {c['line']}: {c['fields'].get('func')} with dtype={c['fields'].get('dtype')}, NCCL reports {want}")
    p2p = {p["fields"].get("func") for p in kinds.get("P2p", [])}
    for f in ("Send", "Recv"):
        if f not in p2p:
            errors.append(f"no P2p event with func={f}")
    if not kinds.get("Group"):
        errors.append("no Group event")
    if net:
        ops = kinds.get("ProxyOp", [])
        steps = kinds.get("ProxyStep", [])
        if not ops:
            errors.append("no ProxyOp event (NET)")
        if not steps:
            errors.append("no ProxyStep event (NET)")
        moved = [s for s in steps if s["states"] >= 1 and s["bytes"] > 0]
        if steps and not moved:
            errors.append("no ProxyStep recorded a state with bytes")
        if any(s["parent"] == "-" for s in steps):
            errors.append("a ProxyStep without its ProxyOp parent")
        for send in ("0", "1"):
            if ops and not any(o["fields"].get("send") == send for o in ops):
                errors.append(f"no ProxyOp with send={send}")
    counts = ", ".join(f"{k} {len(v)}" for k, v in sorted(kinds.items()))
    for e in errors[:20]:
        print("PROFILER TRACE ERROR:", e)
    print(f"PROFILER TRACE: {'PASS' if not errors else 'FAIL'} ({len(order)} events: {counts})")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
