"""Deduplication's cost in scenario b's shape: broker CPU per message with deduplication off and on.

amqpperf cannot declare a queue with arguments or give each message a header, so this script has its
own client (pre-encoded frames, the message identifier spliced into a fixed-width header value): one
publisher process (1 KiB persistent, ``--confirm`` outstanding, 256 as b) and one consumer process
(prefetch 256, one basic.ack per message, as b), on one durable classic queue. Modes:

- ``off``: a plain queue, messages without headers (b itself);
- ``off-ids``: a plain queue, every message with an identifier header (what the header alone costs);
- ``on``: ``x-message-deduplication`` on, messages without headers;
- ``on-ids``: deduplication on, every message with a new identifier (each remembered and written);
- ``retry``: a plain queue with delayed retries configured (``x-delayed-retry-type: all``, min 1 s)
  and no failures (every message acknowledged): what retries cost when nothing comes back.

Each run gets a fresh broker (fsync always, the default) started from ``--tree`` (a source tree; give
two, comma separated, to alternate an old and a new tree in the same minutes). The figure is the
broker's CPU (utime + stime from /proc) over the measured window divided by the messages consumed in
it; beside it the event loop thread's share, the compiled store's fsync workers' share (the threads
named ``lavinpy-fsync``: what a group commit's extra file costs in kernel fsync work) and the
messages per group commit (from the Prometheus flush count). On a loaded machine the rate moves the
figure (a group commit's cost is shared by the messages it confirms): ``--rate`` publishes at a fixed
rate every mode reaches, so the modes share the commit pattern and the difference is the work per
message. Run from the repository root:

    python3 bench/dedup_bench.py --rounds 3
    python3 bench/dedup_bench.py --tree ../old,. --modes off-ids,on-ids --rounds 3
    python3 bench/dedup_bench.py --modes off,retry --rounds 3

On a shared machine one run of a mode moves by a third from one minute to the next, more than the
difference sought. ``--pairs N`` measures that difference so the machine's drift cancels: one broker per
tree (a block), both modes' queues in it (``--modes``: the base first, default ``off,on-ids``), each
with its own publisher and consumer connected throughout; a shared gate says which publisher publishes
(the other idles without a frame). Primed (the deduplicating queue's cache filled, so each new
identifier forgets the oldest, as in a long run), then N pairs of short windows, base and other mode
back to back (``--pair-seconds`` each, 0.5, measured after ``--pair-settle``, 0.1, in which the other
mode's last confirms and deliveries drain), the order alternating (ABBA: a steady drift adds to both
sides alike). Each pair gives the other mode's ratio to the base in broker CPU a message (every
thread's, and the event loop thread's: run time from /proc's schedstat, in nanoseconds) and in messages
consumed a second; printed: each ratio's median over the pairs with a 95 % confidence interval of that
median (order statistics: no assumption on the noise's shape) and its quartiles. Many short pairs, not a
few long runs: the machine's load changes within seconds, and what two adjacent half-seconds share
cancels in their ratio. ``--rate`` paces each turn's publishing there too (the rate then the same in
both modes, the CPU a message compared at equal commit sizes). ``--blocks`` repeats the blocks, the
trees alternated:

    python3 bench/dedup_bench.py --pairs 100 --tree ../old,. --blocks 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from pamqp import body as content_body
from pamqp import commands, frame, header

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_client import Conn  # noqa: E402

QUEUE = "dedup-bench"
ID_HEADER = "x-deduplication-header"
ID_WIDTH = 16
MODES = ("off", "off-ids", "on", "on-ids", "retry")
_ACK_HEAD = struct.Struct(">BHIHHQ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_ns(pid: int) -> dict[str, int]:
    """Each of the process's threads' CPU time so far (``/proc/<pid>/task/<tid>/schedstat``: nanoseconds,
    where ``stat``'s clock ticks are 10 ms, a share of a short window)."""
    times = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            times[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # the thread ended meanwhile
            continue
    return times


def run_ns_between(before: dict[str, int], after: dict[str, int], pid: int) -> tuple[int, int]:
    """The CPU time every thread and the event loop thread took between two ``run_ns`` (a thread that
    ended meanwhile is left out: a sum of the totals would go back by its whole time)."""
    total = sum(ns - before.get(tid, 0) for tid, ns in after.items())
    return total, after.get(str(pid), 0) - before.get(str(pid), 0)


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds per thread kind: "loop" (the main thread), "fsync" (the compiled store's fsync
    workers), "other"."""
    kinds = {"loop": 0.0, "fsync": 0.0, "other": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        kind = "loop" if tid == str(pid) else "fsync" if name == "lavinpy-fsync" else "other"
        kinds[kind] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return kinds


def flush_count(port: int) -> float:
    """The store's group commits so far (``io_sync_ops_total`` on the Prometheus port)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("lavinpy_io_sync_ops_total"):
                return float(line.split()[-1])
    return 0.0


def message_template(size: int, with_id: bool, queue: str = QUEUE) -> tuple[bytes, bytes]:
    """The frames of one message, split where the identifier goes ((whole, b"") without one)."""
    body = b"x" * size
    marker = b"#" * ID_WIDTH
    props = commands.Basic.Properties(delivery_mode=2, headers={ID_HEADER: marker.decode()} if with_id else None)
    raw = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
           + frame.marshal(header.ContentHeader(0, len(body), props), 1)
           + frame.marshal(content_body.ContentBody(body), 1))
    if not with_id:
        return raw, b""
    at = raw.index(marker)
    return raw[:at], raw[at + ID_WIDTH:]


class _Publisher(Conn):
    """Takes basic.ack (the confirms) without decoding a frame: the broker may confirm one by one."""

    def _method(self, raw: bytes, channel: int) -> None:
        if raw[7:11] == b"\x00\x3c\x00\x50":  # basic.ack: delivery tag, multiple
            (tag,) = struct.unpack_from(">Q", raw, 11)
            if tag > self.acked:
                self.acked = tag
            return
        super()._method(raw, channel)


async def _publish(port: int, seconds: float, window: int, size: int, with_id: bool, start_id: int,
                   rate: float = 0.0, queue: str = QUEUE) -> None:
    conn = await _Publisher().open("127.0.0.1", port)
    await conn.confirm_select()
    head, tail = message_template(size, with_id, queue)
    sent, next_id = 0, start_id
    batch = 32
    deadline = time.monotonic() + seconds
    assert conn.writer is not None
    started = time.monotonic()
    while time.monotonic() < deadline and not conn.error:
        if sent - conn.acked + batch > window:
            await asyncio.sleep(0.0005)
            continue
        if rate and sent >= (time.monotonic() - started) * rate:  # paced: at most ``rate`` per second
            await asyncio.sleep(batch / rate / 4)
            continue
        if with_id:
            data = b"".join([head + b"%016x" % i + tail for i in range(next_id, next_id + batch)])
            next_id += batch
        else:
            data = head * batch
        conn.writer.write(data)
        sent += batch
        await conn.writer.drain()
    await conn.close()


class _Consumer(Conn):
    """Counts deliveries and acks each one (in one write per read), without decoding them."""

    def __init__(self) -> None:
        super().__init__()
        self.pending_acks: list[bytes] = []

    def _method(self, raw: bytes, channel: int) -> None:
        if raw[7:11] == b"\x00\x3c\x00\x3c":  # basic.deliver: consumer tag, then the delivery tag
            tag_len = raw[11]
            (tag,) = struct.unpack_from(">Q", raw, 12 + tag_len)
            self.delivered += 1
            self.pending_acks.append(_ACK_HEAD.pack(1, channel, 13, 60, 80, tag) + b"\x00\xce")
            if len(self.pending_acks) >= 16:
                self.flush()
            return
        super()._method(raw, channel)

    def flush(self) -> None:
        if self.pending_acks and self.writer is not None:
            self.writer.write(b"".join(self.pending_acks))
            self.pending_acks.clear()


async def _consume(port: int, seconds: float, prefetch: int, counter: multiprocessing.Value,  # type: ignore[valid-type]
                   queue: str = QUEUE) -> None:
    conn = _Consumer()
    await conn.open("127.0.0.1", port)
    await conn.rpc([commands.Basic.Qos(prefetch_count=prefetch)])
    await conn.rpc([commands.Basic.Consume(queue=queue, no_ack=False)])
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not conn.error:
        await asyncio.sleep(0.002)
        conn.flush()
        counter.value = conn.delivered
    await conn.close()


def _run_publisher(*args: object) -> None:
    asyncio.run(_publish(*args))  # type: ignore[arg-type]


def _run_consumer(*args: object) -> None:
    asyncio.run(_consume(*args))  # type: ignore[arg-type]


async def _declare(port: int, mode: str, cache_size: int, queue: str = QUEUE) -> None:
    conn = await Conn().open("127.0.0.1", port)
    arguments: dict = {}
    if mode.startswith("on"):
        arguments = {"x-message-deduplication": True, "x-cache-size": cache_size}
    elif mode == "retry":
        arguments = {"x-delayed-retry-type": "all", "x-delayed-retry-min": 1000}
    await conn.rpc([commands.Queue.Declare(queue=queue, durable=True, arguments=arguments)])
    await conn.close()


def start_broker(tree: Path, workdir: Path) -> tuple[subprocess.Popen, int, int]:
    """A broker from ``tree`` on a fresh data dir (fsync always); its process, AMQP and metrics ports."""
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-m", "lavinpy", "--data-dir", str(workdir / "data"),
                             "--amqp-port", str(port), "--http-port", "0", "--prometheus-port", str(metrics_port),
                             "--mqtt-port", "0", "--bind", "127.0.0.1", "--log-level", "warning"],
                            cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, port, metrics_port


