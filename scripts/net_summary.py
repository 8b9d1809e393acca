#!/usr/bin/env python3
"""What a scripts/net_bench.sh table says in a few lines: the counts that BENCHMARKS.md and
docs/results/ quote, read from the summary.tsv files net_bench.sh writes (ratio = ref p50 / ours
p50, above 1: ours faster; worst = the lowest ratio of a run pair).

For each file: the points, the geometric mean of the ratios, how many are below 1 in the median
of the runs and in the worst run, how many sizes keep p99 within 1.5 x p50 (ours, the reference),
how often our p99 is at or below the reference's, and our breaks of that bound by band (up to 8
KB, 16 KB-4 MB, above 4 MB). Then per collective its geometric mean, lowest ratio and the sizes
below 1.
--bands: per collective the geometric mean over all sizes and over each band (8 B-8 KB, 16-256
KB, 512 KB-4 MB, above 4 MB; bands with no size left out) and the range: how an A/B of two
builds of ours (--ref-dir) is read, a collective the change leaves alone being the control.
--spread: how the ratios spread over the sizes, for the median of the runs and for the worst run
(lowest, 5th percentile, median, 95th percentile, highest; how many fall under 1, 0.95 and
0.90): how an A/A (our library as both sides) is read, the resolution against which a point
below 1 in an A/B or against NCCL means something (BENCHMARKS.md, "The resolution of a run").

usage: scripts/net_summary.py [--bands | --spread] DIR_OR_TSV...
DIR: a net_bench.sh output folder (OUT), its net/summary.tsv read.
"""
import collections
import math
import os
import sys

BANDS = ((8 << 10, "8 B-8 KB"), (256 << 10, "16-256 KB"), (4 << 20, "512 KB-4 MB"), (None, "above 4 MB"))


def size(b):
    if b >= 1 << 20 and b % (1 << 20) == 0:
        return f"{b >> 20}M"
    if b >= 1 << 10 and b % (1 << 10) == 0:
        return f"{b >> 10}K"
    return str(b)


def geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def band(b):
    return next(name for top, name in BANDS if top is None or b <= top)


def rows(path):
    if os.path.isdir(path):
        path = os.path.join(path, "net", "summary.tsv")
    with open(path) as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            r = dict(zip(head, line.rstrip("\n").split("\t")))
            ratio = float(r["ratio"])
            yield path, {
                "coll": r["coll"],
                "bytes": int(r["bytes"]),
                "ours50": float(r["ours_p50_us"]),
                "ours99": float(r["ours_p99_us"]),
                "ref50": float(r["ref_p50_us"]),
                "ref99": float(r["ref_p99_us"]),
                "ratio": ratio,
                "worst": float(r["worst_ratio"]) if r.get("worst_ratio") else ratio,
            }


def counts(path, rs):
    breaks = [0, 0, 0]
    for r in rs:
        if r["ours99"] > 1.5 * r["ours50"]:
            breaks[0 if r["bytes"] <= 8 << 10 else 1 if r["bytes"] <= 4 << 20 else 2] += 1
    print(f"# {path}")
    print(
        f"# points {len(rs)} geo {geo([r['ratio'] for r in rs]):.2f}"
        f" below {sum(r['ratio'] < 1 for r in rs)}"
        f" worst-run below {sum(r['worst'] < 1 for r in rs)}"
        f" p99<=1.5p50 ours {sum(r['ours99'] <= 1.5 * r['ours50'] for r in rs)}"
        f" ref {sum(r['ref99'] <= 1.5 * r['ref50'] for r in rs)}"
        f" ours p99<=ref p99 {sum(r['ours99'] <= r['ref99'] for r in rs)}"
        f" breaks(<=8K,16K-4M,>4M) {breaks}"
    )
    for coll, cs in by_coll(rs).items():
        below = " ".join(f"{size(r['bytes'])}:{r['ratio']:.2f}" for r in cs if r["ratio"] < 1)
        lowest = min(r["ratio"] for r in cs)
        print(f"#   {coll:15s} geo {geo([r['ratio'] for r in cs]):.2f} min {lowest:.2f} | below {below}")


def bands(path, rs):
    print(f"# {path}")
    for coll, cs in by_coll(rs).items():
        per = collections.OrderedDict((name, []) for _, name in BANDS)
        for r in cs:
            per[band(r["bytes"])].append(r["ratio"])
        ratios = [r["ratio"] for r in cs]
        parts = "  ".join(f"{name} {geo(v):.2f}" for name, v in per.items() if v)
        print(f"#   {coll:14s} all {geo(ratios):.2f}  {parts}  range {min(ratios):.2f}-{max(ratios):.2f}")


def spread(path, rs):
    print(f"# {path}")
    for key, what in (("ratio", "median of the runs"), ("worst", "worst run")):
        v = sorted(r[key] for r in rs)
        p5, p50, p95 = (v[round(q * (len(v) - 1))] for q in (0.05, 0.5, 0.95))
        under = " ".join(f"<{t}: {sum(x < float(t) for x in v)}" for t in ("1", "0.95", "0.90"))
        print(
            f"#   {what:18s} of {len(v)} sizes: lowest {v[0]:.2f} p5 {p5:.2f} median {p50:.2f}"
            f" p95 {p95:.2f} highest {v[-1]:.2f} | {under}"
        )


def by_coll(rs):
    out = collections.OrderedDict()
    for r in rs:
        out.setdefault(r["coll"], []).append(r)
    return out


def main(argv):
    show = counts
    if argv and argv[0] in ("--bands", "--spread"):
        show, argv = (bands if argv[0] == "--bands" else spread), argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    for p in argv:
        got = list(rows(p))
        if not got:
            print(f"net_summary: {p}: no sizes", file=sys.stderr)
            return 1
        show(got[0][0], [r for _, r in got])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
