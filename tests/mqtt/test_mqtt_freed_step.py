"""A subscriber's read of one PUBACK that the connection answers with a write at once (``write_follows``):
the queue whose window it freed runs its step during the read (``DeliveryScheduler.deliver_now``), not
from the scheduler's set; with a cluster lease to check, or without a write to follow, a turn runs it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.sessions import MQTTSessions
from tests.amqp.session_client import Harness
from tests.mqtt.test_mqtt_delivery_runs import _connected, _subscribed

pytestmark = pytest.mark.both_paths


def _window_out(tmp_path: Path) -> tuple[Harness, MQTTConnection, list[int]]:
    """A QoS 1 subscriber (window 10) with 20 messages queued: its first window read, the packet ids."""
    harness = Harness(tmp_path, fsync="never")
    sessions = MQTTSessions(harness.broker)
    sub = _subscribed(sessions, harness)
    pub = _connected(sessions, "pub")
    pub.receive_data(b"".join(codec.publish("t/a", b"m%d" % i, 1, False, False, i + 1) for i in range(20)))
    harness.run_soon()
    out = b"".join(sub.data_to_send())
    ids = [codec.parse_publish(flags, body).packet_id
           for kind, flags, body in codec.PacketReader(1 << 24).feed(out) if kind == codec.PUBLISH]
    assert len(ids) == 10
    return harness, sub, ids


def _payloads(out: bytes) -> list[bytes]:
    return [codec.parse_publish(flags, body).payload
            for kind, flags, body in codec.PacketReader(1 << 24).feed(out) if kind == codec.PUBLISH]


def test_one_puback_read_delivers_the_next_message_before_any_turn(tmp_path: Path) -> None:
    harness, sub, ids = _window_out(tmp_path)
    try:
        scheduler = harness.broker.scheduler
        for i, packet_id in enumerate(ids):
            held = scheduler.hold()  # as the transport drives a read
            sub.receive_data(codec.puback(packet_id), True)
            assert not scheduler.queues  # nothing left for a turn: the step ran in the read
            assert _payloads(b"".join(sub.data_to_send())) == [b"m%d" % (10 + i)]
            sub.settle_deferred()
            scheduler.release(held)
        harness.run_soon()
        assert not b"".join(sub.data_to_send())  # the window is full again: nothing more
    finally:
        harness.close()


def test_a_lease_to_check_or_no_write_to_follow_leaves_the_step_to_a_turn(tmp_path: Path) -> None:
    harness, sub, ids = _window_out(tmp_path)
    try:
        scheduler = harness.broker.scheduler
        checks: list[bool] = []
        scheduler.serving_guard = lambda: checks.append(True) or True  # a cluster leader's lease check
        sub.receive_data(codec.puback(ids[0]), True)
        assert scheduler.queues and not b"".join(sub.data_to_send()) and not checks
        sub.settle_deferred()
        harness.run_soon()
        assert checks and _payloads(b"".join(sub.data_to_send())) == [b"m10"]
        scheduler.serving_guard = None
        sub.receive_data(codec.puback(ids[1]))  # no write follows: the ack schedules the queue
        assert scheduler.queues and not b"".join(sub.data_to_send())
        harness.run_soon()
        assert _payloads(b"".join(sub.data_to_send())) == [b"m11"]
    finally:
        harness.close()


def test_a_failing_step_is_logged_and_the_read_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    harness, sub, ids = _window_out(tmp_path)
    try:
        assert sub.subscriptions is not None
        queue = next(iter(sub.subscriptions.consumers.values())).queue

        def broken() -> bool:
            raise RuntimeError("a bug in the step")

        monkeypatch.setattr(queue, "deliver", broken)
        with caplog.at_level(logging.ERROR, logger="lavinpy.scheduler"):
            sub.receive_data(codec.puback(ids[0]), True)
        assert "delivery from queue" in caplog.text and not sub.closed
        sub.settle_deferred()
        monkeypatch.undo()
        sub.receive_data(codec.puback(ids[1]), True)  # the next read's step delivers the freed room
        assert _payloads(b"".join(sub.data_to_send())) == [b"m10", b"m11"]
    finally:
        harness.close()
