#!/usr/bin/env python3
"""Reads the files benches/kernel_trace.c writes (kt.<pid>.txt, one per process) and tells a
collective's time apart into its launch, the skew between the ranks' kernel starts, and the time
inside the kernel, under NVIDIA's NCCL and ferronickel alike.

usage: scripts/kernel_trace.py DIR [--match REGEX] [--skip N] [--groups N,N,...] [--per-call] [--timeline]

A rank is a (process, device) pair; its kernels are those whose name matches --match (searched
in the name and, for a C++ mangled name such as NCCL's, in its plain form), in start order. The
ranks are taken to be one communicator running the same sequence of collectives, so the k-th
matched kernel of every rank is one call (where the counts differ, the minimum is used). --skip
drops each rank's first N kernels (warmup); --groups splits the calls that are left into
consecutive groups (one benchmark size each). Per call: the start skew (last start - first start),
each rank's duration (end - start), the longest of them, the span (last end - first start) and,
where the file has A records (KERNEL_TRACE_API=1), each rank's launch lag (kernel start - start of
the driver API call with the same correlationId). Per group it prints the median, p90 and max of
each, and each rank's median duration; --per-call prints every call. Times in us.

--timeline lays each group's calls side by side, from the call's first kernel start: every
rank's kernel start and end and, where the directory also holds benches/proxy_timeline.c's
tl.<pid>.txt files (both tools loaded in one run), its proxy's steps in the call: each send's
start and completion and each receive's landing, by peer. Medians over the group's calls. The
proxy stamps CLOCK_MONOTONIC; the tracer's C line sets them beside CUPTI's clock.
"""
import argparse
import glob
import math
import os
import re
import statistics
import sys

DEFAULT_MATCH = r"^(ncclDevKernel|ncclKernel|fnColl|fnCopy)"


def plain_name(name):
    """The identifier(s) of an Itanium-mangled name (_Z28ncclDevKernel_...): 'ncclDevKernel_...'."""
    m = re.match(r"_Z(N?)", name)
    if not m:
        return name
    i, parts = m.end(), []
    while True:
        d = re.match(r"\d+", name[i:])
        if not d:
            break
        n, i = int(d.group()), i + d.end()
        parts.append(name[i:i + n])
        i += n
        if not m.group(1):
            break
    return "::".join(parts) or name


def load(path):
    """(header fields, {device: [kernel dicts]}, {correlationId: api start}, dropped)."""
    head, kernels, api, dropped = None, {}, {}, 0
    with open(path) as f:
        for line in f:
            p = line.split(None, 8)
            if not p:
                continue
            if p[0] == "P" and len(p) >= 5:
                head = dict(pid=p[1], host=p[2], hostid=p[3], rank=p[4].strip())
            elif p[0] == "K" and len(p) >= 9:
                kernels.setdefault(int(p[3]), []).append(
                    dict(start=int(p[1]), end=int(p[2]), corr=int(p[5]), name=p[8].strip()))
            elif p[0] == "A" and len(p) >= 4:
                api[int(p[3])] = int(p[1])
            elif p[0] == "D" and len(p) >= 2:
                dropped += int(p[1])
            elif p[0] == "C" and len(p) >= 3 and head is not None:
                head["clock_offset"] = int(p[1]) - int(p[2])
    if head is None:
        pid = os.path.basename(path).split(".")[1]
        head = dict(pid=pid, host="?", hostid="-", rank="-")
    return head, kernels, api, dropped


def load_proxy(path, offset):
    """benches/proxy_timeline.c's steps of one process, on the tracer's clock: a list of
    (start, end, rank, peer, is_send) for each step of an op with a peer."""
    ops, steps = {}, []
    with open(path) as f:
        for line in f:
            p = line.split()
            if p and p[0] == "O" and len(p) >= 9:
                ops[p[1]] = (int(p[5]), int(p[7]), p[8] == "1")
            elif p and p[0] == "S" and len(p) >= 7 and p[2] in ops:
                steps.append((int(p[3]) + offset, int(p[4]) + offset, *ops[p[2]]))
    steps.sort()
    return steps


def timeline(ranks, calls, first, size, proxy):
    """Prints a group's calls side by side (see --timeline)."""
    rows = {}
    for k in range(first, first + size):
        ref = calls[k]["ref"]
        until = calls[k + 1]["ref"] if k + 1 < len(calls) else float("inf")
        for i, r in enumerate(ranks):
            x = r["kernels"][k]
            rows.setdefault((i, 0, 0, 0, "kernel start"), []).append(x["start"] - ref)
            rows.setdefault((i, 0, 0, 1, "kernel end"), []).append(x["end"] - ref)
            seen = set()
            # A step belongs to the call it ends in (a receive may be posted before its kernel
            # starts); the first one to each peer and direction counts.
            for t0, t1, rank, peer, is_send in proxy.get(r["pid"], []):
                if not ref <= t1 < until or (peer, is_send) in seen:
                    continue
                seen.add((peer, is_send))
                if is_send:
                    rows.setdefault((i, 1, peer, 0, f"proxy send to rank {peer}: start"), []).append(t0 - ref)
                    rows.setdefault((i, 1, peer, 1, f"proxy send to rank {peer}: done"), []).append(t1 - ref)
                else:
                    rows.setdefault((i, 2, peer, 0, f"proxy receive from rank {peer}: landed"), []).append(t1 - ref)
    print(f"  timeline, us from each call's first kernel start (medians over {size} calls):")
    for (i, *_, label), values in sorted(rows.items()):
        r = ranks[i]
        print(f"    pid {r['pid']} dev {r['dev']}  {label:<36}{us(statistics.median(values)):>10}")


