"""PROXY protocol headers: what a forwarding proxy sends before the client's bytes.

Version 1 is one text line, ``PROXY TCP4 <src> <dst> <sport> <dport>\\r\\n`` (TCP6 for IPv6,
``PROXY UNKNOWN ...\\r\\n`` when the proxy does not know), at most 107 bytes with the CRLF. Version 2
is binary: a 12-byte signature, version and command, family, a 16-bit length, the addresses, then
optional TLVs (skipped here). Both as in HAProxy's specification. Pure: bytes in, result out.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable
from dataclasses import dataclass

PROXY_SIGNATURE = b"PROXY "
MAX_LINE = 107
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED = 16  # signature, version/command, family, length
# HAProxy's TLVs (TLS details, unique id) fit easily; anything larger is taken for garbage, not waited for.
V2_MAX_BODY = 4096


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


# --- version 2 (binary) ----------------------------------------------------------------------------
_V2_INET, _V2_INET6 = 0x1, 0x2
_V2_ADDRESS_BYTES = {_V2_INET: 12, _V2_INET6: 36}


def may_be_proxy_header(data: bytes) -> bool:
    """Whether ``data`` (the first bytes of a connection) could start a version 1 or 2 header."""
    n = min(len(data), len(V2_SIGNATURE))
    return may_be_proxy_line(data) or data[:n] == V2_SIGNATURE[:n]


def parse_proxy_header(data: bytes) -> tuple[ProxyHeader, int] | None:
    """Either version from the start of ``data``: (header, bytes used), None while incomplete;
    ProxyHeaderError when it is neither or is malformed."""
    if data[:1] == V2_SIGNATURE[:1]:
        return parse_proxy_v2(data)
    return parse_proxy_line(data)


def parse_proxy_v2(data: bytes) -> tuple[ProxyHeader, int] | None:
    """A version 2 header: (header, bytes used); None while incomplete. A LOCAL command (the proxy's
    own health check) and an address family other than TCP over IPv4/IPv6 give a header without
    addresses, as UNKNOWN does in version 1."""
    n = min(len(data), len(V2_SIGNATURE))
    if data[:n] != V2_SIGNATURE[:n]:
        raise ProxyHeaderError("not a PROXY protocol v2 header")
    if len(data) < V2_FIXED:
        return None
    version_command, family, length = data[12], data[13], struct.unpack_from(">H", data, 14)[0]
    if version_command >> 4 != 2:
        raise ProxyHeaderError(f"PROXY v2 header: version {version_command >> 4}, expected 2")
    command = version_command & 0x0F
    if command > 1:
        raise ProxyHeaderError(f"PROXY v2 header: unknown command {command}")
    if length > V2_MAX_BODY:
        raise ProxyHeaderError(f"PROXY v2 header: {length} bytes of addresses and TLVs, at most {V2_MAX_BODY}")
    if len(data) < V2_FIXED + length:
        return None
    used = V2_FIXED + length
    address_family, transport = family >> 4, family & 0x0F
    if command == 0 or transport != 1 or address_family not in _V2_ADDRESS_BYTES:
        return ProxyHeader(None, None), used
    if length < _V2_ADDRESS_BYTES[address_family]:
        raise ProxyHeaderError(f"PROXY v2 header: {length} bytes cannot hold the addresses")
    size = 4 if address_family == _V2_INET else 16
    body = data[V2_FIXED:used]
    src, dst = body[:size], body[size:2 * size]
    sport, dport = struct.unpack_from(">HH", body, 2 * size)
    return ProxyHeader((str(ipaddress.ip_address(src)), sport), (str(ipaddress.ip_address(dst)), dport)), used


def format_proxy_v2(source: tuple[str, int] | None, destination: tuple[str, int] | None) -> bytes:
    """The version 2 header for a connection from ``source`` to ``destination`` (a LOCAL header
    without addresses unless both are the same IP version)."""
    src = _plain(source[0]) if source is not None else None
    dst = _plain(destination[0]) if destination is not None else None
    if source is None or destination is None or src is None or dst is None or src.version != dst.version:
        return V2_SIGNATURE + bytes([0x20, 0x00]) + struct.pack(">H", 0)
    family = _V2_INET if src.version == 4 else _V2_INET6
    body = src.packed + dst.packed + struct.pack(">HH", source[1], destination[1])
    return V2_SIGNATURE + bytes([0x21, family << 4 | 1]) + struct.pack(">H", len(body)) + body


class TrustedSources:
    """The addresses and networks (``proxy_protocol_trusted_sources``) whose connections must start
    with a PROXY header. An IPv4-mapped IPv6 peer (a dual-stack listener's view of an IPv4 client)
    matches its IPv4 network."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.networks = [parse_network(entry) for entry in entries]

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __contains__(self, host: object) -> bool:
        if not self.networks or not isinstance(host, str):
            return False
        address = _plain(host)
        return address is not None and any(address in network for network in self.networks)


def parse_network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An address or CIDR as a network; ValueError when it is neither."""
    network = ipaddress.ip_network(entry.strip(), strict=False)
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        mapped = network.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}")
    return network
