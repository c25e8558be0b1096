"""MQTTS with RabbitMQ's ssl_cert_login (mqtt_ssl_cert_login): paho with a client certificate and no
credentials logs in as the certificate's user, over TLS and over WebSocket on the HTTPS port;
credentials given take priority; a certificate whose user does not exist gets CONNACK 4."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from cryptography.x509.oid import NameOID

from tests.e2e.cert_login_broker import CertBroker, issue_client

from .conftest import Paho, unique

USER = "CN=sensor-7,O=plant"


@pytest.fixture
def cert_broker(tmp_path: Path) -> Iterator[CertBroker]:
    b = CertBroker(tmp_path)
    b.add_user(USER)
    yield b
    b.close()


def _client(b: CertBroker, port: int, cert: Path | None, key: Path | None, *, username: str | None = None,
            password: str | None = None, websocket: bool = False) -> Paho:
    client = Paho(port, unique("cert"), username=username, password=password, websocket=websocket)
    client.client.tls_set(ca_certs=str(b.ca.cert_path), certfile=None if cert is None else str(cert),
                          keyfile=None if key is None else str(key))
    return client


def _sensor_cert(b: CertBroker) -> tuple[Path, Path]:
    return issue_client(b.ca, "sensor-7", [(NameOID.ORGANIZATION_NAME, "plant"), (NameOID.COMMON_NAME, "sensor-7")])


def test_a_certificate_logs_in_without_credentials(cert_broker: CertBroker) -> None:
    b = cert_broker
    cert, key = _sensor_cert(b)
    topic = unique("certs") + "/t"
    listener = Paho(b.mqtt_port, unique("plain"))
    listener.connect()
    listener.subscribe(topic, 1)
    device = _client(b, b.mqtts_port, cert, key)
    assert device.connect()[1] == "Success"
    device.publish(topic, b"from the device", qos=1)
    assert listener.message().payload == b"from the device"
    users = {c["user"] for c in b.api("GET", "connections")}  # type: ignore[union-attr]
    assert USER in users
    device.disconnect()
    listener.disconnect()


def test_over_websocket_on_the_https_port(cert_broker: CertBroker) -> None:
    b = cert_broker
    cert, key = _sensor_cert(b)
    device = _client(b, b.https_port, cert, key, websocket=True)
    assert device.connect()[1] == "Success"
    device.disconnect()


def test_credentials_given_take_priority(cert_broker: CertBroker) -> None:
    b = cert_broker
    cert, key = _sensor_cert(b)
    wrong = _client(b, b.mqtts_port, cert, key, username="guest", password="wrong")
    assert wrong.connect()[1] == mqtt.ReasonCode(mqtt.PacketTypes.CONNACK, identifier=134)  # 4: bad password
    wrong.client.loop_stop()
    guest = _client(b, b.mqtts_port, cert, key, username="guest", password="guest")
    assert guest.connect()[1] == "Success"
    guest.disconnect()


def test_a_certificate_whose_user_does_not_exist_gets_connack_4(cert_broker: CertBroker) -> None:
    b = cert_broker
    cert, key = issue_client(b.ca, "stranger", [(NameOID.COMMON_NAME, "stranger")])
    stranger = _client(b, b.mqtts_port, cert, key)
    assert stranger.connect()[1] == mqtt.ReasonCode(mqtt.PacketTypes.CONNACK, identifier=134)
    stranger.client.loop_stop()


def test_no_certificate_and_no_credentials_is_refused_with_connack_5(cert_broker: CertBroker) -> None:
    b = cert_broker
    anonymous = _client(b, b.mqtts_port, None, None)
    assert anonymous.connect()[1] == mqtt.ReasonCode(mqtt.PacketTypes.CONNACK, identifier=135)
    anonymous.client.loop_stop()


def test_switched_off_a_certificate_alone_is_anonymous(tmp_path: Path) -> None:
    b = CertBroker(tmp_path, "mqtt_ssl_cert_login: false\n")
    try:
        b.add_user(USER)
        cert, key = _sensor_cert(b)
        device = _client(b, b.mqtts_port, cert, key)
        assert device.connect()[1] == mqtt.ReasonCode(mqtt.PacketTypes.CONNACK, identifier=135)  # 5
        device.client.loop_stop()
    finally:
        b.close()