def stop_broker(proc: subprocess.Popen, workdir: Path) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)


def run_once(tree: Path, mode: str, args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="dedup-bench-"))
    proc, port, metrics_port = start_broker(tree, workdir)
    try:
        asyncio.run(_declare(port, mode, args.cache_size))
        total = args.warmup + args.seconds
        counter = multiprocessing.Value("q", 0)
        consumer = multiprocessing.Process(target=_run_consumer, args=(port, total + 1, 256, counter))
        publisher = multiprocessing.Process(target=_run_publisher,
                                            args=(port, total, args.confirm, args.size, mode.endswith("ids"), 1,
                                                  args.rate))
        consumer.start()
        publisher.start()
        time.sleep(args.warmup)
        f0, k0 = flush_count(metrics_port), thread_cpu_seconds(proc.pid)
        c0, n0, t0 = cpu_seconds(proc.pid), counter.value, time.monotonic()
        time.sleep(args.seconds)
        c1, n1, t1 = cpu_seconds(proc.pid), counter.value, time.monotonic()
        f1, k1 = flush_count(metrics_port), thread_cpu_seconds(proc.pid)
        publisher.join(30)
        consumer.join(30)
        messages = n1 - n0
        return {"tree": str(tree), "mode": mode, "messages": messages, "rate": round(messages / (t1 - t0)),
                "cpu_us_per_msg": round((c1 - c0) * 1e6 / messages, 2) if messages else None,
                **{f"{kind}_us_per_msg": round((k1[kind] - k0[kind]) * 1e6 / messages, 2) if messages else None
                   for kind in ("loop", "fsync")},
                "msg_per_flush": round(messages / (f1 - f0), 1) if f1 > f0 else None}
    finally:
        stop_broker(proc, workdir)


