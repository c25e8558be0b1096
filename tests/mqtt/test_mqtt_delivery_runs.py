"""A subscriber's run of QoS 1 deliveries of one topic is encoded as one buffer (compiled when built,
``codec.publish_run_packets``): the same bytes as the general per-message loop and as PUBLISH packets
encoded one by one, packet ids and their wrap after 65535 included."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.sessions import MQTTSessions
from lavinpy.mqtt.subscriptions import Subscriptions
from lavinpy.mqtt.transport import ConnectionDriver
from lavinpy.store.record import StoredMessage
from lavinpy.wire.accel import cwire
from tests.amqp.session_client import Harness


def _bodies(rng: random.Random, count: int) -> list[bytes]:
    # sizes around the remaining length's 1-, 2- and 3-byte encodings
    return [rng.randbytes(rng.choice([0, 1, 100, 120, 127, 200, 16370, 16400, 70000])) for _ in range(count)]


@pytest.mark.parametrize("seed", range(20))
def test_the_run_encoder_gives_the_packets_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    topic = "t/" + "x" * rng.choice([0, 5, 110, 300])
    bodies = _bodies(rng, rng.randrange(0, 12))
    first_id = rng.choice([1, 2, 1000, 65530, 65535])
    ids = [(first_id - 1 + i) % 65535 + 1 for i in range(len(bodies))]
    expected = b"".join(codec.publish(topic, body, 1, False, False, packet_id)
                        for body, packet_id in zip(bodies, ids, strict=True))
    field = codec.topic_field(topic)
    assert codec.publish_run_packets_py(0x32, field, b"", first_id, bodies) == expected
    assert codec.publish_run_packets(0x32, field, b"", first_id, bodies) == expected
    if cwire is not None:  # the compiled twin, with an MQTT 5 property block too
        for block in (b"", b"\x00", b"\x02\x01\x01"):
            assert (cwire.mqtt_publish_run(0x32, field, block, first_id, bodies)
                    == codec.publish_run_packets_py(0x32, field, block, first_id, bodies))


@pytest.mark.parametrize("seed", range(20))
def test_a_run_of_stored_messages_is_encoded_when_it_is_one_topic_and_properties(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.randrange(1, 8)
    key, properties = "t.a", b"\x10\x00\x02"
    messages = [StoredMessage(i, "amq.topic", key, properties, body) for i, body in enumerate(_bodies(rng, count))]
    changed = rng.choice(["none", "key", "properties", "equal copies", "in place"])
    at = rng.randrange(count)
    msg = messages[at]
    if changed == "key":
        messages[at] = msg._replace(routing_key="t.b")
    elif changed == "properties":
        messages[at] = msg._replace(properties=b"\x10\x00\x01")
    elif changed == "equal copies":  # equal values, other objects: still one run
        messages[at] = msg._replace(routing_key="".join(["t.", "a"]), properties=bytes(bytearray(properties)))
    elif changed == "in place":  # a large body read in place: the loop takes the run (compiled)
        messages[at] = msg._replace(body=memoryview(msg.body))  # type: ignore[arg-type]
    field, first_id = codec.topic_field("t/a"), rng.choice([1, 65530])
    one_run = changed not in ("key", "properties") or (changed != "none" and count == 1 and at == 0)
    expected = codec.publish_run_packets_py(0x32, field, b"", first_id, [m.body for m in messages])
    head = messages[0]
    pure = codec.publish_run_messages_py(0x32, field, b"", first_id, messages, head.routing_key, head.properties)
    assert pure == (expected if one_run else None)
    if cwire is not None:
        compiled = cwire.mqtt_publish_messages(0x32, field, b"", first_id, messages, head.routing_key,
                                               head.properties)
        assert compiled == (None if changed == "in place" else pure)


@pytest.mark.parametrize("seed", range(30))
def test_a_run_s_packet_ids_are_booked_only_when_encoded_and_free(seed: int) -> None:
    """``publish_booked`` (compiled when built) books ids first_id.. to the run's tags when all are free
    and the run is one topic and properties; else None and the in-flight map unchanged."""
    rng = random.Random(seed)
    count = rng.randrange(1, 12)
    key, properties = "t.a", b"\x10\x00\x02"
    messages = [StoredMessage(i, "amq.topic", key, properties, body) for i, body in enumerate(_bodies(rng, count))]
    if rng.random() < 0.2:
        messages[rng.randrange(count)] = messages[0]._replace(routing_key="t.b")
    first_id = rng.choice([1, 20, 65535 - count + 1, 65535 - count + 2, 65535])
    inflight: dict[int, int | None] = {i: rng.choice([None, i * 3]) for i in rng.sample(range(1, 60), rng.randrange(4))}
    if first_id > 1000 and rng.random() < 0.3:
        inflight[rng.randrange(first_id, min(first_id + count, 65536))] = 7
    ids = range(first_id, first_id + count)
    free = first_id + count - 1 <= 65535 and inflight.keys().isdisjoint(ids)
    encoded = codec.publish_run_messages_py(0x32, b"\x00\x03t/a", b"", first_id, messages, key, properties)
    expected = dict(inflight)
    if free and encoded is not None:
        expected.update(zip(ids, range(500, 500 + count), strict=True))
    twins = [codec.publish_booked_py] + ([cwire.mqtt_publish_booked] if cwire is not None else [])
    for twin in twins:
        booked = dict(inflight)
        packets = twin(0x32, b"\x00\x03t/a", b"", first_id, messages, key, properties, booked, 500)
        assert packets == (encoded if free else None)
        assert booked == expected


def _connected(sessions: MQTTSessions, client_id: str) -> MQTTConnection:
    conn = sessions.new_connection(("127.0.0.1", 50000))
    conn.start()
    conn.receive_data(codec.encode_connect(client_id, username="guest", password=b"guest", keepalive=60))
    assert b"".join(conn.data_to_send()) == codec.connack(False, codec.ACCEPTED)
    return conn


def _subscribed(sessions: MQTTSessions, harness: Harness) -> MQTTConnection:
    """A connected subscriber to ``t/#`` at QoS 1, its SUBACK read."""
    sub = _connected(sessions, "sub")
    sub.receive_data(bytes((0x82, 8)) + b"\x00\x01\x00\x03t/#\x01")
    harness.run_soon()
    sub.data_to_send()
    return sub


