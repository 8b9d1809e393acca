#!/usr/bin/env python3
"""Records, while a benchmark runs, what the kernel's TCP did for it: the machine's TCP counters
(/proc/net/snmp and /proc/net/netstat) over the run, and, where `ss` is installed, each established TCP socket's state
(`ss -tin`: congestion control, cwnd, pacing rate, bytes, retransmits, and the time its sender was
limited by the receiver's window or its own buffer) as last seen, sampled every INTERVAL seconds,
so that a socket that closes with the benchmark still has its state from just before. Counters
are machine-wide: run nothing else that talks TCP beside it.

It writes OUT_FILE when it is stopped (SIGTERM or SIGINT): a line "sysctl NAME VALUE" for the
settings that shape TCP on `lo`, a line "count NAME DELTA" for every counter that changed, and a
line "sock LOCAL PEER STATE..." per socket. scripts/net_stalls.sh sums a few of them per run
(docs/NOTES.md, "four hosts of two ranks: the stall is in the Socket net's helper path").

usage: scripts/tcp_state.py OUT_FILE [INTERVAL_S (default 0.25)]
"""
import os
import signal
import subprocess
import sys
import time

SYSCTLS = (
    "net/ipv4/tcp_congestion_control",
    "net/core/default_qdisc",
    "net/ipv4/tcp_rmem",
    "net/ipv4/tcp_wmem",
    "net/ipv4/tcp_slow_start_after_idle",
    "net/ipv4/tcp_autocorking",
)


def counters():
    """{"Group.Name": value} of /proc/net/snmp's and /proc/net/netstat's TCP groups, the packets
    the CPUs' softirqs processed and dropped (/proc/net/softnet_stat), and the time the ksoftirqd
    threads ran and waited for a CPU."""
    out = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        try:
            lines = open(path).read().splitlines()
        except OSError:
            continue
        for names, values in zip(lines[::2], lines[1::2]):
            group, names = names.split(":", 1)
            if not group.startswith("Tcp"):
                continue
            for n, v in zip(names.split(), values.split(":", 1)[1].split()):
                try:
                    out[f"{group}.{n}"] = int(v)
                except ValueError:
                    pass
    # Packets of `lo` are processed in softirq context, on the sending CPU or, when softirqs
    # pile up, later in that CPU's ksoftirqd thread, which waits for a CPU like any thread: a
    # flow whose packets sit in different CPUs' queues arrives out of order.
    try:
        for row in open("/proc/net/softnet_stat"):
            f = [int(x, 16) for x in row.split()]
            for n, i in (("processed", 0), ("dropped", 1), ("squeezed", 2)):
                out[f"softnet.{n}"] = out.get(f"softnet.{n}", 0) + f[i]
    except (OSError, ValueError, IndexError):
        pass
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if not open(f"/proc/{pid}/comm").read().startswith("ksoftirqd/"):
                continue
            run, wait = (int(x) for x in open(f"/proc/{pid}/schedstat").read().split()[:2])
        except (OSError, ValueError):
            continue
        out["ksoftirqd.run_us"] = out.get("ksoftirqd.run_us", 0) + run // 1000
        out["ksoftirqd.wait_us"] = out.get("ksoftirqd.wait_us", 0) + wait // 1000
    return out


def sockets():
    """{(local, peer): state line} of the established TCP sockets, or {} without `ss`."""
    try:
        # No timeout=: with one, a SIGTERM during the call killed the sampler (seen under Python 3.11).
        text = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    out = {}
    key = None
    for line in text.splitlines():
        if line[:1].isspace():
            if key:
                out[key] = " ".join(line.split())
        else:
            p = line.split()
            key = (p[2], p[3]) if len(p) >= 4 else None
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.25
    # Handlers first: a run that ends within the first look still gets its file.
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    start = counters()
    last = {}
    while not stop:
        last.update(sockets())
        time.sleep(interval)
    end = counters()
    with open(path, "w") as f:
        for s in SYSCTLS:
            try:
                v = " ".join(open(f"/proc/sys/{s}").read().split())
            except OSError:
                v = "?"
            f.write(f"sysctl {s.replace('/', '.')} {v}\n")
        for k in sorted(end):
            d = end[k] - start.get(k, 0)
            if d:
                f.write(f"count {k} {d}\n")
        for (local, peer), state in sorted(last.items()):
            f.write(f"sock {local} {peer} {state}\n")


if __name__ == "__main__":
    main()
