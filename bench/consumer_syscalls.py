"""What a consumed message costs the broker process over sockets, by system call: lavinpy beside LavinMQ.

The load of bench/scale.py's consumers curve (``--consumers`` connections on one queue, one publisher, 16 B,
manual acks at ``--prefetch``) runs against a fresh broker (scale.py's own start, lavinpy at ``fsync: never``);
``--window`` seconds into amqpperf's measured window, ``perf stat`` counts the broker's system calls by kind
(all its threads) and /proc gives its user and system CPU over the same seconds. Printed per run, per
consumed message (the messages of the window taken as amqpperf's consumed rate times its length): the calls
of each kind, user and system µs, and the derived figures: messages per send (no confirms in this load:
the sends are the consumers' deliveries), reads per message (the consumers' acks, the publisher's few large
reads), epoll waits and changes, futex calls (thread hand-offs). ``--record`` instead samples the broker
with ``perf record -e cpu-clock -g`` over the window and prints the share of each binary (``--sort dso``).

    python3 bench/consumer_syscalls.py --amqpperf <amqpperf> [--brokers lavinpy,lavinmq --consumers 1000
        --prefetch 10 --runs 1 --window 4 --record]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare  # noqa: E402
import scale_curves as sc  # noqa: E402

CALLS = ("read", "readv", "recvfrom", "recvmsg", "write", "writev", "sendto", "sendmsg", "epoll_wait",
         "epoll_pwait", "epoll_pwait2", "epoll_ctl", "futex", "poll", "ppoll", "eventfd2", "getpid", "mmap",
         "munmap", "madvise", "brk", "mprotect", "sched_yield", "clock_nanosleep", "nanosleep", "pread64",
         "pwrite64", "lseek", "fstat", "newfstatat", "ioctl", "fcntl", "getsockopt", "setsockopt", "accept4",
         "rt_sigprocmask", "rt_sigreturn", "timerfd_settime", "io_uring_enter")
READS = ("read", "readv", "recvfrom", "recvmsg")
SENDS = ("write", "writev", "sendto", "sendmsg")


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime, stime) of the whole process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def count_calls(pid: int, seconds: float) -> dict[str, int]:
    events = [f"syscalls:sys_enter_{c}" for c in CALLS] + ["raw_syscalls:sys_enter"]
    listed = subprocess.run(["perf", "list", "--no-desc", "tracepoint"], capture_output=True, text=True).stdout
    available = {word for line in listed.splitlines() for word in line.split()}
    events = [e for e in events if e in available]
    cmd = ["perf", "stat", "--per-thread", "-x", ",", "-p", str(pid)]
    for e in events:
        cmd += ["-e", e]
    cmd += ["--", "sleep", str(seconds)]
    out = subprocess.run(cmd, capture_output=True, text=True).stderr
    counts: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split(",")  # thread, count, unit, event, running ns, ...
        if len(parts) > 4 and parts[1].isdigit():
            name = parts[3].removeprefix("syscalls:sys_enter_").replace("raw_syscalls:sys_enter", "all")
            counts[name] = counts.get(name, 0) + int(parts[1])
            # perf's start-up with -p takes seconds of the sleep: the messages are those of the counters'
            # own running time, a thread's (the sum over threads would count the window once a thread).
            counts["ns"] = max(counts.get("ns", 0), int(parts[4]))
    return counts


def record(pid: int, seconds: float, out: Path) -> str:
    subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "999", "-g", "-o", str(out), "-p", str(pid),
                    "--", "sleep", str(seconds)], capture_output=True)
    return subprocess.run(["perf", "report", "-i", str(out), "--no-children", "--sort", "dso", "--stdio", "-g",
                           "none", "--percent-limit", "0.5"], capture_output=True, text=True).stdout


def one_run(amqpperf: str, name: str, args: argparse.Namespace, workdir: Path) -> dict:
    broker = sc.BROKERS[name](name, workdir)
    broker.start()
    try:
        pid = broker.pids[0]
        warmup, duration = 3.0, 2 * args.window + 6.0
        flags = ["-consumers", str(args.consumers), "-queues", "1", "-publishers", "1", "-size", "16",
                 "-prefetch", str(args.prefetch), "-warmup", str(warmup), "-duration", str(duration)]
        found: dict = {}

        def measure() -> None:
            # The CPU split first, without perf attached (its tracepoints cost the traced process CPU);
            # then the calls, counted over perf's own interval (its start-up is not in it).
            time.sleep(warmup + 1.0)
            t0, c0 = time.monotonic(), cpu_ticks(pid)
            time.sleep(args.window)
            found["seconds"], c1 = time.monotonic() - t0, cpu_ticks(pid)
            tck = os.sysconf("SC_CLK_TCK")
            found["user_s"], found["sys_s"] = (c1[0] - c0[0]) / tck, (c1[1] - c0[1]) / tck
            if args.record:
                found["report"] = record(pid, args.window, workdir / "perf.data")
            else:
                found["calls"] = count_calls(pid, args.window)

        t = threading.Thread(target=measure)
        t.start()
        result = compare.run_amqpperf(amqpperf, broker, flags)
        t.join()
    finally:
        broker.stop()
    rate = result.get("con_rate") or 0
    found["rate"] = rate
    cores = (result.get("cpu_cores") or {}).get("broker")
    found["window_us"] = cores * 1e6 / rate if cores and rate else 0  # amqpperf's: its whole window
    found["threads"] = result.get("thread_cpu")
    return found


def summary(name: str, r: dict, window: float) -> None:
    messages = r["rate"] * r["seconds"]
    print(f"\n{name}: {r['rate']:,.0f} msg/s consumed; user {r['user_s'] / r['seconds']:.2f} cores, "
          f"system {r['sys_s'] / r['seconds']:.2f} over {r['seconds']:.1f} s")
    if not messages:
        return
    print(f"  µs a message: user {r['user_s'] * 1e6 / messages:.2f}, system {r['sys_s'] * 1e6 / messages:.2f} "
          f"(amqpperf's whole window: {r.get('window_us', 0):.2f})")
    if "report" in r:
        print(r["report"])
        return
    calls = r["calls"]
    messages = r["rate"] * calls.pop("ns", 0) / 1e9
    per = {k: v / messages for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v}
    print("  calls a message: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items()))
    sends = sum(calls.get(c, 0) for c in SENDS)
    reads = sum(calls.get(c, 0) for c in READS)
    waits = sum(calls.get(c, 0) for c in ("epoll_wait", "epoll_pwait", "epoll_pwait2"))
    print(f"  messages a send {messages / sends if sends else 0:.2f}; reads a message {reads / messages:.3f}; "
          f"epoll waits {waits / messages:.4f}, ctl {calls.get('epoll_ctl', 0) / messages:.4f}; "
          f"futex {calls.get('futex', 0) / messages:.4f}; all calls {calls.get('all', 0) / messages:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--amqpperf", required=True)
    ap.add_argument("--brokers", default="lavinpy,lavinmq")
    ap.add_argument("--consumers", type=int, default=1000)
    ap.add_argument("--prefetch", type=int, default=10)
    ap.add_argument("--runs", type=int, default=1, help="runs per broker, the brokers alternating")
    ap.add_argument("--window", type=float, default=4.0, help="seconds counted, inside amqpperf's window")
    ap.add_argument("--record", action="store_true", help="perf record instead of counting system calls")
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args()
    sc.set_nofile(True)
    results = []
    for i in range(args.runs):
        for name in args.brokers.split(","):
            with tempfile.TemporaryDirectory() as d:
                r = one_run(args.amqpperf, name, args, Path(d))
            summary(f"{name} run {i + 1}", r, args.window)
            results.append({"broker": name, **r})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
