"""QoS 2 over TCP: paho-mqtt's PUBLISH/PUBREC/PUBREL/PUBCOMP both ways, a strict client of raw packets
checking the exact handshake and its ids (a duplicate PUBLISH stored once, the PUBREL owed resent on
reconnect, a kill -9 between PUBREC and PUBREL), and AMQP on the other side seeing each message once."""

from __future__ import annotations

import socket

import paho.mqtt.client as mqtt
import pika

from lavinpy.mqtt import codec

from .conftest import TIMEOUT, MQTTBroker, Paho, raw_connect, unique


class Strict:
    """A client of raw packets that checks every packet the broker sends."""

    def __init__(self, port: int, client_id: str, clean: bool = True, present: bool = False) -> None:
        self.sock: socket.socket = raw_connect(port, client_id, clean_session=clean)
        self.reader = codec.PacketReader(1 << 20)
        self.pending: list[tuple[int, int, bytes]] = []
        assert self.packet() == (codec.CONNACK, 0, bytes((int(present), 0)))

    def send(self, *packets: bytes) -> None:
        self.sock.sendall(b"".join(packets))

    def packet(self) -> tuple[int, int, bytes]:
        while not self.pending:
            data = self.sock.recv(65536)
            assert data, "the broker closed the connection"
            self.pending += self.reader.feed(data)
        return self.pending.pop(0)

    def publish(self) -> codec.Publish:
        kind, flags, body = self.packet()
        assert kind == codec.PUBLISH
        return codec.parse_publish(flags, body)

    def nothing(self, wait: float = 0.5) -> None:
        self.sock.settimeout(wait)
        try:
            assert not self.pending and not self.reader.feed(self.sock.recv(65536)), "an unexpected packet"
        except TimeoutError:
            pass
        finally:
            self.sock.settimeout(TIMEOUT)

    def close(self) -> None:
        self.sock.close()


def reply(kind: int, packet_id: int) -> bytes:
    return bytes((kind << 4 | (2 if kind == codec.PUBREL else 0), 2)) + packet_id.to_bytes(2, "big")


def parsed(kind: int, packet_id: int) -> tuple[int, int, bytes]:
    return (kind, 2 if kind == codec.PUBREL else 0, packet_id.to_bytes(2, "big"))


def subscribe(packet_id: int, topic_filter: str, qos: int) -> bytes:
    name = topic_filter.encode()
    return bytes((0x82, 5 + len(name))) + packet_id.to_bytes(2, "big") + len(name).to_bytes(2, "big") + name \
        + bytes((qos,))


def _amqp_queue(broker: MQTTBroker, name: str, key: str) -> pika.BlockingConnection:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = conn.channel()
    channel.queue_declare(name, durable=True)
    channel.queue_bind(name, "amq.topic", key)
    return conn


def _amqp_messages(broker: MQTTBroker, name: str) -> list[bytes]:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = conn.channel()
    bodies = []
    while True:
        method, _, body = channel.basic_get(name, auto_ack=True)
        if method is None:
            conn.close()
            return bodies
        bodies.append(body)


def test_paho_qos2_both_ways_and_amqp_sees_each_once(mqtt_broker: MQTTBroker) -> None:
    base = unique("q2")
    queue = unique("q2-amqp")
    _amqp_queue(mqtt_broker, queue, f"{base}.#").close()
    sub = Paho(mqtt_broker.mqtt_port, unique("sub"))
    sub.connect()
    assert sub.subscribe(f"{base}/#", 2) == [2]
    pub = Paho(mqtt_broker.mqtt_port, unique("pub"))
    pub.connect()
    for i in range(10):
        pub.publish(f"{base}/n", b"%d" % i, qos=2)  # returns after the PUBCOMP
    got = [sub.message() for _ in range(10)]
    assert [(m.payload, m.qos) for m in got] == [(b"%d" % i, 2) for i in range(10)]
    sub.no_message()
    assert _amqp_messages(mqtt_broker, queue) == [b"%d" % i for i in range(10)]
    # An AMQP publish reaches the QoS 2 subscriber once, at QoS 2.
    conn = pika.BlockingConnection(pika.URLParameters(mqtt_broker.url))
    conn.channel().basic_publish("amq.topic", f"{base}.amqp", b"from amqp")
    conn.close()
    msg = sub.message()
    assert (msg.topic, msg.payload, msg.qos) == (f"{base}/amqp", b"from amqp", 2)
    sub.no_message()
    pub.disconnect()
    sub.disconnect()


def test_strict_duplicate_publish_is_stored_once(mqtt_broker: MQTTBroker) -> None:
    base = unique("dup")
    queue = unique("dup-amqp")
    _amqp_queue(mqtt_broker, queue, f"{base}.#").close()
    client = Strict(mqtt_broker.mqtt_port, unique("strict"))
    client.send(codec.publish(f"{base}/t", b"only once", 2, False, False, 300))
    assert client.packet() == parsed(codec.PUBREC, 300)
    # The PUBREC "was lost": the PUBLISH again, with DUP; PUBREC again, nothing stored.
    client.send(codec.publish(f"{base}/t", b"only once", 2, False, True, 300))
    assert client.packet() == parsed(codec.PUBREC, 300)
    client.send(reply(codec.PUBREL, 300))
    assert client.packet() == parsed(codec.PUBCOMP, 300)
    client.send(reply(codec.PUBREL, 300))  # a PUBREL again (the PUBCOMP "was lost"): PUBCOMP again
    assert client.packet() == parsed(codec.PUBCOMP, 300)
    client.nothing()
    client.close()
    assert _amqp_messages(mqtt_broker, queue) == [b"only once"]


