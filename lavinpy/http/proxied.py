"""The client's address behind a PROXY header, for aiohttp (which has no PROXY protocol support).

The listener (lavinpy.listeners) reads a trusted peer's header before the connection reaches aiohttp
and names the client; a thin protocol in front of aiohttp's handler records it, and a middleware
shows it as ``request.remote`` (the loopback-only rule, the login throttle and logs read that).
A PROXY header reaching the handler itself came from a peer that may not send one: bad input.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..amqp.log import log_bad_proxy_header
from ..listeners import HTTP_PROXY_HEADER_REFUSED
from ..wire.proxy_header import ProxyHeader, may_be_proxy_header

# transport -> the client address its PROXY header named (while the connection lasts)
_CLIENTS: dict[Any, tuple[str, int]] = {}


class ForwardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, told which client a PROXY header named (None: none)."""

    def __init__(self, inner: asyncio.Protocol, forwarded: ProxyHeader | None, what: str) -> None:
        self.inner = inner
        self.client = forwarded.source if forwarded is not None else None
        self.what = what
        self.transport: asyncio.BaseTransport | None = None
        self._first_read = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.client is not None:
            _CLIENTS[transport] = self.client
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._first_read:
            self._first_read = False
            if may_be_proxy_header(data[:16]) and self.transport is not None:
                log_bad_proxy_header(self.what, self.transport.get_extra_info("peername"),
                                     "a PROXY header from a source not in proxy_protocol_trusted_sources")
                self.transport.write(HTTP_PROXY_HEADER_REFUSED)  # type: ignore[attr-defined]
                self.transport.close()
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
