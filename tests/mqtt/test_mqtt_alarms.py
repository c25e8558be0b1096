"""A resource alarm stops reading MQTT publishers (their QoS 1 publishes wait for a PUBACK) and a
cleared alarm reads them again; subscribers keep receiving meanwhile."""

from __future__ import annotations

import urllib.parse

from tests.e2e.conftest import http_call

from .conftest import MQTTBroker, Paho, unique


def _set_disk_limit(broker: MQTTBroker, value: int) -> None:
    nodes = http_call(broker, "GET", "/api/nodes")[1]
    path = "/api/nodes/" + urllib.parse.quote(nodes[0]["name"], safe="") + "/disk_free_limit"
    status, body, _ = http_call(broker, "PUT", path, {"bytes": value})
    assert status == 200, body


def test_disk_alarm_blocks_mqtt_publishers_until_cleared(fresh_mqtt_broker: MQTTBroker) -> None:
    broker = fresh_mqtt_broker
    topic = unique("al") + "/t"
    subscriber = Paho(broker.mqtt_port, unique("sub"))
    subscriber.connect()
    subscriber.subscribe(topic, 1)
    publisher = Paho(broker.mqtt_port, unique("pub"))
    publisher.connect()
    publisher.publish(topic, b"before", qos=1)  # a publisher now
    assert subscriber.message().payload == b"before"
    _set_disk_limit(broker, 10**18)
    first = publisher.client.publish(topic, b"first", 1)  # neither is read while the alarm lasts
    second = publisher.client.publish(topic, b"second", 1)
    second.wait_for_publish(1.5)
    assert not second.is_published()  # no PUBACK while the alarm lasts
    _set_disk_limit(broker, 1)
    second.wait_for_publish(10)
    first.wait_for_publish(10)
    assert first.is_published() and second.is_published()
    got = {subscriber.message().payload for _ in range(2)}
    assert got == {b"first", b"second"}
    publisher.disconnect()
    subscriber.disconnect()
