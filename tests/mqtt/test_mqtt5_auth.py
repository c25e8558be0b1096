"""MQTT 5 enhanced authentication on the sans-IO connection: the OAUTH2-JWT method at CONNECT (its
authentication data is the password the login's backends check), an unknown method refused with
CONNACK 0x8C, re-authentication with AUTH 0x19 answered AUTH 0x00 or DISCONNECT 0x87, malformed and
out-of-place AUTH packets closed with their reason code, random AUTH bodies never more than that, and an
expired credential closing an MQTT 5 connection with DISCONNECT 0x87."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.mqtt import codec, codec5
from lavinpy.mqtt.auth5 import AUTH_METHOD
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.properties import encode_properties, read_properties

from .test_mqtt_qos2_sansio import Broker


class AuthBroker(Broker):
    def read(self, conn: MQTTConnection) -> list[tuple[int, int, bytes]]:
        self.harness.run_soon()
        reader = codec.PacketReader(1 << 20)
        reader.auth = True  # the server's AUTH packets too
        return reader.feed(b"".join(conn.data_to_send()))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = AuthBroker(tmp_path)
    yield b
    b.sessions.shutdown()
    b.close()


def open_conn(broker: Broker, properties: dict[str, Any], username: str | None = "guest",
              password: bytes | None = None) -> tuple[MQTTConnection, list[tuple[int, int, bytes]]]:
    conn = broker.sessions.new_connection(("127.0.0.1", 50000))
    conn.start()
    broker.feed(conn, codec5.encode_connect("auth-dev", username=username, password=password, properties=properties))
    return conn, broker.read(conn)


def agreed(broker: Broker) -> MQTTConnection:
    """A connection logged in by the OAUTH2-JWT method (here the local backend checks its data)."""
    conn, out = open_conn(broker, {"authentication_method": AUTH_METHOD, "authentication_data": b"guest"})
    [(kind, _, body)] = out
    assert kind == codec.CONNACK and body[:2] == b"\x00\x00"
    props, _ = read_properties(body, 2, "CONNACK")
    assert props["authentication_method"] == AUTH_METHOD
    return conn


def auth_packet(reason: int, props: dict[str, Any]) -> bytes:
    return codec5.auth(reason, props)


def disconnect_reason(broker: Broker, conn: MQTTConnection) -> int:
    out = broker.read(conn)
    assert out and out[-1][0] == codec.DISCONNECT, out
    assert conn.closed
    return out[-1][2][0]


def test_unknown_method_gets_connack_0x8c_and_data_without_method_0x82(broker: Broker) -> None:
    conn, out = open_conn(broker, {"authentication_method": "SCRAM-SHA-1", "authentication_data": b"x"})
    assert [(k, b[:2]) for k, _, b in out] == [(codec.CONNACK, b"\x00\x8c")] and conn.closed
    conn, out = open_conn(broker, {"authentication_data": b"x"}, password=b"guest")
    assert [(k, b[:2]) for k, _, b in out] == [(codec.CONNACK, b"\x00\x82")] and conn.closed


def test_connect_with_a_bad_token_is_refused_0x86(broker: Broker) -> None:
    conn, out = open_conn(broker, {"authentication_method": AUTH_METHOD, "authentication_data": b"wrong"})
    assert [(k, b[:2]) for k, _, b in out] == [(codec.CONNACK, b"\x00\x86")]


def test_reauthentication_success_then_refusal(broker: Broker) -> None:
    conn = agreed(broker)
    broker.feed(conn, auth_packet(0x19, {"authentication_method": AUTH_METHOD, "authentication_data": b"guest"}))
    [(kind, _, body)] = broker.read(conn)
    assert kind == codec.AUTH and body[0] == 0x00
    assert read_properties(body, 1, "AUTH")[0] == {"authentication_method": AUTH_METHOD}
    broker.feed(conn, b"\xc0\x00")  # PINGREQ
    assert broker.read(conn) == [(codec.PINGRESP, 0, b"")]  # the connection goes on
    broker.feed(conn, auth_packet(0x19, {"authentication_method": AUTH_METHOD, "authentication_data": b"wrong"}))
    assert disconnect_reason(broker, conn) == 0x87


@pytest.mark.parametrize(("packet", "reason"), [
    (auth_packet(0x19, {"authentication_method": "OTHER", "authentication_data": b"guest"}), 0x8C),
    (auth_packet(0x19, {"authentication_data": b"guest"}), 0x82),  # no method
    (auth_packet(0x18, {"authentication_method": AUTH_METHOD}), 0x82),  # continue: nothing was asked
    (auth_packet(0x00, {"authentication_method": AUTH_METHOD}), 0x82),  # success is the server's
    (b"\xf0\x00", 0x82),  # empty: success, the server's
    (auth_packet(0x05, {}), 0x81),  # not an AUTH reason code
    (b"\xf1\x00", 0x81),  # reserved flags
    (b"\xf0\x03\x19\x00\x00", 0x81),  # bytes past the properties
    (b"\xf0\x04\x19\x02\x01\x01", 0x81),  # payload format indicator: not an AUTH property
    (b"\xf0\x0c\x19\x0a\x15\x00\x02ab\x15\x00\x02ab", 0x82),  # the method twice
    (b"\xf0\x05\x19\x05\x15\x00\x05a", 0x81),  # a method longer than its packet
])
def test_malformed_and_out_of_place_auth_packets(broker: Broker, packet: bytes, reason: int) -> None:
    conn = agreed(broker)
    broker.feed(conn, packet)
    assert disconnect_reason(broker, conn) == reason


def test_auth_without_an_agreed_method_is_a_protocol_error(broker: Broker) -> None:
    conn, out = open_conn(broker, {}, password=b"guest")
    assert out[0][2][:2] == b"\x00\x00"
    broker.feed(conn, auth_packet(0x19, {"authentication_method": AUTH_METHOD, "authentication_data": b"guest"}))
    assert disconnect_reason(broker, conn) == 0x82


def test_auth_is_a_reserved_packet_on_3_1_1(broker: Broker) -> None:
    conn = broker.connect("old")
    broker.feed(conn, b"\xf0\x00")
    assert broker.read(conn) == [] and conn.closed  # 3.1.1: closed, no DISCONNECT of the server's


def test_random_auth_bodies_get_an_answer_or_a_reason(broker: Broker) -> None:
    """Random and mutated AUTH bodies on agreed connections: AUTH success, or a DISCONNECT with the
    malformed, protocol-error, bad-method or not-authorized reason code; never an exception."""
    rng = random.Random(35)
    valid = auth_packet(0x19, {"authentication_method": AUTH_METHOD, "authentication_data": b"guest"})[2:]
    conn = agreed(broker)
    for i in range(300):
        if i % 2:
            body = bytearray(valid)
            for _ in range(rng.randint(1, 3)):
                body[rng.randrange(len(body))] = rng.randrange(256)
            body = bytes(body)
        else:
            body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 30)))
        broker.feed(conn, bytes((0xF0,)) + codec.remaining_length(len(body)) + body)
        out = broker.read(conn)
        if conn.closed:
            assert out and out[-1][0] == codec.DISCONNECT and out[-1][2][0] in (0x81, 0x82, 0x87, 0x8C), out
            conn = agreed(broker)
        else:
            assert all(k == codec.AUTH and b[0] == 0 for k, _, b in out), out


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60))
def test_auth_codec_raises_only_protocol_errors(data: bytes) -> None:
    reader = codec.PacketReader(4096)
    reader.auth = True
    try:
        for kind, _, body in reader.feed(b"\xf0" + codec.remaining_length(len(data)) + data):
            assert kind == codec.AUTH
            codec5.parse_auth(body)
    except codec.MQTTProtocolError:
        pass


def test_expired_credential_disconnects_mqtt5_with_0x87(broker: Broker) -> None:
    conn = agreed(broker)
    conn.expires_at = time.time() - 1
    conn.timer_fired()
    assert disconnect_reason(broker, conn) == 0x87
    assert encode_properties({}) == b"\x00"
