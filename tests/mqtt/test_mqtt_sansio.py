"""The MQTT connection without sockets (the h11 shape): bytes in, bytes and effects out, on a real
broker whose deferred work runs by hand."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.effects import Effect, SetTimer
from lavinpy.mqtt.sessions import MQTTSessions
from tests.amqp.session_client import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, fsync="never")
    yield h
    h.close()


def _packets(conn: MQTTConnection) -> list[tuple[int, int, bytes]]:
    return codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))


def _connected(sessions: MQTTSessions, client_id: str = "dev") -> MQTTConnection:
    conn = sessions.new_connection(("127.0.0.1", 50000))
    conn.start()
    conn.receive_data(codec.encode_connect(client_id, username="guest", password=b"guest", keepalive=60))
    assert b"".join(conn.data_to_send()) == codec.connack(False, codec.ACCEPTED)
    assert conn.take_effects() == [SetTimer(10.0), SetTimer(90.0)]  # connect timeout, then keepalive x 1.5
    return conn


def _subscribe(packet_id: int, topic: str, qos: int) -> bytes:
    name = topic.encode()
    return bytes((0x82, 2 + 2 + len(name) + 1)) + packet_id.to_bytes(2, "big") + len(name).to_bytes(2, "big") \
        + name + bytes((qos,))


def test_publish_subscribe_and_puback_settling(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    conn = _connected(sessions)
    # SUBSCRIBE and a QoS 1 PUBLISH in one read: SUBACK; the queue delivers the message in hand to the
    # consumer as it is published; the PUBACK goes at the end of the batch.
    conn.receive_data(_subscribe(1, "a/+", 1) + codec.publish("a/b", b"hi", 1, False, False, 7))
    harness.run_soon()
    packets = _packets(conn)
    assert [(k, body) for k, _, body in packets if k != codec.PUBLISH] == [(codec.SUBACK, b"\x00\x01\x01"),
                                                                           (codec.PUBACK, b"\x00\x07")]
    delivered = [codec.parse_publish(f, b) for k, f, b in packets if k == codec.PUBLISH]
    assert [(p.topic, p.payload, p.qos) for p in delivered] == [("a/b", b"hi", 1)]
    queue = harness.broker.vhosts["/"].queues["mqtt-subscription-devqos1"]
    assert conn.subscriptions is not None and len(conn.subscriptions.deliveries.unacked) == 1
    conn.receive_data(codec.puback(delivered[0].packet_id))
    assert not conn.subscriptions.deliveries.unacked and queue.message_count == 0
    conn.receive_data(bytes((0xE0, 0x00)))  # DISCONNECT
    assert Effect.CLOSE in conn.take_effects()
    conn.lost()
    harness.run_soon()
    assert "mqtt-subscription-devqos1" not in harness.broker.vhosts["/"].queues  # a clean session's queue


def test_bad_input_is_a_close_effect_and_nothing_else(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    conn = _connected(sessions)
    conn.receive_data(codec.publish("a/#", b"x", 0, False, False, 0))
    assert conn.take_effects() == [Effect.CLOSE]
    assert conn.data_to_send() == []
    conn.receive_data(bytes((0xC0, 0x00)))  # nothing more is read once closed
    assert conn.data_to_send() == []


def test_takeover_closes_the_first_connection(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    first = _connected(sessions, "same")
    second = _connected(sessions, "same")
    assert first.closed and Effect.CLOSE in first.take_effects()
    assert sessions.clients[("/", "same")] is second


def test_puback_ids_reads_only_input_made_of_whole_short_pubacks() -> None:
    acks = b"".join(codec.puback(packet_id) for packet_id in (1, 258, 65535))
    assert codec.puback_ids(acks) == [1, 258, 65535]
    assert codec.puback_ids(acks[:-1]) is None  # a packet cut short
    assert codec.puback_ids(acks + bytes((0xC0, 0x00, 0xC0, 0x00))) is None  # PINGREQs after them
    assert codec.puback_ids(codec.qos2_reply(1, 5)) is None  # a PUBREC
    assert codec.puback_ids(bytes((0x40, 0x03, 0x00, 0x05))) is None  # another length
    assert codec.puback_ids(b"") is None


def test_pubacks_settle_alike_whether_read_alone_or_among_other_packets(harness: Harness) -> None:
    """A read of PUBACKs alone settles as one run; the same PUBACKs cut across reads or after another
    packet settle the same deliveries, and an unknown id is ignored either way."""
    sessions = MQTTSessions(harness.broker)
    publisher = _connected(sessions, "pub")
    conn = _connected(sessions)
    conn.receive_data(_subscribe(1, "a/b", 1))
    harness.run_soon()
    conn.data_to_send()
    publisher.receive_data(b"".join(codec.publish("a/b", bytes((i,)), 1, False, False, i + 1) for i in range(6)))
    harness.run_soon()
    delivered = [codec.parse_publish(f, b) for k, f, b in _packets(conn) if k == codec.PUBLISH]
    assert [p.payload for p in delivered] == [bytes((i,)) for i in range(6)]
    ids = [p.packet_id for p in delivered]
    subs = conn.subscriptions
    assert subs is not None and len(subs.deliveries.unacked) == 6
    conn.receive_data(codec.puback(ids[0]) + codec.puback(ids[1]) + codec.puback(999))  # alone, one unknown
    assert len(subs.deliveries.unacked) == 4 and sorted(subs.inflight) == ids[2:]
    third = codec.puback(ids[2])
    conn.receive_data(third[:3])  # cut: the rest of it and the next PUBACK in the following read
    assert len(subs.deliveries.unacked) == 4
    conn.receive_data(third[3:] + codec.puback(ids[3]))
    assert len(subs.deliveries.unacked) == 2
    conn.receive_data(bytes((0xC0, 0x00)) + codec.puback(ids[4]) + codec.puback(ids[5]))  # after a PINGREQ
    assert not subs.deliveries.unacked and not subs.inflight
    assert [k for k, _, _ in _packets(conn)] == [codec.PINGRESP]
    queue = harness.broker.vhosts["/"].queues["mqtt-subscription-devqos1"]
    assert queue.message_count == 0 and not conn.closed


def test_a_large_packet_read_in_small_pieces_costs_its_size_once() -> None:
    """16 MiB in 64 KiB reads: each read is appended, the packet is joined once when it is whole.
    (Joining and re-parsing all the kept input at every read took 7 s here, 22 s for 32 MiB, 29 s of
    the server's single thread for a 60 MiB PUBLISH while every other client waited; linear, it takes
    well under a tenth of a second, so a second is room for any machine.)"""
    size = 16 * 1024 * 1024
    reader = codec.PacketReader(size + 100)
    head = bytes((0x30,)) + codec.remaining_length(size + 4) + b"\x00\x01t"  # a payload of size + 1
    chunk = bytes(65536)
    started = time.perf_counter()
    assert reader.feed(head) == []
    for _ in range(size // len(chunk)):
        assert reader.feed(chunk) == []
    elapsed = time.perf_counter() - started
    assert reader.buffered == size + len(head)
    packets = reader.feed(b"x" + bytes((0xC0, 0x00)))  # the payload's last byte, then a PINGREQ
    assert [(kind, len(body)) for kind, _, body in packets] == [(codec.PUBLISH, size + 4), (codec.PINGREQ, 0)]
    assert packets[0][2].endswith(b"x") and reader.buffered == 0
    assert elapsed < 1.0, elapsed


def test_a_connection_that_ends_mid_packet_drops_what_it_kept(harness: Harness) -> None:
    """The connection object may wait in a reference cycle for a full collection: the unfinished
    packet's bytes are let go when it ends, not then."""
    sessions = MQTTSessions(harness.broker)
    conn = _connected(sessions)
    conn.receive_data(bytes((0x30,)) + codec.remaining_length(1_000_003) + b"\x00\x01t" + bytes(500_000))
    assert conn.reader.buffered > 500_000
    conn.lost()
    assert conn.reader.buffered == 0
