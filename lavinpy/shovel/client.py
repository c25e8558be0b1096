"""The shovel's AMQP 0-9-1 client: one connection with one channel, over lavinpy.wire.

A shovel talks to both brokers over the network, as any client does, so it moves messages from
RabbitMQ, LavinMQ or lavinpy alike. Deliveries are assembled and handed to ``on_delivery`` with
their raw property block; confirms go to ``on_confirm``. Rare methods are decoded by pamqp.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pamqp import commands as spec

from lavinpy.wire.client import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_NACK,
    WireError,
    decode_method,
    method_id,
    parse_ack,
    parse_deliver,
    parse_header,
    publish_method_frame,
    split_frames,
)
from lavinpy.wire.constants import FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, PROTOCOL_HEADER
from lavinpy.wire.uri import AMQPURL
from lavinpy.wire.writer import HEARTBEAT, basic_ack, basic_nack, content_frames, method_frame

CHANNEL = 1
HEARTBEAT_SECONDS = 30
CONNECT_TIMEOUT = 15.0

Delivery = Callable[[int, str, str, bytes, bytes], None]  # tag, exchange, routing key, properties, body
Confirm = Callable[[int, bool, bool], None]  # tag, multiple, nack


class ShovelClientError(Exception):
    """The broker refused something, or the connection was lost; the text says which side and why."""


class ShovelClient(asyncio.Protocol):
    def __init__(self, url: AMQPURL, name: str) -> None:
        self.url, self.name = url, name
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.frame_max = 131072
        self.heartbeat = 0
        self._buf = bytearray()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.error: str | None = None
        self._waiter: asyncio.Future[Any] | None = None
        self._expect: tuple[type, ...] = ()
        self._content: tuple[int, str, str] | None = None
        self._props = b""
        self._body: list[bytes] = []
        self._body_left = 0
        self._last_read = loop.time()
        self._beat: asyncio.TimerHandle | None = None
        self._reading_paused = False
        self.on_delivery: Delivery | None = None
        self.on_confirm: Confirm | None = None
        self.on_writable: Callable[[bool], None] | None = None
        self._publish_frames: dict[tuple[str, str], bytes] = {}

    # ------------------------------------------------------------------ transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=1 << 20, low=1 << 18)  # type: ignore[union-attr]
        self.transport.write(PROTOCOL_HEADER)  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = f"connection lost: {exc}" if exc else "connection closed"
        if self._beat is not None:
            self._beat.cancel()
        self._fail()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        if self.on_writable is not None:
            self.on_writable(False)

    def resume_writing(self) -> None:
        if self.on_writable is not None:
            self.on_writable(True)

    def failure(self) -> ShovelClientError:
        return ShovelClientError(self.error or "connection closed")

    def _fail(self) -> None:
        for fut in (self.opened, self._waiter):
            if fut is not None and not fut.done():
                fut.set_exception(self.failure())
                fut.exception()

    def _abort(self, text: str) -> None:
        self.error = self.error or text
        self._fail()
        if self.transport is not None:
            self.transport.abort()

    def _tick(self) -> None:
        # Heartbeats both ways: a peer silent for two intervals is gone (a partition gives no RST).
        if self.transport is None or self.transport.is_closing():
            return
        if self._reading_paused:
            self._last_read = self._loop.time()  # not reading (held back by the other side): no verdict
        elif self._loop.time() - self._last_read > 2 * self.heartbeat:
            self._abort(f"missed heartbeats from {self.url.host}:{self.url.port}")
            return
        self.transport.write(HEARTBEAT)
        self._beat = self._loop.call_later(self.heartbeat / 2, self._tick)

    # ------------------------------------------------------------------- reading

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        buf = self._buf
        buf += data
        if buf[:4] == b"AMQP":
            self._abort("the broker refused the AMQP 0-9-1 protocol header")
            return
        try:
            frames, used = split_frames(buf)
        except WireError as e:
            self._abort(f"bad frame from the broker: {e}")
            return
        del buf[:used]
        for ftype, _channel, payload in frames:
            if ftype == FRAME_BODY:
                self._body.append(payload)
                self._body_left -= len(payload)
                if self._body_left <= 0:
                    self._delivered()
            elif ftype == FRAME_METHOD:
                mid = method_id(payload)
                if mid == BASIC_DELIVER:
                    tag, _redelivered, exchange, routing_key = parse_deliver(payload)
                    self._content = (tag, exchange, routing_key)
                elif mid in (BASIC_ACK, BASIC_NACK):
                    tag, multiple = parse_ack(payload)
                    if self.on_confirm is not None:
                        self.on_confirm(tag, multiple, mid == BASIC_NACK)
                else:
                    self._method(payload)
            elif ftype == FRAME_HEADER:
                self._body_left, _flags = parse_header(payload)
                self._props = payload[12:]
                self._body = []
                if self._body_left == 0:
                    self._delivered()
            elif ftype == FRAME_HEARTBEAT:
                pass
            if self.transport is None or self.transport.is_closing():
                return

    def _delivered(self) -> None:
        content, self._content = self._content, None
        if content is None:
            return  # the content of a basic.get-ok or basic.return: not used
        if self.on_delivery is not None:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            self.on_delivery(content[0], content[1], content[2], self._props, body)

    def _method(self, payload: bytes) -> None:
        try:
            method = decode_method(payload)
        except WireError as e:
            self._abort(f"cannot decode a frame from the broker: {e}")
            return
        url = self.url
        if isinstance(method, spec.Connection.Start):
            self.send(spec.Connection.StartOk(
                client_properties={"product": "lavinpy shovel", "connection_name": self.name,
                                   "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True,
                                                    "basic.nack": True}},
                mechanism=url.mechanism, response=f"\0{url.user}\0{url.password}", locale="en_US"), 0)
        elif isinstance(method, spec.Connection.Tune):
            self.frame_max = method.frame_max or 131072
            proposed = method.heartbeat
            self.heartbeat = min(proposed, HEARTBEAT_SECONDS) if proposed else HEARTBEAT_SECONDS
            self.send(spec.Connection.TuneOk(channel_max=method.channel_max or 2047, frame_max=self.frame_max,
                                             heartbeat=self.heartbeat), 0)
            self.send(spec.Connection.Open(virtual_host=url.vhost), 0)
            self._beat = self._loop.call_later(self.heartbeat / 2, self._tick)
        elif isinstance(method, spec.Connection.OpenOk):
            self.send(spec.Channel.Open())
        elif isinstance(method, spec.Channel.OpenOk) and not self.opened.done():
            self.opened.set_result(None)
        elif isinstance(method, spec.Connection.Close):
            self.error = f"connection closed by the broker: {method.reply_code} {method.reply_text}"
            self.send(spec.Connection.CloseOk(), 0)
            self._fail()
            assert self.transport is not None
            self.transport.close()
        elif isinstance(method, spec.Channel.Close):
            self.error = f"channel closed by the broker: {method.reply_code} {method.reply_text}"
            self.send(spec.Channel.CloseOk())
            if self._waiter is None or self._waiter.done():
                # Not the answer to a declare the shovel waits for: the channel it moves messages on is
                # gone, so the connection goes too and the shovel starts again.
                assert self.transport is not None
                self.transport.close()
            self._fail()
        elif isinstance(method, spec.Connection.CloseOk):
            assert self.transport is not None
            self.transport.close()
        elif isinstance(method, spec.Basic.Cancel):
            self._abort("the broker cancelled the consumer (the source queue was deleted?)")
        elif isinstance(method, spec.Connection.Blocked):
            pass  # publishes wait in the socket buffer; pause_writing holds the source back
        elif self._waiter is not None and isinstance(method, self._expect) and not self._waiter.done():
            self._waiter.set_result(method)

    # ----------------------------------------------------------------- operations

    def send(self, method: Any, channel: int = CHANNEL) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(method_frame(channel, method))

    async def rpc(self, method: Any, *expect: type, timeout: float = 30.0) -> Any:
        """A synchronous method on the channel and its reply; ShovelClientError when the broker refuses."""
        if self.error:
            raise self.failure()
        self._waiter = self._loop.create_future()
        self._expect = expect
        self.send(method)
        try:
            return await asyncio.wait_for(self._waiter, timeout)
        except TimeoutError:
            self._abort(f"no answer to {type(method).__name__} within {timeout} s")
            raise self.failure() from None
        finally:
            self._waiter = None

    async def reopen_channel(self) -> None:
        """Channel 1 again after the broker closed it (a passive declare that found nothing)."""
        if self.transport is None or self.transport.is_closing():
            raise self.failure()
        self.error = None
        await self.rpc(spec.Channel.Open(), spec.Channel.OpenOk)

    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        key = (exchange, routing_key)
        head = self._publish_frames.get(key)
        if head is None:
            if len(self._publish_frames) > 4096:
                self._publish_frames.clear()
            head = self._publish_frames[key] = publish_method_frame(CHANNEL, exchange, routing_key, False)
        assert self.transport is not None
        self.transport.writelines([head, *content_frames(CHANNEL, properties, body, self.frame_max)])

    def ack(self, tag: int, multiple: bool) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(basic_ack(CHANNEL, tag, multiple))

    def nack(self, tag: int, multiple: bool) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(basic_nack(CHANNEL, tag, multiple, True))

    def pause_reading(self, paused: bool) -> None:
        if self.transport is not None and not self.transport.is_closing() and paused != self._reading_paused:
            self._reading_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    async def close(self, timeout: float = 3.0) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.send(spec.Connection.Close(reply_code=200, reply_text="shovel stopped", class_id=0, method_id=0), 0)
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), timeout)
        except TimeoutError:
            self.transport.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def connect(url: AMQPURL, name: str) -> ShovelClient:
    """An open connection with channel 1 open, or ShovelClientError naming the broker and why."""
    loop = asyncio.get_running_loop()
    where = f"{url.host}:{url.port}"
    tls = url.tls
    try:
        _, client = await asyncio.wait_for(loop.create_connection(
            lambda: ShovelClient(url, name), url.host, url.port,
            ssl=tls.context() if tls is not None else None,
            server_hostname=(tls.server_name or url.host) if tls is not None else None), CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as e:
        raise ShovelClientError(f"cannot connect to {where}: {e or 'timed out'}") from None
    try:
        await asyncio.wait_for(asyncio.shield(client.opened), CONNECT_TIMEOUT)
    except TimeoutError:
        client.abort()
        raise ShovelClientError(f"{where}: the AMQP handshake timed out") from None
    except ShovelClientError as e:
        raise ShovelClientError(f"{where}: {e}") from None
    except asyncio.CancelledError:  # the shovel was stopped during the handshake
        client.abort()
        raise
    return client
