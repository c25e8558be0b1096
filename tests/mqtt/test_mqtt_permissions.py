"""Permissions and topic permissions apply to MQTT as to AMQP: the model's checks, one place. A
publish the user may not write closes the connection (MQTT 3.1.1 has no other answer); a
subscription it may not read gets SUBACK's failure code; a queue it may not configure likewise."""

from __future__ import annotations

from tests.e2e.conftest import http_call

from .conftest import MQTTBroker, Paho, unique


def _user(broker: MQTTBroker, *, configure: str = ".*", write: str = ".*", read: str = ".*",
          topic_write: str | None = None, topic_read: str | None = None) -> tuple[str, str]:
    vhost, user = unique("pv"), unique("pu")
    assert http_call(broker, "PUT", f"/api/vhosts/{vhost}")[0] in (201, 204)
    assert http_call(broker, "PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] in (201, 204)
    body = {"configure": configure, "write": write, "read": read}
    assert http_call(broker, "PUT", f"/api/permissions/{vhost}/{user}", body)[0] in (201, 204)
    if topic_write is not None:
        body = {"exchange": "amq.topic", "write": topic_write, "read": topic_read or ".*"}
        assert http_call(broker, "PUT", f"/api/topic-permissions/{vhost}/{user}", body)[0] in (201, 204)
    return vhost, user


def test_topic_permissions_on_publish_and_subscribe(mqtt_broker: MQTTBroker) -> None:
    vhost, user = _user(mqtt_broker, topic_write="^sensors\\.", topic_read="^sensors\\.")
    client = Paho(mqtt_broker.mqtt_port, unique("c"), username=f"{vhost}:{user}", password="pw")
    assert client.connect()[1] == "Success"
    assert client.subscribe("sensors/#", 1) == [1]
    assert client.subscribe("secrets/#", 1) == [0x80]
    client.publish("sensors/t", b"ok", qos=1)
    assert client.message().payload == b"ok"
    client.client.publish("secrets/t", b"no", qos=1)
    client.disconnects.get(timeout=10)  # closed by the server
    client.client.loop_stop()


def test_exchange_write_and_queue_configure_permissions(mqtt_broker: MQTTBroker) -> None:
    vhost, user = _user(mqtt_broker, configure="^$", write="^$")
    client = Paho(mqtt_broker.mqtt_port, unique("c"), username=f"{vhost}:{user}", password="pw")
    assert client.connect()[1] == "Success"
    assert client.subscribe("a/b", 1) == [0x80]  # may not declare its queue
    client.client.publish("a/b", b"no", qos=1)  # may not write to amq.topic
    client.disconnects.get(timeout=10)
    client.client.loop_stop()


def test_subscribing_needs_read_on_the_queue(mqtt_broker: MQTTBroker) -> None:
    vhost, user = _user(mqtt_broker, read="^amq\\.topic$")  # the exchange, not the queues
    client = Paho(mqtt_broker.mqtt_port, unique("c"), username=f"{vhost}:{user}", password="pw")
    assert client.connect()[1] == "Success"
    assert client.subscribe("a/b", 0) == [0x80]
    client.disconnect()
