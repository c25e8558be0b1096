"""lavinpy-perf's AMQP client: one connection with one channel, lavinpy.wire's asyncio client.

The shared client (wire.client_asyncio over the sans-IO wire.client_connection) does the handshake,
calls and closing; the hot path (publish, deliver, ack, confirm) uses pre-encoded frames and its
struct layouts inline, and hands every other method frame to the shared connection. It talks to the
broker over the network only, so it measures RabbitMQ and lavinpy the same way.
"""

from __future__ import annotations

import asyncio
import struct
import time
from array import array
from typing import Any

from lavinpy.wire.client import BASIC_ACK, BASIC_DELIVER, BASIC_NACK, FRAME_HEAD
from lavinpy.wire.client_asyncio import CONNECT_TIMEOUT, ClientError, ClientProtocol
from lavinpy.wire.client_asyncio import connect as connect_client
from lavinpy.wire.client_connection import ClientConnection, ClientProtocolError
from lavinpy.wire.client_events import ChannelClosed
from lavinpy.wire.constants import FRAME_BODY, FRAME_HEADER, FRAME_METHOD
from lavinpy.wire.uri import Tuning, parse_url
from lavinpy.wire.writer import basic_ack

_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_ack_tail = struct.Struct(">QB")

LATENCY_CAP = 1 << 21  # samples kept per consumer before halving the sampling rate
CHANNEL = 1

# The broker refused or closed something, or the connection was lost.
AMQPError = ClientError


class Client(ClientProtocol):
    """One AMQP connection with one channel; can publish, consume, or do control operations."""

    def __init__(self, connection: ClientConnection) -> None:
        super().__init__(connection)
        self.name = connection.client_properties.get("connection_name", "lavinpy-perf")
        self._buf = bytearray()
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

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._wake_confirm_waiter()
        self._writable.set()

    def writable_changed(self, writable: bool) -> None:
        if writable:
            self._writable.set()
        else:
            self._writable.clear()

    def failure(self) -> ClientError:
        return ClientError(f"{self.name}: {self.error or 'connection closed'}")

    def channel_closed(self, closed: ChannelClosed, awaited: bool) -> None:
        # The publish and consume loops see the error and stop; a declare's refusal goes to its caller.
        self.error = self._channel_text(closed)
        self._wake_confirm_waiter()

    def _wake_confirm_waiter(self) -> None:
        w = self._confirm_wakeup
        if w is not None and not w.done():
            w.set_exception(self.failure())
            w.exception()

    async def rpc(self, method: Any, *expect: type, timeout: float = 30.0) -> Any:
        """Send a synchronous method on channel 1 and wait for its reply."""
        return (await self.call(CHANNEL, method, *expect, timeout=timeout)).method

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
                    self.abort("broker rejected the AMQP 0-9-1 protocol header")
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
            pos = end + 1
        del buf[:pos]

    def _slow_frame(self, channel: int, payload: bytes) -> None:
        """Every other method: the shared connection's (handshake, replies, closes)."""
        try:
            events = self.conn.receive_method(channel, payload)
        except ClientProtocolError as e:
            self.flush()
            self.abort(f"bad frame from the broker: {e}")
            return
        self.handle_events(events)
        self.flush()

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

    # --------------------------------------------------------------- operations

    async def reopen_channel(self) -> None:
        """Open channel 1 again after the broker closed it (the connection must still be up)."""
        if self.transport is None or self.transport.is_closing():
            raise self.failure()
        self.error = None
        await self.open_channel(CHANNEL)

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
    tls, tuning = params.get("tls"), params.get("tuning") or Tuning()
    # Heartbeats off unless the URI asks: a saturated perf run should not be torn down by a late heartbeat.
    connection = ClientConnection(params["user"], params["password"], params["vhost"], name=name,
                                  product="lavinpy-perf", heartbeat=tuning.heartbeat or 0,
                                  mechanisms=tuning.mechanisms, channel_max=tuning.channel_max,
                                  frame_max=tuning.frame_max)
    try:
        client = await connect_client(connection, params["host"], params["port"],
                                      tls=tls.context() if tls is not None else None,
                                      server_hostname=tls.server_name if tls is not None else None,
                                      timeout=tuning.connection_timeout or CONNECT_TIMEOUT, protocol=Client)
        await client.open_channel(CHANNEL)
    except ClientError as e:
        raise AMQPError(f"{name}: {e}") from None
    return client


def parse_uri(uri: str) -> dict[str, Any]:
    """amqp[s]://user:pass@host:port/vhost as connect()'s params (lavinpy.wire.uri.parse_url)."""
    u = parse_url(uri)
    return {"host": u.host, "port": u.port, "user": u.user, "password": u.password, "vhost": u.vhost, "tls": u.tls,
            "tuning": u.tuning}


# ------------------------------------------------------------------ publishing
