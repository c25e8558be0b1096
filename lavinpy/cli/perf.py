"""`lavinpy-perf`: AMQP 0-9-1 throughput and latency tool, in the spirit of lavinmqperf / PerfTest.

Publishers and consumers each get their own connection and go through the default exchange to
one or more queues. Rates are printed every second on stderr, a JSON summary goes to stdout.

The client (perf_client.py) is lavinpy.wire's asyncio client with inline hot paths; it does not import the broker,
so it measures RabbitMQ and lavinpy the same way.
Latency is the time between the publisher stamping the first 8 bytes of the body with
CLOCK_MONOTONIC and the consumer reading it, so publishers and consumers must share a host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from array import array
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from pamqp import commands as spec

from lavinpy.progress import Progress
from lavinpy.wire.client import publish_method_frame
from lavinpy.wire.frames import build_method
from lavinpy.wire.properties import encode_property_values
from lavinpy.wire.writer import content_frames

from .perf_client import (
    CHANNEL,
    AMQPError,
    Client,
    _u64,
    connect,
    parse_uri,
)

PROGRESS_MIN_MS = 2000  # runs shorter than this report no progress


def message_template(queue: str, size: int, persistent: bool, frame_max: int) -> tuple[bytes, int]:
    """All frames of one publish, encoded once; returns them and the offset of the timestamp (-1: none)."""
    method = publish_method_frame(CHANNEL, "", queue, False)
    head, *frames = content_frames(CHANNEL, encode_property_values(delivery_mode=2 if persistent else 1),
                                   bytes(size), frame_max)
    ts_offset = len(method) + len(head) + 7 if size >= 8 else -1
    return method + head + b"".join(frames), ts_offset


async def publish_loop(client: Client, queue: str, args: argparse.Namespace, stop: asyncio.Event) -> None:
    tmpl, ts_off = message_template(queue, args.size, args.persistent, client.frame_max)
    tlen = len(tmpl)
    # Up to ~64 KiB per write: amortises the syscall and the Python overhead per message.
    max_batch = max(1, min(256, 65536 // tlen))
    if args.rate:
        max_batch = max(1, min(max_batch, int(args.rate // 100) or 1))
    blocks: dict[int, bytes] = {}
    pack_ts = _u64.pack_into
    window = args.confirm
    loop = asyncio.get_running_loop()
    started = loop.time()
    sent = 0
    while not stop.is_set():
        if not client.writable:
            await client.wait_writable(0.1)  # bounded so a stop request is noticed while the broker stalls
            continue
        n = max_batch
        if window:
            room = window - (client.published - client.confirmed)
            if room <= 0:
                await client.wait_confirm(0.1)
                continue
            n = min(n, room)
        if args.rate:
            due = int(args.rate * (loop.time() - started)) - sent
            if due <= 0:
                await asyncio.sleep(max(0.001, (sent + 1) / args.rate - (loop.time() - started)))
                continue
            n = min(n, due)
        block = blocks.get(n)
        if block is None:
            block = blocks[n] = tmpl * n
        if ts_off >= 0:
            buf = bytearray(block)  # a fresh buffer: the transport may keep a reference to it
            now = time.monotonic_ns()
            for off in range(ts_off, ts_off + n * tlen, tlen):
                pack_ts(buf, off, now)
            client.transport.write(buf)  # type: ignore[union-attr]
        else:
            client.transport.write(block)  # type: ignore[union-attr]
        client.published += n
        sent += n
        if client.error:
            raise client.failure()
        await asyncio.sleep(0)  # let deliveries, confirms and other publishers run


async def wait_confirms(clients: list[Client], timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    for c in clients:
        while c.confirmed < c.published and not c.error:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            await c.wait_confirm(min(left, 0.1))


# ------------------------------------------------------------------- reporting

def percentile(sorted_values: list[int] | array, q: float) -> int:
    """Nearest-rank percentile of an ascending sequence."""
    if not sorted_values:
        return 0
    rank = max(1, int(-(-q * len(sorted_values) // 100)))  # ceil(q/100 * n)
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(consumers: list[Client]) -> dict[str, Any]:
    # Bring every consumer to the coarsest sampling stride so each message weighs the same.
    top = max((c._lat_stride for c in consumers), default=1)
    merged: list[int] = []
    for c in consumers:
        merged.extend(c.latencies[:: top // c._lat_stride])
    merged.sort()
    if not merged:
        return {"latency_p50_us": None, "latency_p95_us": None, "latency_p99_us": None,
                "latency_min_us": None, "latency_max_us": None, "latency_samples": 0}
    # Round up so a non-empty sample never reports 0 µs.
    us = [(percentile(merged, q) + 999) // 1000 for q in (50, 95, 99)]
    return {"latency_p50_us": us[0], "latency_p95_us": us[1], "latency_p99_us": us[2],
            "latency_min_us": (merged[0] + 999) // 1000, "latency_max_us": (merged[-1] + 999) // 1000,
            "latency_samples": len(merged)}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def totals(pubs: list[Client], cons: list[Client]) -> tuple[int, int, int]:
    return (sum(c.published for c in pubs), sum(c.confirmed for c in pubs), sum(c.consumed for c in cons))


async def reporter(pubs: list[Client], cons: list[Client], warmup: float, quiet: bool) -> None:
    loop = asyncio.get_running_loop()
    start = last_t = loop.time()
    last = totals(pubs, cons)
    tick = 1
    while True:
        await asyncio.sleep(max(0.0, start + tick - loop.time()))
        now, cur = loop.time(), totals(pubs, cons)
        dt = now - last_t
        if not quiet:
            rates = [round((a - b) / dt) for a, b in zip(cur, last, strict=True)]
            tag = " (warmup)" if tick <= warmup else ""
            print(f"{tick:4d}s  published {rates[0]:>8}/s  confirmed {rates[1]:>8}/s  consumed {rates[2]:>8}/s{tag}",
                  file=sys.stderr, flush=True)
        last, last_t = cur, now
        tick += 1


# ------------------------------------------------------------------------ main

def queue_names(args: argparse.Namespace) -> list[str]:
    if args.queues == 1:
        return [args.queue]
    return [f"{args.queue}-{i}" for i in range(1, args.queues + 1)]


async def setup_queues(ctl: Client, names: list[str], durable: bool) -> None:
    for q in names:
        try:
            await ctl.rpc(build_method(spec.Queue.Declare, queue=q, durable=durable), spec.Queue.DeclareOk)
        except AMQPError as e:
            if "406" not in str(e):
                raise
            # Left over from a run with other durability: its messages would be purged anyway.
            print(f"lavinpy-perf: redeclaring queue {q!r} ({e})", file=sys.stderr)
            await ctl.reopen_channel()
            await ctl.rpc(build_method(spec.Queue.Delete, queue=q), spec.Queue.DeleteOk)
            await ctl.rpc(build_method(spec.Queue.Declare, queue=q, durable=durable), spec.Queue.DeclareOk)
        await ctl.rpc(build_method(spec.Queue.Purge, queue=q), spec.Queue.PurgeOk)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    params = parse_uri(args.uri)
    names = queue_names(args)
    ctl = await connect(params, "lavinpy-perf control")
    pubs: list[Client] = []
    cons: list[Client] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    background: list[asyncio.Task[None]] = []
    try:
        await setup_queues(ctl, names, args.persistent)
        for i in range(args.consumers):
            c = await connect(params, f"lavinpy-perf consumer {i + 1}")
            c.autoack = args.autoack
            c.multi_ack = args.multi_ack
            if args.prefetch and not args.autoack:
                await c.rpc(spec.Basic.Qos(prefetch_count=args.prefetch), spec.Basic.QosOk)
            # Round-robin, and with fewer consumers than queues each takes several so none is left unread.
            for q in names[i % len(names)::args.consumers]:
                await c.rpc(build_method(spec.Basic.Consume, queue=q, no_ack=args.autoack), spec.Basic.ConsumeOk)
            cons.append(c)
        for i in range(args.publishers):
            p = await connect(params, f"lavinpy-perf publisher {i + 1}")
            if args.confirm:
                await p.rpc(spec.Confirm.Select(), spec.Confirm.SelectOk)
            pubs.append(p)

        loop = asyncio.get_running_loop()
        background.append(loop.create_task(reporter(pubs, cons, args.warmup, args.json_only)))
        # Unacked deliveries below the multi-ack threshold would otherwise sit forever when traffic stops.
        background.append(loop.create_task(ack_flusher(cons)))
        tasks = [loop.create_task(publish_loop(p, names[i % len(names)], args, stop)) for i, p in enumerate(pubs)]
        watch = asyncio.gather(*tasks)

        async def phase(seconds: float, progress: Progress | None = None) -> None:
            # Sleep, but surface a failing publisher or a lost connection straight away.
            start = loop.time()
            end = start + seconds
            while loop.time() < end:
                if progress is not None:
                    progress.update(int((loop.time() - start) * 1000))
                if watch.done():
                    watch.result()
                for c in (*pubs, *cons):
                    if c.error:
                        raise c.failure()
                await asyncio.sleep(min(0.05, max(0.0, end - loop.time())))

        await phase(args.warmup)
        base = totals(pubs, cons)
        for c in cons:
            c.record_latency = True
        t0, cpu0 = loop.time(), cpu_seconds()
        # A long run shows where it is (stderr: a bar on a terminal, a line per 10 % otherwise).
        with Progress("lavinpy-perf: measuring", int(args.duration * 1000), unit="ms",
                      min_total=PROGRESS_MIN_MS) as progress:
            await phase(args.duration, progress)
        t1, cpu1 = loop.time(), cpu_seconds()
        window = totals(pubs, cons)
        stop.set()
        await asyncio.wait_for(watch, 10)
        end = totals(pubs, cons)
        if args.confirm:
            await wait_confirms(pubs, args.drain_timeout if args.drain else 5.0)
        drained = False
        if args.drain and cons:
            drained = await drain(pubs, cons, args.drain_timeout)
        for c in cons:
            c.record_latency = False
        final = totals(pubs, cons)
        duration = t1 - t0
        summary: dict[str, Any] = {
            "pub_rate": round((window[0] - base[0]) / duration, 1),
            "confirm_rate": round((window[1] - base[1]) / duration, 1),
            "con_rate": round((window[2] - base[2]) / duration, 1),
            "published": end[0] - base[0],
            "confirmed": final[1] - base[1],
            "nacked": sum(p.nacked for p in pubs),
            "consumed": final[2] - base[2],
            "published_total": final[0],
            "consumed_total": final[2],
            "drained": drained,
            **latency_summary(cons),
            "duration": round(duration, 3),
            "client_cpu_percent": round(100 * (cpu1 - cpu0) / duration, 1),
            "params": params_of(args),
        }
        return summary
    finally:
        stop.set()
        for t in (*tasks, *background):
            t.cancel()
        await asyncio.gather(*(c.close() for c in (*pubs, *cons)), return_exceptions=True)
        if not args.keep_queue and not ctl.error:
            for q in names:
                try:
                    await ctl.rpc(build_method(spec.Queue.Delete, queue=q), spec.Queue.DeleteOk, timeout=10)
                except (TimeoutError, AMQPError):
                    break
        await ctl.close()


async def ack_flusher(cons: list[Client]) -> None:
    while True:
        await asyncio.sleep(0.05)
        for c in cons:
            c.ack_pending()


async def drain(pubs: list[Client], cons: list[Client], timeout: float) -> bool:
    """Wait until every published message has been consumed; False on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    target = sum(p.published for p in pubs)
    while sum(c.consumed for c in cons) < target:
        if loop.time() >= deadline or any(c.error for c in cons):
            return False
        await asyncio.sleep(0.02)
    return True


