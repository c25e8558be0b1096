"""Publishes read together are handled as runs of the model, with the single-message rules kept:
PUBACKs in input order, a bad packet inside a run still closes the connection, retained and other
topics break a run; deliveries and PUBACKs of a subscriber as runs. The message counters by protocol
(mqtt311, mqtt310, amqp091), the byte counters and rates of MQTT connection rows, and the QoS an
AMQP-published message gets at an MQTT subscription."""

from __future__ import annotations

import socket
import urllib.parse
import urllib.request

import paho.mqtt.client as mqtt
import pika
from prometheus_client.parser import text_string_to_metric_families

from lavinpy.mqtt import codec
from tests.e2e.conftest import http_call
from tests.helpers import wait_until

from .conftest import TIMEOUT, MQTTBroker, Paho, raw_connect, read_until_closed, unique


def _connected(port: int, client_id: str) -> tuple[socket.socket, codec.PacketReader]:
    sock = raw_connect(port, client_id)
    reader = codec.PacketReader(1 << 20)
    packets: list[tuple[int, int, bytes]] = []
    while not packets:
        packets = reader.feed(sock.recv(4))
    assert packets[0][0] == codec.CONNACK and packets[0][2] == b"\x00\x00"
    return sock, reader


def _read_packets(sock: socket.socket, reader: codec.PacketReader, count: int) -> list[tuple[int, int, bytes]]:
    packets: list[tuple[int, int, bytes]] = []
    while len(packets) < count:
        data = sock.recv(65536)
        assert data, f"closed after {len(packets)} of {count} packets"
        packets += reader.feed(data)
    return packets


def test_a_run_of_publishes_in_one_write_is_acked_in_order_and_delivered_in_order(mqtt_broker: MQTTBroker) -> None:
    base = unique("run")
    sub = Paho(mqtt_broker.mqtt_port, unique("sub"))
    sub.connect()
    assert sub.subscribe(f"{base}/#", 1) == [1]
    pub, reader = _connected(mqtt_broker.mqtt_port, unique("pub"))
    # One write: a run on topic a, one retained (ends the run), QoS 0 ones (another run), topic b.
    packets = [codec.publish(f"{base}/a", f"a{i}".encode(), 1, False, False, 100 + i) for i in range(300)]
    packets.append(codec.publish(f"{base}/a", b"kept", 1, True, False, 400))
    packets += [codec.publish(f"{base}/a", f"z{i}".encode(), 0, False, False, 0) for i in range(50)]
    packets += [codec.publish(f"{base}/b", f"b{i}".encode(), 1, False, i % 2 == 1, 500 + i) for i in range(100)]
    pub.sendall(b"".join(packets))
    acks = _read_packets(pub, reader, 401)
    assert [kind for kind, _, _ in acks] == [codec.PUBACK] * 401
    assert [int.from_bytes(body, "big") for _, _, body in acks] == [*range(100, 401), *range(500, 600)]
    got = [sub.message() for _ in range(451)]
    assert [m.payload for m in got] == [*(f"a{i}".encode() for i in range(300)), b"kept",
                                        *(f"z{i}".encode() for i in range(50)), *(f"b{i}".encode() for i in range(100))]
    assert [m.qos for m in got] == [1] * 301 + [0] * 50 + [1] * 100
    assert {m.topic for m in got[:351]} == {f"{base}/a"} and {m.topic for m in got[351:]} == {f"{base}/b"}
    sub.no_message(0.3)
    # Everything the subscriber got was PUBACKed by paho and settled as runs: nothing left unacked.
    name = f"mqtt-subscription-{sub.client._client_id.decode()}qos1"
    wait_until(lambda: (q := http_call(mqtt_broker, "GET", f"/api/queues/%2F/{name}")[1])["messages"] == 0
               and q.get("message_stats", {}).get("ack") == 451, what="every delivery settled")
    pub.close()
    sub.disconnect()


