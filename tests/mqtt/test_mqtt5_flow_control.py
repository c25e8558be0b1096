"""MQTT 5 flow control of a client's publishes (4.9) on the sans-IO connection: the server's Receive
Maximum (``mqtt_receive_maximum``) is told in the CONNACK when below the protocol's 65535, and a client
with more QoS 1 and 2 publishes unanswered (no PUBACK, or no PUBCOMP, sent yet) is disconnected with
0x93 before the one over it is routed; answered ones free their place."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lavinpy.config import Config, ConfigError
from lavinpy.mqtt import codec, codec5
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.properties import read_properties
from lavinpy.mqtt.sessions import MQTTSessions
from tests.amqp.session_client import Harness

from .conftest import MQTTBroker
from .test_mqtt5_sansio import connect, disconnect_reason, packets, publish5

LIMIT = 3


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, fsync="never", mqtt_receive_maximum=LIMIT)
    yield h
    h.close()


def subscriber(sessions: MQTTSessions, topic: str) -> MQTTConnection:
    """A QoS 0 subscriber to topic (its SUBACK read)."""
    sub, _ = connect(sessions, "fc-sub")
    sub.receive_data(codec5.encode_subscribe(1, [(topic, 0)]))
    assert packets(sub)[0][0] == codec.SUBACK
    return sub


def published(harness: Harness, sub: MQTTConnection) -> int:
    harness.run_soon()
    return sum(1 for kind, _, _ in packets(sub) if kind == codec.PUBLISH)


def test_receive_maximum_is_told_only_below_the_default(harness: Harness, tmp_path: Path) -> None:
    sessions = MQTTSessions(harness.broker)
    _conn, props = connect(sessions, "told")
    assert props["receive_maximum"] == LIMIT
    default = Harness(tmp_path / "default", fsync="never")
    try:
        _conn, props = connect(MQTTSessions(default.broker), "untold")
        assert "receive_maximum" not in props  # absent means 65535 (3.2.2.3.3)
    finally:
        default.close()
    for bad in (0, 65536):
        with pytest.raises(ConfigError, match="mqtt_receive_maximum"):
            Config(mqtt_receive_maximum=bad).validate()


def test_qos2_publishes_over_the_maximum_are_refused_with_0x93(harness: Harness) -> None:
    """Three QoS 2 publishes await their PUBREL; a fourth is not routed, and the client is told why."""
    sessions = MQTTSessions(harness.broker)
    sub = subscriber(sessions, "fc/q2")
    pub, _ = connect(sessions, "fc-q2")
    for packet_id in (1, 2, 3):
        pub.receive_data(publish5("fc/q2", b"m%d" % packet_id, 2, packet_id))
    harness.run_soon()
    assert [kind for kind, _, _ in packets(pub)] == [codec.PUBREC] * 3
    assert published(harness, sub) == 3
    pub.receive_data(publish5("fc/q2", b"m4", 2, 4))
    harness.run_soon()
    assert disconnect_reason(pub) == 0x93
    assert pub.closed
    assert published(harness, sub) == 0, "the publish over the maximum is not routed"


def test_completed_exchanges_free_their_place(harness: Harness) -> None:
    """PUBREL answered with PUBCOMP ends a QoS 2 publish's count; sent PUBACKs end QoS 1 ones."""
    sessions = MQTTSessions(harness.broker)
    sub = subscriber(sessions, "fc/free")
    pub, _ = connect(sessions, "fc-free")
    for round_no in range(3):
        for packet_id in (1, 2, 3):
            pub.receive_data(publish5("fc/free", b"r%d-%d" % (round_no, packet_id), 2, packet_id))
        harness.run_soon()
        assert [kind for kind, _, _ in packets(pub)] == [codec.PUBREC] * 3
        pub.receive_data(b"".join(codec5.ack(codec.PUBREL, packet_id) for packet_id in (1, 2, 3)))
        harness.run_soon()
        assert [kind for kind, _, _ in packets(pub)] == [codec.PUBCOMP] * 3
    for _ in range(3):  # three QoS 1 publishes a read, each read's PUBACKs sent before the next
        pub.receive_data(b"".join(publish5("fc/free", b"q1", 1, packet_id) for packet_id in (4, 5, 6)))
        harness.run_soon()
        assert [kind for kind, _, _ in packets(pub)] == [codec.PUBACK] * 3
    assert not pub.closed
    assert published(harness, sub) == 18


