#!/usr/bin/env python3
"""Reads the files benches/proxy_timeline.c writes (one per process) and says how each library's
NET proxies spent each collective call: its span, and per rank the share of it with a send on the
wire, the sends in flight on average, the longest spell with none, and the gaps between
landings (docs/NET.md, "A proxy's timeline").

usage: scripts/proxy_timeline.py DIR [--detail FUNC:MIB] (a call by its function and the MiB rank 0 sends)
       scripts/proxy_timeline.py DIR --chunks
       scripts/proxy_timeline.py DIR --phases COUNT

--chunks instead says, per process and rank, how the Socket net's chunks (its socket events that
a helper thread, fn-net-help*, started) went: how long after its step started a helper began
moving each one, how long the move took, and how many helpers moved them.

--phases COUNT instead says, per process, for its collective calls of COUNT elements (medians over
them): the time from a call's collective event (its enqueue) to its first step, the span of its
steps (first start to last stop), and from its last stop to the next call's event.

Processes are grouped into runs by the library they loaded and by when they started (the ranks
of one run start together). A step's times: a send from its isend (NCCL: the SendWait state;
ours: the step's start) to its stop; a receive's landing at NCCL's RecvFlushWait state (ours:
the step's stop). A call is the steps each rank started between its collective's start and the
next one's.
"""
import glob
import os
import statistics
import sys

SEND_WAIT, RECV_FLUSH_WAIT = 9, 11


def load(path):
    lib, colls, ops, steps, nets = "?", [], {}, [], []
    for line in open(path):
        p = line.split()
        if not p:
            continue
        if p[0] == "L":
            if "libnccl.so" in p[1]:
                lib = "ref" if "nvidia" in p[1] else "ours"
        elif p[0] == "C":
            colls.append((int(p[2]), int(p[3]), int(p[4]), p[5], int(p[6]), p[7], p[8], p[9]))
        elif p[0] == "O":
            ops[int(p[1])] = dict(ch=int(p[6]), peer=int(p[7]), send=int(p[8]))
        elif p[0] == "S":
            states = [(int(p[i]), int(p[i + 1]), int(p[i + 2])) for i in range(7, len(p), 3)]
            steps.append(
                dict(id=int(p[1]), parent=int(p[2]), t0=int(p[3]), t1=int(p[4]), rank=int(p[5]), step=int(p[6]), states=states)
            )
        elif p[0] == "N":
            net = dict(parent=int(p[2]), t0=int(p[3]), t1=int(p[4]), rank=int(p[5]), thread=int(p[6]), name=p[7], id=p[8])
            if len(p) >= 12:
                net.update(fd=int(p[9]), op=int(p[10]), length=int(p[11]))
            nets.append(net)
    return lib, colls, ops, steps, nets


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def chunks(procs):
    """Per process and rank: the Socket net's chunks' start delays after their steps, and their moves."""
    for lib, _, ops, steps, nets in procs:
        by_id = {s["id"]: s for s in steps}
        got = [n for n in nets if n["name"].startswith("fn-net-help") and n["parent"] in by_id and n["t1"]]
        for rank, op, name in ((r, o, nm) for r in sorted({n["rank"] for n in got}) for o, nm in ((0, "send"), (1, "receive"))):
            side = [n for n in got if n["op"] == op and n["rank"] == rank]
            if not side:
                continue
            delay = [(n["t0"] - by_id[n["parent"]]["t0"]) / 1e3 for n in side]
            took = [(n["t1"] - n["t0"]) / 1e3 for n in side]
            threads = len({n["thread"] for n in side})
            print(
                f"{lib} rank {rank} {name}: {len(side)} chunks by {threads} threads; start after its step p50 "
                f"{pct(delay, 0.5):.0f} us, p99 {pct(delay, 0.99):.0f}, max {max(delay):.0f}; move p50 "
                f"{pct(took, 0.5):.0f} us, p99 {pct(took, 0.99):.0f}, max {max(took):.0f}"
            )