def test_a_bad_packet_inside_a_run_closes_the_connection_after_the_good_ones(mqtt_broker: MQTTBroker) -> None:
    base = unique("badrun")
    sub = Paho(mqtt_broker.mqtt_port, unique("sub"))
    sub.connect()
    assert sub.subscribe(f"{base}/#", 0) == [0]
    pub, reader = _connected(mqtt_broker.mqtt_port, unique("pub"))
    good = [codec.publish(f"{base}/x", f"m{i}".encode(), 1, False, False, i + 1) for i in range(20)]
    bad = codec.publish(f"{base}/x", b"zero id", 1, False, False, 0)  # packet identifier 0 is malformed
    after = codec.publish(f"{base}/x", b"never", 1, False, False, 99)
    pub.sendall(b"".join([*good, bad, after]))
    acks = reader.feed(read_until_closed(pub))
    # Closed for the bad packet: the publishes after it never happened (no PUBACK of those before it
    # either, as the connection is gone: the client sends them again).
    assert [kind for kind, _, _ in acks if kind != codec.PUBACK] == []
    assert {int.from_bytes(body, "big") for _, _, body in acks} <= set(range(1, 21))
    assert [sub.message().payload for _ in range(20)] == [f"m{i}".encode() for i in range(20)]
    sub.no_message(0.3)
    pub.close()
    # A QoS 0 run with a DUP flag in it: malformed too.
    pub, reader = _connected(mqtt_broker.mqtt_port, unique("pub"))
    dup = bytearray(codec.publish(f"{base}/y", b"dup", 0, False, False, 0))
    dup[0] |= 0x08
    pub.sendall(b"".join([codec.publish(f"{base}/y", b"ok", 0, False, False, 0)] * 3 + [bytes(dup)]))
    assert read_until_closed(pub) == b""
    assert [sub.message().payload for _ in range(3)] == [b"ok"] * 3
    pub.close()
    sub.disconnect()


def _samples(broker: MQTTBroker) -> list:
    with urllib.request.urlopen(broker.metrics_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def _counter(broker: MQTTBroker, name: str, protocol: str) -> float:
    return sum(s.value for s in _samples(broker)
               if s.name == f"lavinpy_{name}" and s.labels.get("protocol") == protocol)


def test_message_counters_by_protocol(fresh_mqtt_broker: MQTTBroker) -> None:
    b = fresh_mqtt_broker
    base = unique("count")
    sub = Paho(b.mqtt_port, unique("sub"))
    sub.connect()
    assert sub.subscribe(f"{base}/q1", 1) == [1]
    assert sub.subscribe(f"{base}/q0", 0) == [0]
    old = Paho(b.mqtt_port, unique("old"), protocol=mqtt.MQTTv31)
    old.connect()
    pub, reader = _connected(b.mqtt_port, unique("pub"))
    pub.sendall(b"".join(codec.publish(f"{base}/q1", b"x", 1, False, False, i + 1) for i in range(40)))
    _read_packets(pub, reader, 40)
    pub.sendall(b"".join(codec.publish(f"{base}/q0", b"y", 0, False, False, 0) for _ in range(10)))
    pub.sendall(codec.publish(f"{base}/nobody", b"z", 0, False, False, 0))
    old.publish(f"{base}/q1", b"from 3.1", qos=1)
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    channel = conn.channel()
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True).method.queue
    for _ in range(7):
        channel.basic_publish("", queue, b"amqp")
    for _ in range(7):
        method, _, _ = channel.basic_get(queue)
        channel.basic_ack(method.delivery_tag)
    for _ in range(51):
        sub.message()
    sub.no_message(0.3)
    expected = {
        "global_messages_received_total": {"mqtt311": 51, "mqtt310": 1, "amqp091": 7},
        "global_messages_routed_total": {"mqtt311": 50, "mqtt310": 1, "amqp091": 7},
        "global_messages_unroutable_dropped_total": {"mqtt311": 1, "mqtt310": 0, "amqp091": 0},
        "global_messages_confirmed_total": {"mqtt311": 40, "mqtt310": 1, "amqp091": 7},
        "global_messages_received_confirm_total": {"mqtt311": 40, "mqtt310": 1, "amqp091": 7},
        # The subscriber is an MQTT 3.1.1 client: 41 through its QoS 1 queue, 10 through its QoS 0 one.
        "global_messages_delivered_total": {"mqtt311": 51, "mqtt310": 0, "amqp091": 7},
        "global_messages_delivered_consume_manual_ack_total": {"mqtt311": 41, "mqtt310": 0, "amqp091": 0},
        "global_messages_delivered_consume_auto_ack_total": {"mqtt311": 10, "mqtt310": 0, "amqp091": 0},
        "global_messages_delivered_get_manual_ack_total": {"mqtt311": 0, "mqtt310": 0, "amqp091": 7},
        "global_messages_acknowledged_total": {"mqtt311": 41, "mqtt310": 0, "amqp091": 7},
    }

    def counted() -> dict:
        return {name: {p: _counter(b, name, p) for p in protocols} for name, protocols in expected.items()}
    wait_until(lambda: counted() == expected, what="the counts by protocol")
    conn.close()
    pub.close()
    old.disconnect()
    sub.disconnect()


