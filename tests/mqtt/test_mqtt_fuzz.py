"""Mutated MQTT input: the codec raises only MQTTProtocolError on any bytes, and the broker, fed
mutated copies of a recorded client session over TCP, closes at most those connections while a
client beside them keeps working."""

from __future__ import annotations

import random
import socket
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.mqtt import codec

from .conftest import MQTTBroker, Paho, unique


def _parse_all(data: bytes) -> None:
    reader = codec.PacketReader(4096)
    for kind, flags, body in reader.feed(data):
        if kind == codec.CONNECT:
            codec.parse_connect(body)
        elif kind == codec.PUBLISH:
            codec.parse_publish(flags, body)
        elif kind == codec.SUBSCRIBE:
            codec.parse_subscribe(body)
        elif kind == codec.UNSUBSCRIBE:
            codec.parse_unsubscribe(body)
        elif kind in (codec.PUBACK, codec.PUBREC, codec.PUBREL, codec.PUBCOMP):
            codec.parse_packet_id(body, codec.PACKET_NAMES[kind])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_codec_raises_only_protocol_errors(data: bytes) -> None:
    try:
        _parse_all(data)
    except codec.MQTTProtocolError:
        pass


def _recorded_session(topic: str) -> bytes:
    name = topic.encode()
    subscribe = bytes((0x82, 2 + 2 + len(name) + 1)) + b"\x00\x01" + len(name).to_bytes(2, "big") + name + b"\x02"
    return b"".join([
        codec.encode_connect(unique("fz"), username="guest", password=b"guest", keepalive=30),
        subscribe,
        codec.publish(topic, b"hello", 1, False, False, 2),
        codec.publish(topic, b"again", 0, True, False, 0),
        codec.publish(topic, b"exactly", 2, False, False, 3),
        codec.publish(topic, b"exactly", 2, False, True, 3),  # a duplicate
        bytes((0x62, 0x02, 0x00, 0x03)),  # PUBREL
        bytes((0x50, 0x02, 0x00, 0x02)),  # PUBREC of the delivery of "exactly" to this client
        bytes((0x70, 0x02, 0x00, 0x02)),  # PUBCOMP
        bytes((0xC0, 0x00)),  # PINGREQ
        bytes((0xA2, 2 + 2 + len(name))) + b"\x00\x03" + len(name).to_bytes(2, "big") + name,  # UNSUBSCRIBE
        bytes((0xE0, 0x00)),  # DISCONNECT
    ])


def test_mutated_sessions_close_only_themselves(fresh_mqtt_broker: MQTTBroker) -> None:
    """On a broker of its own: mutated passwords are failed logins, which the login throttle then
    makes every login from this address wait for."""
    mqtt_broker = fresh_mqtt_broker
    rng = random.Random(23)
    bystander = Paho(mqtt_broker.mqtt_port, unique("by"))
    bystander.connect()
    watched = unique("watch") + "/t"
    bystander.subscribe(watched, 1)
    started = time.monotonic()
    for _ in range(60):
        data = bytearray(_recorded_session(unique("fz") + "/t"))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        with socket.create_connection(("127.0.0.1", mqtt_broker.mqtt_port), timeout=5) as sock:
            sock.sendall(bytes(data))
            sock.shutdown(socket.SHUT_WR)
            try:
                while sock.recv(65536):
                    pass
            except (ConnectionResetError, TimeoutError):
                pass
    publisher = Paho(mqtt_broker.mqtt_port, unique("pub"))
    publisher.connect()
    publisher.publish(watched, b"alive", qos=1)
    assert bystander.message().payload == b"alive"
    publisher.disconnect()
    bystander.disconnect()
    assert "Traceback" not in mqtt_broker.log
    # Logged one line per connection, at most 20 per 10 s (the rest counted, said later).
    windows = int((time.monotonic() - started) // 10) + 1
    assert mqtt_broker.log.count(") closed: ") <= 20 * windows