def test_strict_subscriber_handshake_and_pubrel_resent_on_reconnect(mqtt_broker: MQTTBroker) -> None:
    base, device = unique("out"), unique("dev")
    client = Strict(mqtt_broker.mqtt_port, device, clean=False)
    client.send(subscribe(1, f"{base}/#", 2))
    assert client.packet() == (codec.SUBACK, 0, b"\x00\x01\x02")
    pub = Paho(mqtt_broker.mqtt_port, unique("pub"))
    pub.connect()
    pub.publish(f"{base}/a", b"first", qos=2)
    pub.publish(f"{base}/a", b"second", qos=2)
    first, second = client.publish(), client.publish()
    assert [(p.payload, p.qos, p.dup) for p in (first, second)] == [(b"first", 2, False), (b"second", 2, False)]
    client.send(reply(codec.PUBREC, first.packet_id))
    assert client.packet() == parsed(codec.PUBREL, first.packet_id)
    client.close()  # no PUBCOMP for the first, no PUBREC for the second
    client = Strict(mqtt_broker.mqtt_port, device, clean=False, present=True)
    # Resumed: the PUBREL owed, then the PUBLISH awaiting PUBREC again, with DUP and its id.
    assert client.packet() == parsed(codec.PUBREL, first.packet_id)
    again = client.publish()
    assert (again.payload, again.qos, again.dup, again.packet_id) == (b"second", 2, True, second.packet_id)
    client.send(reply(codec.PUBCOMP, first.packet_id), reply(codec.PUBREC, second.packet_id))
    assert client.packet() == parsed(codec.PUBREL, second.packet_id)
    client.send(reply(codec.PUBCOMP, second.packet_id))
    client.nothing()
    client.close()
    client = Strict(mqtt_broker.mqtt_port, device, clean=False, present=True)
    client.nothing()  # nothing owed any more
    client.close()
    pub.disconnect()


def test_kill9_between_pubrec_and_pubrel_delivers_exactly_once(fresh_mqtt_broker: MQTTBroker) -> None:
    broker = fresh_mqtt_broker
    base, publisher_id, device = unique("k9"), unique("pub"), unique("dev")
    subscriber = Paho(broker.mqtt_port, device, clean_session=False)
    subscriber.connect()
    assert subscriber.subscribe(f"{base}/#", 2) == [2]
    subscriber.disconnect()
    queue = unique("k9-amqp")
    _amqp_queue(broker, queue, f"{base}.#").close()
    client = Strict(broker.mqtt_port, publisher_id, clean=False)
    client.send(codec.publish(f"{base}/x", b"exactly once", 2, False, False, 17))
    assert client.packet() == parsed(codec.PUBREC, 17)  # durable now
    broker.kill9()
    client.close()
    broker.start()
    client = Strict(broker.mqtt_port, publisher_id, clean=False, present=True)
    # A strict client sends only the PUBREL; one that missed the PUBREC would send the PUBLISH again:
    # both are answered, the message is stored once.
    client.send(codec.publish(f"{base}/x", b"exactly once", 2, False, True, 17))
    assert client.packet() == parsed(codec.PUBREC, 17)
    client.send(reply(codec.PUBREL, 17))
    assert client.packet() == parsed(codec.PUBCOMP, 17)
    client.close()
    again = Paho(broker.mqtt_port, device, clean_session=False)
    assert again.connect()[0] is True
    msg = again.message()
    assert (msg.payload, msg.qos) == (b"exactly once", 2)
    again.no_message()
    again.disconnect()
    assert _amqp_messages(broker, queue) == [b"exactly once"]


def test_kill9_after_the_subscriber_pubrec_resends_the_pubrel(fresh_mqtt_broker: MQTTBroker) -> None:
    broker = fresh_mqtt_broker
    base, device = unique("k9s"), unique("dev")
    client = Strict(broker.mqtt_port, device, clean=False)
    client.send(subscribe(1, f"{base}/#", 2))
    assert client.packet() == (codec.SUBACK, 0, b"\x00\x01\x02")
    pub = Paho(broker.mqtt_port, unique("pub"), protocol=mqtt.MQTTv311)
    pub.connect()
    pub.publish(f"{base}/a", b"acked", qos=2)
    pub.publish(f"{base}/a", b"pending", qos=2)
    pub.disconnect()
    acked, pending = client.publish(), client.publish()
    client.send(reply(codec.PUBREC, acked.packet_id))
    assert client.packet() == parsed(codec.PUBREL, acked.packet_id)  # sent once the record was durable
    broker.kill9()
    client.close()
    broker.start()
    client = Strict(broker.mqtt_port, device, clean=False, present=True)
    assert client.packet() == parsed(codec.PUBREL, acked.packet_id)
    again = client.publish()
    assert (again.payload, again.qos, again.dup, again.packet_id) == (b"pending", 2, True, pending.packet_id)
    client.send(reply(codec.PUBCOMP, acked.packet_id), reply(codec.PUBREC, pending.packet_id))
    assert client.packet() == parsed(codec.PUBREL, pending.packet_id)
    client.send(reply(codec.PUBCOMP, pending.packet_id))
    client.nothing()
    client.close()
