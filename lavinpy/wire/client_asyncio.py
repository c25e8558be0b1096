"""The asyncio adapter of ClientConnection: one transport, one sans-IO client connection.

Used by the shovel, lavinpy-perf and the federation links. ``connect`` opens a socket (TLS when
given a context), runs the handshake and returns the protocol once connection.open-ok came; then:

    client = await connect(ClientConnection(user, password, vhost, name="my link"), host, port)
    channel = await client.open_channel()
    ok = await client.call(channel, build_method(commands.Queue.Declare, queue="q"), commands.Queue.DeclareOk)
    client.basic_publish(channel, "", "q", properties, body)
    await client.close()

Methods that carry a name are made by ``lavinpy.wire.frames.build_method``: pamqp's constructors refuse
names RabbitMQ takes. A subclass overrides ``handle_delivery``, ``handle_confirm`` and ``handle_event``
to take deliveries, publisher confirms and the other events (returns, flow, blocked, cancels); a
channel the broker closes while nobody waits on it ends the connection unless ``channel_closed`` is
overridden. Calls raise ClientError (the broker refused, or the connection is gone); heartbeats run on
the loop's timer.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from lavinpy.wire.client_connection import ClientConnection, ClientProtocolError
from lavinpy.wire.client_events import (
    ChannelClosed,
    Confirmed,
    ConnectionClosed,
    ConnectionOpened,
    Delivery,
    Event,
    Reply,
)

__all__ = ["ClientError", "ClientProtocol", "connect"]

CONNECT_TIMEOUT = 15.0


class ClientError(Exception):
    """The broker refused something, or the connection was lost; the text says why and ``reply_code``
    is the broker's code when it closed the channel of the call (404, 406...), None otherwise."""

    def __init__(self, text: str, reply_code: int | None = None) -> None:
        super().__init__(text)
        self.reply_code = reply_code


