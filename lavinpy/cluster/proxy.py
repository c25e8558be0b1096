"""A follower's client ports: each connection is forwarded byte for byte to the leader's same port.

The first bytes sent to the leader are a PROXY protocol v1 line naming the client, so the leader
shows (and checks, for loopback-only users) the client's own address. While no leader is known an
AMQP connection is closed at once and an HTTP request gets 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

from ..listeners import address_text, bind_sockets
from ..wire.proxy_header import format_proxy_line

log = logging.getLogger("lavinpy.cluster.proxy")

CONNECT_TIMEOUT = 2.0
CHUNK = 256 * 1024

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
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        sockets = bind_sockets(self.hosts, self.port, self.what)
        self._servers = [await asyncio.start_server(self._handle, sock=sock) for sock in sockets]
        log.info("forwarding %s from %s to the leader", self.what, ", ".join(address_text(s) for s in sockets))

    async def stop(self) -> None:
        """Stop listening and drop every forwarded connection."""
        for server in self._servers:
            server.close()
        self._servers = []
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = writer.get_extra_info("peername")
        local = writer.get_extra_info("sockname")
        target = self.target()
        upstream_writer = None
        if target is not None:
            try:
                upstream_reader, upstream_writer = await asyncio.wait_for(
                    asyncio.open_connection(target[0], target[1]), CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as e:
                log.warning("%s connection from %s: the leader at %s:%d cannot be reached (%s); closing it",
                            self.what, _text(client), target[0], target[1], e)
        else:
            log.warning("%s connection from %s closed: no cluster leader is known", self.what, _text(client))
        if upstream_writer is None:
            if self.unavailable_reply:
                writer.write(self.unavailable_reply)
                with contextlib.suppress(OSError):
                    await writer.drain()
            writer.close()
            return
        self._writers.update((writer, upstream_writer))
        upstream_writer.write(format_proxy_line(_pair(client), _pair(local)))
        try:
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        finally:
            self._writers.discard(writer)
            self._writers.discard(upstream_writer)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either side ends; then both ends close (the other pipe sees its end too)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


def _pair(address: object) -> tuple[str, int] | None:
    return (address[0], address[1]) if isinstance(address, tuple) else None


def _text(address: object) -> str:
    pair = _pair(address)
    return f"{pair[0]}:{pair[1]}" if pair else "?"