async def _publish_gated(port: int, gate: Any, me: int, window: int, size: int, with_id: bool, start_id: int,
                         queue: str, rate: float = 0.0) -> None:
    """``_publish`` while ``gate`` is ``me`` (idle, connected, otherwise), until it is negative; ``rate``:
    at most that many a second from each turn of the gate to it."""
    conn = await _Publisher().open("127.0.0.1", port)
    await conn.confirm_select()
    head, tail = message_template(size, with_id, queue)
    sent, next_id, batch = 0, start_id, 32
    turned, turn_sent = 0.0, 0  # (when the gate last turned to this publisher, and ``sent`` then)
    assert conn.writer is not None
    while gate.value >= 0 and not conn.error:
        if gate.value != me or sent - conn.acked + batch > window:
            if gate.value != me:
                turned = 0.0
            await asyncio.sleep(0.0005)
            continue
        if rate:
            if not turned:
                turned, turn_sent = time.monotonic(), sent
            if sent - turn_sent >= (time.monotonic() - turned) * rate:
                await asyncio.sleep(batch / rate / 4)
                continue
        if with_id:
            data = b"".join([head + b"%016x" % i + tail for i in range(next_id, next_id + batch)])
            next_id += batch
        else:
            data = head * batch
        conn.writer.write(data)
        sent += batch
        await conn.writer.drain()
    await conn.close()


async def _consume_gated(port: int, gate: Any, prefetch: int, counter: Any, queue: str) -> None:
    """``_consume`` until ``gate`` is negative."""
    conn = _Consumer()
    await conn.open("127.0.0.1", port)
    await conn.rpc([commands.Basic.Qos(prefetch_count=prefetch)])
    await conn.rpc([commands.Basic.Consume(queue=queue, no_ack=False)])
    while gate.value >= 0 and not conn.error:
        await asyncio.sleep(0.002)
        conn.flush()
        counter.value = conn.delivered
    await conn.close()


def _run_publisher_gated(*args: object) -> None:
    asyncio.run(_publish_gated(*args))  # type: ignore[arg-type]