class ClientProtocol(asyncio.Protocol):
    """asyncio's side of one ClientConnection (see the module's text)."""

    def __init__(self, connection: ClientConnection) -> None:
        self.conn = connection
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[ConnectionOpened] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.error: str | None = None
        self._waiters: dict[int, deque[asyncio.Future[Reply]]] = {}
        self._beat: asyncio.TimerHandle | None = None
        self._reading_paused = False

    @property
    def frame_max(self) -> int:
        return self.conn.frame_max

    # ------------------------------------------------------------------ transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        # Big enough to batch, small enough that pause_writing pushes back on a slow broker.
        self.transport.set_write_buffer_limits(high=1 << 20, low=1 << 18)  # type: ignore[union-attr]
        self.conn.initiate()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = self.conn.error or (f"connection lost: {exc}" if exc else "connection closed")
        if self._beat is not None:
            self._beat.cancel()
        self._fail_all()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except ClientProtocolError as e:
            self.flush()  # the connection.close that says why
            self.abort(str(e))
            return
        self.handle_events(events)
        self.flush()

    def flush(self) -> None:
        """Write what the connection has queued."""
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def pause_writing(self) -> None:
        self.writable_changed(False)

    def resume_writing(self) -> None:
        self.writable_changed(True)

    def pause_reading(self, paused: bool) -> None:
        """Stop (or restart) reading from the broker, e.g. while the other side of a link is slow."""
        if self.transport is not None and not self.transport.is_closing() and paused != self._reading_paused:
            self._reading_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # ------------------------------------------------------------------ events

    def handle_events(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Delivery):
                self.handle_delivery(event)
            elif isinstance(event, Confirmed):
                self.handle_confirm(event)
            elif isinstance(event, Reply):
                waiters = self._waiters.get(event.channel)
                if waiters:
                    waiter = waiters.popleft()
                    if not waiter.done():
                        waiter.set_result(event)
            elif isinstance(event, ChannelClosed):
                self._on_channel_closed(event)
            elif isinstance(event, ConnectionOpened):
                self._on_opened(event)
            elif isinstance(event, ConnectionClosed):
                self.error = self.error or self.conn.error
                self._fail_all()
                self.flush()
                if self.transport is not None:
                    self.transport.close()
            else:
                self.handle_event(event)

    def handle_delivery(self, delivery: Delivery) -> None:
        """A message from a consumer (override)."""

    def handle_confirm(self, confirm: Confirmed) -> None:
        """A publisher confirm (override)."""

    def handle_event(self, event: Event) -> None:
        """Any other event: Returned, ChannelFlow, Blocked, Unblocked, ConsumerCancelled, MethodReceived."""

    def writable_changed(self, writable: bool) -> None:
        """The transport's buffer went over its high mark (False) or under its low one (True)."""

    def channel_closed(self, closed: ChannelClosed, awaited: bool) -> None:
        """The broker closed a channel; ``awaited`` says a call on it was waiting (and got the error).
        By default a channel closed under nobody's call ends the connection."""
        if not awaited:
            self.abort(self._channel_text(closed))

    @staticmethod
    def _channel_text(closed: ChannelClosed) -> str:
        return f"channel closed by the broker: {closed.reply_code} {closed.reply_text}"

    def _on_channel_closed(self, closed: ChannelClosed) -> None:
        error = ClientError(self._channel_text(closed), closed.reply_code)
        waiters = self._waiters.pop(closed.channel, None) or ()
        awaited = False
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
                awaited = True
        self.channel_closed(closed, awaited)

    def _on_opened(self, opened: ConnectionOpened) -> None:
        if not self.opened.done():
            self.opened.set_result(opened)
        if self.conn.heartbeat_interval:
            self._beat = self._loop.call_later(self.conn.heartbeat_interval, self._tick)

    def _tick(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self._reading_paused:
            self.conn.note_peer_alive()  # not reading on purpose: silence says nothing then
        if self.conn.tick():
            self.abort(self.conn.error or "missed heartbeats")
            return
        self.flush()
        self._beat = self._loop.call_later(self.conn.heartbeat_interval, self._tick)

    def failure(self) -> ClientError:
        return ClientError(self.error or "connection closed")

    def _fail_all(self) -> None:
        error = self.failure()
        futures: list[asyncio.Future[Any]] = [self.opened]
        for waiters in self._waiters.values():
            futures += waiters
        self._waiters.clear()
        for future in futures:
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: nobody may await it any more

    # ------------------------------------------------------------------ operations

    async def call(self, channel: int, method: Any, *expect: type, timeout: float = 30.0) -> Reply:
        """A synchronous method and its reply; ClientError when the broker refuses (closes the channel
        or connection) or does not answer within ``timeout`` (the connection is then aborted)."""
        return await self._reply(channel, lambda: self.conn.call(channel, method, *expect), type(method).__name__,
                                 timeout)

    async def open_channel(self, channel: int = 0, timeout: float = 30.0) -> int:
        """Open ``channel`` (0: the lowest free number) and return its number."""
        opened: list[int] = []
        await self._reply(channel, lambda: opened.append(self.conn.open_channel(channel)), "channel.open", timeout,
                          opened)
        return opened[0]

    async def confirm_select(self, channel: int, timeout: float = 30.0) -> None:
        """Publisher confirms on ``channel``: ``basic_publish`` returns each message's delivery tag."""
        await self._reply(channel, lambda: self.conn.confirm_select(channel), "confirm.select", timeout)

    async def _reply(self, channel: int, send: Callable[[], object], what: str, timeout: float,
                     opened: list[int] | None = None) -> Reply:
        if self.error:
            raise self.failure()
        try:
            send()
        except ClientProtocolError as e:
            raise ClientError(str(e)) from None
        if opened:
            channel = opened[0]
        waiter: asyncio.Future[Reply] = self._loop.create_future()
        self._waiters.setdefault(channel, deque()).append(waiter)
        self.flush()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            self.abort(f"no answer to {what} within {timeout:g} s")
            raise self.failure() from None

    def send_method(self, channel: int, method: Any) -> None:
        """A method with no reply (a nowait one)."""
        if not self.conn.is_open:
            raise self.failure()
        self.conn.send_method(channel, method)
        self.flush()

    def basic_publish(self, channel: int, exchange: str, routing_key: str, properties: bytes, body: bytes,
                      mandatory: bool = False) -> int:
        """Publish (``properties`` a packed property block); the delivery tag on a confirm channel, else 0."""
        tag = self.conn.publish(channel, exchange, routing_key, properties, body, mandatory)
        self.flush()
        return tag

    def basic_ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        self.conn.ack(channel, delivery_tag, multiple)
        self.flush()

    def basic_nack(self, channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self.conn.nack(channel, delivery_tag, multiple, requeue)
        self.flush()

    async def close(self, timeout: float = 3.0, reply_text: str = "") -> None:
        """connection.close and wait for the broker's close-ok (abort after ``timeout``)."""
        if self.transport is None or self.transport.is_closing():
            return
        self.conn.close(200, reply_text)
        self.flush()
        if self.conn.is_closed:  # mid-handshake: nothing to wait for
            self.transport.close()
            return
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), timeout)
        except TimeoutError:
            self.transport.abort()

    def abort(self, text: str | None = None) -> None:
        """Drop the connection at once; ``text`` says why (kept as ``error``)."""
        if text and self.error is None:
            self.error = text
        self._fail_all()
        if self.transport is not None:
            self.transport.abort()


Protocol = TypeVar("Protocol", bound=ClientProtocol)


async def connect(connection: ClientConnection, host: str, port: int, *, tls: ssl.SSLContext | None = None,
                  server_hostname: str | None = None, timeout: float = CONNECT_TIMEOUT,
                  protocol: type[Protocol] = ClientProtocol) -> Protocol:  # type: ignore[assignment]
    """An open connection (handshake done) as a ``protocol`` instance, or ClientError naming host:port and why."""
    loop = asyncio.get_running_loop()
    where = f"{host}:{port}"
    try:
        _, client = await asyncio.wait_for(loop.create_connection(
            lambda: protocol(connection), host, port, ssl=tls,
            server_hostname=(server_hostname or host) if tls is not None else None), timeout)
    except (OSError, TimeoutError) as e:
        raise ClientError(f"cannot connect to {where}: {e or 'timed out'}") from None
    try:
        await asyncio.wait_for(asyncio.shield(client.opened), timeout)
    except TimeoutError:
        client.abort()
        raise ClientError(f"{where}: the AMQP handshake timed out") from None
    except ClientError as e:
        client.abort()
        raise ClientError(f"{where}: {e}") from None
    except asyncio.CancelledError:  # the caller gave up during the handshake
        client.abort()
        raise
    return client