def phases(procs, count):
    """Per process: a call's collective event to its first step, the steps' span, and on to the next call."""
    for lib, colls, _, steps, _ in procs:
        cs = sorted((c[0], c[4]) for c in colls)
        rows = []
        for (t, n), (nxt, _) in zip(cs, cs[1:]):
            inside = [s for s in steps if t <= s["t0"] < nxt and s["t1"]]
            if n != count or not inside:
                continue
            first, last = min(s["t0"] for s in inside), max(s["t1"] for s in inside)
            rows.append(((first - t) / 1e3, (last - first) / 1e3, (nxt - last) / 1e3, (nxt - t) / 1e3))
        if rows:
            med = [statistics.median(r[k] for r in rows) for k in range(4)]
            print(
                f"{lib}: {len(rows)} calls; event to first step {med[0]:.0f} us, steps {med[1]:.0f}, "
                f"last step to next event {med[2]:.0f}, event to event {med[3]:.0f}"
            )


def step_times(lib, s, is_send):
    """(wire start, end, bytes) of a step, or None where it never reached the wire."""
    by = {st: (t, b) for st, t, b in s["states"]}
    if is_send:
        if lib == "ref":
            if SEND_WAIT not in by or not s["t1"]:
                return None
            return by[SEND_WAIT][0], s["t1"], by[SEND_WAIT][1]
        return (s["t0"], s["t1"], s["states"][0][2] if s["states"] else 0) if s["t1"] else None
    if lib == "ref":
        if RECV_FLUSH_WAIT not in by:
            return None
        t = by[RECV_FLUSH_WAIT][0]
        return t, t, by[RECV_FLUSH_WAIT][1]
    return (s["t1"], s["t1"], s["states"][0][2] if s["states"] else 0) if s["t1"] else None


def union(iv):
    tot, end = 0, None
    for a, b in sorted(iv):
        if end is None or a > end:
            tot += b - a
            end = b
        elif b > end:
            tot += b - end
            end = b
    return tot


def longest_idle(iv, lo, hi):
    best, at = 0, lo
    for a, b in sorted(iv):
        best = max(best, a - at)
        at = max(at, b)
    return max(best, hi - at)


def mean_inflight(iv, lo, hi):
    return sum(b - a for a, b in iv) / max(1, hi - lo)


def warm(rows):
    """The calls after the first, which warms up, where there are more than two."""
    return rows[1:] if len(rows) > 2 else rows


