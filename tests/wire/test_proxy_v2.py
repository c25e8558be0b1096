"""PROXY protocol v2 (binary) headers: parsing complete, partial and malformed ones, the version
dispatch, round trips with the formatter, and the trusted-source matching."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lavinpy.wire.proxy_header import (
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    TrustedSources,
    format_proxy_v2,
    may_be_proxy_header,
    parse_proxy_header,
    parse_proxy_v2,
)


def _v2(command: int, family: int, body: bytes) -> bytes:
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack(">H", len(body)) + body


def test_tcp4_header_and_rest() -> None:
    body = bytes([203, 0, 113, 9]) + bytes([127, 0, 0, 1]) + struct.pack(">HH", 40000, 5672)
    data = _v2(1, 0x11, body) + b"AMQP\x00\x00\x09\x01"
    header, used = parse_proxy_v2(data)
    assert header == ProxyHeader(("203.0.113.9", 40000), ("127.0.0.1", 5672))
    assert data[used:] == b"AMQP\x00\x00\x09\x01"


def test_tcp6_header_with_tlvs_skipped() -> None:
    src, dst = ipaddress.ip_address("2001:db8::7"), ipaddress.ip_address("::1")
    tlv = bytes([0x05, 0x00, 0x03]) + b"abc"  # PP2_TYPE_UNIQUE_ID, as HAProxy may add
    data = _v2(1, 0x21, src.packed + dst.packed + struct.pack(">HH", 1, 2) + tlv) + b"GET /"
    header, used = parse_proxy_header(data)
    assert header == ProxyHeader(("2001:db8::7", 1), ("::1", 2)) and data[used:] == b"GET /"


def test_local_command_and_other_families_have_no_address() -> None:
    assert parse_proxy_v2(_v2(0, 0x00, b"")) == (ProxyHeader(None, None), 16)
    unix = _v2(1, 0x31, b"\x00" * 216)
    assert parse_proxy_v2(unix) == (ProxyHeader(None, None), len(unix))
    udp = _v2(1, 0x12, b"\x00" * 12)
    assert parse_proxy_v2(udp)[0] == ProxyHeader(None, None)


def test_incomplete_header_waits() -> None:
    whole = format_proxy_v2(("192.0.2.1", 1000), ("192.0.2.2", 5672))
    for cut in range(len(whole)):
        assert parse_proxy_header(whole[:cut]) is None, cut
        assert may_be_proxy_header(whole[:cut])
    assert not may_be_proxy_header(b"\r\n\r\nX") and not may_be_proxy_header(b"AMQP")


@pytest.mark.parametrize("data", [
    V2_SIGNATURE + bytes([0x10, 0x11]) + struct.pack(">H", 0),  # version 1 in a binary header
    V2_SIGNATURE + bytes([0x22, 0x11]) + struct.pack(">H", 0),  # command 2
    V2_SIGNATURE + bytes([0x21, 0x11]) + struct.pack(">H", 4) + b"\x00" * 4,  # too short for IPv4
    V2_SIGNATURE + bytes([0x21, 0x11]) + struct.pack(">H", 65535),  # absurd length: not waited for
    b"\r\n\r\n\x00\r\nQUIX\n" + b"\x00" * 8,  # a wrong signature
])
def test_malformed_headers_are_refused(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse_proxy_header(data)


def test_v1_still_parsed_through_the_dispatch() -> None:
    header, used = parse_proxy_header(b"PROXY TCP4 192.0.2.9 192.0.2.2 5000 5672\r\nAMQP")
    assert header.source == ("192.0.2.9", 5000) and used == 42


_v4 = st.ip_addresses(v=4).map(str)
_v6 = st.ip_addresses(v=6).filter(lambda a: a.ipv4_mapped is None).map(str)
_port = st.integers(0, 65535)


@given(st.one_of(st.tuples(_v4, _v4), st.tuples(_v6, _v6)), _port, _port, st.binary(max_size=20))
def test_format_parse_round_trip(pair: tuple[str, str], sport: int, dport: int, rest: bytes) -> None:
    data = format_proxy_v2((pair[0], sport), (pair[1], dport)) + rest
    header, used = parse_proxy_header(data)
    assert header == ProxyHeader((pair[0], sport), (pair[1], dport)) and data[used:] == rest


def test_mixed_versions_format_as_local() -> None:
    assert parse_proxy_v2(format_proxy_v2(("192.0.2.1", 1), ("::1", 2)))[0] == ProxyHeader(None, None)


def test_trusted_sources_addresses_and_networks() -> None:
    trusted = TrustedSources(["192.0.2.10", "10.0.0.0/8", "2001:db8::/32"])
    assert "192.0.2.10" in trusted and "10.1.2.3" in trusted and "2001:db8::5" in trusted
    assert "::ffff:10.9.9.9" in trusted  # a dual-stack listener's view of an IPv4 peer
    assert "192.0.2.11" not in trusted and "127.0.0.1" not in trusted and "not-an-ip" not in trusted
    assert not TrustedSources([]) and "127.0.0.1" not in TrustedSources([])
    with pytest.raises(ValueError):
        TrustedSources(["10.0.0.0/33"])
