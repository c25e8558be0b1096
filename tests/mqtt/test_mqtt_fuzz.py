"""Mutated MQTT input: the codecs (3.1.1 and MQTT 5, AUTH included) raise only MQTTProtocolError on any
bytes, and the broker, fed mutated copies of a recorded client session (3.1.1, and MQTT 5 with
properties on every packet, enhanced authentication and a re-authentication) over TCP, closes at most
those connections while a client beside them keeps working."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.mqtt import codec, codec5
from lavinpy.mqtt.auth5 import AUTH_METHOD
from lavinpy.mqtt.properties import encode_properties

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


def _parse_all5(data: bytes) -> None:
    reader = codec.PacketReader(4096)
    reader.auth = True
    for kind, flags, body in reader.feed(data):
        if kind == codec.CONNECT:
            codec5.parse_connect(body)
        elif kind == codec.PUBLISH:
            codec5.parse_publish(flags, body)
        elif kind == codec.SUBSCRIBE:
            codec5.parse_subscribe(body)
        elif kind == codec.UNSUBSCRIBE:
            codec5.parse_unsubscribe(body)
        elif kind in (codec.PUBACK, codec.PUBREC, codec.PUBREL, codec.PUBCOMP):
            codec5.parse_ack(body, codec.PACKET_NAMES[kind])
        elif kind == codec.DISCONNECT:
            codec5.parse_disconnect(body)
        elif kind == codec.AUTH:
            codec5.parse_auth(body)


@pytest.mark.parametrize("parse_all", [_parse_all, _parse_all5], ids=["mqtt311", "mqtt5"])
@settings(max_examples=300, deadline=None)
@given(st.sampled_from([0x10, 0x32, 0x40, 0x62, 0x82, 0xA2, 0xE0, 0xF0]), st.binary(max_size=300))
def test_codec_raises_only_protocol_errors(parse_all: Callable[[bytes], None], first: int, body: bytes) -> None:
    """Random bodies under each packet type a client sends (CONNECT, PUBLISH, the acks, SUBSCRIBE,
    UNSUBSCRIBE, DISCONNECT, and MQTT 5's AUTH), and random bytes."""
    for data in (bytes((first,)) + codec.remaining_length(len(body)) + body, body):
        try:
            parse_all(data)
        except codec.MQTTProtocolError:
            pass


def _recorded_session5(topic: str) -> bytes:
    """An MQTT 5 client's packets, each with properties: a CONNECT by the OAUTH2-JWT method (the local
    backend checks its data here), subscriptions with options and an identifier, publishes with
    message properties and a topic alias, QoS 2 acks with reasons, a re-authentication, UNSUBSCRIBE
    and a DISCONNECT with a reason."""
    def packet(first: int, body: bytes) -> bytes:
        return bytes((first,)) + codec.remaining_length(len(body)) + body
    user = {"user_property": [("k", "v")]}
    return b"".join([
        codec5.encode_connect(unique("fz5"), username="guest", keepalive=30, properties={
            "session_expiry_interval": 30, "receive_maximum": 10, "topic_alias_maximum": 5,
            "authentication_method": AUTH_METHOD, "authentication_data": b"guest", **user}),
        codec5.encode_subscribe(1, [(topic, 0x2E), (f"$share/g/{topic}", 0x02)], subscription_id=9),
        codec5.publish(topic, b"hello", 1, False, False, 2, encode_properties({
            "topic_alias": 1, "content_type": "text/plain", "message_expiry_interval": 60,
            "response_topic": "r/t", "correlation_data": b"c", "payload_format_indicator": 1, **user})),
        codec5.publish("", b"by alias", 2, False, False, 3, encode_properties({"topic_alias": 1})),
        codec5.ack(codec.PUBREL, 3, 0x92, {"reason_string": "x"}),
        codec5.ack(codec.PUBACK, 1, 0x10, user),
        codec5.ack(codec.PUBREC, 2, 0x80, {"reason_string": "no"}),
        codec5.auth(0x19, {"authentication_method": AUTH_METHOD, "authentication_data": b"guest", **user}),
        bytes((0xC0, 0x00)),  # PINGREQ
        packet(0xA2, b"\x00\x04" + encode_properties(user) + codec.topic_field(topic)),
        codec5.disconnect(0x04, {"session_expiry_interval": 0, "reason_string": "bye"}),
    ])


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
    for i in range(90):  # 3.1.1 and MQTT 5 sessions
        record = _recorded_session5 if i % 3 == 2 else _recorded_session
        data = bytearray(record(unique("fz") + "/t"))
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
