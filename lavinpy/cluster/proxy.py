"""A follower's client ports: each connection is forwarded byte for byte to the leader's same port.

The first bytes sent to the leader are a PROXY protocol v1 line naming the client, so the leader
shows (and checks, for loopback-only users) the client's own address. While no leader is known an
AMQP connection is closed at once and an HTTP request gets 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import cast

from ..listeners import address_text, bind_sockets
from ..wire.proxy_header import format_proxy_line

log = logging.getLogger("lavinpy.cluster.proxy")

CONNECT_TIMEOUT = 2.0
EARLY_LIMIT = 256 * 1024  # bytes taken from a client before the leader's end is connected

_UNAVAILABLE_BODY = json.dumps({"error": "service_unavailable",
                                "reason": "no cluster leader is known yet, try again"}).encode()
HTTP_UNAVAILABLE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
                    + str(len(_UNAVAILABLE_BODY)).encode() + b"\r\n\r\n" + _UNAVAILABLE_BODY)


class ClientProxy:
    """Listens on ``port`` of every bind address; ``target()`` is the leader's (host, port) or None."""

    def __init__(self, what: str, hosts: list[str], port: int,
                 target: Callable[[], tuple[str, int] | None], unavailable_reply: bytes = b"") -> None:
        self.what = what
        self.hosts = hosts
        self.port = port
        self.target = target
        self.unavailable_reply = unavailable_reply
        self._servers: list[asyncio.AbstractServer] = []
        self.halves: set[_Half] = set()

    async def start(self) -> None:
        sockets = bind_sockets(self.hosts, self.port, self.what)
        loop = asyncio.get_running_loop()
        self._servers = [await loop.create_server(lambda: _ClientHalf(self), sock=sock) for sock in sockets]
        log.info("forwarding %s from %s to the leader", self.what, ", ".join(address_text(s) for s in sockets))

    async def stop(self) -> None:
        """Stop listening and drop every forwarded connection."""
        for server in self._servers:
            server.close()
        self._servers = []
        for half in list(self.halves):
            half.abort()
        self.halves.clear()


class _Half(asyncio.Protocol):
    """One end of a forwarded connection. Bytes go straight from one transport to the other in the
    callback that received them (no stream buffer, no task turn); a side whose output backs up
    pauses the other side's reading, so nothing is buffered without bound."""

    def __init__(self, proxy: ClientProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.early = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.proxy.halves.add(self)

    def _other(self) -> asyncio.Transport | None:
        """The other end's transport while both ends are linked and open."""
        return self.peer.transport if self.peer is not None else None

    def data_received(self, data: bytes) -> None:
        other = self._other()
        if other is not None:
            other.write(data)
        else:  # before the other end is there (a loop may deliver what came with the connection)
            self.early += data
            if len(self.early) > EARLY_LIMIT and self.transport is not None:
                self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # close this side; connection_lost closes the other

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.halves.discard(self)
        self.transport = None
        other = self._other()
        if self.peer is not None:
            self.peer.peer = None
            self.peer = None
        if other is not None:
            other.close()  # what it still has to send goes out first

    def pause_writing(self) -> None:
        if (other := self._other()) is not None:
            other.pause_reading()

    def resume_writing(self) -> None:
        if (other := self._other()) is not None:
            other.resume_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class _ClientHalf(_Half):
    """The client's end: its bytes go to the leader once the leader's end is connected and the PROXY
    line sent (what comes before is kept, up to EARLY_LIMIT)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        cast(asyncio.Transport, transport).pause_reading()
        self._connecting = asyncio.get_running_loop().create_task(self._connect())  # kept: tasks are weak

    async def _connect(self) -> None:
        proxy, transport = self.proxy, self.transport
        if transport is None:
            return
        client = transport.get_extra_info("peername")
        target = proxy.target()
        upstream: _Half | None = None
        if target is None:
            log.warning("%s connection from %s closed: no cluster leader is known", proxy.what, _text(client))
        else:
            try:
                _, upstream = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                    lambda: _Half(proxy), target[0], target[1]), CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as e:
                log.warning("%s connection from %s: the leader at %s:%d cannot be reached (%s); closing it",
                            proxy.what, _text(client), target[0], target[1], e)
        if self.transport is None:  # the client left meanwhile
            if upstream is not None:
                upstream.abort()
            return
        if upstream is None or upstream.transport is None:
            if proxy.unavailable_reply:
                transport.write(proxy.unavailable_reply)
            transport.close()
            return
        upstream.transport.write(format_proxy_line(_pair(client), _pair(transport.get_extra_info("sockname"))))
        self.peer, upstream.peer = upstream, self
        leader_end = upstream.transport
        # What each end sent early goes out before the link.
        for half, own, other in ((self, transport, leader_end), (upstream, leader_end, transport)):
            if half.early:
                other.write(bytes(half.early))
                half.early.clear()
            own.resume_reading()


def _pair(address: object) -> tuple[str, int] | None:
    return (address[0], address[1]) if isinstance(address, tuple) else None


def _text(address: object) -> str:
    pair = _pair(address)
    return f"{pair[0]}:{pair[1]}" if pair else "?"
