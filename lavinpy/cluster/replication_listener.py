"""The leader's replication port: accepts connections, lets HandshakeAdmission refuse them before a
byte is read, then (with TLS on) runs the TLS handshake, and hands each admitted connection over as a
stream pair together with its admission ticket.

Connections are accepted by hand rather than by ``start_server(ssl=...)``, so that admission comes
before the TLS handshake (a refused peer costs no handshake), and the TLS layer is there from the first
byte (a ClientHello read by a plain stream before ``start_tls`` would be lost to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable

from .admission import HandshakeAdmission, Ticket

log = logging.getLogger("lavinpy.cluster.replication")

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Ticket], Awaitable[None]]


class ReplicationListener:
    def __init__(self, serve: Serve, admission: HandshakeAdmission, tls: ssl.SSLContext | None,
                 handshake_timeout: Callable[[], float]) -> None:
        self._serve = serve
        self.admission = admission
        self._tls = tls
        self._handshake_timeout = handshake_timeout
        self._sockets: list[socket.socket] = []
        self._acceptors: list[asyncio.Task[None]] = []
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on every address ``host`` resolves to; the port (the one chosen when ``port`` is 0)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        try:
            for family, kind, protocol, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, protocol)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(self._sockets) > 1:  # every address on the port chosen for the first
                    address = (address[0], self._sockets[0].getsockname()[1], *address[2:])
                sock.bind(address)
                sock.listen(128)
                sock.setblocking(False)
        except OSError:
            self.close()
            raise
        self._acceptors = [loop.create_task(self._accept(sock)) for sock in self._sockets]
        return int(self._sockets[0].getsockname()[1])

    def close(self) -> None:
        for task in self._acceptors:
            task.cancel()
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    async def wait_closed(self) -> None:
        for task in [*self._acceptors, *self._connections]:
            task.cancel()
        for task in [*self._acceptors, *self._connections]:
            with contextlib.suppress(BaseException):
                await task
        self._acceptors = []

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(listener)
            except asyncio.CancelledError:
                raise
            except OSError as e:  # out of file descriptors, say: try again shortly
                log.warning("replication: accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            ticket = self.admission.admit(str(peer[0]))
            if ticket is None:
                # An RST at once: nothing of what the peer sent is read or waited for.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
                continue
            task = loop.create_task(self._connection(sock, ticket))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _connection(self, sock: socket.socket, ticket: Ticket) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            try:
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol, sock, ssl=self._tls,
                    ssl_handshake_timeout=self._handshake_timeout() if self._tls is not None else None)
            except (OSError, ssl.SSLError, TimeoutError) as e:
                sock.close()
                log.warning("replication: TLS handshake with %s failed: %s", ticket.address,
                            str(e) or type(e).__name__)
                return
            except BaseException:  # cancelled (the leader stops): the socket is not a transport's yet
                sock.close()
                raise
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            await self._serve(reader, writer, ticket)
        finally:
            ticket.release()