def params_of(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("publishers", "consumers", "size", "persistent", "confirm", "prefetch", "autoack", "multi_ack",
            "queue", "queues", "rate", "warmup", "duration", "drain")
    out = {k: getattr(args, k) for k in keys}
    u = urlsplit(args.uri)
    # Never echo the password into result files.
    out["uri"] = u._replace(netloc=u.netloc.rsplit("@", 1)[-1]).geturl()
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lavinpy-perf", description="AMQP 0-9-1 throughput and latency test")
    a = p.add_argument
    a("--uri", default="amqp://guest:guest@127.0.0.1:5672/", help="broker URI (default: %(default)s)")
    a("-x", "--publishers", type=int, default=1, help="publisher connections (default: 1)")
    a("-y", "--consumers", type=int, default=1, help="consumer connections (default: 1)")
    a("-s", "--size", type=int, default=16, help="message body size in bytes; >= 8 for latency (default: 16)")
    a("--persistent", action="store_true", help="delivery_mode 2 and durable queues")
    a("-c", "--confirm", type=int, default=0, metavar="WINDOW",
      help="publisher confirms with at most WINDOW unconfirmed messages per publisher (default: off)")
    a("-q", "--prefetch", type=int, default=0, help="consumer prefetch count, 0 = unlimited (default: 0)")
    a("-a", "--autoack", action="store_true", help="consume with no_ack")
    a("--multi-ack", type=int, default=None, metavar="N",
      help="ack with multiple=true every N messages (default: prefetch/2, or 100)")
    a("-z", "--duration", type=float, default=10.0, help="measured seconds (default: 10)")
    a("--warmup", type=float, default=0.0, help="seconds run before measuring (default: 0)")
    a("-r", "--rate", type=float, default=0.0, help="max messages/s per publisher, 0 = unlimited")
    a("-u", "--queue", default="perf-test", help="queue name, or prefix with --queues (default: %(default)s)")
    a("--queues", type=int, default=1, help="number of queues, publishers/consumers spread round-robin")
    a("--keep-queue", action="store_true", help="do not delete the queue(s) at the end")
    a("--drain", action="store_true", help="after publishing stops, wait until everything is consumed")
    a("--drain-timeout", type=float, default=60.0, help="give up draining after this many seconds (default: 60)")
    a("--json-only", action="store_true", help="no per-second rates on stderr")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("publishers", "consumers", "size", "confirm", "prefetch", "queues"):
        if getattr(args, name) < 0:
            p.error(f"--{name} must be >= 0")
    if args.queues < 1:
        p.error("--queues must be >= 1")
    if args.duration <= 0:
        p.error("--duration must be > 0")
    if args.prefetch > 65535:
        p.error("--prefetch must be <= 65535")
    if args.multi_ack is None:
        args.multi_ack = max(1, args.prefetch // 2) if args.prefetch else 100
    # Acking less often than the prefetch window allows would stall the consumer until the flusher runs.
    args.multi_ack = max(1, min(args.multi_ack, args.prefetch or args.multi_ack))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    try:
        parse_uri(args.uri)
    except ValueError as e:
        parser.error(str(e))
    runner: Callable[..., Any]
    try:
        import uvloop  # optional: roughly doubles what one Python process can push

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        summary = runner(run(args))
    except (TimeoutError, AMQPError, OSError) as e:
        print(f"lavinpy-perf: {e or type(e).__name__}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if not args.json_only:
        print(f"published {summary['pub_rate']:.0f}/s, consumed {summary['con_rate']:.0f}/s, "
              f"latency p50/p95/p99 {summary['latency_p50_us']}/{summary['latency_p95_us']}/"
              f"{summary['latency_p99_us']} µs, client CPU {summary['client_cpu_percent']}%", file=sys.stderr)
    print(json.dumps(summary))
    if args.drain and args.consumers and not summary["drained"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
