"""Listeners: a list of bind addresses, IPv6 loopback by default, dual stack on "::"."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from .conftest import LocalBroker, lavinpy_only


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no ::1")


def _roundtrip(host: str, port: int) -> None:
    params = pika.ConnectionParameters(host=host, port=port, credentials=pika.PlainCredentials("guest", "guest"),
                                       connection_attempts=1, socket_timeout=10)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"hello")
        _, _, body = ch.basic_get(q, auto_ack=True)
        assert body == b"hello"
    finally:
        conn.close()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    b = LocalBroker(tmp_path / "broker")
    yield b
    b.close()


@lavinpy_only()
@needs_ipv6
def test_default_listens_on_ipv4_and_ipv6_loopback(broker):
    _roundtrip("127.0.0.1", broker.port)
    _roundtrip("::1", broker.port)  # guest is allowed: ::1 is loopback


@lavinpy_only()
def test_an_address_the_machine_lacks_is_logged_and_skipped(own_broker):
    own_broker.extra_args = ["--bind", "127.0.0.1,192.0.2.1"]  # 192.0.2.0/24: documentation only
    own_broker.start()
    _roundtrip("127.0.0.1", own_broker.port)
    assert re.search(r"not listening for AMQP on 192\.0\.2\.1", own_broker.log), own_broker.log[-2000:]


@lavinpy_only()
@needs_ipv6
def test_ipv6_wildcard_is_dual_stack_and_mapped_loopback_counts_as_loopback(own_broker):
    own_broker.extra_args = ["--bind", "::"]
    own_broker.start()
    # An IPv4 client of the dual-stack socket is ::ffff:127.0.0.1, which is loopback for guest.
    _roundtrip("127.0.0.1", own_broker.port)
    assert "connection ::ffff:127.0.0.1:" in own_broker.log, own_broker.log[-2000:]
    _roundtrip("::1", own_broker.port)
