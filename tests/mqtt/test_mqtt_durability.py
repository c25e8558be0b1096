"""A PUBACK means the message is durable (fsync always): every PUBACKed QoS 1 publish is delivered
after kill -9, through a persistent MQTT session and to an AMQP queue."""

from __future__ import annotations

import time

import pika
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from .conftest import MQTTBroker, Paho, unique


def test_pubacked_messages_survive_kill9(fresh_mqtt_broker: MQTTBroker) -> None:
    broker = fresh_mqtt_broker
    device, base = unique("dev"), unique("k9")
    subscriber = Paho(broker.mqtt_port, device, clean_session=False)
    subscriber.connect()
    assert subscriber.subscribe(f"{base}/#", 1) == [1]
    subscriber.disconnect()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = conn.channel()
    channel.queue_declare("k9-amqp", durable=True)
    channel.queue_bind("k9-amqp", "amq.topic", f"{base}.#")
    conn.close()
    publisher = Paho(broker.mqtt_port, unique("pub"))
    publisher.connect()
    for i in range(20):
        publisher.publish(f"{base}/n", b"%d" % i, qos=1)  # returns after the PUBACK
    broker.kill9()
    broker.start()
    again = Paho(broker.mqtt_port, device, clean_session=False)
    assert again.connect()[0] is True
    assert [again.message().payload for _ in range(20)] == [b"%d" % i for i in range(20)]
    again.disconnect()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    assert conn.channel().queue_declare("k9-amqp", passive=True).method.message_count == 20
    conn.close()


def test_retained_messages_survive_kill9(fresh_mqtt_broker: MQTTBroker) -> None:
    broker = fresh_mqtt_broker
    base = unique("r9")
    publisher = Paho(broker.mqtt_port, unique("pub"))
    publisher.connect()
    publisher.publish(f"{base}/kept", b"v1", qos=1, retain=True)
    publisher.publish(f"{base}/kept", b"v2", qos=1, retain=True)
    publisher.publish(f"{base}/cleared", b"x", qos=1, retain=True)
    publisher.publish(f"{base}/cleared", b"", qos=1, retain=True)
    broker.kill9()
    broker.start()
    subscriber = Paho(broker.mqtt_port, unique("sub"))
    subscriber.connect()
    subscriber.subscribe(f"{base}/#", 1)
    msg = subscriber.message()
    assert (msg.topic, msg.payload, msg.retain) == (f"{base}/kept", b"v2", True)
    subscriber.no_message()
    subscriber.disconnect()


def test_clean_stop_with_mqtt_clients_connected(fresh_mqtt_broker: MQTTBroker) -> None:
    """SIGTERM disconnects MQTT clients and exits 0; unacknowledged deliveries of a persistent session
    are there again after the restart (redelivered, with DUP set)."""
    broker = fresh_mqtt_broker
    device, base = unique("dev"), unique("st")
    subscriber = Paho(broker.mqtt_port, device, clean_session=False)
    subscriber.connect()
    subscriber.subscribe(f"{base}/#", 1)
    subscriber.client.on_message = lambda c, u, msg: None  # paho acks on return: this client never sees them
    subscriber.client.loop_stop()  # and now reads nothing more: the deliveries stay unacked
    publisher = Paho(broker.mqtt_port, unique("pub"))
    publisher.connect()
    publisher.publish(f"{base}/x", b"kept", qos=1)
    broker.stop()  # asserts exit code 0
    broker.start()
    again = Paho(broker.mqtt_port, device, clean_session=False)
    assert again.connect()[0] is True
    msg = again.message()
    assert (msg.payload, msg.qos, msg.dup) == (b"kept", 1, True)
    again.disconnect()


def test_mqtt5_options_shared_qos2_and_delayed_will_survive_kill9(fresh_mqtt_broker: MQTTBroker) -> None:
    """A persistent MQTT 5 session's subscription options (No Local, a subscription identifier, a shared
    subscription at QoS 2) and a will waiting for its delay are there again after kill -9."""
    from .test_mqtt5_paho import Paho5
    broker = fresh_mqtt_broker
    base = unique("o9")
    device = Paho5(broker.mqtt_port, unique("dev"))
    device.connect(SessionExpiryInterval=600)
    assert device.subscribe(f"{base}/own/#", 1, subscription_id=5, noLocal=True) == [1]
    assert device.subscribe(f"$share/g/{base}/jobs/#", 2) == [2]
    device.close()
    dying = Paho5(broker.mqtt_port, unique("will"))
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.WillDelayInterval = 3
    dying.client.will_set(f"{base}/wills", b"gone", 1, retain=True, properties=will_props)  # kept if due first
    dying.connect(SessionExpiryInterval=600)
    dying.kill()  # the will waits 3 s
    lost_at = time.monotonic()
    time.sleep(0.3)
    broker.kill9()
    broker.start()
    watcher = Paho5(broker.mqtt_port, unique("watch"))
    watcher.connect()
    watcher.subscribe(f"{base}/wills", 1)
    message = watcher.message(10)
    assert message.payload == b"gone" and time.monotonic() - lost_at >= 2.9  # not before it was due
    again = Paho5(broker.mqtt_port, device.client._client_id.decode())
    flags, rc, _ = again.connect(clean_start=False, SessionExpiryInterval=600)
    assert rc == 0 and flags.session_present
    again.publish(f"{base}/own/a", b"mine", 1)  # No Local: not back
    watcher.publish(f"{base}/own/a", b"theirs", 1)
    watcher.publish(f"{base}/jobs/x", b"job", 2)
    got = {m.payload: m for m in (again.message(), again.message())}
    assert set(got) == {b"theirs", b"job"}
    assert got[b"theirs"].properties.SubscriptionIdentifier == [5]
    assert got[b"job"].qos == 2
    again.no_message()
    for client in (again, watcher):
        client.close()