def _run_consumer_gated(*args: object) -> None:
    asyncio.run(_consume_gated(*args))  # type: ignore[arg-type]


def run_pairs(tree: Path, base: str, other: str, pairs: int, first_id: int, args: argparse.Namespace) -> list[dict]:
    """A block: one broker from ``tree``, both modes' queues, each with a publisher and a consumer that
    stay connected; a gate says which publisher publishes. Primed, then ``pairs`` pairs of windows (see
    the text): the gate turned to a mode, ``--pair-settle`` seconds for the other's last confirms and
    deliveries, then ``--pair-seconds`` measured (the broker's CPU, that mode's messages consumed)."""
    workdir = Path(tempfile.mkdtemp(prefix="dedup-bench-"))
    proc, port, _ = start_broker(tree, workdir)
    modes = (base, other)
    gate = multiprocessing.Value("i", 0)  # 0: nobody publishes; 1 + a mode's index: it does; -1: the end
    counters = [multiprocessing.Value("q", 0) for _ in modes]
    clients: list[multiprocessing.Process] = []
    results = []
    try:
        for k, mode in enumerate(modes):
            queue = f"{QUEUE}-{mode}"
            asyncio.run(_declare(port, mode, args.cache_size, queue))
            clients.append(multiprocessing.Process(target=_run_consumer_gated,
                                                   args=(port, gate, 256, counters[k], queue)))
            clients.append(multiprocessing.Process(target=_run_publisher_gated, args=(
                port, gate, k + 1, args.confirm, args.size, mode.endswith("ids"), first_id + k * 10 ** 11, queue,
                args.rate)))
        for client in clients:
            client.start()
        time.sleep(1.0)  # (connected)

        def window(k: int, seconds: float) -> dict:
            gate.value = k + 1
            time.sleep(args.pair_settle)
            c0, n0, t0 = run_ns(proc.pid), counters[k].value, time.monotonic()
            time.sleep(seconds)
            c1, n1, t1 = run_ns(proc.pid), counters[k].value, time.monotonic()
            messages = n1 - n0
            cpu, loop = run_ns_between(c0, c1, proc.pid)
            return {"rate": messages / (t1 - t0), "cpu_us_per_msg": cpu / 1e3 / messages if messages else None,
                    "loop_us_per_msg": loop / 1e3 / messages if messages else None}

        for k in range(2):  # primed: the cache full (each new identifier then forgets the oldest)
            primed = 0
            for _ in range(30):
                primed += window(k, 1.0)["rate"]
                if primed > args.cache_size * 1.2:
                    break
        for i in range(pairs):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            sides = {modes[k]: window(k, args.pair_seconds) for k in order}
            b, o = sides[base], sides[other]
            pair = {"tree": str(tree), "pair": i + 1, "first": modes[order[0]], "load": round(os.getloadavg()[0], 1),
                    **{f"{mode}_{key}": round(side[key], 3) for mode, side in sides.items()
                       for key in ("rate", "cpu_us_per_msg", "loop_us_per_msg") if side[key] is not None},
                    **{f"{key[:-11]}_ratio": round(o[key] / b[key], 4) if o[key] and b[key] else None
                       for key in ("cpu_us_per_msg", "loop_us_per_msg")},
                    "rate_ratio": round(o["rate"] / b["rate"], 4) if b["rate"] else None}
            if args.verbose:
                print(json.dumps(pair), flush=True)
            results.append(pair)
    finally:
        gate.value = -1
        for client in clients:
            client.join(10)
            if client.is_alive():
                client.terminate()
        stop_broker(proc, workdir)
    return results


def median_interval(values: list[float]) -> tuple[float, float, float, float, float]:
    """The median, a distribution-free 95 % confidence interval of it (the order statistics k and n+1-k
    of n values, k from the binomial's normal approximation; the extremes for fewer than 6), quartiles."""
    ordered = sorted(values)
    n = len(ordered)
    k = max(int((n - 1.96 * n ** 0.5) / 2), 1) if n >= 6 else 1
    quartiles = statistics.quantiles(ordered, n=4) if n >= 2 else [ordered[0]] * 3
    return statistics.median(ordered), ordered[k - 1], ordered[n - k], quartiles[0], quartiles[2]


