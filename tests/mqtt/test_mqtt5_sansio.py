"""MQTT 5 on the sans-IO connection: CONNECT/CONNACK properties, reason codes, topic aliases, message
properties to and from AMQP, expiry, subscription options and identifiers, shared subscriptions, and
bad properties answered with the spec's reason code."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lavinpy.broker.metrics.stats import ProtocolCounters, ProtocolId
from lavinpy.broker.ops.publish import publish
from lavinpy.mqtt import codec, codec5
from lavinpy.mqtt.codec import Will
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.connection5 import MQTT5Connection
from lavinpy.mqtt.message5 import amqp_properties
from lavinpy.mqtt.properties import encode_properties, encode_varint, read_properties, read_varint
from lavinpy.mqtt.sessions import MQTTSessions
from lavinpy.mqtt.views import connection_info, session_info
from lavinpy.wire.properties import encode_property_values, property_values
from tests.amqp.session_client import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, fsync="never")
    yield h
    h.close()


def packets(conn: MQTTConnection) -> list[tuple[int, int, bytes]]:
    return codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))


def connect(sessions: MQTTSessions, client_id: str = "dev5", **kwargs: Any) -> tuple[MQTT5Connection, dict[str, Any]]:
    conn = sessions.new_connection(("127.0.0.1", 50000))
    assert isinstance(conn, MQTT5Connection)
    conn.start()
    conn.receive_data(codec5.encode_connect(client_id, username="guest", password=b"guest", **kwargs))
    [(kind, _, body)] = packets(conn)
    assert kind == codec.CONNACK and body[1] == 0, body
    props, _ = read_properties(body, 2, "CONNACK")
    conn.take_effects()
    return conn, props


def publish5(topic: str, payload: bytes, qos: int = 0, packet_id: int = 0, retain: bool = False,
             **props: Any) -> bytes:
    return codec5.publish(topic, payload, qos, retain, False, packet_id, encode_properties(props))


def disconnect_reason(conn: MQTTConnection) -> int:
    """The reason code of the DISCONNECT that is the connection's only output."""
    [(kind, _, body)] = packets(conn)
    assert kind == codec.DISCONNECT
    reason, props = codec5.parse_disconnect(body)
    assert set(props) <= {"reason_string"}
    return reason


def delivered(conn: MQTTConnection) -> list[tuple[codec.Publish, dict[str, Any]]]:
    return [codec5.parse_publish(f, b) for k, f, b in packets(conn) if k == codec.PUBLISH]


def amqp_counters(harness: Harness) -> ProtocolCounters:
    return harness.broker.node_counters.of(ProtocolId("amqp091", "AMQP 0-9-1"))


def test_varint_round_trip_and_shortest_form() -> None:
    for value in (0, 127, 128, 16383, 16384, 2097151, 2097152, 268435455):
        assert read_varint(encode_varint(value), 0) == (value, len(encode_varint(value)))
    with pytest.raises(codec.MQTTProtocolError) as e:
        read_varint(b"\x80\x00", 0)  # 0 in two bytes: not the shortest form
    assert e.value.reason == 0x81
    with pytest.raises(codec.MQTTProtocolError):
        read_varint(b"\xff\xff\xff\xff\x01", 0)


