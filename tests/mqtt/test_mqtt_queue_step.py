"""A classic queue hands its single-consumer delivery step to an MQTT subscriber's QoS 1 consumer
(``Subscriptions.deliver_from_queue``, ``Queue.take_run``): the subscriber reads the same bytes as
through the queue's own loop, in the same writes, its in-flight window held."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lavinpy.broker.queues.queue import Queue
from lavinpy.mqtt import codec
from lavinpy.mqtt.sessions import MQTTSessions
from lavinpy.mqtt.subscriptions import Subscriptions
from tests.amqp.session_client import Harness
from tests.mqtt.test_mqtt_delivery_runs import _connected, _deliveries, _subscribed, _window_round_trips

pytestmark = pytest.mark.both_paths


def test_the_subscriber_s_step_gives_the_bytes_of_the_queue_s_loop(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    own_step = Subscriptions.deliver_from_queue
    taken: list[int | None] = []

    def counted(self: Subscriptions, queue: Any, consumer: Any, budget: int) -> int | None:
        delivered = own_step(self, queue, consumer, budget)
        taken.append(delivered)
        return delivered

    monkeypatch.setattr(Subscriptions, "deliver_from_queue", counted)
    stepped = _deliveries(tmp_path / "step")
    assert any(delivered for delivered in taken)  # the subscriber took the queue's step
    monkeypatch.setattr(Subscriptions, "deliver_from_queue", lambda self, queue, consumer, budget: None)
    assert _deliveries(tmp_path / "loop") == stepped


def test_the_step_keeps_the_window_and_the_order(tmp_path: Path) -> None:
    """60 messages queued for a subscriber with a window of 10 (the configured default): each write holds
    the next 10 in publish order, and the next write comes only once they are acknowledged."""
    harness = Harness(tmp_path, fsync="never")
    try:
        sessions = MQTTSessions(harness.broker)
        sub = _subscribed(sessions, harness)
        assert sub.subscriptions is not None and sub.subscriptions.window == 10
        pub = _connected(sessions, "pub")
        pub.receive_data(b"".join(codec.publish("t/a", b"m%d" % i, 1, False, False, i + 1) for i in range(60)))
        harness.run_soon()
        payloads: list[list[bytes]] = []
        out = b"".join(sub.data_to_send())
        while out:
            got = [codec.parse_publish(flags, body) for kind, flags, body in codec.PacketReader(1 << 24).feed(out)
                   if kind == codec.PUBLISH]
            payloads.append([p.payload for p in got])
            harness.run_soon()
            assert not b"".join(sub.data_to_send())  # nothing more until the PUBACKs
            sub.receive_data(b"".join(codec.puback(p.packet_id) for p in got))
            harness.run_soon()
            out = b"".join(sub.data_to_send())
        assert payloads == [[b"m%d" % i for i in range(start, start + 10)] for start in range(0, 60, 10)]
    finally:
        harness.close()


def test_a_damaged_run_is_dropped_and_the_next_one_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``take_run`` when every record of a run is damaged: they are removed and the next run read."""
    asyncio.run(_damaged_run(tmp_path, monkeypatch))


