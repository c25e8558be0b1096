"""A follower's client ports: each connection is forwarded byte for byte to the leader's same port.

The first bytes sent to the leader are a PROXY protocol v1 line naming the client, so the leader
shows (and checks, for loopback-only users) the client's own address. Behind a load balancer listed in
``proxy_protocol_trusted_sources`` the client is the one its PROXY header names: the header is read
and checked by the node's own listener code (lavinpy.listeners), with its rules and limits, and only
the line naming that client goes on. A PROXY header from anyone else is bad input, refused here as the
leader's own ports would. While no leader is known an AMQP connection is closed at once, an HTTP
request gets 503 and an MQTT client a CONNACK "server unavailable".
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import cast

from ..listeners import ProxiedListener, ProxyPolicy, address_text, bind_sockets
from ..wire.proxy_header import ProxyHeader, TrustedSources, format_proxy_line, may_be_proxy_header

log = logging.getLogger("lavinpy.cluster.proxy")

CONNECT_TIMEOUT = 2.0
EARLY_LIMIT = 256 * 1024  # bytes taken from a client before the leader's end is connected

_UNAVAILABLE_BODY = json.dumps({"error": "service_unavailable",
                                "reason": "no cluster leader is known yet, try again"}).encode()
HTTP_UNAVAILABLE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
                    + str(len(_UNAVAILABLE_BODY)).encode() + b"\r\n\r\n" + _UNAVAILABLE_BODY)

# CONNACK, return code 3 "server unavailable": what an MQTT client reads while no leader is known.
MQTT_UNAVAILABLE = b"\x20\x02\x00\x03"


class ClientProxy:
    """Listens on ``port`` of every bind address; ``target()`` is the leader's (host, port) or None.

    ``policy`` says who must send a PROXY header (the node's trusted sources) and logs refusals;
    ``refused_reply`` is what a client refused for a PROXY header gets before the close, as on the
    leader's port of the same protocol."""

    def __init__(self, what: str, hosts: list[str], port: int,
                 target: Callable[[], tuple[str, int] | None], unavailable_reply: bytes = b"",
                 policy: ProxyPolicy | None = None, refused_reply: bytes = b"") -> None:
        self.what = what
        self.hosts = hosts
        self.port = port
        self.target = target
        self.unavailable_reply = unavailable_reply
        self.policy = policy if policy is not None else ProxyPolicy(TrustedSources([]))
        self.refused_reply = refused_reply
        self._servers: list[asyncio.AbstractServer | ProxiedListener] = []
        self.halves: set[_Half] = set()

    @property
    def listening(self) -> bool:
        return bool(self._servers)

    async def start(self) -> None:
        sockets = bind_sockets(self.hosts, self.port, self.what)
        names = ", ".join(address_text(s) for s in sockets)
        if self.policy:  # trusted sources send a header first: accepted (and the header read) there
            self._servers = [ProxiedListener(sock, lambda header: _ClientHalf(self, header), self.policy, self.what,
                                             None) for sock in sockets]
        else:
            loop = asyncio.get_running_loop()
            self._servers = [await loop.create_server(lambda: _ClientHalf(self, None), sock=sock)
                             for sock in sockets]
        log.info("forwarding %s from %s to the leader%s", self.what, names,
                 " (PROXY protocol from trusted sources)" if self.policy else "")

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
    line sent (what comes before is kept, up to EARLY_LIMIT). ``forwarded``: the header a trusted load
    balancer sent, naming the client and the address it connected to (None: the TCP peer is the client)."""

    def __init__(self, proxy: ClientProxy, forwarded: ProxyHeader | None) -> None:
        super().__init__(proxy)
        self.forwarded = forwarded
        self._first_read = True

    def data_received(self, data: bytes) -> None:
        if self._first_read:
            self._first_read = False
            # The same test as the leader's protocols make on their first read: a (further) PROXY
            # header here came from a peer that may not send one.
            if may_be_proxy_header(data[:16]):
                self._refuse()
                return
        super().data_received(data)

    def _refuse(self) -> None:
        transport, proxy = self.transport, self.proxy
        if transport is None:
            return
        proxy.policy.refused(proxy.what, transport.get_extra_info("peername"),
                             "a PROXY header from a source not in proxy_protocol_trusted_sources")
        if self.peer is not None:  # the leader's end has seen the PROXY line only: dropped silently
            self.peer.abort()
        if proxy.refused_reply:
            transport.write(proxy.refused_reply)
        transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        cast(asyncio.Transport, transport).pause_reading()
        self._connecting = asyncio.get_running_loop().create_task(self._connect())  # kept: tasks are weak

    async def _connect(self) -> None:
        proxy, transport = self.proxy, self.transport
        if transport is None:
            return
        forwarded = self.forwarded
        client = forwarded.source if forwarded is not None else transport.get_extra_info("peername")
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
        if self.transport is None or transport.is_closing():  # the client left (or was refused) meanwhile
            if upstream is not None:
                upstream.abort()
            return
        if upstream is None or upstream.transport is None:
            if proxy.unavailable_reply:
                transport.write(proxy.unavailable_reply)
            transport.close()
            return
        reached = forwarded.destination if forwarded is not None else transport.get_extra_info("sockname")
        upstream.transport.write(format_proxy_line(_pair(client), _pair(reached)))
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
