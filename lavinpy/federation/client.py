"""What a federation link asks of an AMQP 0-9-1 connection, and the client that gives it.

The link names only ``LinkConnection`` and ``connect``: the shovel's client (lavinpy.shovel.client, an
asyncio adapter of lavinpy.wire's sans-IO client connection) with the server's properties shown, so
that the link can read the upstream's cluster name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from lavinpy.shovel.client import ShovelClient, ShovelClientError
from lavinpy.shovel.client import connect as connect_shovel_client
from lavinpy.wire.client_events import Delivery
from lavinpy.wire.field_table import encode_table
from lavinpy.wire.frames import build_method, method_fields
from lavinpy.wire.uri import AMQPURL
from lavinpy.wire.writer import EncodedMethod

LinkError = ShovelClientError


def raw_method(cls: type, fields: dict[str, Any], arguments: dict[str, Any]) -> EncodedMethod:
    """A method whose arguments table (the last field of every method that has one) is encoded by
    lavinpy.wire, which keeps an Int64 a long ('l': RabbitMQ wants x-max-hops so) where pamqp picks the
    smallest integer type."""
    head = method_fields(build_method(cls, **fields, arguments={}))[:-4]  # the empty table's length
    return EncodedMethod(cls.__name__, cls.index, head + encode_table(arguments))  # type: ignore[attr-defined]


def unchecked(cls: type, **fields: Any) -> Any:
    """A method with names sent as given (``federation: x -> cluster``, which pamqp's check refuses) and,
    when it has arguments, encoded by ``raw_method``."""
    arguments = fields.pop("arguments", None)
    if arguments:
        return raw_method(cls, fields, arguments)
    return build_method(cls, **fields)


class LinkConnection(Protocol):
    """One connection with one channel open."""

    error: str | None
    closed: asyncio.Future[None]
    @property
    def server_properties(self) -> dict[str, Any]: ...
    on_message: Callable[[int, bool, str, str, bytes, bytes], None] | None
    on_confirm: Callable[[int, bool, bool], None] | None
    on_writable: Callable[[bool], None] | None

    async def rpc(self, method: Any, *expect: type, timeout: float = 30.0) -> Any: ...
    async def reopen_channel(self) -> None: ...
    def send(self, method: Any, channel: int = 1) -> None: ...
    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None: ...
    def ack(self, tag: int, multiple: bool) -> None: ...
    def nack(self, tag: int, multiple: bool) -> None: ...
    def pause_reading(self, paused: bool) -> None: ...
    def publish_through(self, peer: LinkConnection | None) -> None: ...
    async def close(self, timeout: float = 3.0) -> None: ...
    def abort(self) -> None: ...


MessageCallback = Callable[[int, bool, str, str, bytes, bytes], None]  # tag, redelivered, exchange, key, props, body


class _Client(ShovelClient):
    """The shovel's client, with connection.start's server properties, nowait methods on channel 1, and
    deliveries with their redelivered flag (``x-received-from`` carries it)."""

    on_message: MessageCallback | None = None
    _peer: _Client | None = None  # where this connection's deliveries are published (publish_through)
    _corked = False  # writes held back while a run of the peer's deliveries is handled

    def publish_through(self, peer: LinkConnection | None) -> None:
        """The deliveries of one read of this connection are published on ``peer``: its writes are held
        back until the whole run is handled and go out in one (a system call per run, not per message)."""
        self._peer = peer if isinstance(peer, _Client) else None

    def flush(self) -> None:
        if not self._corked:
            super().flush()

    def data_received(self, data: bytes) -> None:
        peer = self._peer
        if peer is None or peer._corked:
            super().data_received(data)
            return
        peer._corked = True
        try:
            super().data_received(data)
        finally:
            peer._corked = False
            peer.flush()

    def handle_delivery(self, delivery: Delivery) -> None:
        if self.on_message is not None:
            self.on_message(delivery.delivery_tag, delivery.redelivered, delivery.exchange, delivery.routing_key,
                            delivery.properties, delivery.body)

    @property
    def server_properties(self) -> dict[str, Any]:
        return self.conn.server_properties

    def send(self, method: Any, channel: int = 1) -> None:
        self.send_method(channel, method)


async def connect(url: AMQPURL, name: str) -> LinkConnection:
    """An open connection with channel 1 open, or LinkError naming the broker and why."""
    return await connect_shovel_client(url, name, product="lavinpy federation", protocol=_Client)
