"""`lavinpy-perf`: AMQP 0-9-1 throughput and latency tool, in the spirit of lavinmqperf / PerfTest.

Publishers and consumers each get their own connection and go through the default exchange to
one or more queues. Rates are printed every second on stderr, a JSON summary goes to stdout.

The client is a raw asyncio.Protocol: pamqp encodes/decodes the handshake and the rare methods,
while the hot path (publish, deliver, ack, confirm) uses pre-encoded frames and struct. It does
not import lavinpy's broker code on purpose, so it measures RabbitMQ and lavinpy the same way.
Latency is the time between the publisher stamping the first 8 bytes of the body with
CLOCK_MONOTONIC and the consumer reading it, so publishers and consumers must share a host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import struct
import sys
import time
from array import array
from typing import Any
from urllib.parse import unquote, urlsplit

from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.exceptions import UnmarshalingException

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
# class_id << 16 | method_id of the methods handled on the hot path.
BASIC_DELIVER = (60 << 16) | 60
BASIC_ACK = (60 << 16) | 80
BASIC_NACK = (60 << 16) | 120

_frame_head = struct.Struct(">BHI")
_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_ack_tail = struct.Struct(">QB")
_ack_frame = struct.Struct(">BHIHHQBB")  # type, channel, size, class, method, tag, multiple, frame-end
_HEARTBEAT = bytes([FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END])

LATENCY_CAP = 1 << 21  # samples kept per consumer before halving the sampling rate
CHANNEL = 1


class AMQPError(Exception):
    """The broker refused or closed something, or the connection was lost."""


class Client(asyncio.Protocol):
    """One AMQP connection with one channel; can publish, consume, or do control operations."""

    def __init__(self, user: str, password: str, vhost: str, name: str) -> None:
        self.user, self.password, self.vhost, self.name = user, password, vhost, name
        self.transport: asyncio.Transport | None = None
        self.frame_max = 131072
        self._buf = bytearray()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.error: str | None = None
        self._waiter: asyncio.Future[Any] | None = None
        self._waiting_for: tuple[type, ...] = ()
        self._writable = asyncio.Event()
        self._writable.set()
        # Publisher state: confirms are counted exactly, also when single and multiple acks mix.
        self.published = 0
        self.confirmed = 0
        self.nacked = 0
        self._acked_upto = 0
        self._singles: set[int] = set()
        self._confirm_wakeup: asyncio.Future[None] | None = None
        # Consumer state.
        self.consumed = 0
        self.autoack = True
        self.multi_ack = 100
        self._unacked = 0
        self._last_tag = 0
        self._body_left = 0  # bytes of body still expected for the current delivery
        self._first_body = False
        self.record_latency = False
        self.latencies = array("q")
        self._lat_stride = 1
        self._lat_skip = 0

    # ----------------------------------------------------------------- plumbing

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        # Big enough to batch, small enough that pause_writing pushes back on a slow broker.
        self.transport.set_write_buffer_limits(high=1 << 20, low=1 << 18)  # type: ignore[union-attr]
        self.transport.write(PROTOCOL_HEADER)  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = f"connection lost: {exc}" if exc else "connection closed by broker"
        self._fail(self.failure())
        if not self.closed.done():
            self.closed.set_result(None)
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _fail(self, exc: Exception) -> None:
        for fut in (self.opened, self._waiter, self._confirm_wakeup):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: nobody may be awaiting it any more

    def failure(self) -> AMQPError:
        return AMQPError(f"{self.name}: {self.error}")

    def send(self, method: Any, channel: int = CHANNEL) -> None:
        assert self.transport is not None
        self.transport.write(pframe.marshal(method, channel))

    async def rpc(self, method: Any, *expect: type, timeout: float = 30.0) -> Any:
        """Send a synchronous method on channel 1 and wait for its reply."""
        if self.error:
            raise self.failure()
        self._waiter = self._loop.create_future()
        self._waiting_for = expect
        self.send(method)
        try:
            return await asyncio.wait_for(self._waiter, timeout)
        finally:
            self._waiter = None

    # ------------------------------------------------------------------ parsing

    def data_received(self, data: bytes) -> None:
        # One flat loop on purpose: this is the hot path for deliveries and confirms.
        buf = self._buf
        buf += data
        size_all = len(buf)
        pos = 0
        unpack_head = _frame_head.unpack_from
        while size_all - pos >= 8:
            ftype, channel, size = unpack_head(buf, pos)
            end = pos + 7 + size  # index of the frame-end octet
            if end >= size_all:
                if buf[:4] == b"AMQP":  # the broker answered our header with the version it wants
                    self._protocol_error("broker rejected the AMQP 0-9-1 protocol header")
                    return
                break
            p = pos + 7
            if ftype == FRAME_BODY:
                if self._first_body:
                    self._first_body = False
                    if self.record_latency and size >= 8:
                        self._record(time.monotonic_ns() - _u64.unpack_from(buf, p)[0])
                self._body_left -= size
                if self._body_left <= 0:
                    self._delivered()
            elif ftype == FRAME_METHOD:
                cm = _u32.unpack_from(buf, p)[0]
                if cm == BASIC_DELIVER:
                    self._last_tag = _u64.unpack_from(buf, p + 5 + buf[p + 4])[0]
                elif cm in (BASIC_ACK, BASIC_NACK):
                    tag, bits = _ack_tail.unpack_from(buf, p + 4)
                    self._on_confirm(tag, bits & 1, cm == BASIC_NACK)
                else:
                    self._slow_frame(bytes(buf[pos:end + 1]))
                    if self.transport is None or self.transport.is_closing():
                        return
            elif ftype == FRAME_HEADER:
                self._body_left = _u64.unpack_from(buf, p + 4)[0]
                self._first_body = True
                if self._body_left == 0:
                    self._delivered()
            elif ftype == FRAME_HEARTBEAT and self.transport is not None:
                self.transport.write(_HEARTBEAT)
            pos = end + 1
        del buf[:pos]

    def _record(self, ns: int) -> None:
        # Keep a uniform sample: when the buffer is full, drop every other sample and halve the rate.
        self._lat_skip += 1
        if self._lat_skip < self._lat_stride:
            return
        self._lat_skip = 0
        lat = self.latencies
        lat.append(ns)
        if len(lat) >= LATENCY_CAP:
            self.latencies = lat[::2]
            self._lat_stride *= 2

    def _delivered(self) -> None:
        self.consumed += 1
        if not self.autoack:
            self._unacked += 1
            if self._unacked >= self.multi_ack:
                self.ack_pending()

    def ack_pending(self) -> None:
        """Ack everything received so far with one multiple=true ack."""
        if self._unacked and self.transport is not None and not self.transport.is_closing():
            self.transport.write(_ack_frame.pack(FRAME_METHOD, CHANNEL, 13, 60, 80, self._last_tag, 1, FRAME_END))
        self._unacked = 0

    def _on_confirm(self, tag: int, multiple: int, nack: bool) -> None:
        if multiple:
            if tag <= self._acked_upto:
                return
            covered = [t for t in self._singles if t <= tag] if self._singles else []
            n = tag - self._acked_upto - len(covered)
            self._singles.difference_update(covered)
            self._acked_upto = tag
        elif tag > self._acked_upto and tag not in self._singles:
            self._singles.add(tag)
            n = 1
        else:
            return
        self.confirmed += n
        if nack:
            self.nacked += n
        w = self._confirm_wakeup
        if w is not None and not w.done():
            w.set_result(None)

    def _slow_frame(self, raw: bytes) -> None:
        try:
            _, channel, method = pframe.unmarshal(raw)
        except UnmarshalingException as e:
            self._protocol_error(f"cannot decode frame from broker: {e}")
            return
        if isinstance(method, spec.Connection.Start):
            self.send(spec.Connection.StartOk(
                client_properties={"product": "lavinpy-perf", "connection_name": self.name,
                                   "capabilities": {"publisher_confirms": True}},
                mechanism="PLAIN", response=f"\0{self.user}\0{self.password}", locale="en_US"), 0)
        elif isinstance(method, spec.Connection.Tune):
            self.frame_max = method.frame_max or 131072
            # Heartbeats off: a saturated perf run should not be torn down by a late heartbeat.
            self.send(spec.Connection.TuneOk(channel_max=method.channel_max or 2047,
                                             frame_max=self.frame_max, heartbeat=0), 0)
            self.send(spec.Connection.Open(virtual_host=self.vhost), 0)
        elif isinstance(method, spec.Connection.OpenOk):
            self.send(spec.Channel.Open())
        elif isinstance(method, spec.Channel.OpenOk) and not self.opened.done():
            self.opened.set_result(None)
        elif isinstance(method, spec.Connection.Close):
            self.error = f"connection closed by broker: {method.reply_code} {method.reply_text}"
            self.send(spec.Connection.CloseOk(), 0)
            self._fail(self.failure())
            assert self.transport is not None
            self.transport.close()
        elif isinstance(method, spec.Channel.Close):
            self.error = f"channel closed by broker: {method.reply_code} {method.reply_text}"
            self.send(spec.Channel.CloseOk(), channel)
            self._fail(self.failure())
        elif isinstance(method, spec.Connection.CloseOk):
            assert self.transport is not None
            self.transport.close()
        elif self._waiter is not None and isinstance(method, self._waiting_for) and not self._waiter.done():
            self._waiter.set_result(method)
        # Anything else (consume-ok after a timeout, basic.return, ...) is of no interest here.

    def _protocol_error(self, text: str) -> None:
        self.error = text
        self._fail(self.failure())
        if self.transport is not None:
            self.transport.close()

    # --------------------------------------------------------------- operations

    async def close(self, timeout: float = 3.0) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.send(spec.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0)
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), timeout)
        except TimeoutError:
            self.transport.abort()

    async def reopen_channel(self) -> None:
        """Open channel 1 again after the broker closed it (the connection must still be up)."""
        if self.transport is None or self.transport.is_closing():
            raise AMQPError(f"{self.name}: {self.error or 'connection closed'}")
        self.error = None
        await self.rpc(spec.Channel.Open(), spec.Channel.OpenOk)

    @property
    def writable(self) -> bool:
        return self._writable.is_set()

    async def wait_writable(self, timeout: float) -> None:
        """Wait until the transport drains below its low-water mark (or the timeout passes)."""
        try:
            await asyncio.wait_for(self._writable.wait(), timeout)
        except TimeoutError:
            pass
        if self.error:
            raise self.failure()

    async def wait_confirm(self, timeout: float | None = None) -> None:
        """Wait until at least one more confirm arrives (or the timeout passes)."""
        if self.error:
            raise self.failure()
        self._confirm_wakeup = self._loop.create_future()
        try:
            await asyncio.wait_for(self._confirm_wakeup, timeout)
        except TimeoutError:
            pass
        finally:
            self._confirm_wakeup = None


async def connect(params: dict[str, Any], name: str) -> Client:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(
        lambda: Client(params["user"], params["password"], params["vhost"], name), params["host"], params["port"])
    try:
        await asyncio.wait_for(client.opened, 15)
    except TimeoutError:
        if client.transport is not None:
            client.transport.abort()
        raise AMQPError(f"{name}: handshake timed out")
    return client


def parse_uri(uri: str) -> dict[str, Any]:
    u = urlsplit(uri)
    if u.scheme != "amqp":
        raise ValueError(f"unsupported URI scheme {u.scheme!r} (only amqp://)")
    vhost = unquote(u.path[1:]) if len(u.path) > 1 else "/"
    return {"host": u.hostname or "127.0.0.1", "port": u.port or 5672,
            "user": unquote(u.username) if u.username is not None else "guest",
            "password": unquote(u.password) if u.password is not None else "guest", "vhost": vhost}


# ------------------------------------------------------------------ publishing

def message_template(queue: str, size: int, persistent: bool, frame_max: int) -> tuple[bytes, int]:
    """All frames of one publish, encoded once; returns them and the offset of the timestamp (-1: none)."""
    method = pframe.marshal(spec.Basic.Publish(exchange="", routing_key=queue), CHANNEL)
    props = spec.Basic.Properties(delivery_mode=2 if persistent else 1)
    head = pframe.marshal(pheader.ContentHeader(body_size=size, properties=props), CHANNEL)
    body = bytes(size)
    chunk = frame_max - 8
    frames = [_frame_head.pack(FRAME_BODY, CHANNEL, len(part)) + part + bytes([FRAME_END])
              for part in (body[i:i + chunk] for i in range(0, size, chunk))]
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
            await ctl.rpc(spec.Queue.Declare(queue=q, durable=durable), spec.Queue.DeclareOk)
        except AMQPError as e:
            if "406" not in str(e):
                raise
            # Left over from a run with other durability: its messages would be purged anyway.
            print(f"lavinpy-perf: redeclaring queue {q!r} ({e})", file=sys.stderr)
            await ctl.reopen_channel()
            await ctl.rpc(spec.Queue.Delete(queue=q), spec.Queue.DeleteOk)
            await ctl.rpc(spec.Queue.Declare(queue=q, durable=durable), spec.Queue.DeclareOk)
        await ctl.rpc(spec.Queue.Purge(queue=q), spec.Queue.PurgeOk)


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
                await c.rpc(spec.Basic.Consume(queue=q, no_ack=args.autoack), spec.Basic.ConsumeOk)
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

        async def phase(seconds: float) -> None:
            # Sleep, but surface a failing publisher or a lost connection straight away.
            end = loop.time() + seconds
            while loop.time() < end:
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
        await phase(args.duration)
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
                    await ctl.rpc(spec.Queue.Delete(queue=q), spec.Queue.DeleteOk, timeout=10)
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
    try:
        import uvloop  # optional: roughly doubles what one Python process can push
    except ImportError:
        uvloop = None
    runner = uvloop.run if uvloop is not None else asyncio.run
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
