"""PROXY protocol version 1: the one text line a forwarding proxy sends before the client's bytes.

``PROXY TCP4 <src> <dst> <sport> <dport>\\r\\n`` (TCP6 for IPv6, ``PROXY UNKNOWN ...\\r\\n`` when the proxy
does not know), at most 107 bytes with the CRLF (HAProxy's specification). Pure: bytes in, result out.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

PROXY_SIGNATURE = b"PROXY "
MAX_LINE = 107


class ProxyHeaderError(ValueError):
    """The bytes start like a PROXY line but are not a valid one."""


@dataclass(frozen=True)
class ProxyHeader:
    """The client's address (source) and the address it connected to (destination); None for UNKNOWN."""

    source: tuple[str, int] | None
    destination: tuple[str, int] | None


def may_be_proxy_line(data: bytes) -> bool:
    """Whether ``data`` (the first bytes of a connection) could be the start of a PROXY line."""
    n = min(len(data), len(PROXY_SIGNATURE))
    return data[:n] == PROXY_SIGNATURE[:n]


def parse_proxy_line(data: bytes) -> tuple[ProxyHeader, int] | None:
    """(header, bytes used) from the start of ``data``; None while the line is incomplete.

    ProxyHeaderError when ``data`` is not a PROXY line or the line is malformed or too long.
    """
    if not may_be_proxy_line(data):
        raise ProxyHeaderError("not a PROXY protocol line")
    end = data.find(b"\r\n", 0, MAX_LINE)
    if end < 0:
        if len(data) >= MAX_LINE:
            raise ProxyHeaderError(f"PROXY line longer than {MAX_LINE} bytes")
        return None
    try:
        parts = data[:end].decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise ProxyHeaderError("PROXY line is not ASCII")
    if len(parts) >= 2 and parts[1] == "UNKNOWN":
        return ProxyHeader(None, None), end + 2
    if len(parts) != 6 or parts[1] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError("PROXY line must be 'PROXY TCP4|TCP6 src dst sport dport'")
    version = 4 if parts[1] == "TCP4" else 6
    src, dst = _address(parts[2], version), _address(parts[3], version)
    return ProxyHeader((src, _port(parts[4])), (dst, _port(parts[5]))), end + 2


def _address(text: str, version: int) -> str:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ProxyHeaderError(f"PROXY line: bad address {text!r}")
    if address.version != version:
        raise ProxyHeaderError(f"PROXY line: {text!r} is not an IPv{version} address")
    return str(address)


def _port(text: str) -> int:
    if not text.isdigit() or (len(text) > 1 and text[0] == "0") or int(text) > 65535:
        raise ProxyHeaderError(f"PROXY line: bad port {text!r}")
    return int(text)


def format_proxy_line(source: tuple[str, int] | None, destination: tuple[str, int] | None) -> bytes:
    """The PROXY line for a connection from ``source`` to ``destination`` (UNKNOWN unless both are the
    same IP version; an IPv4-mapped IPv6 address counts as IPv4)."""
    if source is None or destination is None:
        return b"PROXY UNKNOWN\r\n"
    src, dst = _plain(source[0]), _plain(destination[0])
    if src is None or dst is None or src.version != dst.version:
        return b"PROXY UNKNOWN\r\n"
    family = "TCP4" if src.version == 4 else "TCP6"
    return f"PROXY {family} {src} {dst} {source[1]} {destination[1]}\r\n".encode("ascii")


def _plain(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
