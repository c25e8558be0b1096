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


def message_template(size: int, with_id: bool) -> tuple[bytes, bytes]:
    """The frames of one message, split where the identifier goes ((whole, b"") without one)."""
    body = b"x" * size
    marker = b"#" * ID_WIDTH
    props = commands.Basic.Properties(delivery_mode=2, headers={ID_HEADER: marker.decode()} if with_id else None)
    raw = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=QUEUE), 1)
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
                   rate: float = 0.0) -> None:
    conn = await _Publisher().open("127.0.0.1", port)
    await conn.confirm_select()
    head, tail = message_template(size, with_id)
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


async def _consume(port: int, seconds: float, prefetch: int, counter: multiprocessing.Value) -> None:  # type: ignore[valid-type]
    conn = _Consumer()
    await conn.open("127.0.0.1", port)
    await conn.rpc([commands.Basic.Qos(prefetch_count=prefetch)])
    await conn.rpc([commands.Basic.Consume(queue=QUEUE, no_ack=False)])
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


async def _declare(port: int, mode: str, cache_size: int) -> None:
    conn = await Conn().open("127.0.0.1", port)
    arguments: dict = {}
    if mode.startswith("on"):
        arguments = {"x-message-deduplication": True, "x-cache-size": cache_size}
    elif mode == "retry":
        arguments = {"x-delayed-retry-type": "all", "x-delayed-retry-min": 1000}
    await conn.rpc([commands.Queue.Declare(queue=QUEUE, durable=True, arguments=arguments)])
    await conn.close()


def run_once(tree: Path, mode: str, args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="dedup-bench-"))
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-m", "lavinpy", "--data-dir", str(workdir / "data"),
                             "--amqp-port", str(port), "--http-port", "0", "--prometheus-port", str(metrics_port),
                             "--mqtt-port", "0", "--bind", "127.0.0.1", "--log-level", "warning"],
                            cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
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
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


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
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in args.tree.split(",")]
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
