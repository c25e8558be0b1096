"""The PROXY protocol v1 line: parsing (complete, partial, malformed) and formatting round trips."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lavinpy.wire.proxy_header import (
    ProxyHeader,
    ProxyHeaderError,
    format_proxy_line,
    may_be_proxy_line,
    parse_proxy_line,
)


def test_tcp4_line_and_rest() -> None:
    data = b"PROXY TCP4 192.0.2.1 198.51.100.2 51234 5672\r\nAMQP\x00\x00\x09\x01"
    header, used = parse_proxy_line(data)
    assert header == ProxyHeader(("192.0.2.1", 51234), ("198.51.100.2", 5672))
    assert data[used:] == b"AMQP\x00\x00\x09\x01"


def test_tcp6_and_unknown() -> None:
    header, _ = parse_proxy_line(b"PROXY TCP6 2001:db8::1 ::1 40000 15672\r\n")
    assert header.source == ("2001:db8::1", 40000) and header.destination == ("::1", 15672)
    header, used = parse_proxy_line(b"PROXY UNKNOWN\r\nGET")
    assert header == ProxyHeader(None, None) and used == 15


def test_incomplete_line_waits() -> None:
    assert parse_proxy_line(b"PRO") is None
    assert parse_proxy_line(b"PROXY TCP4 10.0.0.1 10.0") is None
    assert may_be_proxy_line(b"PROX") and not may_be_proxy_line(b"AMQP")


@pytest.mark.parametrize("line", [
    b"AMQP\x00\x00\x09\x01",
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2 3\r\n",
    b"PROXY TCP4 ::1 10.0.0.2 1 2\r\n",
    b"PROXY TCP6 10.0.0.1 ::1 1 2\r\n",
    b"PROXY TCP4 10.0.0.1 10.0.0.2 65536 2\r\n",
    b"PROXY TCP4 10.0.0.1 10.0.0.2 -1 2\r\n",
    b"PROXY TCP4 10.0.0.1 10.0.0.2 01 2\r\n",
    b"PROXY UDP4 10.0.0.1 10.0.0.2 1 2\r\n",
    b"PROXY TCP4 host 10.0.0.2 1 2\r\n",
    b"PROXY TCP4 \xff 10.0.0.2 1 2\r\n",
    b"PROXY " + b"1" * 120,
])
def test_malformed_lines(line: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse_proxy_line(line)


def test_format_mixed_families_is_unknown() -> None:
    assert format_proxy_line(("10.0.0.1", 1), ("::1", 2)) == b"PROXY UNKNOWN\r\n"
    assert format_proxy_line(None, ("::1", 2)) == b"PROXY UNKNOWN\r\n"
    # An IPv4 client on a dual-stack listener shows up IPv4-mapped: sent as TCP4.
    assert format_proxy_line(("::ffff:10.0.0.1", 1), ("::ffff:10.0.0.2", 2)) == \
        b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\r\n"


addresses4 = st.ip_addresses(v=4).map(str)
addresses6 = st.ip_addresses(v=6).filter(lambda a: a.ipv4_mapped is None).map(str)
ports = st.integers(0, 65535)


@given(st.one_of(st.tuples(addresses4, addresses4), st.tuples(addresses6, addresses6)), ports, ports,
       st.binary(max_size=20))
def test_round_trip(pair: tuple[str, str], sport: int, dport: int, rest: bytes) -> None:
    line = format_proxy_line((pair[0], sport), (pair[1], dport))
    assert len(line) <= 107
    header, used = parse_proxy_line(line + rest)
    assert header.source == (str(ipaddress.ip_address(pair[0])), sport)
    assert header.destination == (str(ipaddress.ip_address(pair[1])), dport)
    assert (line + rest)[used:] == rest
