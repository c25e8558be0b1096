"""Sessions with paho-mqtt: clean and persistent sessions, takeover of a client id, the last will,
keepalive, retained messages."""

from __future__ import annotations

import pika

from lavinpy.mqtt import codec
from tests.e2e.conftest import http_call
from tests.helpers import wait_until

from .conftest import MQTTBroker, Paho, raw_connect, read_until_closed, unique


def _queues(broker: MQTTBroker, client_id: str) -> dict[str, dict]:
    queues = http_call(broker, "GET", "/api/queues/%2F")[1]
    return {q["name"]: q for q in queues if q["name"].startswith(f"mqtt-subscription-{client_id}qos")}


def test_persistent_session_keeps_its_queue_and_messages(mqtt_broker: MQTTBroker) -> None:
    client_id, base = unique("dev"), unique("p")
    first = Paho(mqtt_broker.mqtt_port, client_id, clean_session=False)
    assert first.connect()[0] is False
    assert first.subscribe(f"{base}/#", 1) == [1]
    first.disconnect()
    queue = _queues(mqtt_broker, client_id)[f"mqtt-subscription-{client_id}qos1"]
    assert queue["durable"] is True and queue["auto_delete"] is False
    publisher = Paho(mqtt_broker.mqtt_port, unique("pub"))
    publisher.connect()
    publisher.publish(f"{base}/a", b"while away", qos=1)
    publisher.disconnect()
    again = Paho(mqtt_broker.mqtt_port, client_id, clean_session=False)
    assert again.connect()[0] is True  # session present
    msg = again.message()
    assert (msg.topic, msg.payload, msg.qos) == (f"{base}/a", b"while away", 1)
    again.disconnect()
    # A clean session with the same id drops what the persistent one left.
    clean = Paho(mqtt_broker.mqtt_port, client_id, clean_session=True)
    assert clean.connect()[0] is False
    assert _queues(mqtt_broker, client_id) == {}
    clean.disconnect()


def test_clean_session_queue_goes_with_the_connection(mqtt_broker: MQTTBroker) -> None:
    client_id = unique("c")
    client = Paho(mqtt_broker.mqtt_port, client_id)
    client.connect()
    assert client.subscribe(unique("t") + "/x", 0) == [0]
    queue = _queues(mqtt_broker, client_id)[f"mqtt-subscription-{client_id}qos0"]
    assert queue["auto_delete"] is True and queue["durable"] is False
    client.disconnect()
    wait_until(lambda: not _queues(mqtt_broker, client_id), what="the clean session's queue to go")


def test_second_connect_with_the_same_client_id_takes_over(mqtt_broker: MQTTBroker) -> None:
    client_id, base = unique("same"), unique("tk")
    first = Paho(mqtt_broker.mqtt_port, client_id, clean_session=False)
    first.connect()
    first.subscribe(f"{base}/#", 1)
    second = Paho(mqtt_broker.mqtt_port, client_id, clean_session=False)
    assert second.connect()[0] is True
    first.disconnects.get(timeout=10)  # the first was disconnected by the server
    first.client.loop_stop()
    publisher = Paho(mqtt_broker.mqtt_port, unique("pub"))
    publisher.connect()
    publisher.publish(f"{base}/x", b"to the second", qos=1)
    assert second.message().payload == b"to the second"
    publisher.disconnect()
    second.disconnect()
    Paho(mqtt_broker.mqtt_port, client_id).connect()  # clean up the persistent queue


def test_last_will_on_an_unclean_end_only(mqtt_broker: MQTTBroker) -> None:
    base = unique("will")
    watcher = Paho(mqtt_broker.mqtt_port, unique("w"))
    watcher.connect()
    watcher.subscribe(f"{base}/#", 1)
    polite = Paho(mqtt_broker.mqtt_port, unique("polite"))
    polite.client.will_set(f"{base}/polite", b"gone", 1)
    polite.connect()
    polite.disconnect()
    watcher.no_message()
    rude = Paho(mqtt_broker.mqtt_port, unique("rude"))
    rude.client.will_set(f"{base}/rude", b"lost", 1)
    rude.connect()
    rude.drop()
    msg = watcher.message()
    assert (msg.topic, msg.payload) == (f"{base}/rude", b"lost")
    watcher.disconnect()


def test_keepalive_times_out_after_one_and_a_half_periods(mqtt_broker: MQTTBroker) -> None:
    base = unique("ka")
    watcher = Paho(mqtt_broker.mqtt_port, unique("w"))
    watcher.connect()
    watcher.subscribe(f"{base}/#", 0)
    sock = raw_connect(mqtt_broker.mqtt_port, client_id=unique("silent"), keepalive=1)

    assert sock.recv(4) == codec.connack(False, codec.ACCEPTED)
    # Silent: closed after 1.5 s (the read returns the end of the stream; the fixture's timeout is 10 s).
    assert read_until_closed(sock) == b""
    watcher.no_message(0.2)
    watcher.disconnect()


def test_retained_message_is_delivered_on_subscribe_and_cleared_by_an_empty_one(mqtt_broker: MQTTBroker) -> None:
    base = unique("ret")
    pub = Paho(mqtt_broker.mqtt_port, unique("pub"))
    pub.connect()
    pub.publish(f"{base}/state", b"open", qos=1, retain=True)
    sub = Paho(mqtt_broker.mqtt_port, unique("sub"))
    sub.connect()
    sub.subscribe(f"{base}/+", 1)
    msg = sub.message()
    assert (msg.topic, msg.payload, msg.retain, msg.qos) == (f"{base}/state", b"open", True, 1)
    pub.publish(f"{base}/state", b"closed", qos=0, retain=True)
    msg = sub.message()
    assert (msg.payload, msg.retain) == (b"closed", False)  # live deliveries carry no retain flag
    pub.publish(f"{base}/state", b"", qos=1, retain=True)
    assert sub.message().payload == b""
    late = Paho(mqtt_broker.mqtt_port, unique("late"))
    late.connect()
    late.subscribe(f"{base}/#", 1)
    late.no_message()
    for client in (pub, sub, late):
        client.disconnect()


def test_amqp_sees_mqtt_publishes_of_every_qos_as_persistent_or_not(mqtt_broker: MQTTBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(mqtt_broker.url))
    channel = conn.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    base = unique("hdr")
    channel.queue_bind(queue, "amq.topic", f"{base}.#")
    pub = Paho(mqtt_broker.mqtt_port, unique("pub"))
    pub.connect()
    pub.publish(f"{base}/q", b"x", qos=1)
    _, props, _ = channel.basic_get(queue, auto_ack=True)
    assert props.headers == {"x-mqtt-publish-qos": 1}
    pub.disconnect()
    conn.close()


def test_deleting_the_vhost_disconnects_its_clients(mqtt_broker: MQTTBroker) -> None:
    vhost = unique("gone")
    assert http_call(mqtt_broker, "PUT", f"/api/vhosts/{vhost}")[0] in (201, 204)
    body = {"configure": ".*", "write": ".*", "read": ".*"}
    assert http_call(mqtt_broker, "PUT", f"/api/permissions/{vhost}/guest", body)[0] in (201, 204)
    client = Paho(mqtt_broker.mqtt_port, unique("c"), username=f"{vhost}:guest")
    assert client.connect()[1] == "Success"
    client.subscribe("a/b", 1)
    assert http_call(mqtt_broker, "DELETE", f"/api/vhosts/{vhost}")[0] == 204
    client.disconnects.get(timeout=10)
    client.client.loop_stop()
