"""Bad input closes only the connection it came from: malformed packets, reserved flags, a remaining
length over four bytes, a packet over mqtt_max_packet_size, a PUBLISH before CONNECT, a wildcard in
a PUBLISH topic. Raw sockets, since a real client does not send these; a paho client connected
beside them keeps working."""

from __future__ import annotations

import socket

import pika
import pytest

from lavinpy.mqtt import codec

from .conftest import TIMEOUT, MQTTBroker, Paho, raw_connect, read_until_closed, unique


def _publish_packet(topic: str, payload: bytes, qos: int = 0, packet_id: int = 1) -> bytes:
    return codec.publish(topic, payload, qos, False, False, packet_id)


def _connected(broker: MQTTBroker) -> socket.socket:
    sock = raw_connect(broker.mqtt_port, client_id=unique("raw"))
    assert sock.recv(4) == codec.connack(False, codec.ACCEPTED)
    return sock


BAD_AFTER_CONNECT = {
    "reserved packet type 0": bytes((0x00, 0x00)),
    "reserved packet type 15": bytes((0xF0, 0x00)),
    "SUBSCRIBE with flags 0": bytes((0x80, 0x06, 0, 1, 0, 1, ord("a"), 0)),
    "PINGREQ with flags": bytes((0xC1, 0x00)),
    "PUBLISH QoS 3": bytes((0x36, 0x05, 0, 1, ord("a"), 0, 1)),
    "remaining length over four bytes": bytes((0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01)),
    "string longer than its packet": bytes((0x30, 0x03, 0x00, 0x09, ord("a"))),
    "wildcard in a PUBLISH topic": _publish_packet("a/+/b", b"x"),
    "# in a PUBLISH topic": _publish_packet("a/#", b"x", 1),
    "empty topic": _publish_packet("", b"x"),
    "a second CONNECT": codec.encode_connect("again", username="guest", password=b"guest"),
    "PUBREL with reserved flags 0": bytes((0x60, 0x02, 0, 1)),
    "PUBREC with a body too long": bytes((0x50, 0x03, 0, 1, 0)),
    "SUBSCRIBE with QoS byte 3": bytes((0x82, 0x06, 0, 1, 0, 1, ord("a"), 3)),
    "PUBACK with a body too long": bytes((0x40, 0x03, 0, 1, 0)),
    "invalid UTF-8 topic": bytes((0x30, 0x04, 0x00, 0x02, 0xC3, 0x28)),
    # MQTT-2.3.1-1: a SUBSCRIBE or UNSUBSCRIBE carries a non-zero packet identifier
    "SUBSCRIBE with packet identifier 0": bytes((0x82, 0x06, 0, 0, 0, 1, ord("a"), 0)),
    "UNSUBSCRIBE with packet identifier 0": bytes((0xA2, 0x05, 0, 0, 0, 1, ord("a"))),
}


@pytest.mark.parametrize("packet", BAD_AFTER_CONNECT.values(), ids=BAD_AFTER_CONNECT.keys())
def test_bad_packet_closes_only_its_connection(mqtt_broker: MQTTBroker, packet: bytes) -> None:
    bystander = Paho(mqtt_broker.mqtt_port, unique("by"))
    bystander.connect()
    topic = unique("by") + "/t"
    bystander.subscribe(topic, 1)
    sock = _connected(mqtt_broker)
    sock.sendall(packet)
    assert read_until_closed(sock) == b""
    other = Paho(mqtt_broker.mqtt_port, unique("pub"))
    other.connect()
    other.publish(topic, b"still fine", qos=1)
    assert bystander.message().payload == b"still fine"
    other.disconnect()
    bystander.disconnect()


def test_publish_before_connect_closes(mqtt_broker: MQTTBroker) -> None:
    sock = socket.create_connection(("127.0.0.1", mqtt_broker.mqtt_port), timeout=TIMEOUT)
    sock.sendall(_publish_packet("a/b", b"x"))
    assert read_until_closed(sock) == b""


