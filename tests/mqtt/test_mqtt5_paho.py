"""MQTT 5 with paho-mqtt over TCP against the shared broker: CONNACK properties, message properties
both ways (with an AMQP consumer), topic aliases, subscription options and identifiers, will delay,
server DISCONNECT reasons, shared subscriptions with a member killed mid-stream, and fuzzed MQTT 5
input answered with a reason code while a client beside keeps working."""

from __future__ import annotations

import queue
import socket
import time
import urllib.request
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions
from prometheus_client.parser import text_string_to_metric_families

from lavinpy.mqtt import codec, codec5
from lavinpy.mqtt.properties import encode_properties
from tests.e2e.conftest import http_call
from tests.helpers import wait_until

from .conftest import TIMEOUT, MQTTBroker, unique


class Paho5:
    """A paho-mqtt MQTT 5 client with its events as queues."""

    def __init__(self, port: int, client_id: str = "", manual_ack: bool = False) -> None:
        self.port = port
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5,
                                  manual_ack=manual_ack)
        self.client.username_pw_set("guest", "guest")
        self.connacks: queue.Queue[tuple[Any, Any, Any]] = queue.Queue()
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.subacks: queue.Queue[list[Any]] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.client.on_connect = lambda c, u, flags, rc, props: self.connacks.put((flags, rc, props))
        self.client.on_message = lambda c, u, msg: self.messages.put(msg)
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subacks.put(list(codes))
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)

    def connect(self, clean_start: bool = True, **props: Any) -> tuple[Any, Any, Any]:
        properties = Properties(PacketTypes.CONNECT)
        for name, value in props.items():
            setattr(properties, name, value)
        self.client.connect("127.0.0.1", self.port, 60, clean_start=clean_start,
                            properties=properties if props else None)
        self.client.loop_start()
        return self.connacks.get(timeout=TIMEOUT)

    def subscribe(self, topic: str, qos: int = 1, subscription_id: int | None = None, **options: Any) -> list[Any]:
        properties = None
        if subscription_id is not None:
            properties = Properties(PacketTypes.SUBSCRIBE)
            properties.SubscriptionIdentifier = subscription_id
        self.client.subscribe(topic, options=SubscribeOptions(qos=qos, **options), properties=properties)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, **props: Any) -> None:
        properties = None
        if props:
            properties = Properties(PacketTypes.PUBLISH)
            for name, value in props.items():
                setattr(properties, name, value)
        info = self.client.publish(topic, payload, qos, retain, properties=properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()

    def message(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def no_message(self, wait: float = 0.3) -> None:
        with pytest.raises(queue.Empty):
            self.messages.get(timeout=wait)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def kill(self) -> None:
        """The socket closes under the client (no DISCONNECT)."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.fixture
def clients(mqtt_broker: MQTTBroker) -> Any:
    made: list[Paho5] = []

    def make(client_id: str = "", manual_ack: bool = False) -> Paho5:
        made.append(Paho5(mqtt_broker.mqtt_port, client_id or unique("p5"), manual_ack))
        return made[-1]
    yield make
    for client in made:
        client.client.disconnect()
        client.client.loop_stop()


def test_connack_properties_and_message_properties_both_ways(mqtt_broker: MQTTBroker, clients: Any) -> None:
    sub = clients()
    _, rc, props = sub.connect(SessionExpiryInterval=10 ** 8, ReceiveMaximum=5)
    assert rc == 0 and props.TopicAliasMaximum == 16 and props.SessionExpiryInterval == 86400
    topic = unique("props")
    assert sub.subscribe(f"{topic}/#", 1, subscription_id=42)[0] == 1
    # An AMQP queue bound to the topic sees RabbitMQ's mapping of the properties.
    amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", mqtt_broker.port))
    channel = amqp.channel()
    amqp_queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(amqp_queue, "amq.topic", f"{topic}.#")
    pub = clients()
    pub.connect()
    pub.publish(f"{topic}/a", b"hello", 1, ContentType="text/plain", ResponseTopic=f"{topic}/reply",
                CorrelationData=b"req-1", MessageExpiryInterval=120, UserProperty=[("k", "v")])
    message = sub.message()
    assert message.payload == b"hello" and message.qos == 1
    got = message.properties
    assert got.ContentType == "text/plain" and got.ResponseTopic == f"{topic}/reply"
    assert got.CorrelationData == b"req-1" and got.UserProperty == [("k", "v")]
    assert got.SubscriptionIdentifier == [42] and 118 <= got.MessageExpiryInterval <= 120
    method, header, body = channel.basic_get(amqp_queue, auto_ack=True)
    assert body == b"hello" and header.content_type == "text/plain" and header.correlation_id == "req-1"
    assert header.expiration == "120000" and header.headers["k"] == "v"
    assert header.headers["x-reply-to-topic"] == f"{topic}.reply"
    # And back: an AMQP publish reaches the MQTT 5 subscriber with properties.
    channel.basic_publish("amq.topic", f"{topic}.b", b"from-amqp", pika.BasicProperties(
        content_type="application/json", correlation_id="c-2", headers={"x-reply-to-topic": "r.t", "n": 1}))
    message = sub.message()
    assert message.payload == b"from-amqp" and message.properties.ContentType == "application/json"
    assert message.properties.CorrelationData == b"c-2" and message.properties.ResponseTopic == "r/t"
    assert ("n", "1") in message.properties.UserProperty
    amqp.close()


def test_topic_alias_and_subscription_options(clients: Any) -> None:
    conn = clients()
    conn.connect(TopicAliasMaximum=5)
    topic = unique("opts")
    conn.subscribe(f"{topic}/nl/#", 1, noLocal=True)
    conn.subscribe(f"{topic}/rap/#", 1, retainAsPublished=True)
    conn.publish(f"{topic}/nl/a", b"not to me")
    conn.publish(f"{topic}/rap/a", b"retained", retain=True)
    message = conn.message()
    assert (message.topic, message.payload, message.retain) == (f"{topic}/rap/a", b"retained", True)
    conn.no_message()
    # A topic alias set by the client, then used with an empty topic.
    other = clients()
    other.connect()
    other.subscribe(f"{topic}/alias", 0)
    conn.publish(f"{topic}/alias", b"1", 1, TopicAlias=2)
    conn.publish("", b"2", 1, TopicAlias=2)
    assert [other.message().payload for _ in range(2)] == [b"1", b"2"]
    # Retain handling 2: no retained messages at SUBSCRIBE.
    late = clients()
    late.connect()
    late.subscribe(f"{topic}/rap/#", 1, retainHandling=2)
    late.no_message()
    conn.publish(f"{topic}/rap/a", b"", retain=True)  # clears it


def test_server_disconnect_reasons_and_will_delay(clients: Any) -> None:
    topic = unique("will")
    watcher = clients()
    watcher.connect()
    watcher.subscribe(f"{topic}/#", 0)
    client_id = unique("same")
    first = clients(client_id)
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.WillDelayInterval = 1
    first.client.will_set(f"{topic}/first", b"late", 0, properties=will_props)
    first.connect(SessionExpiryInterval=60)
    taker = clients(client_id)
    taker.connect(clean_start=False, SessionExpiryInterval=60)
    assert first.disconnects.get(timeout=TIMEOUT) == 0x8E  # session taken over
    # Taken over by the same client id within the delay: the session continues, no will.
    watcher.no_message(1.5)
    taker.kill()
    taker.client.loop_stop()
    # The taker had no will; a client with a delayed will that goes away for good sends it after the delay.
    gone = clients()
    gone.client.will_set(f"{topic}/gone", b"bye", 0, properties=will_props)
    gone.connect(SessionExpiryInterval=60)
    started = time.monotonic()
    gone.kill()
    message = watcher.message(5)
    assert message.payload == b"bye" and time.monotonic() - started >= 0.9


def test_shared_subscription_member_killed_mid_stream_no_loss(clients: Any) -> None:
    topic = unique("jobs")
    members = [clients(manual_ack=True), clients(), clients()]  # the first never acks: its window stays in flight
    for member in members:
        member.connect()
        assert member.subscribe(f"$share/workers/{topic}/#", 1)[0] == 1
    producer = clients()
    producer.connect()
    count = 300
    for i in range(count):
        producer.client.publish(f"{topic}/x", str(i).encode(), 1)
        if i == 100:
            time.sleep(0.2)
            members[0].kill()  # whatever it had in flight goes to the others
    killed = set()  # what the killed member got, never acked
    while not members[0].messages.empty():
        killed.add(members[0].messages.get().payload)
    assert killed
    expected = {str(i).encode() for i in range(count)}
    seen: dict[int, set[bytes]] = {1: set(), 2: set()}
    deadline = time.monotonic() + 20
    while seen[1] | seen[2] != expected and time.monotonic() < deadline:
        for i in (1, 2):
            try:
                seen[i].add(members[i].message(0.05).payload)
            except queue.Empty:
                pass
    assert seen[1] | seen[2] == expected  # what the killed member had in flight too
    assert seen[1] and seen[2]  # spread over both members left


def test_shared_subscription_qos2_member_killed_mid_stream_exactly_once(clients: Any) -> None:
    """Three members at QoS 2, one whose socket dies mid-stream and that comes back (its session
    persists): each message reaches the applications of the group once. What the dead member had
    answered with PUBREC stays its own (paho hands it over at the PUBREL sent when it resumes), what
    it had not goes to the others."""
    topic = unique("jobs2")
    members = [clients(), clients(), clients()]
    for member in members:
        member.connect(SessionExpiryInterval=60)
        assert member.subscribe(f"$share/exact/{topic}/#", 2)[0] == 2
    producer = clients()
    producer.connect()
    count = 300
    infos = []
    for i in range(count):
        infos.append(producer.client.publish(f"{topic}/x", str(i).encode(), 2))
        if i == 100:
            time.sleep(0.2)
            members[0].kill()  # mid-stream: some deliveries past PUBREC, some not yet answered
    for info in infos:
        info.wait_for_publish(TIMEOUT)
    time.sleep(0.3)
    members[0].connect(clean_start=False, SessionExpiryInterval=60)  # resumes: its PUBRELs owed come
    expected = {str(i).encode() for i in range(count)}
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while set(got) != expected and time.monotonic() < deadline:
        for member in members:
            try:
                got.append(member.message(0.05).payload)
            except queue.Empty:
                pass
    time.sleep(0.5)  # anything delivered a second time would come now
    for member in members:
        while not member.messages.empty():
            got.append(member.messages.get().payload)
    assert set(got) == expected
    assert len(got) == count, sorted(p for p in set(got) if got.count(p) > 1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=40),
       st.sampled_from(["PUBLISH", "SUBSCRIBE", "DISCONNECT", "AUTH", "PUBACK", "UNSUBSCRIBE"]))
def test_fuzzed_properties_get_a_reason_code(mqtt_broker: MQTTBroker, props: bytes, where: str) -> None:
    """Random bytes as the property block of an MQTT 5 packet: the broker answers the packet or sends a
    DISCONNECT with a malformed-packet, protocol-error or topic-alias reason and closes; never more."""
    sock = socket.create_connection(("127.0.0.1", mqtt_broker.mqtt_port), timeout=TIMEOUT)
    try:
        sock.sendall(codec5.encode_connect(unique("fz"), username="guest", password=b"guest"))
        assert sock.recv(3)[:1] == bytes((codec.CONNACK << 4,))
        sock.recv(1 << 16)
        block = codec.remaining_length(len(props))[:1] + props if len(props) < 128 else props
        if where == "PUBLISH":
            body, first = codec.topic_field("fz/t") + block + b"payload", 0x30
        elif where == "SUBSCRIBE":
            body, first = b"\x00\x01" + block + codec.topic_field("fz/#") + b"\x01", 0x82
        elif where == "AUTH":  # on a connection that agreed no method: a protocol error at best
            body, first = b"\x19" + block, 0xF0
        elif where == "PUBACK":  # of an id not in flight: ignored once read
            body, first = b"\x00\x01\x00" + block, 0x40
        elif where == "UNSUBSCRIBE":
            body, first = b"\x00\x01" + block + codec.topic_field("fz/#"), 0xA2
        else:
            body, first = b"\x00" + block, 0xE0
        sock.sendall(bytes((first,)) + codec.remaining_length(len(body)) + body + b"\xc0\x00")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if data.endswith(b"\xd0\x00"):  # PINGRESP: the packet was taken
                break
        replies = codec.PacketReader(1 << 20).feed(data)
        for kind, _, packet in replies:
            if kind == codec.DISCONNECT:
                assert packet[0] in (0x81, 0x82, 0x94, 0x8F, 0x90), packet
        if where == "AUTH":  # never taken on a connection that agreed no authentication method
            assert [k for k, _, _ in replies][-1:] == [codec.DISCONNECT], replies
    finally:
        sock.close()
    # The broker serves a client beside as before.
    check = Paho5(mqtt_broker.mqtt_port, unique("after"))
    assert check.connect()[1] == 0
    check.close()


def test_malformed_connect_properties_get_connack_reason(mqtt_broker: MQTTBroker) -> None:
    sock = socket.create_connection(("127.0.0.1", mqtt_broker.mqtt_port), timeout=TIMEOUT)
    data = codec5.encode_connect("bad-props", username="guest", password=b"guest",
                                 properties={"maximum_packet_size": 7})
    sock.sendall(data.replace(encode_properties({"maximum_packet_size": 7}),
                              encode_properties({"maximum_packet_size": 0})))
    reply = b""
    while chunk := sock.recv(1024):
        reply += chunk
    [(kind, _, body)] = codec.PacketReader(1 << 16).feed(reply)
    assert kind == codec.CONNACK and body[1] == 0x82
    sock.close()


def test_visible_as_mqtt5_in_api_and_metrics(mqtt_broker: MQTTBroker, clients: Any) -> None:
    client_id = unique("visible5")
    conn = clients(client_id)
    conn.connect()
    conn.subscribe(f"{client_id}/#", 1)
    conn.publish(f"{client_id}/x", b"x")
    conn.message()

    def row() -> dict[str, Any] | None:
        rows = http_call(mqtt_broker, "GET", "/api/connections")[1]
        return next((r for r in rows if r["client_properties"].get("client_id") == client_id), None)
    found = wait_until(row, what="the MQTT 5 connection listed")
    assert found["protocol"] == "MQTT 5.0"
    with urllib.request.urlopen(mqtt_broker.metrics_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    labels = {s.labels.get("protocol") for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "lavinpy_global_publishers"}
    assert "mqtt50" in labels


def test_retained_messages_keep_their_properties_and_expire(clients: Any) -> None:
    """A retained message comes on SUBSCRIBE with the properties it was published with and what is
    left of its expiry interval (3.3.2.3.3); once that has passed it is not sent."""
    topic = unique("ret5")
    publisher = clients()
    publisher.connect()
    publisher.publish(f"{topic}/kept", b"kept", qos=1, retain=True, UserProperty=[("a", "2"), ("c", "3")],
                      ContentType="text/plain", ResponseTopic="replies/here", CorrelationData=b"\x00id",
                      MessageExpiryInterval=100)
    publisher.publish(f"{topic}/short", b"short", qos=1, retain=True, MessageExpiryInterval=1)
    time.sleep(2.1)
    subscriber = clients()
    subscriber.connect()
    assert subscriber.subscribe(f"{topic}/+", qos=2, subscription_id=7) == [2]
    message = subscriber.message()
    props = message.properties
    assert (message.topic, message.payload, message.retain) == (f"{topic}/kept", b"kept", True)
    assert sorted(props.UserProperty) == [("a", "2"), ("c", "3")]
    assert (props.ContentType, props.ResponseTopic, props.CorrelationData) == ("text/plain", "replies/here",
                                                                               b"\x00id")
    assert 95 <= props.MessageExpiryInterval <= 98 and props.SubscriptionIdentifier == [7]
    subscriber.no_message(0.5)  # the one whose second went by is not sent
    for name in ("kept", "short"):
        publisher.publish(f"{topic}/{name}", b"", qos=1, retain=True)
