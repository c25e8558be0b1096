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
from collections.abc import Callable

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
                 ssl_context: ssl.SSLContext | None = None) -> list[asyncio.AbstractServer]:
    """Start serving on every address of hosts that the machine has."""
    loop = asyncio.get_running_loop()
    servers = []
    for sock in bind_sockets(hosts, port, what):
        servers.append(await loop.create_server(factory, sock=sock, ssl=ssl_context, backlog=BACKLOG))
    names = ", ".join(address_text(s) for server in servers for s in server.sockets)
    log.info("listening for %s on %s", what, names)
    return servers


def address_text(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
