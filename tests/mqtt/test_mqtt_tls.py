"""MQTT over TLS on mqtts_port with the AMQPS certificate: paho with tls_set to a paho subscriber on
the plain port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.tls_certs import CA
from tests.helpers import free_port

from .conftest import MQTTBroker, Paho, unique


@pytest.fixture
def tls_mqtt_broker(tmp_path: Path) -> Iterator[tuple[MQTTBroker, int, Path]]:
    ca = CA(tmp_path / "pki")
    cert, key, _ = ca.issue("server", server=True)
    mqtts_port = free_port()
    conf = tmp_path / "tls.yaml"
    conf.write_text(f"tls_cert: {cert}\ntls_key: {key}\namqps_port: 0\n"
                    "https_port: 0\nprometheus_tls_port: 0\n")
    broker = MQTTBroker(tmp_path / "broker")
    broker.extra_args += ["--config", str(conf), "--mqtts-port", str(mqtts_port)]
    broker.start()
    yield broker, mqtts_port, ca.cert_path
    broker.close()


def test_paho_over_tls(tls_mqtt_broker: tuple[MQTTBroker, int, Path]) -> None:
    broker, mqtts_port, ca_path = tls_mqtt_broker
    topic = unique("tls") + "/t"
    plain = Paho(broker.mqtt_port, unique("plain"))
    plain.connect()
    plain.subscribe(topic, 1)
    secure = Paho(mqtts_port, unique("tls"))
    secure.client.tls_set(ca_certs=str(ca_path))
    assert secure.connect()[1] == "Success"
    secure.publish(topic, b"over tls", qos=1)
    assert plain.message().payload == b"over tls"
    assert "listening for MQTTS" in broker.log
    secure.disconnect()
    plain.disconnect()
