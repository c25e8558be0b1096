"""Every face's connections in the model's registry (broker.connections) and every face's traffic in
its protocol's counters, in process: an AMQP connection and an MQTT one on one broker, listed, counted,
found, refused and closed through broker.ops.scope as the HTTP API does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands

from lavinpy.broker.access.actor import Actor
from lavinpy.broker.errors import ACCESS_REFUSED, NOT_FOUND, BrokerChannelError
from lavinpy.broker.metrics.stats import AMQP_091
from lavinpy.broker.ops.scope import close_connection, find_connection, visible_connections, visible_consumers
from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.sessions import MQTTSessions
from tests.amqp.session_client import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, fsync="never")
    yield h
    h.close()


def _mqtt(sessions: MQTTSessions, client_id: str) -> MQTTConnection:
    conn = sessions.new_connection(("127.0.0.1", 50001), ("127.0.0.1", 1883))
    conn.start()
    conn.receive_data(codec.encode_connect(client_id, username="guest", password=b"guest", keepalive=60))
    assert b"".join(conn.data_to_send()) == codec.connack(False, codec.ACCEPTED)
    return conn


def test_both_faces_register_their_connections_and_the_api_reads_them_alike(harness: Harness) -> None:
    broker = harness.broker
    registry = broker.connections
    amqp = harness.connect()
    assert len(registry) == 1 and registry.listed() == []  # a socket in its handshake is not listed
    assert registry.counts()["amqp091"].sockets == 1 and registry.counts()["amqp091"].open == 0
    amqp.handshake()
    amqp.open_channel()
    mqtt_sessions = MQTTSessions(broker)
    mqtt = _mqtt(mqtt_sessions, "dev")
    listed = registry.listed()
    assert [(c.protocol.label, c.user, c.vhost, c.channel_count) for c in listed] == [
        ("amqp091", "guest", "/", 1), ("mqtt311", "guest", "/", 0)]
    names = [c.name for c in listed]
    assert names[1] == "127.0.0.1:50001 -> 127.0.0.1:1883"
    assert [row["protocol"] for row in (c.info("n") for c in listed)] == ["AMQP 0-9-1", "MQTT 3.1.1"]
    assert listed[1].client_info == {"client_id": "dev"}
    assert "mqtt_session" in listed[1].details("n") and "mqtt_session" not in listed[0].details("n")
    # an MQTT subscription is a consumer of its connection
    mqtt.receive_data(bytes((0x82, 8)) + (1).to_bytes(2, "big") + (3).to_bytes(2, "big") + b"a/b" + bytes((1,)))
    harness.run_soon()
    assert [c["channel_details"]["connection_name"] for c in visible_consumers(broker, None, "n")] == [names[1]]
    counts = registry.counts()
    assert (counts["amqp091"].open, counts["mqtt311"].open, counts["mqtt311"].consumers) == (1, 1, 1)

    # found by name, whichever face; another user's connection is not found, nor closed
    assert find_connection(broker, None, names[1]) is listed[1]
    assert broker.users is not None
    broker.users.add_user("other", "pw", [])
    other = Actor(broker.users, "other")
    assert visible_connections(broker, other) == []
    with pytest.raises(BrokerChannelError) as refused:
        find_connection(broker, other, names[1])
    assert refused.value.kind is NOT_FOUND and refused.value.text == f"NOT_FOUND - no connection '{names[1]}'"
    broker.users.add_user("monitor", "pw", ["monitoring"])
    with pytest.raises(BrokerChannelError) as refused:
        close_connection(broker, Actor(broker.users, "monitor"), names[0], None)
    assert refused.value.kind is ACCESS_REFUSED

    # closed through the registry: AMQP with 320 and the reason, MQTT by closing its socket
    close_connection(broker, None, names[0], "bye")
    close = [f for _, f in amqp.methods() if isinstance(f, commands.Connection.Close)]
    assert [(c.reply_code, c.reply_text) for c in close] == [(320, "CONNECTION_FORCED - bye")]
    amqp.conn.lost()
    close_connection(broker, None, names[1], None)
    mqtt.lost()
    mqtt_sessions.forget(mqtt)
    assert len(registry) == 0 and registry.counts() == {}


def test_each_protocols_traffic_is_counted_by_the_model(harness: Harness) -> None:
    broker = harness.broker
    amqp = harness.connect()
    amqp.handshake()
    amqp.open_channel()
    amqp.send((1, commands.Queue.Declare(queue="q")))
    amqp.read()
    amqp.send(*amqp.publish(1, "q", b"a"), *amqp.publish(1, "q", b"b"), *amqp.publish(1, "nowhere", b"c"))
    amqp.read()
    mqtt = _mqtt(MQTTSessions(broker), "dev")
    mqtt.receive_data(codec.publish("t/1", b"x", 1, False, False, 1) + codec.publish("t/1", b"y", 1, False, False, 2))
    harness.run_soon()
    by_protocol = broker.node_counters.by_protocol
    amqp_counts, mqtt_counts = by_protocol["amqp091"], by_protocol["mqtt311"]
    assert amqp_counts.protocol == AMQP_091
    assert (amqp_counts.publish, amqp_counts.publish_out, amqp_counts.drop_unroutable) == (3, 2, 1)
    # the MQTT publishes are unroutable here (no subscriber), each expecting its PUBACK
    assert (mqtt_counts.publish, mqtt_counts.drop_unroutable, mqtt_counts.received_confirm) == (2, 2, 2)
    assert mqtt_counts.confirm == 2  # the PUBACKs went out
    amqp.send((1, commands.Basic.Get(queue="q", no_ack=True)))
    amqp.read()
    assert (amqp_counts.get_no_ack, mqtt_counts.get_no_ack) == (1, 0)