def test_mqtt_connection_rows_carry_byte_counts_and_rates(fresh_mqtt_broker: MQTTBroker) -> None:
    b = fresh_mqtt_broker
    client_id = unique("bytes")
    pub, reader = _connected(b.mqtt_port, client_id)
    pub.sendall(b"".join(codec.publish("bytes/x", b"p" * 1000, 1, False, False, i + 1) for i in range(50)))
    _read_packets(pub, reader, 50)

    def row() -> dict:
        rows = http_call(b, "GET", "/api/connections")[1]
        return next(r for r in rows if r["client_properties"].get("client_id") == client_id)
    first = row()
    assert first["recv_oct"] > 50_000 and first["recv_cnt"] >= 1
    assert first["send_oct"] == 4 + 50 * 4 and first["send_cnt"] >= 2  # CONNACK and the PUBACKs
    # The rates come from the same window as an AMQP row's: bytes since the last samples, per second.
    assert first["recv_oct_details"]["rate"] > 0 and first["send_oct_details"]["rate"] > 0
    single = http_call(b, "GET", f"/api/connections/{urllib.parse.quote(first['name'], safe='')}")[1]
    assert single["recv_oct"] == first["recv_oct"] and "rate" in single["recv_oct_details"]
    pub.close()


def test_amqp_publishes_reach_mqtt_subscriptions_at_their_qos_unless_the_header_lowers_it(
        mqtt_broker: MQTTBroker) -> None:
    """RabbitMQ's rule: min(subscription QoS, x-mqtt-publish-qos); without the header, the
    subscription's QoS."""
    base = unique("amqpqos")
    sub1 = Paho(mqtt_broker.mqtt_port, unique("sub1"))
    sub1.connect()
    assert sub1.subscribe(f"{base}/#", 1) == [1]
    sub0 = Paho(mqtt_broker.mqtt_port, unique("sub0"))
    sub0.connect()
    assert sub0.subscribe(f"{base}/#", 0) == [0]
    conn = pika.BlockingConnection(pika.URLParameters(mqtt_broker.url))
    channel = conn.channel()
    cases = [(None, 1, 0), ({"x-mqtt-publish-qos": 0}, 0, 0), ({"x-mqtt-publish-qos": 1}, 1, 0),
             ({"other": "h"}, 1, 0)]
    for i, (headers, _, _) in enumerate(cases):
        properties = pika.BasicProperties(headers=headers) if headers is not None else None
        for _ in range(3):  # a run of the same publish, as the broker groups them
            channel.basic_publish("amq.topic", f"{base}.m{i}", f"m{i}".encode(), properties)
    for i, (_, at_qos1, at_qos0) in enumerate(cases):
        for _ in range(3):
            msg = sub1.message()
            assert (msg.payload, msg.qos) == (f"m{i}".encode(), at_qos1)
            msg = sub0.message()
            assert (msg.payload, msg.qos) == (f"m{i}".encode(), at_qos0)
    conn.close()
    sub0.disconnect()
    sub1.disconnect()


def test_raw_subscriber_pubacks_of_one_write_settle_and_refill_the_window(mqtt_broker: MQTTBroker) -> None:
    base = unique("window")
    sub, reader = _connected(mqtt_broker.mqtt_port, unique("sub"))
    sub.sendall(bytes((0x82, 2 + 2 + len(f"{base}/#") + 1)) + b"\x00\x01" + codec.topic_field(f"{base}/#") + b"\x01")
    assert _read_packets(sub, reader, 1)[0][0] == codec.SUBACK
    pub, pub_reader = _connected(mqtt_broker.mqtt_port, unique("pub"))
    pub.sendall(b"".join(codec.publish(f"{base}/n", str(i).encode(), 1, False, False, i + 1) for i in range(100)))
    _read_packets(pub, pub_reader, 100)
    got: list[bytes] = []
    sub.settimeout(TIMEOUT)
    while len(got) < 100:
        window = _read_packets(sub, reader, 1)
        ids = []
        for kind, flags, body in window:
            assert kind == codec.PUBLISH
            packet = codec.parse_publish(flags, body)
            got.append(packet.payload)
            ids.append(packet.packet_id)
        assert len(ids) <= 10  # the in-flight window
        ids.append(ids[0])  # a PUBACK repeated: ignored
        sub.sendall(b"".join(codec.puback(i) for i in ids))
    assert got == [str(i).encode() for i in range(100)]
    pub.close()
    sub.close()
