#!/usr/bin/env python3
"""Reads what benches/syscall_time.c wrote (st.<pid>.txt files) and says, per process, where its
socket calls' time went: for each thread that moved bytes, the time in sends and receives that
moved them and in looks that moved none (would-block answers and peeks), beside its CPU time;
then, per collective call (from one call's start to the next), the medians over the calls after
the first SKIP: how long a call took, how much of it the process spent in sends and in receives
that moved bytes, the bytes, what one such send and one such receive moved on average, and the
looks. A call's figures hold for a process whose calls are
synchronised one after another, as the benchmark's are (benches/net_bench.cu: one checked call
and three warm-ups come first, hence SKIP 4). docs/NET.md, "What the proxy's calls cost".

usage: scripts/syscall_time.py [--skip 4] DIR_OR_FILE...
"""
import os
import statistics
import sys


def files(args):
    for a in args:
        if os.path.isdir(a):
            yield from sorted(os.path.join(a, f) for f in os.listdir(a) if f.startswith("st.") and f.endswith(".txt"))
        else:
            yield a


def read(path):
    """(threads, calls): T lines as (name, [11 numbers]), K lines as [t, send_ns, sent, recv_ns,
    received, looks, look_ns, sends, receives]."""
    threads, calls = [], []
    for line in open(path):
        f = line.split()
        try:
            if f[0] == "T" and len(f) == 13:
                threads.append((f[1], [int(x) for x in f[2:]]))
            elif f[0] == "K" and len(f) == 11:
                calls.append([int(x) for x in f[2:]])
        except ValueError:
            pass  # a line cut short by a process killed mid-write
    return threads, calls


def main(argv):
    skip = 4
    if len(argv) >= 2 and argv[0] == "--skip":
        skip, argv = int(argv[1]), argv[2:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 2
    for path in files(argv):
        threads, calls = read(path)
        print(f"== {path}")
        for name, (sns, sb, rns, rb, looks, lns, yields, yns, cpu, ns_, nr) in threads:
            if sb + rb == 0:
                continue
            print(
                f"  thread {name}: {ns_} sends {sns / 1e6:.1f} ms for {sb / 1e6:.1f} MB, {nr} receives {rns / 1e6:.1f} ms"
                f" for {rb / 1e6:.1f} MB, {looks} looks {lns / 1e6:.1f} ms, {yields} yields {yns / 1e6:.1f} ms,"
                f" CPU {cpu / 1e6:.1f} ms"
            )
        # One call is the difference between its start and the next one's.
        per = [[b - a for a, b in zip(calls[k], calls[k + 1])] for k in range(skip, len(calls) - 1)]
        if not per:
            continue
        t, sns, sb, rns, rb, looks, lns, ns_, nr = (statistics.median(c) for c in zip(*per))
        each = lambda b, n: f"{b / n / 1024:.0f} KiB" if n else "-"
        print(
            f"  {len(per)} calls, medians: {t / 1e3:.1f} us a call, of it in sends {sns / 1e3:.1f} us and receives"
            f" {rns / 1e3:.1f} us ({100 * (sns + rns) / t:.0f} %), {sb / 1e6:.2f} MB sent, {rb / 1e6:.2f} MB received,"
            f" {ns_:.0f} sends of {each(sb, ns_)} and {nr:.0f} receives of {each(rb, nr)} on average,"
            f" {looks:.0f} looks {lns / 1e3:.1f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