def pct(values, q):
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def us(ns):
    return f"{ns / 1e3:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="directory holding kt.<pid>.txt files")
    ap.add_argument("--match", default=DEFAULT_MATCH, help=f"kernel name regex (default {DEFAULT_MATCH})")
    ap.add_argument("--skip", type=int, default=0, help="drop each rank's first N matched kernels")
    ap.add_argument("--groups", help="comma list of consecutive call counts, one per benchmark size")
    ap.add_argument("--per-call", action="store_true", help="print every call's numbers")
    ap.add_argument("--timeline", action="store_true",
                    help="each group's calls side by side, with the proxy's steps where tl.<pid>.txt files are beside")
    args = ap.parse_args()
    pattern = re.compile(args.match)

    ranks, dropped, incomplete = [], 0, 0
    # By pid: the ranks a benchmark forks one after another come out in rank order.
    paths = sorted(glob.glob(os.path.join(args.dir, "kt.*.txt")),
                   key=lambda p: (int(p.split(".")[-2]) if p.split(".")[-2].isdigit() else 0, p))
    for path in paths:
        head, kernels, api, d = load(path)
        dropped += d
        for dev, ks in sorted(kernels.items()):
            good = [k for k in ks if pattern.search(k["name"]) or pattern.search(plain_name(k["name"]))]
            complete = [k for k in good if k["start"] and k["end"] >= k["start"]]
            incomplete += len(good) - len(complete)
            complete.sort(key=lambda k: k["start"])
            if complete:
                ranks.append(dict(head, dev=dev, kernels=complete[args.skip:], api=api))
    if dropped:
        print(f"warning: {dropped} records were dropped by the tracer; calls may be misaligned")
    if incomplete:
        print(f"note: {incomplete} matched kernels without a start or end (still running at exit) left out")
    if not ranks:
        sys.exit(f"no kernels matching {args.match!r} in {args.dir}/kt.*.txt")
    counts = [len(r["kernels"]) for r in ranks]
    ncalls = min(counts)
    print(f"{len(paths)} files, {len(ranks)} ranks (process, device) with matched kernels;"
          f" kernels after --skip {args.skip}: {counts}")
    if len(set(counts)) > 1:
        print(f"warning: the counts differ; pairing the first {ncalls} of each")
    with_api = sum(1 for r in ranks if r["api"])
    if with_api:
        print(f"launch lag from the {with_api} of {len(ranks)} ranks whose files have A records")

    calls = []
    for k in range(ncalls):
        ks = [r["kernels"][k] for r in ranks]
        starts = [x["start"] for x in ks]
        durs = [x["end"] - x["start"] for x in ks]
        lags = [x["start"] - r["api"][x["corr"]] for r, x in zip(ranks, ks) if x["corr"] in r["api"]]
        calls.append(dict(ref=min(starts), skew=max(starts) - min(starts), durs=durs, longest=max(durs),
                          span=max(x["end"] for x in ks) - min(starts), lags=lags,
                          names={plain_name(x["name"]) for x in ks}))

    proxy = {}
    if args.timeline:
        for r in ranks:
            tl = os.path.join(args.dir, f"tl.{r['pid']}.txt")
            if os.path.exists(tl) and "clock_offset" in r:
                proxy[r["pid"]] = load_proxy(tl, r["clock_offset"])
        print(f"proxy steps from {len(proxy)} of {len(ranks)} ranks (tl.<pid>.txt beside, and the tracer's clock line)")

    sizes = [int(g) for g in args.groups.split(",")] if args.groups else [ncalls]
    if sum(sizes) != ncalls:
        print(f"warning: --groups adds up to {sum(sizes)} calls, there are {ncalls}")
    at = 0
    for gi, size in enumerate(sizes):
        group = calls[at:at + size]
        first = at
        at += size
        if not group:
            print(f"\n== group {gi}: no calls")
            continue
        names = sorted(set().union(*(c["names"] for c in group)))
        print(f"\n== group {gi}: {len(group)} calls (calls {first}..{first + len(group) - 1}), kernels {', '.join(names)[:120]}")
        rows = [("start skew", [c["skew"] for c in group]),
                ("duration, every rank", [d for c in group for d in c["durs"]]),
                ("longest duration", [c["longest"] for c in group]),
                ("span", [c["span"] for c in group])]
        lags = [x for c in group for x in c["lags"]]
        if lags:
            rows.append(("launch lag, every rank", lags))
        elif with_api:
            rows.append(("launch lag, every rank", None))
        print(f"  {'us':<24}{'median':>10}{'p90':>10}{'max':>10}")
        for label, values in rows:
            if values:
                print(f"  {label:<24}{us(statistics.median(values)):>10}{us(pct(values, 0.9)):>10}{us(max(values)):>10}")
            else:
                print(f"  {label:<24}  (no driver API call with a kernel's correlationId)")
        for i, r in enumerate(ranks):
            med = statistics.median(c["durs"][i] for c in group)
            print(f"  pid {r['pid']} dev {r['dev']} host {r['host']} hostid {r['hostid']} rank {r['rank']}: median duration {us(med)} us")
        if args.timeline:
            timeline(ranks, calls, first, len(group), proxy)
        if args.per_call:
            print(f"  {'call':>6}{'skew':>10}{'span':>10}{'longest':>10}{'lag max':>10}  durations")
            for j, c in enumerate(group):
                lag = us(max(c["lags"])) if c["lags"] else "-"
                print(f"  {first + j:>6}{us(c['skew']):>10}{us(c['span']):>10}{us(c['longest']):>10}{lag:>10}  "
                      + " ".join(us(d) for d in c["durs"]))


if __name__ == "__main__":
    main()
