"""Retained messages live in their vhost's file, not in the broker's memory: 96 MiB of them survive a
restart and reach a subscriber while the restarted broker's resident memory stays far below them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mqtt.conftest import MQTTBroker, Paho, unique

from .conftest import rss_mib

MIB = 1024 * 1024
COUNT = 96


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MQTTBroker]:
    b = MQTTBroker(tmp_path / "broker")
    b.start()
    yield b
    b.close()


@pytest.mark.timeout(300)
def test_retained_messages_are_read_from_disk_after_a_restart(broker: MQTTBroker) -> None:
    prefix = unique("disk")
    publisher = Paho(broker.mqtt_port, unique("pub"))
    publisher.connect()
    for i in range(COUNT):
        publisher.publish(f"{prefix}/{i}", bytes([i]) * MIB, qos=1, retain=True)
    publisher.publish(f"{prefix}/0", b"replaced", qos=1, retain=True)
    publisher.publish(f"{prefix}/1", b"", qos=1, retain=True)  # cleared
    publisher.disconnect()
    broker.restart()
    baseline = rss_mib(broker.pid)
    subscriber = Paho(broker.mqtt_port, unique("sub"))
    subscriber.connect()
    assert subscriber.subscribe(f"{prefix}/+", 1) == [1]
    got = {}
    deadline = time.monotonic() + 120
    while len(got) < COUNT - 1 and time.monotonic() < deadline:
        message = subscriber.message()
        assert message.retain
        got[message.topic] = message.payload
    subscriber.disconnect()
    assert got[f"{prefix}/0"] == b"replaced" and f"{prefix}/1" not in got
    assert all(got[f"{prefix}/{i}"] == bytes([i]) * MIB for i in range(2, COUNT))
    assert baseline < 150, baseline  # the index, not 96 MiB of payloads
    assert rss_mib(broker.pid) - baseline < 64