def test_a_run_of_qos1_publishes_over_the_maximum_is_refused_whole(harness: Harness) -> None:
    """Four QoS 1 publishes in one read, none answered yet: the run is over the maximum of 3."""
    sessions = MQTTSessions(harness.broker)
    sub = subscriber(sessions, "fc/q1")
    pub, _ = connect(sessions, "fc-q1")
    pub.receive_data(b"".join(publish5("fc/q1", b"x", 1, packet_id) for packet_id in (1, 2, 3, 4)))
    harness.run_soon()
    assert disconnect_reason(pub) == 0x93
    assert published(harness, sub) == 0



def test_refused_publishes_are_answered_and_free_their_place(harness: Harness) -> None:
    """A QoS 1 publish refused with a reason code (here a payload that is not the UTF-8 its format
    indicator says) is answered at once: twice the maximum of them, a read each, keep the connection."""
    sessions = MQTTSessions(harness.broker)
    pub, _ = connect(sessions, "fc-refused")
    for packet_id in range(1, 2 * LIMIT + 1):
        pub.receive_data(publish5("fc/refused", b"\xff", 1, packet_id, payload_format_indicator=1))
        harness.run_soon()
        [(kind, _, body)] = packets(pub)
        assert kind == codec.PUBACK and body[2] == 0x99  # Payload format invalid
    assert not pub.closed

def test_a_duplicate_of_a_publish_awaiting_pubrel_is_not_a_new_one(tmp_path: Path) -> None:
    """A QoS 2 PUBLISH sent again (DUP) while its id awaits PUBREL is answered again, not counted again:
    with the maximum taken, duplicates keep the connection open (the answer waits for the store's
    flush: an event loop runs it)."""

    async def main() -> None:
        harness = Harness(tmp_path, fsync="never", mqtt_receive_maximum=LIMIT)
        try:
            pub, _ = connect(MQTTSessions(harness.broker), "fc-dup")
            for packet_id in (1, 2, 3):
                pub.receive_data(publish5("fc/dup", b"m", 2, packet_id))
            for _ in range(3):
                pub.receive_data(codec5.publish("fc/dup", b"m", 2, False, True, 3, b"\x00"))
            for _ in range(10):
                harness.run_soon()
                await asyncio.sleep(0)
            assert [kind for kind, _, _ in packets(pub)] == [codec.PUBREC] * 6
            assert not pub.closed
        finally:
            harness.close()

    asyncio.run(main())


def test_a_client_that_keeps_sending_still_reads_why_it_was_disconnected(tmp_path: Path) -> None:
    """Over a real socket: the client has the maximum of QoS 2 publishes awaiting PUBREL, sends one more,
    and only then answers its PUBRECs with PUBRELs, after the server ended the connection. Closing at
    once would answer those with a reset (the client's next write fails with EPIPE before it reads the
    DISCONNECT); the server reads and drops them until the client closes, so the client reads DISCONNECT
    0x93, then the end of the stream."""
    broker = MQTTBroker(tmp_path / "broker")
    broker.settings["mqtt_receive_maximum"] = str(LIMIT)
    broker.start()
    try:
        with socket.create_connection(("127.0.0.1", broker.mqtt_port), timeout=10) as sock:
            reader = codec.PacketReader(1 << 20)
            got: list[tuple[int, int, bytes]] = []

            def next_packet() -> tuple[int, int, bytes] | None:
                while not got:
                    data = sock.recv(65536)
                    if not data:
                        return None
                    got.extend(reader.feed(data))
                return got.pop(0)

            sock.sendall(codec5.encode_connect("fc-sock", username="guest", password=b"guest"))
            connack = next_packet()
            assert connack is not None and connack[0] == codec.CONNACK
            assert read_properties(connack[2], 2, "CONNACK")[0]["receive_maximum"] == LIMIT
            sock.sendall(b"".join(publish5("fc/sock", b"m", 2, packet_id) for packet_id in range(1, LIMIT + 1)))
            assert [next_packet() for _ in range(LIMIT)] == [
                (codec.PUBREC, 0, packet_id.to_bytes(2, "big")) for packet_id in range(1, LIMIT + 1)]
            sock.sendall(publish5("fc/sock", b"one too many", 2, LIMIT + 1))
            time.sleep(0.3)  # the server has ended the connection by now
            for packet_id in range(1, LIMIT + 1):  # the client catches up with its PUBRECs
                sock.sendall(codec5.ack(codec.PUBREL, packet_id))
                time.sleep(0.05)
            disconnect = next_packet()
            assert disconnect is not None and disconnect[0] == codec.DISCONNECT
            assert codec5.parse_disconnect(disconnect[2])[0] == 0x93
            assert next_packet() is None
    finally:
        broker.close()
