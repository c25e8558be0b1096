"""Listening sockets for a list of bind addresses.

An address the machine does not have (no ::1 where IPv6 is off, an interface that is down) is
logged and skipped; any other error (port in use, no permission) stops the start. "::" on its own
accepts IPv4 too (dual stack, as RabbitMQ's listener does), IPv4 peers then show up as
::ffff:a.b.c.d; next to an IPv4 wildcard it is IPv6 only so both can bind the port.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable

from .wire.constants import PROTOCOL_HEADER
from .wire.proxy_header import (
    V2_FIXED,
    V2_MAX_BODY,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    TrustedSources,
    may_be_proxy_header,
    parse_proxy_header,
)

log = logging.getLogger("lavinpy")

# The machine lacks the address or the address family: skip it, keep the others.
_UNAVAILABLE = {errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT}
BACKLOG = 1024


def _bind_one(host: str, port: int, dual_stack: bool) -> list[socket.socket]:
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def bind_sockets(hosts: list[str], port: int, what: str) -> list[socket.socket]:
    """One listening socket per address (port 0: the port the first one got, for all)."""
    ipv4_wildcard = any(h in ("0.0.0.0", "") for h in hosts)
    sockets: list[socket.socket] = []
    try:
        for host in hosts:
            try:
                bound = _bind_one(host, port, dual_stack=host == "::" and not ipv4_wildcard)
            except socket.gaierror as e:
                log.warning("not listening for %s on %s: %s", what, host, e.strerror)
                continue
            except OSError as e:
                if e.errno not in _UNAVAILABLE:
                    raise OSError(e.errno, f"cannot listen for {what} on {host} port {port}: {e.strerror}")
                log.warning("not listening for %s on %s: %s", what, host, e.strerror)
                continue
            sockets.extend(bound)
            if port == 0 and bound:
                port = bound[0].getsockname()[1]
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(errno.EADDRNOTAVAIL, f"no address to listen for {what} on ({', '.join(hosts)})")
    return sockets


async def listen(factory: Callable[[], asyncio.Protocol], hosts: list[str], port: int, what: str,
                 ssl_context: ssl.SSLContext | None = None) -> list[asyncio.Server]:
    """Start serving on every address of hosts that the machine has."""
    loop = asyncio.get_running_loop()
    servers: list[asyncio.Server] = []
    for sock in bind_sockets(hosts, port, what):
        servers.append(await loop.create_server(factory, sock=sock, ssl=ssl_context, backlog=BACKLOG))
    names = ", ".join(address_text(s) for server in servers for s in server.sockets)
    log.info("listening for %s on %s", what, names)
    return servers


def address_text(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- PROXY protocol ---------------------------------------------------------------------------------
HEADER_TIMEOUT = 5.0  # a trusted proxy sends its header at once; one that does not is dropped
TLS_HELLO_TIMEOUT = 60.0  # asyncio's own TLS handshake timeout
_PEEK_BYTES = V2_FIXED + V2_MAX_BODY
_ACCEPT_PAUSE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# The answer on an HTTP port (the leader's, or a follower's forwarding one) to a PROXY header from a
# peer that may not send one.
HTTP_PROXY_HEADER_REFUSED = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                             b"Content-Length: 35\r\n\r\nPROXY header from an untrusted peer")

# What a client refused for its PROXY header reads before the close, per port, as the protocol would answer.
_REFUSED_REPLIES = {"AMQP": PROTOCOL_HEADER, "HTTP": HTTP_PROXY_HEADER_REFUSED}

# A protocol for one accepted connection; its argument is the PROXY header naming the client and the
# address it connected to (None: the TCP peer is the client).
ForwardedFactory = Callable[[ProxyHeader | None], asyncio.Protocol]


UNTRUSTED_SOURCE = "a PROXY header from a source not in proxy_protocol_trusted_sources"
NOT_A_MEMBER = ("a PROXY header from an address that is no cluster member's (etcd lists none there, read"
                " after the connection came) and not in proxy_protocol_trusted_sources")


class ProxyPolicy:
    """Which peers send a PROXY header: configured load balancers must, cluster members may (a
    follower forwards its clients with one; the node itself also connects directly)."""

    def __init__(self, trusted: TrustedSources, member: Callable[[str], bool] | None = None,
                 refused: Callable[[str, object, str], None] | None = None,
                 member_now: Callable[[str, float], Awaitable[bool]] | None = None) -> None:
        """``refused(what, peer, reason)`` logs a connection closed for a bad header (the server passes
        the rate-limited log the faces use, which this module may not import). ``member(host)`` answers
        from the members last read; ``member_now(host, since)`` reads them again (once for all the
        connections waiting, from one that started after ``since``): a node that has just registered
        (again) is not in the last read yet, and its forwarded clients must not be refused for that."""
        self.trusted = trusted
        self.member = member
        self.member_now = member_now
        self.refused = refused or (lambda what, peer, reason: log.warning("%s connection from %s closed: %s",
                                                                          what, peer, reason))

    def __bool__(self) -> bool:
        return bool(self.trusted) or self.member is not None

    def mode(self, host: str) -> str | None:
        """"must", "may" or None (a header from ``host`` is bad input)."""
        if host in self.trusted:
            return "must"
        if self.member is not None and self.member(host):
            return "may"
        return None


class _ClosedEarly(ConnectionError):
    """The peer closed before sending a byte."""


async def read_proxy_header(sock: socket.socket, required: bool) -> ProxyHeader | None:
    """Take a PROXY header (either version) off the start of ``sock`` and nothing more: the bytes after
    it stay in the socket for asyncio (and TLS) to read. None when the connection does not start with
    one and none is ``required``; ProxyHeaderError when it is required and absent, or malformed."""
    loop = asyncio.get_running_loop()
    while True:
        await _readable(loop, sock)
        data = sock.recv(_PEEK_BYTES, socket.MSG_PEEK)
        if not data:
            raise _ClosedEarly()
        if not may_be_proxy_header(data):
            if required:
                raise ProxyHeaderError("a trusted source must start with a PROXY header")
            return None
        parsed = parse_proxy_header(data)
        if parsed is not None:
            header, used = parsed
            while used:  # already received: no wait
                used -= len(sock.recv(used))
            return header
        # Incomplete (rare: a proxy writes its header in one piece). Peeking does not drain the
        # socket, so it stays readable: poll instead of spinning.
        await asyncio.sleep(0.01)


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)
    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def _first_bytes(sock: socket.socket) -> bytes:
    """A peek at the first bytes, enough to tell a PROXY line from an HTTP "POST" or "PRI" (a
    version 2 signature's first byte starts no protocol served here); b"" when the peer closed."""
    loop = asyncio.get_running_loop()
    await _readable(loop, sock)
    while True:
        first = sock.recv(len(V2_SIGNATURE), socket.MSG_PEEK)
        if not first.startswith(b"P") or len(first) >= len(b"PROXY"):
            return first
        await asyncio.sleep(0.01)  # a peek leaves the socket readable: poll, as read_proxy_header does


class ProxiedListener:
    """Accepts connections itself so that a PROXY header can be read before asyncio (and TLS, whose
    handshake comes after the header) takes the socket; asyncio's own server cannot hand over bytes
    it already read. Used only when some peer is trusted to send one."""

    def __init__(self, sock: socket.socket, factory: ForwardedFactory, policy: ProxyPolicy, what: str,
                 ssl_context: ssl.SSLContext | None) -> None:
        self.sockets = [sock]
        self.factory = factory
        self.policy = policy
        self.what = what
        self.ssl_context = ssl_context
        self._pending: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        sock = self.sockets[0]
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except OSError as e:
                if sock.fileno() < 0:  # closed
                    return
                # Out of descriptors or memory: let some close first. Anything else (a client that
                # reset before it was accepted) concerns one connection, never the listener.
                pause = e.errno in _ACCEPT_PAUSE
                (log.warning if pause else log.debug)("%s: cannot accept a connection: %s", self.what, e)
                await asyncio.sleep(0.1 if pause else 0)
                continue
            task = loop.create_task(self._serve(conn, peer))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        accepted = time.monotonic()
        conn.setblocking(False)
        client = None
        mode = self.policy.mode(peer[0])
        if mode is None and self.policy.member_now is not None and self.ssl_context is None:
            mode = await self._member_after_all(conn, peer, accepted)
            if mode == "refused":
                return
        if mode is not None:
            try:
                header = await asyncio.wait_for(read_proxy_header(conn, mode == "must"), HEADER_TIMEOUT)
            except _ClosedEarly:
                # A balancer's TCP health check (connect, close): no input at all, nothing to report.
                log.debug("%s connection from %s closed before sending anything", self.what, peer)
                conn.close()
                return
            except (ProxyHeaderError, OSError, TimeoutError) as e:
                self.policy.refused(self.what, peer, str(e) or "no PROXY header in time")
                conn.close()
                return
            client = header if header is not None and header.source is not None else None
        elif self.ssl_context is not None and not await self._no_header_before_tls(conn, peer):
            return
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: self.factory(client), conn, ssl=self.ssl_context)
        except (OSError, ssl.SSLError) as e:
            log.debug("%s connection from %s failed before it started: %s", self.what, peer, e)
            conn.close()

    async def _member_after_all(self, conn: socket.socket, peer: tuple[str, int], accepted: float) -> str | None:
        """For a peer not among the members last read: "may" when it starts with a PROXY header and
        etcd, read again, lists it now; "refused" (closed, logged) when it does not; None (no header:
        a client of its own) to serve it as any other. A peer silent for HEADER_TIMEOUT is served too:
        the protocol's own handshake timeout applies."""
        try:
            first = await asyncio.wait_for(_first_bytes(conn), HEADER_TIMEOUT)
        except TimeoutError:
            return None
        except OSError:
            first = b""
        if not first:
            log.debug("%s connection from %s closed before sending anything", self.what, peer)
            conn.close()
            return "refused"
        if not may_be_proxy_header(first):
            return None
        assert self.policy.member_now is not None
        try:
            member = await self.policy.member_now(peer[0], accepted)
        except Exception as e:  # the node is stopping: the connection is refused, never left open
            log.warning("%s connection from %s: cluster members not read (%s)", self.what, peer, e)
            member = False
        if member:
            return "may"
        self.policy.refused(self.what, peer, NOT_A_MEMBER)
        reply = _REFUSED_REPLIES.get(self.what, b"")
        try:
            conn.recv(_PEEK_BYTES)  # taken, as the protocol would: unread input makes the close a reset
            if reply:
                conn.send(reply)
        except OSError:
            pass
        conn.close()
        return "refused"

    async def _no_header_before_tls(self, conn: socket.socket, peer: tuple[str, int]) -> bool:
        """Whether an untrusted peer's first bytes may be a TLS ClientHello; a PROXY header there would
        only fail the handshake unreported, so it is refused and logged as on the plain ports."""
        try:
            await asyncio.wait_for(_readable(asyncio.get_running_loop(), conn), TLS_HELLO_TIMEOUT)
            first = conn.recv(len(V2_SIGNATURE), socket.MSG_PEEK)
        except (OSError, TimeoutError):
            first = b""
        if first and not may_be_proxy_header(first):
            return True
        if first:
            self.policy.refused(self.what, peer, UNTRUSTED_SOURCE)
        conn.close()
        return False

    def close(self) -> None:
        self._accepting.cancel()
        for task in self._pending:
            task.cancel()
        for sock in self.sockets:
            sock.close()


async def listen_forwarded(factory: ForwardedFactory, hosts: list[str], port: int, what: str,
                           policy: ProxyPolicy, ssl_context: ssl.SSLContext | None = None) -> list[ProxiedListener]:
    """As ``listen``, accepting here: for PROXY headers from trusted peers, and on TLS ports."""
    listeners = [ProxiedListener(sock, factory, policy, what, ssl_context) for sock in bind_sockets(hosts, port, what)]
    log.info("listening for %s on %s%s", what, ", ".join(address_text(s) for lst in listeners for s in lst.sockets),
             " (PROXY protocol from trusted sources)" if policy else "")
    return listeners


async def serve_port(factory: ForwardedFactory, hosts: list[str], port: int, what: str, policy: ProxyPolicy,
                     ssl_context: ssl.SSLContext | None = None) -> list[ProxiedListener] | list[asyncio.Server]:
    """asyncio's own server for a plain port nobody may send a PROXY header to (the protocols refuse
    one themselves); accepted here when some peer may, or for TLS (where the header would come
    before the handshake, out of the protocol's sight)."""
    if policy or ssl_context is not None:
        return await listen_forwarded(factory, hosts, port, what, policy, ssl_context)
    return await listen(lambda: factory(None), hosts, port, what, ssl_context)
