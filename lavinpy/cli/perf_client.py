"""lavinpy-perf's AMQP client: one connection with one channel, as a raw asyncio.Protocol.

The shared codec (lavinpy.wire) encodes and decodes the handshake and the rare methods; the hot
path (publish, deliver, ack, confirm) uses pre-encoded frames and its struct layouts inline. It talks
to the broker over the network only, so it measures RabbitMQ and lavinpy the same way.
"""

from __future__ import annotations

import asyncio
import struct
import time
from array import array
from typing import Any

from pamqp import commands as spec

from lavinpy.wire.client import BASIC_ACK, BASIC_DELIVER, BASIC_NACK, FRAME_HEAD, WireError, decode_method
from lavinpy.wire.constants import FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, PROTOCOL_HEADER
from lavinpy.wire.uri import parse_url
from lavinpy.wire.writer import HEARTBEAT, basic_ack, method_frame

_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_ack_tail = struct.Struct(">QB")

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
        self.transport.write(method_frame(channel, method))

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
        unpack_head = FRAME_HEAD.unpack_from
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
                    self._slow_frame(channel, bytes(buf[p:end]))
                    if self.transport is None or self.transport.is_closing():
                        return
            elif ftype == FRAME_HEADER:
                self._body_left = _u64.unpack_from(buf, p + 4)[0]
                self._first_body = True
                if self._body_left == 0:
                    self._delivered()
            elif ftype == FRAME_HEARTBEAT and self.transport is not None:
                self.transport.write(HEARTBEAT)
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
            self.transport.write(basic_ack(CHANNEL, self._last_tag, True))
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

    def _slow_frame(self, channel: int, payload: bytes) -> None:
        try:
            method = decode_method(payload)
        except WireError as e:
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
    tls = params.get("tls")
    _, client = await loop.create_connection(
        lambda: Client(params["user"], params["password"], params["vhost"], name), params["host"], params["port"],
        ssl=tls.context() if tls is not None else None,
        server_hostname=(tls.server_name or params["host"]) if tls is not None else None)
    try:
        await asyncio.wait_for(client.opened, 15)
    except TimeoutError:
        if client.transport is not None:
            client.transport.abort()
        raise AMQPError(f"{name}: handshake timed out")
    return client


def parse_uri(uri: str) -> dict[str, Any]:
    """amqp[s]://user:pass@host:port/vhost as connect()'s params (lavinpy.wire.uri.parse_url)."""
    u = parse_url(uri)
    return {"host": u.host, "port": u.port, "user": u.user, "password": u.password, "vhost": u.vhost, "tls": u.tls}


# ------------------------------------------------------------------ publishing