def test_connack_properties_and_protocol_label(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    conn, props = connect(sessions, "", properties={"session_expiry_interval": 10 ** 9})
    assert props["assigned_client_identifier"].startswith("lavinpy-")
    assert props["topic_alias_maximum"] == 16
    assert props["maximum_packet_size"] == harness.broker.config.mqtt_max_packet_size
    assert props["session_expiry_interval"] == 86400  # capped, and said so
    assert conn.counters is harness.broker.node_counters.by_protocol["mqtt50"]
    assert connection_info(conn, "n")["protocol"] == "MQTT 5.0"


def test_properties_to_amqp_and_back_with_expiry_left(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    sub, _ = connect(sessions, "sub")
    sub.receive_data(codec5.encode_subscribe(1, [("r/#", 1)], subscription_id=7))
    assert packets(sub)[0][2] == b"\x00\x01\x00\x01"
    pub, _ = connect(sessions, "pub")
    pub.receive_data(publish5("r/x", b"body", 1, 5, content_type="text/plain", correlation_data=b"\x00\xff",
                              response_topic="replies/me", payload_format_indicator=0, message_expiry_interval=60,
                              user_property=[("k", "v"), ("k2", "v2")]))
    harness.run_soon()
    assert packets(pub) == [(codec.PUBACK, 0, b"\x00\x05")]
    [(message, props)] = delivered(sub)
    assert (message.topic, message.payload, message.qos) == ("r/x", b"body", 1)
    assert props["content_type"] == "text/plain" and props["correlation_data"] == b"\x00\xff"
    assert props["response_topic"] == "replies/me" and props["subscription_identifier"] == 7
    assert props["user_property"] == [("k", "v"), ("k2", "v2")]
    assert 59 <= props["message_expiry_interval"] <= 60
    assert "topic_alias" not in props  # the client set no alias maximum


def test_amqp_message_to_mqtt5_properties(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    sub, _ = connect(sessions, "sub-amqp")
    sub.receive_data(codec5.encode_subscribe(1, [("a/b", 1)]))
    packets(sub)
    raw = encode_property_values(content_type="application/json", correlation_id="c-1", expiration="30000",
                                 headers={"x-reply-to-topic": "reply.to", "n": 3, "t": "s"}, delivery_mode=2)
    vhost = harness.broker.vhosts["/"]
    publish(vhost, vhost.exchanges["amq.topic"], "a.b", False, raw, b"{}", amqp_counters(harness), 1)
    harness.run_soon()
    [(message, props)] = delivered(sub)
    assert message.qos == 1 and props["content_type"] == "application/json"
    assert props["correlation_data"] == b"c-1" and props["response_topic"] == "reply/to"
    assert dict(props["user_property"]) == {"n": "3", "t": "s"}
    assert 29 <= props["message_expiry_interval"] <= 30


def test_mqtt5_publish_as_amqp_properties(harness: Harness) -> None:
    raw = amqp_properties(1, {"content_type": "text/plain", "correlation_data": b"\xff" * 3,
                              "response_topic": "a/b", "message_expiry_interval": 5,
                              "user_property": [("k", "v"), ("k", "w")], "payload_format_indicator": 1})
    values = dict(zip(("content_type", "headers", "correlation_id", "expiration", "delivery_mode"),
                      [property_values(raw, typed=False)[i] for i in (0, 2, 5, 7, 3)], strict=True))
    assert values["content_type"] == "text/plain" and values["expiration"] == "5000"
    assert values["correlation_id"] is None and values["delivery_mode"] == 2
    headers = values["headers"]
    assert headers["x-correlation-id"] == b"\xff" * 3 and headers["x-reply-to-topic"] == "a.b"
    assert headers["k"] == "v" and headers["x-mqtt-payload-format-indicator"] == 1
    assert headers["x-mqtt-publish-qos"] == 1


def test_topic_alias_inbound_and_outbound(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    sub, _ = connect(sessions, "alias-sub", properties={"topic_alias_maximum": 4})
    sub.receive_data(codec5.encode_subscribe(1, [("al/#", 0)]))
    packets(sub)
    pub, _ = connect(sessions, "alias-pub")
    pub.receive_data(publish5("al/long/topic", b"1", topic_alias=3) + publish5("", b"2", topic_alias=3))
    harness.run_soon()
    got = delivered(sub)
    assert [(p.topic, p.payload, props.get("topic_alias")) for p, props in got] == [
        ("al/long/topic", b"1", 1), ("", b"2", 1)]
    pub.receive_data(publish5("", b"3", topic_alias=2))  # never set: a protocol error
    assert disconnect_reason(pub) == 0x82
    other, _ = connect(sessions, "alias-pub2")
    other.receive_data(publish5("x", b"3", topic_alias=17))  # over the maximum
    assert disconnect_reason(other) == 0x94


def test_subscription_options(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    conn, _ = connect(sessions, "opts")
    # No Local on "nl/#"; retain-as-published on "rap/#".
    conn.receive_data(codec5.encode_subscribe(1, [("nl/#", 0x04 | 1), ("rap/#", 0x08 | 1)]))
    assert packets(conn)[0][2] == b"\x00\x01\x00\x01\x01"
    conn.receive_data(publish5("nl/a", b"mine", 1, 1) + publish5("rap/a", b"kept", 1, 2, retain=True))
    harness.run_soon()
    got = [(p.topic, p.payload, p.retain) for p, _ in delivered(conn)]
    assert got == [("rap/a", b"kept", True)]
    # Retain handling: 1 sends retained messages for a new subscription only, 2 never.
    conn.receive_data(codec5.encode_subscribe(2, [("rap/#", 0x10 | 1)]))
    harness.run_soon()
    assert [k for k, _, _ in packets(conn)] == [codec.SUBACK]
    conn.receive_data(codec5.encode_subscribe(3, [("rap/+", 0x20)]))
    harness.run_soon()
    assert [k for k, _, _ in packets(conn)] == [codec.SUBACK]
    conn.receive_data(codec5.encode_subscribe(4, [("rap/a", 0)]))
    harness.run_soon()
    assert [(p.topic, p.retain) for p, _ in delivered(conn)] == [("rap/a", True)]
    # UNSUBACK reason codes.
    body = b"\x00\x09\x00" + codec.topic_field("nl/#") + codec.topic_field("none")
    conn.receive_data(bytes((0xA2,)) + codec.remaining_length(len(body)) + body)
    assert packets(conn) == [(codec.UNSUBACK, 0, b"\x00\x09\x00\x00\x11")]


def test_shared_subscription_round_robin_and_redelivery(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    members = [connect(sessions, f"member{i}")[0] for i in range(3)]
    for conn in members:
        conn.receive_data(codec5.encode_subscribe(1, [("$share/g/jobs/#", 1)]))
        assert packets(conn)[0][2] == b"\x00\x01\x00\x01"
    pub, _ = connect(sessions, "producer")
    pub.receive_data(b"".join(publish5("jobs/x", str(i).encode(), 1, i + 1) for i in range(30)))
    harness.run_soon()
    got = {i: delivered(conn) for i, conn in enumerate(members)}
    assert all(got[i] for i in range(3)), {i: len(v) for i, v in got.items()}
    # Member 0 acks nothing and goes: its deliveries go to the others, with DUP.
    lost = {p.payload for p, _ in got[0]}
    members[0].lost()
    for i in (1, 2):
        members[i].receive_data(b"".join(codec5.ack(codec.PUBACK, p.packet_id) for p, _ in got[i]))
    harness.run_soon()
    seen = {p.payload for i in (1, 2) for p, _ in got[i]}
    for _ in range(10):
        for i in (1, 2):
            more = delivered(members[i])
            seen |= {p.payload for p, _ in more}
            members[i].receive_data(b"".join(codec5.ack(codec.PUBACK, p.packet_id) for p, _ in more))
        harness.run_soon()
    assert seen == {str(i).encode() for i in range(30)} and lost <= seen


@pytest.mark.parametrize(("props", "reason"), [
    (b"\x02\x99\x00", 0x81),  # an unknown property identifier
    (b"\x02\x11\x00", 0x81),  # session expiry (of CONNECT) in a PUBLISH: not valid there
    (b"\x04\x01\x01\x01\x00", 0x82),  # payload format indicator twice
    (b"\x02\x01\x02", 0x82),  # payload format indicator 2
    (b"\x03\x23\x00\x00", 0x94),  # topic alias 0
    (b"\x05\x03\x00\x05ab", 0x81),  # content type longer than its properties
    (b"\x04\x03\x00\x02\xff\xfe", 0x81),  # content type not UTF-8
    (b"\x02\x0b\x01", 0x82),  # a subscription identifier from a client
    (b"\x06\x08\x00\x03a/#", 0x82),  # a response topic with a wildcard (MQTT-3.3.2-14)
    (b"\x06\x08\x00\x03a/+", 0x82),
])
def test_bad_publish_properties_disconnect_with_reason(harness: Harness, props: bytes, reason: int) -> None:
    sessions = MQTTSessions(harness.broker)
    conn, _ = connect(sessions, "bad")
    body = codec.topic_field("t") + props + b"x"
    conn.receive_data(bytes((0x30,)) + codec.remaining_length(len(body)) + body)
    assert disconnect_reason(conn) == reason
    assert conn.closed


@pytest.mark.parametrize("packet", [
    bytes((0x82, 0x07, 0, 0, 0, 0, 1, ord("a"), 0)),  # SUBSCRIBE, packet id 0, no properties, filter "a"
    bytes((0xA2, 0x06, 0, 0, 0, 0, 1, ord("a"))),  # UNSUBSCRIBE, packet id 0
], ids=["SUBSCRIBE", "UNSUBSCRIBE"])
def test_packet_identifier_0_is_malformed(harness: Harness, packet: bytes) -> None:
    """MQTT-2.2.1-3: the SUBACK or UNSUBACK would answer no request; the connection ends with 0x81."""
    sessions = MQTTSessions(harness.broker)
    conn, _ = connect(sessions, "id0")
    conn.receive_data(packet)
    assert disconnect_reason(conn) == 0x81
    assert conn.closed


def test_no_local_on_a_shared_subscription_is_a_protocol_error(harness: Harness) -> None:
    """MQTT-3.8.3-4: DISCONNECT 0x82, nothing subscribed (it was granted, the flag meaning nothing)."""
    sessions = MQTTSessions(harness.broker)
    conn, _ = connect(sessions, "shared-no-local")
    name = b"$share/g/t"
    body = b"\x00\x01\x00" + len(name).to_bytes(2, "big") + name + b"\x04"  # id 1, no properties, No Local
    conn.receive_data(bytes((0x82, len(body))) + body)
    assert disconnect_reason(conn) == 0x82
    assert conn.closed


def test_bad_connect_gets_connack_reason(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    conn = sessions.new_connection(("127.0.0.1", 50000))
    conn.start()
    data = codec5.encode_connect("c", username="guest", password=b"guest", properties={"receive_maximum": 1})
    conn.receive_data(data.replace(b"\x03\x21\x00\x01", b"\x03\x21\x00\x00"))  # receive maximum 0
    [(kind, _, body)] = packets(conn)
    assert kind == codec.CONNACK and body[:2] == b"\x00\x82" and conn.closed
    bad = sessions.new_connection(("127.0.0.1", 50001))
    bad.start()
    bad.receive_data(codec5.encode_connect("c", username="guest", password=b"wrong"))
    harness.run_soon()
    [(kind, _, body)] = packets(bad)
    assert kind == codec.CONNACK and body[:2] == b"\x00\x86"


def test_receive_maximum_bounds_inflight(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    sub, _ = connect(sessions, "rm", properties={"receive_maximum": 2})
    sub.receive_data(codec5.encode_subscribe(1, [("rm/#", 1)]))
    packets(sub)
    pub, _ = connect(sessions, "rm-pub")
    pub.receive_data(b"".join(publish5("rm/a", b"%d" % i, 1, i + 1) for i in range(5)))
    harness.run_soon()
    first = delivered(sub)
    assert len(first) == 2
    sub.receive_data(codec5.ack(codec.PUBACK, first[0][0].packet_id, 0x10))  # a reason code on the PUBACK
    harness.run_soon()
    assert len(delivered(sub)) == 1


def test_maximum_packet_size_drops_larger(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    sub, _ = connect(sessions, "mps", properties={"maximum_packet_size": 100})
    sub.receive_data(codec5.encode_subscribe(1, [("mps/#", 1)]))
    packets(sub)
    pub, _ = connect(sessions, "mps-pub")
    pub.receive_data(publish5("mps/a", b"x" * 200, 1, 1) + publish5("mps/a", b"small", 1, 2))
    harness.run_soon()
    assert [p.payload for p, _ in delivered(sub)] == [b"small"]
    assert not harness.broker.vhosts["/"].queues["mqtt-subscription-mpsqos1"].message_count


def test_server_disconnect_on_takeover_and_will_on_disconnect_with_will(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    watcher, _ = connect(sessions, "watch")
    watcher.receive_data(codec5.encode_subscribe(1, [("wills/#", 0)]))
    packets(watcher)
    first, _ = connect(sessions, "same", will=Will("wills/same", b"gone", 0, False),
                       will_properties={"content_type": "text/plain"})
    connect(sessions, "same")
    assert disconnect_reason(first) == 0x8e
    first.lost()
    harness.run_soon()
    [(message, props)] = delivered(watcher)
    assert message.payload == b"gone" and props["content_type"] == "text/plain"
    leaving, _ = connect(sessions, "leaving", will=Will("wills/leaving", b"bye", 0, False))
    leaving.receive_data(b"\xe0\x01\x04")  # DISCONNECT with will message
    leaving.lost()
    harness.run_soon()
    assert [p.payload for p, _ in delivered(watcher)] == [b"bye"]


def test_session_expiry_keeps_queues_with_x_expires(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    conn, _ = connect(sessions, "exp", clean_start=False, properties={"session_expiry_interval": 30})
    conn.receive_data(codec5.encode_subscribe(1, [("e/#", 1)]))
    packets(conn)
    conn.lost()
    harness.run_soon()
    queue = harness.broker.vhosts["/"].queues["mqtt-subscription-expqos1"]
    assert queue.durable and queue.arguments.get("x-expires") == 30000
    again, _ = connect(sessions, "exp", clean_start=False, properties={"session_expiry_interval": 30})
    again.receive_data(b"\xe0\x00")
    again.lost()
    zero, _ = connect(sessions, "exp", clean_start=False)  # expiry 0: the session ends with the connection
    zero.receive_data(b"\xe0\x00")
    zero.lost()
    harness.run_soon()
    assert "mqtt-subscription-expqos1" not in harness.broker.vhosts["/"].queues


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120), st.sampled_from([0x30, 0x32, 0x40, 0x50, 0x62, 0x70, 0x82, 0xA2, 0xE0, 0x10]))
def test_codec5_raises_only_protocol_errors_with_a_reason(body: bytes, first: int) -> None:
    kind, flags = first >> 4, first & 0x0F
    parsers = {codec.PUBLISH: lambda: codec5.parse_publish(flags, body),
               codec.SUBSCRIBE: lambda: codec5.parse_subscribe(body),
               codec.UNSUBSCRIBE: lambda: codec5.parse_unsubscribe(body),
               codec.DISCONNECT: lambda: codec5.parse_disconnect(body),
               codec.CONNECT: lambda: codec5.parse_connect(body)}
    parse = parsers.get(kind, lambda: codec5.parse_ack(body, "ACK"))
    try:
        parse()
    except codec.MQTTProtocolError as e:
        assert e.reason in (0x81, 0x82, 0x94)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from([0x30, 0x32, 0x34, 0x40, 0x50, 0x62, 0x70, 0x82, 0xA2, 0xC0, 0xE0, 0x10]),
                          st.binary(max_size=60)), min_size=1, max_size=4))
def test_fuzzed_packets_on_a_connection_end_in_a_reason_code(harness: Harness,
                                                            packets_in: list[tuple[int, bytes]]) -> None:
    """Any packets after an MQTT 5 CONNECT: answered, or one DISCONNECT with the spec's reason and a
    closed connection; never an exception out of the connection."""
    sessions = MQTTSessions(harness.broker)
    conn, _ = connect(sessions, "fuzz")
    conn.receive_data(b"".join(bytes((first,)) + codec.remaining_length(len(body)) + body
                               for first, body in packets_in))
    harness.run_soon()
    out = packets(conn)
    ends = [body for kind, _, body in out if kind == codec.DISCONNECT]
    if ends:
        assert len(ends) == 1 and conn.closed and out[-1][0] == codec.DISCONNECT
        assert ends[0][0] in (0x81, 0x82, 0x87, 0x8F, 0x90, 0x94, 0x95, 0x97, 0x99), ends[0]
    conn.lost()
    harness.run_soon()


def test_runs_of_plain_publishes_and_deliveries_keep_order_and_properties(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    sub, _ = connect(sessions, "run-sub")
    sub.receive_data(codec5.encode_subscribe(1, [("run/#", 1)]))
    packets(sub)
    pub, _ = connect(sessions, "run-pub")
    # Plain QoS 1 publishes (a run), one with a property in the middle, then plain QoS 0 ones.
    data = b"".join(publish5("run/a", b"%d" % i, 1, i + 1) for i in range(4))
    data += publish5("run/a", b"4", 1, 5, content_type="x") + publish5("run/a", b"5", 1, 6)
    data += b"".join(publish5("run/a", b"%d" % i, 0) for i in range(6, 9))
    pub.receive_data(data)
    harness.run_soon()
    assert [body for kind, _, body in packets(pub)] == [i.to_bytes(2, "big") for i in range(1, 7)]
    seen: list[tuple[codec.Publish, dict[str, Any]]] = []
    for _ in range(3):  # the in-flight window is 10: acks free room for the rest
        got = delivered(sub)
        seen += got
        sub.receive_data(b"".join(codec5.ack(codec.PUBACK, p.packet_id) for p, _ in got if p.qos))
        harness.run_soon()
    assert [(p.payload, p.qos, props.get("content_type")) for p, props in seen] == [
        (b"0", 1, None), (b"1", 1, None), (b"2", 1, None), (b"3", 1, None), (b"4", 1, "x"), (b"5", 1, None),
        (b"6", 0, None), (b"7", 0, None), (b"8", 0, None)]


def test_payload_format_invalid_and_server_keep_alive(harness: Harness) -> None:
    harness.broker.config.mqtt_max_keepalive = 30
    sessions = MQTTSessions(harness.broker)
    conn, props = connect(sessions, "pfi", keepalive=600)
    assert props["server_keep_alive"] == 30 and conn.keepalive == 30
    conn.receive_data(publish5("pfi/a", b"\xff\xfe", 1, 9, payload_format_indicator=1)
                      + publish5("pfi/a", b"text", 1, 10, payload_format_indicator=1))
    harness.run_soon()
    replies = [codec5.parse_ack(body, "PUBACK")[:2] for kind, _, body in packets(conn) if kind == codec.PUBACK]
    assert replies == [(9, 0x99), (10, 0)]
    conn.receive_data(publish5("pfi/a", b"\xff", 0, payload_format_indicator=1))  # QoS 0: no ack to say it in
    assert disconnect_reason(conn) == 0x99


def test_keepalive_timeout_is_a_disconnect_with_its_reason(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    conn, _ = connect(sessions, "quiet", keepalive=1)
    conn._last_recv -= 2  # as if 2 s went by without a packet
    conn.timer_fired()
    assert disconnect_reason(conn) == 0x8D and conn.closed


def test_message_expiry_is_a_per_message_ttl(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    sub, _ = connect(sessions, "ttl", clean_start=False, properties={"session_expiry_interval": 60})
    sub.receive_data(codec5.encode_subscribe(1, [("ttl/#", 1)]))
    packets(sub)
    sub.receive_data(b"\xe0\x00")
    sub.lost()
    pub, _ = connect(sessions, "ttl-pub")

    async def publish_durably() -> None:  # persistent messages to a durable queue: PUBACKs after the store's flush
        pub.receive_data(publish5("ttl/a", b"short", 1, 1, message_expiry_interval=1)
                         + publish5("ttl/a", b"kept", 1, 2))
        harness.run_soon()
        for _ in range(50):
            await asyncio.sleep(0)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(publish_durably())
    loop.close()
    assert [body for _, _, body in packets(pub)] == [b"\x00\x01", b"\x00\x02"]
    time.sleep(1.1)
    again, _ = connect(sessions, "ttl", clean_start=False, properties={"session_expiry_interval": 60})
    harness.run_soon()
    assert [p.payload for p, _ in delivered(again)] == [b"kept"]


def test_shared_member_unsubscribes(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    first, _ = connect(sessions, "m-a")
    second, _ = connect(sessions, "m-b")
    for conn in (first, second):
        conn.receive_data(codec5.encode_subscribe(1, [("$share/grp/u/#", 0)]))
        packets(conn)
    body = b"\x00\x02\x00" + codec.topic_field("$share/grp/u/#")
    first.receive_data(bytes((0xA2,)) + codec.remaining_length(len(body)) + body)
    assert packets(first) == [(codec.UNSUBACK, 0, b"\x00\x02\x00\x00")]
    pub, _ = connect(sessions, "m-pub")
    pub.receive_data(b"".join(publish5("u/x", b"%d" % i) for i in range(5)))
    harness.run_soon()
    assert delivered(first) == [] and len(delivered(second)) == 5
    # Groups whose names and filters would read alike with a dash are queues of their own.
    third, _ = connect(sessions, "m-c")
    third.receive_data(codec5.encode_subscribe(2, [("$share/a-b/c", 0)]))
    second.receive_data(codec5.encode_subscribe(2, [("$share/a/b-c", 0)]))
    packets(third), packets(second)
    pub.receive_data(b"".join(publish5("c", b"to a-b") for _ in range(4)) + publish5("b-c", b"to a"))
    harness.run_soon()
    assert [p.payload for p, _ in delivered(third)] == [b"to a-b"] * 4
    assert [p.payload for p, _ in delivered(second)] == [b"to a"]
    # A bad share name is refused per filter.
    second.receive_data(codec5.encode_subscribe(3, [("$share//u", 0), ("$share/g+/u", 0), ("$share/g", 0),
                                                    ("a/#/b", 0), ("$share/g/a/#/b", 0)]))
    assert packets(second) == [(codec.SUBACK, 0, b"\x00\x03\x00\x8f\x8f\x8f\x8f\x8f")]


def test_a_311_subscriber_gets_mqtt5_messages_as_311_packets(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    old = sessions.new_connection(("127.0.0.1", 50002))
    old.start()
    old.receive_data(codec.encode_connect("old", username="guest", password=b"guest"))
    assert b"".join(old.data_to_send()) == codec.connack(False, codec.ACCEPTED)
    old.receive_data(bytes((0x82, 10)) + b"\x00\x01" + codec.topic_field("mix/#") + b"\x01")
    packets(old)
    pub, _ = connect(sessions, "mix-pub")
    pub.receive_data(publish5("mix/a", b"with props", 1, 1, user_property=[("k", "v")], content_type="t")
                     + publish5("mix/a", b"plain", 0))
    harness.run_soon()
    got = [codec.parse_publish(f, b) for k, f, b in packets(old) if k == codec.PUBLISH]
    assert [(p.topic, p.payload, p.qos) for p in got] == [("mix/a", b"with props", 1), ("mix/a", b"plain", 0)]


def test_qos2_both_ways_with_properties(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    sub, _ = connect(sessions, "q2-sub")
    sub.receive_data(codec5.encode_subscribe(1, [("q2/#", 2)], subscription_id=5))
    assert packets(sub)[0][2] == b"\x00\x01\x00\x02"
    pub, _ = connect(sessions, "q2-pub")
    pub.receive_data(publish5("q2/a", b"once", 2, 7, content_type="t"))
    harness.run_soon()
    assert packets(pub) == [(codec.PUBREC, 0, b"\x00\x07")]
    pub.receive_data(codec5.ack(codec.PUBREL, 7))
    harness.run_soon()
    assert packets(pub) == [(codec.PUBCOMP, 0, b"\x00\x07")]
    [(message, props)] = delivered(sub)
    assert (message.payload, message.qos, props["content_type"], props["subscription_identifier"]) == (
        b"once", 2, "t", 5)
    sub.receive_data(codec5.ack(codec.PUBREC, message.packet_id))
    harness.run_soon()
    assert packets(sub) == [(codec.PUBREL, 2, message.packet_id.to_bytes(2, "big"))]
    sub.receive_data(codec5.ack(codec.PUBCOMP, message.packet_id))
    assert not harness.broker.vhosts["/"].queues["mqtt-subscription-q2-subqos1"].message_count
    pub.receive_data(codec5.ack(codec.PUBREL, 7))  # again: the id is no longer known
    harness.run_soon()
    assert packets(pub) == [(codec.PUBCOMP, 0, b"\x00\x07\x92\x00")]


def test_refused_by_permissions_acks_say_not_authorized(harness: Harness) -> None:
    users = harness.broker.users
    users.add_user("limited", "pw")
    users.set_permissions("limited", "/", ".*", ".*", ".*")
    users.set_topic_permission("limited", "/", "amq.topic", "^open\\.", "^open\\.")
    sessions = MQTTSessions(harness.broker)
    conn = sessions.new_connection(("127.0.0.1", 50003))
    conn.start()
    conn.receive_data(codec5.encode_connect("limited-dev", username="limited", password=b"pw"))
    harness.run_soon()
    assert packets(conn)[0][0] == codec.CONNACK
    conn.receive_data(codec5.encode_subscribe(1, [("open/#", 1), ("closed/#", 1)])
                      + publish5("closed/x", b"no", 1, 3) + publish5("open/x", b"yes", 1, 4))
    harness.run_soon()
    out = packets(conn)
    assert out[0] == (codec.SUBACK, 0, b"\x00\x01\x00\x01\x87")
    acks = [codec5.parse_ack(body, "PUBACK")[:2] for kind, _, body in out if kind == codec.PUBACK]
    assert acks == [(3, 0x87), (4, 0)]  # in order; the connection stays
    assert not conn.closed


def test_session_page_lists_shared_subscriptions_and_options(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    conn, _ = connect(sessions, "page")
    conn.receive_data(codec5.encode_subscribe(1, [("own/#", 0x04 | 1)], subscription_id=3)
                      + codec5.encode_subscribe(2, [("$share/g/jobs/+", 1)]))
    packets(conn)
    rows = {row["topic_filter"]: row for row in session_info(conn)["subscriptions"]}
    assert rows["own/#"]["no_local"] and rows["own/#"]["subscription_identifier"] == 3
    assert rows["own/#"]["queue"] == "mqtt-subscription-pageqos1"
    assert rows["$share/g/jobs/+"]["queue"] == "mqtt-shared-g/jobs.*" and rows["$share/g/jobs/+"]["qos"] == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=40), st.binary(max_size=20))
def test_fuzzed_connect_properties_get_a_connack_reason(harness: Harness, props: bytes, will_props: bytes) -> None:
    """Random CONNECT and will property blocks: a CONNACK, accepted or with the spec's reason code (then
    the connection closes); never an exception out of the connection."""
    def block(raw: bytes) -> bytes:
        return encode_varint(len(raw)) + raw
    body = (codec.topic_field("MQTT") + bytes((5, 0x02 | 0x04 | 0x80 | 0x40)) + b"\x00\x3c" + block(props)
            + codec.topic_field("fz") + block(will_props) + codec.topic_field("w") + codec.topic_field("x")
            + codec.topic_field("guest") + codec.topic_field("guest"))
    sessions = MQTTSessions(harness.broker)
    conn = sessions.new_connection(("127.0.0.1", 50004))
    conn.start()
    conn.receive_data(bytes((0x10,)) + codec.remaining_length(len(body)) + body)
    harness.run_soon()
    [(kind, _, reply)] = packets(conn)
    assert kind == codec.CONNACK
    if reply[1]:
        assert reply[1] in (0x81, 0x82, 0x8C) and conn.closed, reply
    conn.lost()
    harness.run_soon()
