"""CONNECT against the user store with a real paho-mqtt client and raw CONNECT packets: RabbitMQ's
vhost choice, CONNACK return codes, MQTT 3.1 and 3.1.1."""

from __future__ import annotations

import time

import paho.mqtt.client as mqtt

from lavinpy.mqtt import codec
from tests.e2e.conftest import http_call

from .conftest import MQTTBroker, Paho, raw_connect, read_until_closed, unique


def test_paho_connects_with_a_user_of_the_store(mqtt_broker: MQTTBroker) -> None:
    for protocol in (mqtt.MQTTv311, mqtt.MQTTv31):
        client = Paho(mqtt_broker.mqtt_port, unique("c"), protocol=protocol)
        present, rc = client.connect()
        assert (present, rc.is_failure) == (False, False)
        client.disconnect()


def test_a_bad_password_is_refused_with_the_spec_code(mqtt_broker: MQTTBroker) -> None:
    client = Paho(mqtt_broker.mqtt_port, unique("c"), password="wrong")
    _, rc = client.connect()
    assert rc == "Bad user name or password"
    client.client.loop_stop()
    sock = raw_connect(mqtt_broker.mqtt_port, password=b"wrong")
    assert read_until_closed(sock) == codec.connack(False, codec.BAD_USERNAME_OR_PASSWORD)


def test_anonymous_from_loopback_logs_in_as_the_default_user(mqtt_broker: MQTTBroker) -> None:
    """RabbitMQ's default (allow_anonymous, as guest): a client without credentials on this host."""
    client_id = unique("anon")
    client = Paho(mqtt_broker.mqtt_port, client_id, username=None, password=None)
    assert client.connect()[1] == "Success"
    found = []
    deadline = time.monotonic() + 10
    while not found and time.monotonic() < deadline:
        found = [c for c in http_call(mqtt_broker, "GET", "/api/connections")[1]
                 if c.get("client_properties", {}).get("client_id") == client_id]
        time.sleep(0.05)
    assert [c["user"] for c in found] == ["guest"]
    client.disconnect()


def test_anonymous_is_refused_with_connack_5_when_not_allowed() -> None:
    from lavinpy.config import Config
    from lavinpy.mqtt.connect_login import connect_login

    anonymous = codec.Connect(protocol="MQTT", level=4, client_id="c", clean_session=True, keepalive=60,
                              username=None, password=None, will=None)
    allowed = connect_login(Config(), anonymous, None, "127.0.0.1")
    assert allowed is not None and (allowed[0].username, allowed[0].password) == ("guest", "guest")
    assert connect_login(Config(mqtt_allow_anonymous=False), anonymous, None, "127.0.0.1") is None


def test_vhost_colon_user_picks_the_vhost(mqtt_broker: MQTTBroker) -> None:
    vhost, user = unique("vh"), unique("u")
    assert http_call(mqtt_broker, "PUT", f"/api/vhosts/{vhost}")[0] in (201, 204)
    assert http_call(mqtt_broker, "PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] in (201, 204)
    # No permission on the vhost yet: not authorized.
    sock = raw_connect(mqtt_broker.mqtt_port, username=f"{vhost}:{user}", password=b"pw")
    assert read_until_closed(sock) == codec.connack(False, codec.NOT_AUTHORIZED)
    body = {"configure": ".*", "write": ".*", "read": ".*"}
    assert http_call(mqtt_broker, "PUT", f"/api/permissions/{vhost}/{user}", body)[0] in (201, 204)
    client = Paho(mqtt_broker.mqtt_port, unique("c"), username=f"{vhost}:{user}", password="pw")
    assert client.connect()[1] == "Success"
    assert client.subscribe("a/b", 1) == [1]
    queues = http_call(mqtt_broker, "GET", f"/api/queues/{vhost}")[1]
    assert [q["name"] for q in queues] == [f"mqtt-subscription-{client.client._client_id.decode()}qos1"]
    client.disconnect()
    # The same user without the vhost prefix lands in the default vhost "/", where it has no access.
    sock = raw_connect(mqtt_broker.mqtt_port, username=user, password=b"pw")
    assert read_until_closed(sock) == codec.connack(False, codec.NOT_AUTHORIZED)


def test_unknown_protocol_level_gets_return_code_1(mqtt_broker: MQTTBroker) -> None:
    sock = raw_connect(mqtt_broker.mqtt_port, level=6)
    assert read_until_closed(sock) == codec.connack(False, codec.UNACCEPTABLE_PROTOCOL_VERSION)


def test_empty_client_id_needs_a_clean_session(mqtt_broker: MQTTBroker) -> None:
    sock = raw_connect(mqtt_broker.mqtt_port, client_id="", clean_session=False)
    assert read_until_closed(sock) == codec.connack(False, codec.IDENTIFIER_REJECTED)
    sock = raw_connect(mqtt_broker.mqtt_port, client_id="", clean_session=True)
    assert sock.recv(4) == codec.connack(False, codec.ACCEPTED)
    sock.close()


def test_login_throttle_delays_answers_after_repeated_failures(fresh_mqtt_broker: MQTTBroker) -> None:
    """After three failed logins from an address its next CONNACK, right or wrong, comes later (and
    the packets sent behind the CONNECT are handled after it, in order)."""
    for _ in range(4):
        sock = raw_connect(fresh_mqtt_broker.mqtt_port, password=b"wrong")
        assert read_until_closed(sock) == codec.connack(False, codec.BAD_USERNAME_OR_PASSWORD)
    started = time.monotonic()
    sock = raw_connect(fresh_mqtt_broker.mqtt_port)
    sock.sendall(bytes((0xC0, 0x00)))  # PINGREQ right behind the CONNECT
    answer = b""
    while len(answer) < 6:
        answer += sock.recv(6 - len(answer))
    assert time.monotonic() - started >= 0.1  # the throttle's base delay at least
    assert answer == codec.connack(False, codec.ACCEPTED) + codec.PINGRESP_PACKET
    sock.close()
    assert "login refused for user 'guest'" in fresh_mqtt_broker.log


def test_vhost_and_user_connection_limits_count_mqtt_connections(mqtt_broker: MQTTBroker) -> None:
    vhost, user = unique("vh"), unique("u")
    assert http_call(mqtt_broker, "PUT", f"/api/vhosts/{vhost}")[0] in (201, 204)
    assert http_call(mqtt_broker, "PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] in (201, 204)
    body = {"configure": ".*", "write": ".*", "read": ".*"}
    assert http_call(mqtt_broker, "PUT", f"/api/permissions/{vhost}/{user}", body)[0] in (201, 204)
    assert http_call(mqtt_broker, "PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 1})[0] in (201, 204)
    first = Paho(mqtt_broker.mqtt_port, unique("c"), username=f"{vhost}:{user}", password="pw")
    assert first.connect()[1] == "Success"
    sock = raw_connect(mqtt_broker.mqtt_port, username=f"{vhost}:{user}", password=b"pw")
    assert read_until_closed(sock) == codec.connack(False, codec.NOT_AUTHORIZED)
    first.disconnect()  # its place is freed
    deadline = time.monotonic() + 10
    while True:
        second = Paho(mqtt_broker.mqtt_port, unique("c"), username=f"{vhost}:{user}", password="pw")
        if second.connect()[1] == "Success":
            break
        second.client.loop_stop()
        assert time.monotonic() < deadline, "the closed MQTT connection did not free its place"
        time.sleep(0.2)
    second.disconnect()
    assert http_call(mqtt_broker, "DELETE", f"/api/vhost-limits/{vhost}/max-connections")[0] == 204