async def _damaged_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # a loop: persistent publishes
    harness = Harness(tmp_path, fsync="never")
    try:
        sessions = MQTTSessions(harness.broker)
        sub = sessions.new_connection(("127.0.0.1", 50000))  # not clean: its queue outlives the connection
        sub.start()
        sub.receive_data(codec.encode_connect("sub", clean_session=False, username="guest", password=b"guest")
                         + bytes((0x82, 8)) + b"\x00\x01\x00\x03t/#\x01")
        harness.run_soon()
        assert sub.subscriptions is not None
        queue = next(iter(sub.subscriptions.consumers.values())).queue
        assert isinstance(queue, Queue)
        sub.receive_data(b"\xe0\x00")  # DISCONNECT: what is published next stays queued
        sub.lost()
        pub = _connected(sessions, "pub")
        pub.receive_data(b"".join(codec.publish("t/a", b"m%d" % i, 1, False, False, i + 1) for i in range(6)))
        harness.run_soon()
        assert queue.message_count == 6
        store = queue.vhost.store.messages
        first_run: list[int] = []
        real_read_many, real_read = store.read_many, queue.read

        def read_many(positions: list[int]) -> list[Any]:
            if not first_run:  # the first run read is damaged throughout
                first_run.extend(positions)
                raise KeyError(positions[0])
            return real_read_many(positions)

        monkeypatch.setattr(store, "read_many", read_many)
        monkeypatch.setattr(queue, "read", lambda pos: None if pos in first_run else real_read(pos))
        monkeypatch.setattr(queue, "_run_limit", 3)
        positions, messages, redelivered = queue.take_run(10)
        assert [m.body for m in messages] == [b"m3", b"m4", b"m5"] and redelivered is None
        assert len(positions) == 3 and queue.message_count == 0 and queue.unacked_count == 3
    finally:
        harness.close()


def test_a_window_freed_by_one_puback_takes_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PUBACK a read frees one delivery's room: the step takes the queue's head alone (``take_one``), with
    the same bytes, window and queue state as a run of one taken by ``take_run``."""
    own_take_one = Queue.take_one
    taken: list[int] = []

    def counted(self: Queue) -> Any:
        got = own_take_one(self)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(Queue, "take_one", counted)
    one = _window_round_trips(tmp_path / "one", True, 1)
    assert sum(taken) == 50  # every read after the first window's: 60 messages, a window of 10

    def as_a_run(self: Queue) -> Any:
        positions, messages, redelivered = self.take_run(1)
        return (positions[0], messages[0], bool(redelivered and redelivered[0])) if positions else None

    monkeypatch.setattr(Queue, "take_one", as_a_run)
    assert _window_round_trips(tmp_path / "run", True, 1) == one


def test_take_one_drops_a_damaged_head_and_keeps_the_redelivered_flag(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(_take_one_damaged(tmp_path, monkeypatch))


async def _take_one_damaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = Harness(tmp_path, fsync="never")
    try:
        sessions = MQTTSessions(harness.broker)
        sub = sessions.new_connection(("127.0.0.1", 50000))  # not clean: its queue outlives the connection
        sub.start()
        sub.receive_data(codec.encode_connect("sub", clean_session=False, username="guest", password=b"guest")
                         + bytes((0x82, 8)) + b"\x00\x01\x00\x03t/#\x01")
        harness.run_soon()
        assert sub.subscriptions is not None
        queue = next(iter(sub.subscriptions.consumers.values())).queue
        assert isinstance(queue, Queue)
        sub.receive_data(b"\xe0\x00")  # DISCONNECT: what is published next stays queued
        sub.lost()
        pub = _connected(sessions, "pub")
        pub.receive_data(b"".join(codec.publish("t/a", b"m%d" % i, 1, False, False, i + 1) for i in range(6)))
        harness.run_soon()
        store = queue.vhost.store.messages
        damaged: list[int] = []
        real_read = store.read

        def read(pos: int) -> Any:
            if len(damaged) < 2:  # the first two heads read are damaged
                damaged.append(pos)
                raise KeyError(pos)
            return real_read(pos)

        monkeypatch.setattr(store, "read", read)
        corrupt = queue.corrupt_messages
        pos, msg, redelivered = queue.take_one() or (0, None, None)
        assert msg is not None and msg.body == b"m2" and redelivered is False
        assert queue.corrupt_messages == corrupt + 2 and queue.message_count == 3 and queue.unacked_count == 1
        head = queue.head_position()
        assert head is not None
        queue.mark_redelivered([head])
        taken = queue.take_one()
        assert taken is not None and taken[0] == head and taken[1].body == b"m3" and taken[2] is True
    finally:
        harness.close()
