"""The management API's and /metrics' ports, open from the start, with the HTTP stack loaded by the first
connection to one of them.

aiohttp, the modules it pulls in (email, cookies, pickle, unicode data) and the API's routes were 15-17 MiB
of the broker's RSS, a third of it, whether anybody used the API or not (bench/history.md: the bodies runs,
whose broker has its HTTP ports open, peaked at 56-59 MiB against 42 without them). The ports are bound at
start as before (a port in use still stops the start); a connection accepted before the stack is loaded
waits with its reading paused and is handed to aiohttp's protocol once it is, in the order the connections
came. The modules are imported in a worker thread, so the event loop goes on serving AMQP meanwhile; the
first request waits for that (a few hundred ms), later ones do not. A broker whose API is used pays the
same RSS as before, from its first request on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..wire.proxy_header import ProxyHeader

log = logging.getLogger("lavinpy.http")

# A loaded server's protocol for one connection: (the client a PROXY header named or None, the port's name).
ProtocolMaker = Callable[[ProxyHeader | None, str], asyncio.Protocol]
# Loads the stack: a ProtocolMaker for each kind of port ("management", "metrics").
Loader = Callable[[], Awaitable[dict[str, ProtocolMaker]]]


class HttpGate:
    """The protocol factories of the HTTP ports: aiohttp's protocols once loaded, a waiting one before."""

    def __init__(self, load: Loader) -> None:
        self._load = load
        self._makers: dict[str, ProtocolMaker] | None = None
        self._waiting: list[WaitingConnection] = []
        self._loading: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def loaded(self) -> bool:
        return self._makers is not None

    def factory(self, kind: str, what: str) -> Callable[[ProxyHeader | None], asyncio.Protocol]:
        """The listener's factory for a port of ``kind`` (named ``what`` in logs)."""

        def make(client: ProxyHeader | None) -> asyncio.Protocol:
            makers = self._makers
            if makers is not None:
                return makers[kind](client, what)
            return WaitingConnection(self, kind, what, client)

        return make

    def arrived(self, waiting: WaitingConnection) -> None:
        if self._closed:
            waiting.close()
            return
        self._waiting.append(waiting)
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load_now())

    def left(self, waiting: WaitingConnection) -> None:
        if waiting in self._waiting:
            self._waiting.remove(waiting)

    async def _load_now(self) -> None:
        try:
            makers = await self._load()
        except Exception:
            log.exception("the HTTP API could not be loaded; its waiting connections are closed")
            waiting, self._waiting = self._waiting, []
            for connection in waiting:
                connection.close()
            self._loading = None  # the next connection tries again
            return
        self._makers = makers
        waiting, self._waiting = self._waiting, []
        for connection in waiting:
            if self._closed:
                connection.close()
            else:
                connection.hand_over(makers[connection.kind](connection.client, connection.what))

    async def close(self) -> None:
        """No more hand-overs; a load under way is waited for (its servers are the caller's to stop)."""
        self._closed = True
        loading = self._loading
        if loading is not None and not loading.done():
            try:
                await loading
            except asyncio.CancelledError:
                pass
        waiting, self._waiting = self._waiting, []
        for connection in waiting:
            connection.close()


class WaitingConnection(asyncio.Protocol):
    """A connection accepted before the HTTP stack was loaded: its reading is paused until the gate hands
    it to aiohttp's protocol (which then sees it as a connection just made)."""

    def __init__(self, gate: HttpGate, kind: str, what: str, client: ProxyHeader | None) -> None:
        self.gate = gate
        self.kind = kind
        self.what = what
        self.client = client
        self.transport: asyncio.Transport | None = None
        self._early: list[bytes] = []  # read before the pause took hold (a transport may deliver one read)
        self._eof = False
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.pause_reading()  # type: ignore[attr-defined]
        self.gate.arrived(self)

    def data_received(self, data: bytes) -> None:
        self._early.append(data)

    def eof_received(self) -> bool:
        self._eof = True
        return True  # kept open: the request read so far is still answered

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.gate.left(self)

    def hand_over(self, protocol: asyncio.Protocol) -> None:
        transport = self.transport
        if self._lost or transport is None or transport.is_closing():
            return
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        for data in self._early:
            protocol.data_received(data)
        self._early = []
        if self._eof:
            if not protocol.eof_received():
                transport.close()
            return
        transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self._lost:
            self.transport.close()
