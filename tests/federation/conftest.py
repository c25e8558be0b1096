"""Fixtures: two lavinpy brokers as processes (tests/e2e's LocalBroker), "up" and "down", shared by a module."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from tests.e2e.conftest import LocalBroker, http_call

pytestmark = pytest.mark.timeout(120)


def named(broker: LocalBroker, name: str) -> None:
    """Give the broker a cluster name (two brokers on one host would share the default, the host's)."""
    status, body, _ = http_call(broker, "PUT", "/api/global-parameters/cluster_name",
                                {"name": "cluster_name", "value": name})
    assert status in (201, 204), body


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBroker, LocalBroker]]:
    root = tmp_path_factory.mktemp("federation")
    up, down = LocalBroker(root / "up"), LocalBroker(root / "down")
    up.start()
    down.start()
    named(up, "up")
    named(down, "down")
    try:
        yield up, down
    finally:
        for b in (up, down):
            if b.running():
                b.stop()


def wait_for(check: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def channel(broker: LocalBroker) -> tuple[pika.BlockingConnection, Any]:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    return conn, conn.channel()


def drain(broker: LocalBroker, queue: str, expect: int, timeout: float = 10.0, settle: float = 0.5) -> list:
    """Messages of ``queue`` (acked): at least ``expect`` within ``timeout``, then any more for ``settle``."""
    conn, ch = channel(broker)
    got: list = []
    deadline = time.monotonic() + timeout
    quiet_until = None
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            if len(got) >= expect:
                quiet_until = quiet_until or time.monotonic() + settle
                if time.monotonic() > quiet_until:
                    break
            time.sleep(0.05)
            continue
        got.append((props, body))
    conn.close()
    return got


def links(broker: LocalBroker, user: str = "guest", password: str = "guest") -> list[dict]:
    status, body, _ = http_call(broker, "GET", "/api/federation-links", user=user, password=password)
    assert status == 200, body
    return body


def upstream_bindings(broker: LocalBroker, exchange: str) -> set[str]:
    status, body, _ = http_call(broker, "GET", "/api/bindings/%2F")
    assert status == 200
    return {b["routing_key"] for b in body if b["source"] == exchange}
