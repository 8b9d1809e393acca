#!/usr/bin/env python3
"""Samples, while a benchmark runs, how the threads of its processes use the CPUs, by kind of
thread: the NET proxies (ours: nccl-proxy-d*; NCCL's: NCCL Progress*), the Socket net's helpers
(ours: fn-net-help*; NCCL's: NCCL Sock*), the processes' main threads (named as the process) and
the rest. NCCL names its threads only under NCCL_SET_THREAD_NAME=1; otherwise they keep the
process's name and count as main threads. Every INTERVAL seconds it writes one line: the seconds
since it started, then for each kind "kind=cores/busy/threads/waitMS/maxMS": the CPU it used (in
cores), how many of its threads ran more than half the time, how many there are, and the time
its threads spent runnable but waiting for a CPU (the run-queue delay of
/proc/<pid>/task/<tid>/schedstat), summed and the most of one thread, in ms a second; then
"busy=" the cores the whole machine used and "steal=" the cores its host held back from it (a
virtual machine's steal time, /proc/stat).
Waits that add up to seconds a second mean that threads which have work sit in run queues: a
machine short of cores for everything that spins on it (docs/NOTES.md, "four hosts of two ranks:
the stall is in the Socket net's helper path").

usage: scripts/thread_cpu.py OUT_FILE [PROCESS_NAME (default nb)] [INTERVAL_S (default 0.25)]
Run it in the background beside the benchmark and kill it after.
       scripts/thread_cpu.py --summary FILE...
prints one line per file: each kind's mean cores and mean busy threads over its samples, and the
machine's mean busy cores and its host's mean and peak steal.
"""
import collections
import os
import sys
import time

KINDS = (("help", ("fn-net-help", "NCCL Sock")), ("proxy", ("nccl-proxy", "NCCL Progress")))


def kind_of(thread, process):
    for kind, prefixes in KINDS:
        if thread.startswith(prefixes):
            return kind
    return "main" if thread == process else "other"


def sample(process):
    """{(pid, tid): (thread name, CPU ticks, run-queue ns)} of every process named `process`."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != process:
                    continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    s = f.read()
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    waited = int(f.read().split()[1])
                name = s[s.index("(") + 1 : s.rindex(")")]
                fields = s[s.rindex(")") + 2 :].split()
                out[(pid, tid)] = (name, int(fields[11]) + int(fields[12]), waited)
        except (OSError, ValueError, IndexError):
            pass  # a process or thread that ended while we read it
    return out


def machine():
    """Ticks of /proc/stat's first line: (busy, steal). Steal is time a virtual machine's CPUs were
    ready to run but its host ran something else: a machine that is itself short of CPUs."""
    try:
        f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    except (OSError, ValueError):
        return (0, 0)
    # user nice system idle iowait irq softirq steal ...
    return (f[0] + f[1] + f[2] + f[5] + f[6], f[7] if len(f) > 7 else 0)


def summary(path):
    """One line of means over the samples of a file this script wrote."""
    kinds = collections.defaultdict(lambda: [0.0, 0.0])  # cores, busy threads
    busy, steal, peak, n = 0.0, 0.0, 0.0, 0
    for line in open(path):
        fields = line.split()[1:]
        values = dict(f.split("=", 1) for f in fields if "=" in f)
        try:
            busy += float(values.pop("busy"))
            s = float(values.pop("steal"))
        except (KeyError, ValueError):
            continue  # a line cut short when the sampler was killed
        steal, peak, n = steal + s, max(peak, s), n + 1
        for kind, v in values.items():
            cores, busy_threads = v.split("/")[:2]
            kinds[kind][0] += float(cores)
            kinds[kind][1] += float(busy_threads)
    if n == 0:
        return f"{path}: no samples"
    # A kind missing from a sample had no thread then: it counts as none.
    each = " ".join(f"{k}={c / n:.1f} cores/{b / n:.1f} busy" for k, (c, b) in sorted(kinds.items()))
    return f"{os.path.basename(path)}: {each} machine busy={busy / n:.1f} steal={steal / n:.2f} (peak {peak:.1f}), {n} samples"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--summary":
        for path in sys.argv[2:]:
            print(summary(path))
        return
    process = sys.argv[2] if len(sys.argv) > 2 else "nb"
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.25
    hz = os.sysconf("SC_CLK_TCK")
    t0 = last = time.time()
    prev = {}
    prev_machine = machine()
    with open(sys.argv[1], "w") as out:
        while True:
            cur = sample(process)
            cur_machine = machine()
            now = time.time()
            dt, last = now - last, now
            busy, steal = ((c - p) / hz / dt for c, p in zip(cur_machine, prev_machine))
            prev_machine = cur_machine
            agg = collections.defaultdict(lambda: [0.0, 0, 0, 0.0, 0.0])
            for key, (name, ticks, waited) in cur.items():
                if key not in prev:
                    continue
                a = agg[kind_of(name, process)]
                share = (ticks - prev[key][1]) / hz / dt
                wait_ms = (waited - prev[key][2]) / 1e6 / dt
                a[0] += share
                a[1] += share > 0.5
                a[2] += 1
                a[3] += wait_ms
                a[4] = max(a[4], wait_ms)
            prev = cur
            if agg:
                kinds = " ".join(
                    f"{k}={v[0]:.1f}/{v[1]}/{v[2]}/{v[3]:.0f}/{v[4]:.0f}" for k, v in sorted(agg.items())
                )
                out.write(f"{now - t0:.2f} {kinds} busy={busy:.1f} steal={steal:.2f}\n")
                out.flush()
            time.sleep(interval)


if __name__ == "__main__":
    main()
