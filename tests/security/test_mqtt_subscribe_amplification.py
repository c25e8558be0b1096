"""One SUBSCRIBE cannot make the broker queue gigabytes: a filter repeated in the packet is one
subscription whose retained messages go out once, the filters of one packet are capped, retained
messages go out only as fast as the socket takes them, and each vhost's retained messages are capped
in count and bytes."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import Effect, MQTTConnection
from lavinpy.mqtt.sessions import MQTTSessions
from lavinpy.mqtt.subscriptions import RETAINED_BATCH_BYTES
from tests.amqp.session_client import Harness
from tests.mqtt.conftest import MQTTBroker, Paho, unique

from .conftest import rss_mib

MIB = 1024 * 1024


def subscribe_packet(packet_id: int, filters: list[tuple[str, int]]) -> bytes:
    body = packet_id.to_bytes(2, "big")
    for topic_filter, qos in filters:
        name = topic_filter.encode()
        body += len(name).to_bytes(2, "big") + name + bytes((qos,))
    return bytes((0x82,)) + codec.remaining_length(len(body)) + body


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, fsync="never", mqtt_max_subscribe_filters=50, mqtt_retained_max_messages=3,
                mqtt_retained_max_bytes=3 * MIB)
    yield h
    h.close()


def _connected(sessions: MQTTSessions, client_id: str) -> MQTTConnection:
    conn = sessions.new_connection(("127.0.0.1", 50000))
    conn.start()
    conn.receive_data(codec.encode_connect(client_id, username="guest", password=b"guest"))
    assert b"".join(conn.data_to_send()) == codec.connack(False, codec.ACCEPTED)
    conn.take_effects()
    return conn


def _packets(data: list[bytes]) -> list[tuple[int, int, bytes]]:
    return codec.PacketReader(1 << 30).feed(b"".join(data))


def test_a_repeated_filter_is_one_subscription_and_its_retained_message_goes_once(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    publisher = _connected(sessions, "pub")
    publisher.receive_data(codec.publish("r/t", b"kept", 0, True, False, 0))
    conn = _connected(sessions, "sub")
    conn.receive_data(subscribe_packet(1, [("r/#", 0)] * 49 + [("r/#", 1)]))
    packets = _packets(conn.data_to_send())
    assert packets[0] == (codec.SUBACK, 0, b"\x00\x01" + b"\x01" * 50)  # one code per request
    retained = [codec.parse_publish(flags, body) for kind, flags, body in packets if kind == codec.PUBLISH]
    assert [(p.topic, p.payload, p.qos, p.retain) for p in retained] == [("r/t", b"kept", 0, True)]
    assert conn.data_to_send() == []
    exchange = harness.broker.vhosts["/"].exchanges["amq.topic"]
    assert [b.routing_key for b in exchange.bindings() if b.destination.name.startswith("mqtt-subscription-sub")] \
        == ["r.#"]


def test_filters_over_the_cap_close_the_connection(harness: Harness) -> None:
    conn = _connected(MQTTSessions(harness.broker), "many")
    conn.receive_data(subscribe_packet(1, [(f"f/{i}", 0) for i in range(51)]))
    assert Effect.CLOSE in conn.take_effects()
    assert conn.data_to_send() == []  # no SUBACK


def test_retained_messages_go_out_as_the_socket_takes_them(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    publisher = _connected(sessions, "pub")
    for i in range(3):
        publisher.receive_data(codec.publish(f"big/{i}", bytes(MIB - 100), 0, True, False, 0))
    conn = _connected(sessions, "slow")
    conn.receive_data(subscribe_packet(1, [("big/#", 0), ("big/+", 0), ("#", 0)]))
    first = sum(map(len, conn.data_to_send()))
    assert first < RETAINED_BATCH_BYTES + 2 * MIB  # a batch, not the nine messages owed
    conn.set_writable(False)  # the socket is full: nothing more is made
    assert conn.data_to_send() == []
    conn.set_writable(True)
    rest = sum(len(p) for _ in range(20) for p in conn.data_to_send())
    assert 9 * (MIB - 100) < first + rest < 9 * MIB + 1000  # three filters, three messages each


def test_retained_messages_are_capped_per_vhost(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    publisher = _connected(sessions, "pub")
    for i in range(5):
        publisher.receive_data(codec.publish(f"c/{i}", b"x", 0, True, False, 0))
    retained = sessions.retained.of(harness.broker.vhosts["/"])
    assert sorted(retained.topics("c/+")) == ["c/0", "c/1", "c/2"]  # the count cap: 3
    publisher.receive_data(codec.publish("c/0", bytes(2 * MIB), 0, True, False, 0))  # replacing is fine
    publisher.receive_data(codec.publish("c/1", bytes(2 * MIB), 0, True, False, 0))  # over the 3 MiB cap
    kept = {topic: (found.payload, found.qos) for topic in ("c/0", "c/1") if (found := retained.get(topic))}
    assert kept == {"c/0": (bytes(2 * MIB), 0), "c/1": (b"x", 0)}
    publisher.receive_data(codec.publish("c/2", b"", 0, True, False, 0))  # clearing makes room
    publisher.receive_data(codec.publish("c/9", b"y", 0, True, False, 0))
    assert sorted(retained.topics("#")) == ["c/0", "c/1", "c/9"]
    assert not publisher.closed  # refused retention is no error of the client's


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MQTTBroker]:
    b = MQTTBroker(tmp_path_factory.mktemp("security-subscribe"))
    b.start()
    yield b
    b.close()


def _raw_client(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # a slow reader's small window
    sock.sendall(codec.encode_connect(client_id, username="guest", password=b"guest"))
    assert sock.recv(4) == codec.connack(False, codec.ACCEPTED)
    return sock


@pytest.mark.timeout(120)
def test_100000_copies_of_a_filter_over_a_1_mib_retained_message(broker: MQTTBroker) -> None:
    topic = unique("amp") + "/r"
    publisher = Paho(broker.mqtt_port, unique("pub"))
    publisher.connect()
    publisher.publish(topic, bytes(MIB), qos=1, retain=True)
    before = rss_mib(broker.pid)
    with _raw_client(broker.mqtt_port, unique("amp")) as sock:
        sock.sendall(subscribe_packet(1, [(topic, 1)] * 100_000))  # over the cap of 1,000: closed
        sock.settimeout(10)
        assert sock.recv(65536) == b""
    # The cap's worth of copies, read slowly: one SUBACK, the retained message once.
    with _raw_client(broker.mqtt_port, unique("amp")) as sock:
        sock.sendall(subscribe_packet(1, [(topic, 1)] * 1000))
        time.sleep(1)
        during = rss_mib(broker.pid)
        other = Paho(broker.mqtt_port, unique("other"))  # another client is served meanwhile
        assert other.connect()[1] == "Success"
        assert other.subscribe(topic + "/x", 0) == [0]
        other.disconnect()
        reader = codec.PacketReader(1 << 30)
        packets: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(k == codec.PUBLISH for k, _, _ in packets):
            packets += reader.feed(sock.recv(1 << 20))
        time.sleep(0.5)
        sock.setblocking(False)
        try:
            packets += reader.feed(sock.recv(1 << 24))
        except BlockingIOError:
            pass
        assert [k for k, _, _ in packets] == [codec.SUBACK, codec.PUBLISH]
        assert len(packets[0][2]) == 2 + 1000
    publisher.disconnect()
    assert during - before < 64 and rss_mib(broker.pid) - before < 64, (before, during)


def test_the_client_is_not_read_while_more_than_a_packet_of_filters_is_owed(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    publisher = _connected(sessions, "pub")
    publisher.receive_data(codec.publish("o/t", b"kept", 0, True, False, 0))
    conn = _connected(sessions, "owed")
    conn.set_writable(False)  # a client that does not read
    conn.receive_data(subscribe_packet(1, [(f"o/{i}", 0) for i in range(49)] + [("o/#", 0)]))
    assert Effect.PAUSE_READING not in conn.take_effects()  # one packet's worth: read on
    conn.receive_data(subscribe_packet(2, [("o/+", 0)]))
    assert Effect.PAUSE_READING in conn.take_effects()
    conn.set_writable(True)
    retained = [codec.parse_publish(f, b).topic for k, f, b in _packets(conn.data_to_send()) if k == codec.PUBLISH]
    assert retained == ["o/t", "o/t"]  # once for each filter that matches
    assert conn.take_effects() == [Effect.RESUME_READING]