def main():
    d = sys.argv[1]
    detail = None
    if "--detail" in sys.argv:
        f, c = sys.argv[sys.argv.index("--detail") + 1].split(":")
        detail = (f, float(c))
    procs = [load(f) for f in glob.glob(os.path.join(d, "tl.*.txt"))]
    if "--chunks" in sys.argv:
        chunks(procs)
        return
    if "--phases" in sys.argv:
        phases(sorted(procs, key=lambda p: (p[0], p[1][0][0] if p[1] else 0)), int(sys.argv[sys.argv.index("--phases") + 1]))
        return
    procs = [p for p in procs if p[1]]
    procs.sort(key=lambda p: p[1][0][0])
    runs, cur = [], []
    for p in procs:
        # A run's ranks make their first call within moments of each other; the next run starts
        # after the last one ended, which may be under a second for a short size range.
        if cur and (p[0] != cur[0][0] or p[1][0][0] - cur[-1][1][0][0] > 0.3e9):
            runs.append(cur)
            cur = []
        cur.append(p)
    if cur:
        runs.append(cur)
    table = {}
    for ri, run in enumerate(runs):
        lib = run[0][0]
        calls = {}  # (func, seq) -> {rank: ([sends], [recvs])}
        for _, colls, ops, steps, _ in run:
            cs = sorted(colls)
            for s in steps:
                op = ops.get(s["parent"])
                if op is None:
                    continue
                k = None
                for c in cs:
                    if c[0] <= s["t0"] and c[1] == s["rank"]:
                        k = c
                    elif c[0] > s["t0"]:
                        break
                if k is None:
                    continue
                tt = step_times(lib, s, op["send"])
                if tt is None:
                    continue
                key = (k[3], k[2])
                rk = calls.setdefault(key, {}).setdefault(s["rank"], ([], []))
                rk[0 if op["send"] else 1].append((tt[0], tt[1], tt[2], op["peer"], op["ch"]))
        for (func, seq), ranks in calls.items():
            allt = [x for r in ranks.values() for side in r for x in side]
            if not allt:
                continue
            lo = min(x[0] for x in allt)
            hi = max(x[1] for x in allt)
            row = dict(span=hi - lo, ranks={}, lo=lo, ranks_raw=ranks, run=ri)
            # A call is known by its function and the bytes its rank 0 sent, the same in both libraries.
            sent0 = sum(x[2] for x in ranks.get(0, ([], []))[0])
            count = round(sent0 / 2**20, 1)
            for r, (snd, rcv) in ranks.items():
                iv = [(a, b) for a, b, *_ in snd]
                lands = sorted(a for a, *_ in rcv)
                gaps = [b - a for a, b in zip(lands, lands[1:])]
                row["ranks"][r] = dict(
                    busy=union(iv) / max(1, hi - lo),
                    inflight=mean_inflight(iv, lo, hi),
                    idle=longest_idle(iv, lo, hi),
                    nsend=len(snd),
                    sbytes=sum(x[2] for x in snd),
                    first=(min(a for a, *_ in snd) - lo) if snd else 0,
                    gapmax=max(gaps) if gaps else 0,
                    msgbytes=statistics.median([x[2] for x in snd]) if snd else 0,
                )
            table.setdefault((func, count), {}).setdefault(lib, []).append(row)
    for (func, count), libs in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        print(f"== {func}, rank 0 sends {count} MiB")
        for lib in ("ours", "ref"):
            rows = warm(libs.get(lib, []))
            if not rows:
                continue
            spans = sorted(r["span"] for r in rows)
            print(f"  {lib}: {len(rows)} calls, span p50 {spans[len(spans) // 2] / 1e3:.0f} us, min {spans[0] / 1e3:.0f}, max {spans[-1] / 1e3:.0f}")
            ranks = sorted({r for row in rows for r in row["ranks"]})
            for r in ranks:
                vals = [row["ranks"][r] for row in rows if r in row["ranks"]]

                def med(k):
                    return statistics.median(v[k] for v in vals)

                print(
                    f"    rank {r}: sends {med('nsend'):.0f} of {med('msgbytes') / 1024:.0f} KiB, {med('sbytes') / 2**20:.1f} MiB;"
                    f" on the wire {100 * med('busy'):.0f} %, in flight {med('inflight'):.2f},"
                    f" longest with none {med('idle') / 1e3:.0f} us; first send at {med('first') / 1e3:.0f} us;"
                    f" longest gap between landings {med('gapmax') / 1e3:.0f} us"
                )
        if detail and detail == (func, count):
            for lib in ("ours", "ref"):
                rows = warm(libs.get(lib, []))
                if not rows:
                    continue
                row = sorted(rows, key=lambda r: r["span"])[len(rows) // 2]
                print(f"  -- {lib}: the median call, span {row['span'] / 1e3:.0f} us (us from its start; s=isend..done KiB, r=landed KiB)")
                for r, (snd, rcv) in sorted(row["ranks_raw"].items()):
                    ev = [(a, f"s{(a - row['lo']) / 1e3:.0f}-{(b - row['lo']) / 1e3:.0f}:{x // 1024}") for a, b, x, *_ in snd]
                    ev += [(a, f"r{(a - row['lo']) / 1e3:.0f}:{x // 1024}") for a, b, x, *_ in rcv]
                    print(f"    rank {r}: " + " ".join(e for _, e in sorted(ev)))


if __name__ == "__main__":
    main()