def test_malformed_connect_flags_close_without_connack(mqtt_broker: MQTTBroker) -> None:
    good = codec.encode_connect("x", username="guest", password=b"guest")
    flags_at = 2 + 2 + 4 + 1  # fixed header, name length, "MQTT", level
    bad = bytearray(good)
    bad[flags_at] |= 0x01  # the reserved flag
    sock = socket.create_connection(("127.0.0.1", mqtt_broker.mqtt_port), timeout=TIMEOUT)
    sock.sendall(bytes(bad))
    assert read_until_closed(sock) == b""


def test_oversized_packet_closes_before_it_is_buffered(fresh_mqtt_broker: MQTTBroker) -> None:
    fresh_mqtt_broker.extra_args += ["--config", str(_config(fresh_mqtt_broker, "mqtt_max_packet_size: 1024\n"))]
    fresh_mqtt_broker.restart()
    sock = _connected(fresh_mqtt_broker)
    sock.sendall(_publish_packet("a/b", b"x" * 900))  # fits
    header = _publish_packet("a/b", b"y" * 2000)[:8]  # only the start: its length alone is too much
    sock.sendall(header)
    assert read_until_closed(sock) == b""


def _config(broker: MQTTBroker, text: str):
    path = broker.workdir / "mqtt.yaml"
    path.write_text(text)
    return path


def test_qos1_deliveries_stop_at_the_inflight_window_until_pubacks(mqtt_broker: MQTTBroker) -> None:
    sock = _connected(mqtt_broker)
    topic = unique("win")
    sock.sendall(bytes((0x82,)) + bytes((2 + 2 + len(topic) + 1,)) + b"\x00\x07"
                 + len(topic).to_bytes(2, "big") + topic.encode() + b"\x01")
    assert sock.recv(5) == codec.suback(7, [1])
    conn = pika.BlockingConnection(pika.URLParameters(mqtt_broker.url))
    channel = conn.channel()
    for i in range(15):
        channel.basic_publish("amq.topic", topic, b"%02d" % i)
    reader = codec.PacketReader(1 << 20)
    publishes: list[codec.Publish] = []
    while len(publishes) < 10:  # the window's worth comes (the socket's timeout fails a stall)
        publishes += [codec.parse_publish(f, b) for k, f, b in reader.feed(sock.recv(65536)) if k == codec.PUBLISH]
    sock.settimeout(1.0)  # and no more while none is acknowledged
    try:
        publishes += [codec.parse_publish(f, b) for k, f, b in reader.feed(sock.recv(65536)) if k == codec.PUBLISH]
    except TimeoutError:
        pass
    assert [p.payload for p in publishes] == [b"%02d" % i for i in range(10)]  # the window: 10
    sock.sendall(b"".join(codec.puback(p.packet_id) for p in publishes[:3]))
    sock.settimeout(TIMEOUT)
    more: list[codec.Publish] = []
    while len(more) < 3:
        more += [codec.parse_publish(f, b) for k, f, b in reader.feed(sock.recv(65536)) if k == codec.PUBLISH]
    assert [p.payload for p in more] == [b"10", b"11", b"12"]
    conn.close()
    sock.close()


def test_a_large_packet_before_connect_is_refused(mqtt_broker: MQTTBroker) -> None:
    """Before a login only 64 KiB packets: a CONNECT of 70 kB (a large will) closes at its header."""
    sock = socket.create_connection(("127.0.0.1", mqtt_broker.mqtt_port), timeout=TIMEOUT)
    sock.sendall(bytes((0x10, 0xF0, 0xA2, 0x04)))  # CONNECT, remaining length 70000: the length alone is too much
    assert read_until_closed(sock) == b""
    # After CONNECT the configured limit applies: a 100 kB publish is fine.
    sub = Paho(mqtt_broker.mqtt_port, unique("sub"))
    sub.connect()
    topic = unique("big") + "/t"
    sub.subscribe(topic, 1)
    sub.publish(topic, b"z" * 100_000, qos=1)
    assert sub.message().payload == b"z" * 100_000
    sub.disconnect()
