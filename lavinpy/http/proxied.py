"""PROXY protocol v1 in front of aiohttp's request handler (aiohttp has no support of its own).

On a cluster's leader, followers forward HTTP connections byte for byte after a PROXY line naming the
client. A thin protocol strips that line (only from a trusted peer) and hands everything else to
aiohttp's handler untouched; a middleware then shows the client's address as ``request.remote``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..wire.proxy_header import ProxyHeaderError, may_be_proxy_line, parse_proxy_line

# transport -> the client address its PROXY line named (while the connection lasts)
_CLIENTS: dict[Any, tuple[str, int]] = {}


class ProxyLineProtocol(asyncio.Protocol):
    def __init__(self, inner: asyncio.Protocol, accept_proxy: Callable[[str], bool]) -> None:
        self.inner = inner
        self.accept_proxy = accept_proxy
        self.transport: asyncio.BaseTransport | None = None
        self._pending: bytes | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and self.accept_proxy(peer[0]):
            self._pending = b""
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._pending is not None:
            pending = self._pending + data
            try:
                parsed = parse_proxy_line(pending) if may_be_proxy_line(pending) else False
            except ProxyHeaderError:
                parsed = False  # aiohttp answers it as the bad request it is
            if parsed is None:
                self._pending = pending
                return
            self._pending = None
            data = pending
            if parsed:
                header, used = parsed
                if header.source is not None:
                    _CLIENTS[self.transport] = header.source
                data = pending[used:]
            if not data:
                return
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        _CLIENTS.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def forwarded_client(transport: Any) -> tuple[str, int] | None:
    return _CLIENTS.get(transport) if _CLIENTS else None


@web.middleware
async def proxied_remote(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """A forwarded request's ``remote`` is its client's address (for loopback-only users and logs)."""
    client = forwarded_client(request.transport)
    if client is not None:
        request = request.clone(remote=client[0])
    return await handler(request)


async def serve_with_proxy_lines(server: web.Server, sockets: list[Any],
                                 accept_proxy: Callable[[str], bool]) -> list[asyncio.AbstractServer]:
    """Serve aiohttp's ``server`` on bound ``sockets``, each connection behind a ProxyLineProtocol."""
    loop = asyncio.get_running_loop()
    return [await loop.create_server(lambda: ProxyLineProtocol(server(), accept_proxy), sock=sock)
            for sock in sockets]