def report_pairs(results: list[dict], trees: list[Path], base: str, other: str) -> None:
    print(f"{other} against {base}, per-pair ratios ({other} / {base}): median [95 % CI of the median] "
          "(quartiles); beside them each mode's own medians")
    for tree in trees:
        mine = [r for r in results if r["tree"] == str(tree)]
        for key, what in (("cpu_ratio", "broker CPU a message"), ("loop_ratio", "loop thread's CPU a msg"),
                          ("rate_ratio", "messages a second")):
            values = [r[key] for r in mine if r[key] is not None]
            if not values:
                continue
            med, lo, hi, q1, q3 = median_interval(values)
            print(f"{str(tree)[-40:]:<40} {what:<22} {med - 1:+.1%} [{lo - 1:+.1%}, {hi - 1:+.1%}] "
                  f"({q1 - 1:+.1%}, {q3 - 1:+.1%}); {len(values)} pairs")
        for mode in (base, other):
            cpu = [r[f"{mode}_cpu_us_per_msg"] for r in mine if f"{mode}_cpu_us_per_msg" in r]
            loop = [r[f"{mode}_loop_us_per_msg"] for r in mine if f"{mode}_loop_us_per_msg" in r]
            rate = [r[f"{mode}_rate"] for r in mine if f"{mode}_rate" in r]
            if cpu:
                print(f"{'':<40} {mode:<8} µs CPU/msg {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}), "
                      f"loop {statistics.median(loop):.2f}, msg/s {statistics.median(rate):,.0f} "
                      f"({min(rate):,.0f}-{max(rate):,.0f})")
    print(f"load average {os.getloadavg()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent),
                    help="source tree(s) to start the broker from, comma separated (alternated)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--confirm", type=int, default=256)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--cache-size", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=0.0,
                    help="publish at most this many messages per second (0: as fast as the confirms allow, as b)")
    ap.add_argument("--pairs", type=int, default=0,
                    help="tight pairs per block (the two --modes back to back on one broker; see the text); 0: "
                         "a fresh broker a run, as before")
    ap.add_argument("--pair-seconds", type=float, default=0.5, help="the measured seconds of each side of a pair")
    ap.add_argument("--pair-settle", type=float, default=0.1,
                    help="seconds between turning the gate to a mode and its measured window")
    ap.add_argument("--verbose", action="store_true", help="with --pairs: print each pair")
    ap.add_argument("--blocks", type=int, default=1, help="with --pairs: blocks per tree, the trees alternated")
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in args.tree.split(",")]
    if args.pairs:
        modes = [m for m in args.modes.split(",") if m] if args.modes != ",".join(MODES) else ["off", "on-ids"]
        if len(modes) != 2:
            ap.error("--pairs compares two --modes: the base, then the other")
        pairs: list[dict] = []
        for block in range(args.blocks):
            for t, tree in enumerate(trees):
                pairs += run_pairs(tree, modes[0], modes[1], args.pairs, (block * len(trees) + t) * 10 ** 12 + 1,
                                     args)
        report_pairs(pairs, trees, modes[0], modes[1])
        return
    modes = [m for m in args.modes.split(",") if m]
    results: dict[tuple[str, str], list[float]] = {}
    parts: dict[tuple[str, str, str], list[float]] = {}
    for rnd in range(args.rounds):
        for mode in modes:
            for tree in trees:
                r = run_once(tree, mode, args)
                r["round"] = rnd + 1
                r["load"] = os.getloadavg()[0]
                print(json.dumps(r), flush=True)
                if r["cpu_us_per_msg"]:
                    results.setdefault((str(tree), mode), []).append(r["cpu_us_per_msg"])
                    for kind in ("loop", "fsync"):
                        parts.setdefault((str(tree), mode, kind), []).append(r[f"{kind}_us_per_msg"])
    print(f"{'tree':<40}{'mode':<10}{'µs/msg (median)':>18}{'vs off':>10}{'vs off-ids':>12}{'loop':>8}{'fsync':>8}")
    for tree in trees:
        base = statistics.median(results.get((str(tree), "off"), [0.0])) or None
        with_ids = statistics.median(results.get((str(tree), "off-ids"), [0.0])) or None
        for mode in modes:
            values = results.get((str(tree), mode))
            if not values:
                continue
            med = statistics.median(values)
            ratio = f"{med / base - 1:+.1%}" if base else ""
            ids_ratio = f"{med / with_ids - 1:+.1%}" if with_ids and mode == "on-ids" else ""
            loop, fsync = (statistics.median(parts[(str(tree), mode, kind)]) for kind in ("loop", "fsync"))
            print(f"{str(tree)[-40:]:<40}{mode:<10}{med:>18.2f}{ratio:>10}{ids_ratio:>12}{loop:>8.2f}{fsync:>8.2f}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
