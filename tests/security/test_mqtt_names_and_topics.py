"""Names and topics at the MQTT face: a client id whose queue names would be over 255 bytes gets CONNACK
2, a topic name or filter over 255 bytes (the longest routing key) closes the connection or fails its
SUBACK entry, ``{client_id}`` is expanded in topic permissions, a filter starting with a wildcard
matches no topic starting with ``$`` (MQTT 3.1.1, 4.7.2); and whatever the names and filters, the
connection answers as the spec says and raises nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import Effect, MQTTConnection
from lavinpy.mqtt.sessions import MQTTSessions
from tests.amqp.session_client import Harness

from .test_mqtt_subscribe_amplification import subscribe_packet


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, fsync="never")
    yield h
    h.close()


def _connect(sessions: MQTTSessions, client_id: str, user: str = "guest", password: bytes = b"guest"
             ) -> tuple[MQTTConnection, list[tuple[int, int, bytes]]]:
    conn = sessions.new_connection(("127.0.0.1", 50000))
    conn.start()
    conn.receive_data(codec.encode_connect(client_id, username=user, password=password))
    return conn, codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))


def _received(harness: Harness, conn: MQTTConnection) -> list[codec.Publish]:
    harness.run_soon()
    return [codec.parse_publish(f, b) for k, f, b in codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))
            if k == codec.PUBLISH]


def test_a_client_id_too_long_for_its_queue_names_gets_connack_2(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    longest = "c" * (255 - len("mqtt-subscription-qos1"))
    conn, packets = _connect(sessions, longest)
    assert packets == [(codec.CONNACK, 0, b"\x00\x00")]
    conn.receive_data(subscribe_packet(1, [("a/b", 1)]))
    assert f"mqtt-subscription-{longest}qos1" in harness.broker.vhosts["/"].queues
    for client_id in (longest + "c", "é" * 117):
        conn, packets = _connect(sessions, client_id)
        assert packets == [(codec.CONNACK, 0, bytes((0, codec.IDENTIFIER_REJECTED)))]
        assert Effect.CLOSE in conn.take_effects()


def test_long_user_and_vhost_names_are_refused_logins(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    assert _connect(sessions, "u", "u" * 300)[1] == [(codec.CONNACK, 0, bytes((0, codec.BAD_USERNAME_OR_PASSWORD)))]
    assert _connect(sessions, "v", "v" * 300 + ":guest")[1] == [(codec.CONNACK, 0, bytes((0, codec.NOT_AUTHORIZED)))]


def test_topics_over_255_bytes(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    conn, _ = _connect(sessions, "topics")
    conn.receive_data(subscribe_packet(1, [("f/" + "z" * 253, 0), ("f/" + "z" * 254, 0)]))
    assert codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send())) == [(codec.SUBACK, 0, b"\x00\x01\x00\x80")]
    conn.receive_data(codec.publish("t/" + "x" * 253, b"fits", 0, False, False, 0))
    assert not conn.closed
    conn.receive_data(codec.publish("t/" + "x" * 254, b"over", 1, False, False, 1))
    assert conn.closed and conn.data_to_send() == []  # no PUBACK: closed, as for a refused publish


def test_client_id_is_expanded_in_topic_permissions(harness: Harness) -> None:
    users = harness.broker.users
    assert users is not None
    users.add_user("dev", "pw")
    users.set_permissions("dev", "/", ".*", ".*", ".*")
    users.set_topic_permission("dev", "/", "amq.topic", "^devices\\.{client_id}\\.", "^devices\\.{client_id}\\.")
    sessions = MQTTSessions(harness.broker)
    conn, packets = _connect(sessions, "lamp-1", "dev", b"pw")
    assert packets == [(codec.CONNACK, 0, b"\x00\x00")]
    conn.receive_data(subscribe_packet(1, [("devices/lamp-1/#", 0), ("devices/lamp-2/#", 0)]))
    assert codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send())) == [(codec.SUBACK, 0, b"\x00\x01\x00\x80")]
    conn.receive_data(codec.publish("devices/lamp-1/state", b"on", 0, False, False, 0))
    assert [p.payload for p in _received(harness, conn)] == [b"on"]
    conn.receive_data(codec.publish("devices/lamp-2/state", b"on", 0, False, False, 0))
    assert conn.closed  # write access to topic refused


def test_wildcards_first_do_not_match_dollar_topics(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    everything, _ = _connect(sessions, "everything")
    everything.receive_data(subscribe_packet(1, [("#", 0), ("+/status", 0)]))
    system, _ = _connect(sessions, "system")
    system.receive_data(subscribe_packet(1, [("$SYS/#", 0)]))
    plus, _ = _connect(sessions, "plus")
    plus.receive_data(subscribe_packet(1, [("+/+", 1)]))
    for conn in (everything, system, plus):
        conn.data_to_send()
    publisher, _ = _connect(sessions, "publisher")
    publisher.receive_data(codec.publish("$SYS/status", b"s", 1, True, False, 1)
                           + codec.publish("node/status", b"n", 1, False, False, 2))
    assert sorted(p.topic for p in _received(harness, everything)) == ["node/status"]
    assert [p.topic for p in _received(harness, system)] == ["$SYS/status"]
    assert [p.topic for p in _received(harness, plus)] == ["node/status"]
    queue = harness.broker.vhosts["/"].queues["mqtt-subscription-plusqos1"]
    assert queue.message_count == 0 and plus.subscriptions is not None and len(plus.subscriptions.inflight) == 1
    # Retained: the same rule.
    late, _ = _connect(sessions, "late")
    late.receive_data(subscribe_packet(1, [("#", 0), ("+/status", 0), ("$SYS/+", 0)]))
    assert [(p.topic, p.retain) for p in _received(harness, late)] == [("$SYS/status", True)]


_LEVEL = st.sampled_from(["", "a", "+", "#", "$SYS", "$", "é", "x" * 60, "+#", "a+", "\u0000"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(filters=st.lists(st.lists(_LEVEL, min_size=1, max_size=6).map("/".join), min_size=1, max_size=5),
       topic=st.lists(_LEVEL, min_size=1, max_size=6).map("/".join), client_id=st.text(max_size=300))
def test_any_names_get_the_spec_answer(harness: Harness, filters: list[str], topic: str, client_id: str) -> None:
    sessions = MQTTSessions(harness.broker)
    conn, packets = _connect(sessions, client_id)
    code = packets[0][2][1] if packets and packets[0][0] == codec.CONNACK else None
    too_long = len(f"mqtt-subscription-{client_id}qos1".encode("utf-8", "surrogatepass")) > 255
    if "\u0000" in client_id or any(0xD800 <= ord(c) <= 0xDFFF for c in client_id):
        assert conn.closed  # bad UTF-8 in the CONNECT: closed, CONNACK or not
        return
    if too_long:
        assert code == codec.IDENTIFIER_REJECTED and conn.closed
        return
    if client_id == "" or code != codec.ACCEPTED:
        assert code in (codec.ACCEPTED, codec.IDENTIFIER_REJECTED)
        if code != codec.ACCEPTED:
            return
    conn.receive_data(subscribe_packet(1, [(f, 1) for f in filters]))
    harness.run_soon()
    answer = codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))
    if not conn.closed:
        assert answer[0][0] == codec.SUBACK and len(answer[0][2]) == 2 + len(filters)  # a code per request
        assert set(answer[0][2][2:]) <= {0, 1, 0x80}
        conn.receive_data(codec.publish(topic, b"p", 1, False, False, 7))
        harness.run_soon()
        answer = codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))
        bad = not topic or "+" in topic or "#" in topic or "\u0000" in topic or len(topic.encode()) > 255
        assert conn.closed == bad, (topic, answer)
        if not bad:
            assert (codec.PUBACK, 0, b"\x00\x07") in answer
    conn.lost()
    harness.run_soon()
