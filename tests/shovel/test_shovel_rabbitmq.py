"""Migration: a shovel moves a RabbitMQ queue into lavinpy while a publisher keeps publishing to
RabbitMQ with confirms; lavinpy is killed (-9) once and RabbitMQ once mid-way. Every confirmed
message arrives in lavinpy (duplicates are counted, none may be lost); then the publisher switches
to lavinpy. The private RabbitMQ node is the one tests/e2e/test_rabbitmq_interop.py runs.

LAVINPY_LONG=1 makes the run longer (more messages, more kills).
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.e2e.conftest import LocalBroker
from tests.e2e.rabbitmq_node import RabbitNode, needs_rabbitmq
from tests.helpers import LONG

from .engine import EngineThread

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300 if LONG else 120),
              needs_rabbitmq]
QUEUE = "migrate"


class Publisher(threading.Thread):
    """Publishes numbered persistent messages with confirms; remembers the confirmed ones; reconnects."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.next = 0
        self.confirmed: set[int] = set()
        self.failures = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.url + "?connection_attempts=1&socket_timeout=3"))
                ch = conn.channel()
                ch.queue_declare(QUEUE, durable=True)
                ch.confirm_delivery()
                while not self.halt.is_set():
                    n = self.next
                    self.next += 1
                    ch.basic_publish("", QUEUE, str(n).encode(), pika.BasicProperties(delivery_mode=2))
                    self.confirmed.add(n)
                    if n % 50 == 0:
                        time.sleep(0.01)  # a steady stream, not a flood
                conn.close()
            except (pika.exceptions.AMQPError, OSError):
                self.failures += 1
                time.sleep(0.3)


def _received(url: str, until: set[int], timeout: float) -> collections.Counter:
    """Every message in lavinpy's queue (basic.get until the confirmed ones are all there)."""
    got: collections.Counter = collections.Counter()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, _props, body = ch.basic_get(QUEUE, auto_ack=True)
        if method is None:
            if until <= set(got):
                break
            time.sleep(0.05)
            continue
        got[int(body)] += 1
    conn.close()
    return got


def _kill_rabbit(node: RabbitNode) -> None:
    assert node.proc is not None
    os.killpg(node.proc.pid, signal.SIGKILL)
    node.proc.wait(10)


def test_rabbitmq_to_lavinpy_with_both_killed(tmp_path: Path) -> None:
    rabbit = RabbitNode(tmp_path / "rabbitmq")
    rabbit.start()
    lavin = LocalBroker(tmp_path / "lavinpy")
    lavin.start()
    engine = EngineThread()
    publisher = Publisher(rabbit.url_for("guest", "guest", "/"))
    try:
        publisher.start()
        while not publisher.confirmed:
            time.sleep(0.05)
        engine.apply("migrate", {"src-uri": rabbit.url_for("guest", "guest", "/"), "src-queue": QUEUE,
                                 "dest-uri": lavin.url, "dest-queue": QUEUE, "reconnect-delay": 0.5,
                                 "src-prefetch-count": 200})
        engine.wait_state("migrate", "running", timeout=20)
        for _round in range(3 if LONG else 1):
            time.sleep(1.5)
            lavin.kill9()
            engine.wait_state("migrate", "terminated")
            lavin.start()
            engine.wait_state("migrate", "running", timeout=20)
            time.sleep(1.5)
            _kill_rabbit(rabbit)
            engine.wait_state("migrate", "terminated")
            rabbit.start()
            engine.wait_state("migrate", "running", timeout=60)
        time.sleep(1.0)
        publisher.halt.set()
        publisher.join(10)
        # The switch: the publisher goes on against lavinpy itself.
        switched = Publisher(lavin.url)
        switched.next = publisher.next
        switched.start()
        time.sleep(0.5)
        switched.halt.set()
        switched.join(10)
        confirmed = publisher.confirmed | switched.confirmed
        got = _received(lavin.url, confirmed, timeout=30)
        lost = confirmed - set(got)
        duplicates = sum(c - 1 for c in got.values())
        print(f"confirmed {len(confirmed)}, received {len(got)} distinct, {duplicates} duplicates, "
              f"forwarded {engine.status('migrate')['forwarded']}, publisher reconnects {publisher.failures}")
        assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:10]}"
        assert len(confirmed) > 100
    finally:
        publisher.halt.set()
        engine.close()
        if lavin.running():
            lavin.stop()
        rabbit.stop()
