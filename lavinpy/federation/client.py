"""What a federation link asks of an AMQP 0-9-1 connection, and the client that gives it.

The link names only ``LinkConnection`` and ``connect``: today the shovel's client (lavinpy.shovel.client,
on lavinpy.wire) with the server's properties kept, so that the link can read the upstream's
cluster name; the shared sans-IO client can take its place behind the same few methods.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any, Protocol

from pamqp import commands as spec

from lavinpy.shovel.client import CONNECT_TIMEOUT, ShovelClient, ShovelClientError
from lavinpy.wire.constants import FRAME_END, FRAME_METHOD
from lavinpy.wire.field_table import encode_table
from lavinpy.wire.frames import build_method, method_fields
from lavinpy.wire.uri import AMQPURL

LinkError = ShovelClientError


class RawMethod:
    """A method whose octets are made here: its names as given, and its arguments table (the last field
    of every method that has one) encoded by lavinpy.wire, which keeps an Int64 a long ('l': RabbitMQ
    wants x-max-hops so) where pamqp picks the smallest integer type. Sent by the link's client as is."""

    def __init__(self, cls: type, fields: dict[str, Any], arguments: dict[str, Any]) -> None:
        self.name = cls.__name__
        head = method_fields(build_method(cls, **fields, arguments={}))[:-4]  # the empty table's length
        self.payload = head + encode_table(arguments)
        self.index: int = cls.index  # type: ignore[attr-defined]  # a pamqp method class

    def frame(self, channel: int) -> bytes:
        return struct.pack(">BHII", FRAME_METHOD, channel, 4 + len(self.payload), self.index) + self.payload \
            + bytes([FRAME_END])


def unchecked(cls: type, **fields: Any) -> Any:
    """A method with names sent as given (``federation: x -> cluster``, which pamqp's check refuses) and,
    when it has arguments, as a RawMethod."""
    arguments = fields.pop("arguments", None)
    if arguments:
        return RawMethod(cls, fields, arguments)
    return build_method(cls, **fields)


class LinkConnection(Protocol):
    """One connection with one channel open."""

    error: str | None
    closed: asyncio.Future[None]
    server_properties: dict[str, Any]
    on_delivery: Callable[[int, str, str, bytes, bytes], None] | None
    on_confirm: Callable[[int, bool, bool], None] | None
    on_writable: Callable[[bool], None] | None

    async def rpc(self, method: Any, *expect: type, timeout: float = 30.0) -> Any: ...
    async def reopen_channel(self) -> None: ...
    def send(self, method: Any, channel: int = 1) -> None: ...
    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None: ...
    def ack(self, tag: int, multiple: bool) -> None: ...
    def nack(self, tag: int, multiple: bool) -> None: ...
    def pause_reading(self, paused: bool) -> None: ...
    async def close(self, timeout: float = 3.0) -> None: ...
    def abort(self) -> None: ...


class _Client(ShovelClient):
    """The shovel's client, keeping connection.start's server properties."""

    def __init__(self, url: AMQPURL, name: str) -> None:
        super().__init__(url, name)
        self.server_properties: dict[str, Any] = {}

    def send(self, method: Any, channel: int = 1) -> None:
        if isinstance(method, RawMethod):
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(method.frame(channel))
            return
        super().send(method, channel)

    def _method(self, payload: bytes) -> None:
        if payload[:4] == b"\x00\x0a\x00\x0a":  # connection.start
            try:
                start = spec.Connection.Start()
                start.unmarshal(payload[4:])
                self.server_properties = dict(start.server_properties or {})
            except Exception:  # no properties: the handshake below reports a real fault
                pass
        super()._method(payload)


async def connect(url: AMQPURL, name: str) -> LinkConnection:
    """An open connection with channel 1 open, or LinkError naming the broker and why."""
    loop = asyncio.get_running_loop()
    where = f"{url.host}:{url.port}"
    tls = url.tls
    try:
        _, client = await asyncio.wait_for(loop.create_connection(
            lambda: _Client(url, name), url.host, url.port,
            ssl=tls.context() if tls is not None else None,
            server_hostname=(tls.server_name or url.host) if tls is not None else None), CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as e:
        raise LinkError(f"cannot connect to {where}: {e or 'timed out'}") from None
    try:
        await asyncio.wait_for(asyncio.shield(client.opened), CONNECT_TIMEOUT)
    except TimeoutError:
        client.abort()
        raise LinkError(f"{where}: the AMQP handshake timed out") from None
    except LinkError as e:
        raise LinkError(f"{where}: {e}") from None
    except asyncio.CancelledError:
        client.abort()
        raise
    return client