def _deliveries(tmp_path: Path) -> list[bytes]:
    """What a QoS 1 subscriber (window 10, packet ids starting near 65535) reads, write by write,
    answering each write with its PUBACKs, of runs of one and of several topics, QoS 0 and 1, sizes."""
    harness = Harness(tmp_path, fsync="never")
    try:
        sessions = MQTTSessions(harness.broker)
        sub = _subscribed(sessions, harness)
        assert sub.subscriptions is not None
        sub.subscriptions._next_id = 65520
        pub = _connected(sessions, "pub")
        rng = random.Random(7)
        packets: list[bytes] = []
        for round_ in range(6):
            topics = ["t/a"] if round_ % 2 == 0 else ["t/a", "t/b", "t/c/d"]
            for i, body in enumerate(_bodies(rng, 40)):
                qos = 0 if round_ == 3 and i % 3 == 0 else 1
                packets.append(codec.publish(rng.choice(topics), body, qos, False, False, 1 + len(packets) % 60000))
        pub.receive_data(b"".join(packets))
        harness.run_soon()
        reads: list[bytes] = []
        reader = codec.PacketReader(1 << 24)
        while True:
            harness.run_soon()
            out = b"".join(sub.data_to_send())
            if not out:
                break
            reads.append(out)
            ids = [codec.parse_publish(flags, body).packet_id for kind, flags, body in reader.feed(out)
                   if kind == codec.PUBLISH and flags & 0x06]
            sub.receive_data(b"".join(codec.puback(packet_id) for packet_id in ids))
        assert sum(1 for read in reads for _ in codec.PacketReader(1 << 24).feed(read)) == len(packets)
        return reads
    finally:
        harness.close()


