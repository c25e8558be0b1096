"""PUBLISH and SUBSCRIBE through amq.topic with real clients: paho to paho, paho to pika and pika to
paho with RabbitMQ's topic mapping, QoS 0, 1 and 2, PUBACK settling deliveries."""

from __future__ import annotations

import pika

from tests.e2e.conftest import http_call
from tests.helpers import wait_until

from .conftest import MQTTBroker, Paho, unique


def test_paho_to_paho_qos0_qos1_and_qos2(mqtt_broker: MQTTBroker) -> None:
    sub = Paho(mqtt_broker.mqtt_port, unique("sub"))
    sub.connect()
    base = unique("t")
    assert sub.subscribe(f"{base}/+/temp", 1) == [1]
    assert sub.subscribe(f"{base}/all/#", 0) == [0]
    assert sub.subscribe(f"{base}/two", 2) == [2]
    pub = Paho(mqtt_broker.mqtt_port, unique("pub"))
    pub.connect()
    pub.publish(f"{base}/kitchen/temp", b"21.5", qos=1)
    msg = sub.message()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (f"{base}/kitchen/temp", b"21.5", 1, False)
    pub.publish(f"{base}/kitchen/temp", b"qos0", qos=0)
    msg = sub.message()
    assert (msg.payload, msg.qos) == (b"qos0", 0)  # the lower of publish and subscription QoS
    pub.publish(f"{base}/all/x/y", b"deep", qos=1)
    msg = sub.message()
    assert (msg.topic, msg.payload, msg.qos) == (f"{base}/all/x/y", b"deep", 0)
    pub.publish(f"{base}/two", b"q2", qos=2)
    msg = sub.message()
    assert (msg.payload, msg.qos) == (b"q2", 2)  # PUBLISH, PUBREC, PUBREL, PUBCOMP both ways
    pub.publish(f"{base}/elsewhere", b"no", qos=1)
    sub.no_message()
    sub.client.unsubscribe(f"{base}/+/temp")
    wait_until(lambda: not _bound(mqtt_broker, sub, f"{base}.*.temp"), what="the binding to go")
    pub.publish(f"{base}/kitchen/temp", b"after", qos=1)
    sub.no_message()
    pub.disconnect()
    sub.disconnect()


def _bound(broker: MQTTBroker, client: Paho, key: str) -> bool:
    name = f"mqtt-subscription-{client.client._client_id.decode()}qos1"
    bindings = http_call(broker, "GET", f"/api/queues/%2F/{name}/bindings")[1] or []
    return any(b["routing_key"] == key for b in bindings)


def test_paho_publish_reaches_a_pika_consumer_with_the_mapped_key(mqtt_broker: MQTTBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(mqtt_broker.url))
    channel = conn.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    base = unique("dev")
    channel.queue_bind(queue, "amq.topic", f"{base}.*.temperature")
    pub = Paho(mqtt_broker.mqtt_port, unique("pub"))
    pub.connect()
    pub.publish(f"{base}/room.1/temperature", b"19", qos=1)
    # The PUBACK came after the message was stored: it is in the queue now.
    method, props, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None and body == b"19"
    assert method.routing_key == f"{base}.room/1.temperature"  # "/" and "." swap
    assert props.delivery_mode == 2  # QoS 1 publishes are persistent
    pub.publish(f"{base}/r/temperature", b"q0", qos=0)
    got = wait_until(lambda: channel.basic_get(queue, auto_ack=True), what="the QoS 0 message")
    assert got[2] == b"q0" and got[1].delivery_mode == 1
    pub.disconnect()
    conn.close()


def test_pika_publish_reaches_a_paho_subscriber(mqtt_broker: MQTTBroker) -> None:
    sub = Paho(mqtt_broker.mqtt_port, unique("sub"))
    sub.connect()
    base = unique("cmd")
    assert sub.subscribe(f"{base}/+/set", 1) == [1]
    conn = pika.BlockingConnection(pika.URLParameters(mqtt_broker.url))
    channel = conn.channel()
    channel.basic_publish("amq.topic", f"{base}.lamp.set", b"on")
    msg = sub.message()
    assert (msg.topic, msg.payload, msg.qos) == (f"{base}/lamp/set", b"on", 1)
    conn.close()
    sub.disconnect()


def test_qos1_deliveries_are_settled_by_puback_within_the_window(mqtt_broker: MQTTBroker) -> None:
    """The client's PUBACKs ack the deliveries through the model: the queue ends empty, no unacked."""
    sub = Paho(mqtt_broker.mqtt_port, unique("sub"))
    sub.connect()
    base = unique("bulk")
    assert sub.subscribe(f"{base}/#", 1) == [1]
    conn = pika.BlockingConnection(pika.URLParameters(mqtt_broker.url))
    channel = conn.channel()
    for i in range(50):  # more than the in-flight window of 10
        channel.basic_publish("amq.topic", f"{base}.n", str(i).encode())
    got = [sub.message().payload for _ in range(50)]
    assert got == [str(i).encode() for i in range(50)]
    name = f"mqtt-subscription-{sub.client._client_id.decode()}qos1"

    def settled() -> bool:
        q = http_call(mqtt_broker, "GET", f"/api/queues/%2F/{name}")[1]
        return q.get("messages") == 0 and q.get("messages_unacknowledged") == 0 and \
            q.get("message_stats", {}).get("ack") == 50
    wait_until(settled, timeout=10, what="50 acks and an empty queue")
    conn.close()
    sub.disconnect()