def test_run_deliveries_are_the_bytes_of_the_general_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = Subscriptions._qos1_run
    runs: list[bool] = []

    def counted(self: Subscriptions, first: int, messages: list) -> bool:  # type: ignore[type-arg]
        took = fast(self, first, messages)
        runs.append(took)
        return took

    monkeypatch.setattr(Subscriptions, "_qos1_run", counted)
    with_runs = _deliveries(tmp_path / "runs")
    assert True in runs and False in runs  # both the whole-run step and the loop were taken
    monkeypatch.setattr(Subscriptions, "_qos1_run", lambda self, first, messages: False)
    assert _deliveries(tmp_path / "loop") == with_runs


def test_a_large_body_read_in_place_goes_to_a_qos1_subscriber(tmp_path: Path) -> None:
    """Records of 256 KiB and more are read with their body in place (not bytes): a run of them goes
    out through the loop, whole."""
    asyncio.run(_large_bodies(tmp_path))


async def _large_bodies(tmp_path: Path) -> None:  # a running loop: the publisher's PUBACKs wait for the disk
    harness = Harness(tmp_path, fsync="never")
    try:
        sessions = MQTTSessions(harness.broker)

        def subscriber() -> MQTTConnection:  # not clean: its queue outlives the connection
            conn = sessions.new_connection(("127.0.0.1", 50000))
            conn.start()
            conn.receive_data(codec.encode_connect("sub", clean_session=False, username="guest", password=b"guest")
                              + bytes((0x82, 8)) + b"\x00\x01\x00\x03t/#\x01")
            harness.run_soon()
            return conn

        sub = subscriber()
        sub.data_to_send()
        sub.receive_data(b"\xe0\x00")  # DISCONNECT: what is published next waits in the queue
        sub.lost()
        pub = _connected(sessions, "pub")
        bodies = [bytes([i]) * (300 << 10) for i in range(3)]
        pub.receive_data(b"".join(codec.publish("t/a", body, 1, False, False, i + 1) for i, body in enumerate(bodies)))
        harness.run_soon()
        sub = subscriber()
        packets = codec.PacketReader(1 << 24).feed(b"".join(sub.data_to_send()))
        got = [codec.parse_publish(flags, body) for kind, flags, body in packets if kind == codec.PUBLISH]
        assert [(p.topic, p.payload, p.qos) for p in got] == [("t/a", body, 1) for body in bodies]
    finally:
        harness.close()


def _window_round_trips(tmp_path: Path, write_follows: bool, per_read: int = 0
                        ) -> tuple[list[bytes], list[tuple[int, int]]]:
    """A QoS 1 subscriber (window 10) answering each write with its PUBACKs (in reads of ``per_read``; 0: all
    in one), 60 messages queued: the writes, and per read the queue's unacked count (once its deliveries
    are out, then at the end)."""
    harness = Harness(tmp_path, fsync="never")
    try:
        sessions = MQTTSessions(harness.broker)
        sub = _subscribed(sessions, harness)
        pub = _connected(sessions, "pub")
        pub.receive_data(b"".join(codec.publish("t/a", b"m%d" % i, 1, False, False, i + 1) for i in range(60)))
        harness.run_soon()
        assert sub.subscriptions is not None
        queue = next(iter(sub.subscriptions.consumers.values())).queue
        reads, counts = [], []
        out = b"".join(sub.data_to_send())
        while out:
            reads.append(out)
            ids = [codec.parse_publish(flags, body).packet_id
                   for kind, flags, body in codec.PacketReader(1 << 24).feed(out) if kind == codec.PUBLISH]
            step, outs = per_read or len(ids) or 1, []
            for at in range(0, len(ids), step):
                sub.receive_data(b"".join(codec.puback(packet_id) for packet_id in ids[at:at + step]), write_follows)
                harness.run_soon()
                outs.append(b"".join(sub.data_to_send()))
                out_count = queue.unacked_count
                sub.settle_deferred()
                counts.append((out_count, queue.unacked_count))
            out = b"".join(outs)
        assert queue.message_count == 0 and queue.unacked_count == 0
        return reads, counts
    finally:
        harness.close()


def test_acks_settled_after_the_write_leave_the_queue_as_acks_settled_at_once(tmp_path: Path) -> None:
    """A subscriber's PUBACK read with ``write_follows``: its window is free for the next deliveries
    at once, the queue's index learns of the acks at ``settle_deferred``; the same bytes and end state."""
    at_once, at_once_counts = _window_round_trips(tmp_path / "at-once", False)
    deferred, deferred_counts = _window_round_trips(tmp_path / "deferred", True)
    assert deferred == at_once and len(at_once) == 6
    assert at_once_counts == [(10, 10)] * 5 + [(0, 0)]
    assert deferred_counts == [(20, 10)] * 5 + [(10, 0)]  # the acks of a window reach the queue after its write


def test_a_deferred_ack_of_one_puback_leaves_the_queue_as_one_settled_at_once(tmp_path: Path) -> None:
    """A PUBACK a read (as paho and libmosquitto send them), its ack settled after the write (the
    single-position path): the same bytes, window and end state as acks settled at once."""
    at_once, at_once_counts = _window_round_trips(tmp_path / "at-once", False, 1)
    deferred, deferred_counts = _window_round_trips(tmp_path / "deferred", True, 1)
    assert deferred == at_once and len(at_once) == 6
    assert at_once_counts == [(10, 10)] * 50 + [(10 - i, 10 - i) for i in range(1, 11)]
    assert deferred_counts == [(11, 10)] * 50 + [(11 - i, 10 - i) for i in range(1, 11)]


class _RecordingDriver(ConnectionDriver):
    """The asyncio driver on a recording carrier: what the queue had unacked at each write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[bytes, int]] = []
        self.queue: Any = None

    def write(self, data: bytes) -> None:
        self.writes.append((data, self.queue.unacked_count if self.queue is not None else -1))

    def close(self) -> None:
        pass

    def set_reading(self, paused: bool) -> None:
        pass

    def closing(self) -> bool:
        return False


def test_the_driver_writes_the_next_window_then_settles_the_acks(tmp_path: Path) -> None:
    asyncio.run(_driver_round_trip(tmp_path))


async def _driver_round_trip(tmp_path: Path) -> None:
    harness = Harness(tmp_path, fsync="never")
    try:
        sessions = MQTTSessions(harness.broker)
        driver = _RecordingDriver()
        driver.attach(sessions.new_connection(("127.0.0.1", 50000)))
        driver.received(codec.encode_connect("sub", username="guest", password=b"guest")
                        + bytes((0x82, 8)) + b"\x00\x01\x00\x03t/#\x01")
        harness.run_soon()
        pub = _connected(sessions, "pub")
        pub.receive_data(b"".join(codec.publish("t/a", b"m%d" % i, 1, False, False, i + 1) for i in range(30)))
        harness.run_soon()
        conn = driver.conn
        assert conn is not None and conn.subscriptions is not None
        driver.queue = next(iter(conn.subscriptions.consumers.values())).queue
        for _ in range(2):
            first = driver.writes[-1][0]
            ids = [codec.parse_publish(flags, body).packet_id
                   for kind, flags, body in codec.PacketReader(1 << 24).feed(first) if kind == codec.PUBLISH]
            assert len(ids) == 10
            driver.received(b"".join(codec.puback(packet_id) for packet_id in ids))
            assert driver.writes[-1][1] == 20  # the next window written before its acks reached the queue
            assert driver.queue.unacked_count == 10  # and settled before received() returned
            assert conn.subscriptions.deliveries.deferred_acks is None
    finally:
        harness.close()
