"""QoS 2 on the sans-IO MQTT connection, on a real broker whose deferred work runs by hand: the
inbound handshake (PUBREC, the id remembered until PUBREL, duplicates stored once, PUBCOMP), the
outbound one (PUBLISH qos 2, PUBREC acks the queue, PUBREL, PUBCOMP) and the persistent session's
state across a reconnect and a restart of the broker on the same data dir."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.sessions import MQTTSessions
from tests.amqp.session_client import Harness

QOS1_QUEUE = "mqtt-subscription-{}qos1"


class Broker:
    """A harness and its MQTT sessions; ``restart`` closes both and opens them again on the same dir."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.harness = Harness(path, fsync="never")
        self.sessions = MQTTSessions(self.harness.broker)
        self.loop = asyncio.new_event_loop()

    def restart(self) -> None:
        self.sessions.shutdown()
        self.harness.close()
        self.harness = Harness(self.path, fsync="never")
        self.sessions = MQTTSessions(self.harness.broker)

    def held(self, client_id: str) -> int:
        """Messages the client's QoS 1 queue holds, ready or unacked."""
        queue = self.harness.broker.vhosts["/"].queues[QOS1_QUEUE.format(client_id)]
        return queue.message_count + queue.unacked_count

    def connect(self, client_id: str, clean: bool = True, present: bool = False) -> MQTTConnection:
        conn = self.sessions.new_connection(("127.0.0.1", 50000))
        conn.start()
        self.feed(conn, codec.encode_connect(client_id, clean_session=clean, username="guest", password=b"guest"))
        packets = self.read(conn)
        assert packets[0] == (codec.CONNACK, 0, bytes((int(present), 0)))
        self.rest = packets[1:]
        return conn

    def feed(self, conn: MQTTConnection, data: bytes) -> None:
        """Input on an event loop, run until the replies waiting for the store's flush are out."""
        async def run() -> None:
            conn.receive_data(data)
            for _ in range(5):
                await asyncio.sleep(0)

        self.loop.run_until_complete(run())

    def read(self, conn: MQTTConnection) -> list[tuple[int, int, bytes]]:
        self.harness.run_soon()
        return codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))

    def close(self) -> None:
        self.harness.close()
        self.loop.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path)
    yield b
    b.close()


def _subscribe(packet_id: int, topic: str, qos: int) -> bytes:
    name = topic.encode()
    return bytes((0x82, 2 + 2 + len(name) + 1)) + packet_id.to_bytes(2, "big") + len(name).to_bytes(2, "big") \
        + name + bytes((qos,))


def _reply(kind: int, packet_id: int) -> tuple[int, int, bytes]:
    return (kind, 2 if kind == codec.PUBREL else 0, packet_id.to_bytes(2, "big"))


def _pkt(kind: int, packet_id: int) -> bytes:
    return bytes((kind << 4 | (2 if kind == codec.PUBREL else 0), 2)) + packet_id.to_bytes(2, "big")


def _publishes(packets: list[tuple[int, int, bytes]]) -> list[codec.Publish]:
    return [codec.parse_publish(flags, body) for kind, flags, body in packets if kind == codec.PUBLISH]


def test_inbound_pubrec_duplicate_stored_once_pubcomp(broker: Broker) -> None:
    sub = broker.connect("sub")
    broker.feed(sub, _subscribe(1, "a/b", 1))
    assert broker.read(sub) == [(codec.SUBACK, 0, b"\x00\x01\x01")]
    pub = broker.connect("pub")
    broker.feed(pub, codec.publish("a/b", b"once", 2, False, False, 7))
    assert broker.read(pub) == [_reply(codec.PUBREC, 7)]
    # The client did not see the PUBREC: it sends the PUBLISH again with DUP, then once more without it
    # (the id is what counts). Both are answered with PUBREC; neither is routed.
    broker.feed(pub, codec.publish("a/b", b"once", 2, False, True, 7) + codec.publish("a/b", b"once", 2, False,
                                                                                          False, 7))
    assert broker.read(pub) == [_reply(codec.PUBREC, 7), _reply(codec.PUBREC, 7)]
    delivered = _publishes(broker.read(sub))
    assert [(p.payload, p.qos) for p in delivered] == [(b"once", 1)]  # QoS 2 publish, QoS 1 subscription
    assert broker.held("sub") == 1
    broker.feed(pub, _pkt(codec.PUBREL, 7))
    assert broker.read(pub) == [_reply(codec.PUBCOMP, 7)]
    broker.feed(pub, _pkt(codec.PUBREL, 7) + _pkt(codec.PUBREL, 99))  # unknown ids: PUBCOMP all the same
    assert broker.read(pub) == [_reply(codec.PUBCOMP, 7), _reply(codec.PUBCOMP, 99)]
    # After PUBCOMP the id is free: the same id is a new message.
    broker.feed(pub, codec.publish("a/b", b"again", 2, False, False, 7))
    assert broker.read(pub) == [_reply(codec.PUBREC, 7)]
    assert [p.payload for p in _publishes(broker.read(sub))] == [b"again"]
    counts = broker.harness.broker.node_counters.by_protocol["mqtt311"]
    assert counts.publish == 2 and counts.confirm == 4 and counts.received_confirm == 2


def test_inbound_qos2_replies_keep_input_order_with_pubacks(broker: Broker) -> None:
    pub = broker.connect("pub")
    broker.feed(pub, codec.publish("x", b"1", 1, False, False, 1) + codec.publish("x", b"2", 2, False, False, 2)
                     + codec.publish("x", b"3", 1, False, False, 3) + _pkt(codec.PUBREL, 2))
    assert broker.read(pub) == [_reply(codec.PUBACK, 1), _reply(codec.PUBREC, 2), _reply(codec.PUBACK, 3),
                                _reply(codec.PUBCOMP, 2)]


def test_outbound_handshake_acks_the_queue_at_pubrec(broker: Broker) -> None:
    sub = broker.connect("sub")
    broker.feed(sub, _subscribe(1, "s/+", 2) + _subscribe(2, "low", 1))
    assert broker.read(sub) == [(codec.SUBACK, 0, b"\x00\x01\x02"), (codec.SUBACK, 0, b"\x00\x02\x01")]
    pub = broker.connect("pub")
    broker.feed(pub, codec.publish("s/2", b"two", 2, False, False, 1) + codec.publish("s/1", b"one", 1, False, False, 2)
                     + codec.publish("s/0", b"zero", 0, False, False, 0) + codec.publish("low", b"l", 2, False,
                                                                                          False, 3))
    broker.read(pub)
    got = _publishes(broker.read(sub))
    # The lower of the publish's QoS and the subscription's.
    assert [(p.topic, p.payload, p.qos) for p in got] == [("s/2", b"two", 2), ("s/1", b"one", 1), ("s/0", b"zero", 0),
                                                           ("low", b"l", 1)]
    two = got[0].packet_id
    assert broker.held("sub") == 3
    broker.feed(sub, codec.puback(two))  # a PUBACK does not settle a QoS 2 delivery
    assert broker.held("sub") == 3
    broker.feed(sub, _pkt(codec.PUBREC, two))
    assert broker.read(sub) == [_reply(codec.PUBREL, two)]
    assert broker.held("sub") == 2  # acked to the queue at PUBREC
    assert sub.subscriptions is not None and two in sub.subscriptions.qos2.pubrel_owed
    broker.feed(sub, _pkt(codec.PUBREC, two))  # a PUBREC again: PUBREL again
    assert broker.read(sub) == [_reply(codec.PUBREL, two)]
    broker.feed(sub, _pkt(codec.PUBCOMP, two) + codec.puback(got[1].packet_id) + codec.puback(got[3].packet_id))
    assert broker.read(sub) == [] and broker.held("sub") == 0
    assert sub.subscriptions.qos2.empty is False  # the filter granted QoS 2 is part of the state
    assert not sub.subscriptions.qos2.pubrel_owed and not sub.subscriptions.inflight


def test_amqp_publish_to_a_qos2_subscriber_arrives_once_at_qos2(broker: Broker) -> None:
    sub = broker.connect("sub")
    broker.feed(sub, _subscribe(1, "dev/#", 2))
    broker.read(sub)
    amqp = broker.harness.connect()
    amqp.handshake()
    amqp.open_channel(1)
    amqp.send(*amqp.publish(1, "dev.a", b"from amqp", exchange="amq.topic"))
    got = _publishes(broker.read(sub))
    assert [(p.topic, p.payload, p.qos) for p in got] == [("dev/a", b"from amqp", 2)]


def test_persistent_session_keeps_ids_across_reconnect_and_restart(broker: Broker) -> None:
    sub = broker.connect("keep", clean=False)
    broker.feed(sub, _subscribe(1, "k", 2))
    broker.read(sub)
    pub = broker.connect("pubkeep", clean=False)
    broker.feed(pub, codec.publish("k", b"m1", 2, False, False, 41) + codec.publish("k", b"m2", 2, False, False, 42))
    assert broker.read(pub) == [_reply(codec.PUBREC, 41), _reply(codec.PUBREC, 42)]
    first, second = _publishes(broker.read(sub))
    assert (first.qos, second.qos) == (2, 2)
    broker.feed(sub, _pkt(codec.PUBREC, first.packet_id))
    assert broker.read(sub) == [_reply(codec.PUBREL, first.packet_id)]
    # Gone without PUBCOMP for the first nor PUBREC for the second; back on the same broker.
    sub.lost()
    sub = broker.connect("keep", clean=False, present=True)
    resumed = broker.rest + broker.read(sub)
    assert resumed[0] == _reply(codec.PUBREL, first.packet_id)  # the PUBREL owed first
    again = _publishes(resumed)
    assert [(p.payload, p.qos, p.dup, p.packet_id) for p in again] == [(b"m2", 2, True, second.packet_id)]
    sub.lost()
    pub.lost()
    broker.restart()
    # After a restart: the publisher's ids still await PUBREL (a PUBLISH again is a duplicate); the
    # subscriber still owes PUBREL and the PUBLISH awaiting PUBREC keeps its id.
    pub = broker.connect("pubkeep", clean=False, present=True)
    broker.feed(pub, codec.publish("k", b"m1", 2, False, True, 41))
    assert broker.read(pub) == [_reply(codec.PUBREC, 41)]
    broker.feed(pub, _pkt(codec.PUBREL, 41) + _pkt(codec.PUBREL, 42))
    assert broker.read(pub) == [_reply(codec.PUBCOMP, 41), _reply(codec.PUBCOMP, 42)]
    sub = broker.connect("keep", clean=False, present=True)
    resumed = broker.rest + broker.read(sub)
    assert resumed[0] == _reply(codec.PUBREL, first.packet_id)
    again = _publishes(resumed)
    assert [(p.payload, p.qos, p.dup, p.packet_id) for p in again] == [(b"m2", 2, True, second.packet_id)]
    broker.feed(sub, _pkt(codec.PUBCOMP, first.packet_id) + _pkt(codec.PUBREC, second.packet_id))
    assert broker.read(sub) == [_reply(codec.PUBREL, second.packet_id)]
    broker.feed(sub, _pkt(codec.PUBCOMP, second.packet_id))
    assert broker.held("keep") == 0
    sub.lost()
    pub.lost()
    broker.restart()
    sub = broker.connect("keep", clean=False, present=True)
    assert broker.rest + broker.read(sub) == []  # nothing owed any more
    # A clean session drops the state: the filter granted QoS 2 too.
    sub.lost()
    sub = broker.connect("keep", clean=True)
    assert sub.subscriptions is not None and sub.subscriptions.qos2.empty
    sub.lost()
    broker.restart()
    sub = broker.connect("keep", clean=False)
    assert sub.subscriptions is not None and sub.subscriptions.qos2.empty


def test_pubrels_never_completed_stop_deliveries_not_the_broker(tmp_path: Path) -> None:
    """Every packet id held by a QoS 2 exchange awaiting PUBCOMP: deliveries wait (no id is reused, no
    error), and one PUBCOMP lets the next message go."""
    broker = Broker(tmp_path)
    broker.harness.broker.config.mqtt_inflight_window = 65535
    try:
        sub = broker.connect("greedy")
        broker.feed(sub, _subscribe(1, "g", 2))
        broker.read(sub)
        pub = broker.connect("pub")
        total = 65535 + 3
        broker.feed(pub, b"".join(codec.publish("g", b"%d" % i, 2, False, False, i % 65535 + 1)
                                  + _pkt(codec.PUBREL, i % 65535 + 1) for i in range(total)))
        got = _publishes(broker.read(sub))
        assert len(got) == 65535 and len({p.packet_id for p in got}) == 65535
        broker.feed(sub, b"".join(_pkt(codec.PUBREC, p.packet_id) for p in got))
        assert len(broker.read(sub)) == 65535  # PUBRELs; no PUBCOMP comes
        assert broker.held("greedy") == 3 and not _publishes(broker.read(sub))
        broker.feed(sub, _pkt(codec.PUBCOMP, got[5].packet_id))
        (freed,) = _publishes(broker.read(sub))
        assert (freed.payload, freed.qos, freed.packet_id) == (b"65535", 2, got[5].packet_id)
    finally:
        broker.close()


def test_runs_of_one_read_store_once_and_their_batched_records_survive_a_restart(broker: Broker) -> None:
    sub = broker.connect("runsub", clean=False)
    broker.feed(sub, _subscribe(1, "r", 2))
    broker.read(sub)
    pub = broker.connect("runpub", clean=False)
    # One read: a run of three QoS 2 PUBLISHes, the third repeating the first's id (a duplicate).
    broker.feed(pub, codec.publish("r", b"a", 2, False, False, 5) + codec.publish("r", b"b", 2, False, False, 6)
                     + codec.publish("r", b"a", 2, False, True, 5))
    assert broker.read(pub) == [_reply(codec.PUBREC, 5), _reply(codec.PUBREC, 6), _reply(codec.PUBREC, 5)]
    got = _publishes(broker.read(sub))
    assert [(p.payload, p.qos) for p in got] == [(b"a", 2), (b"b", 2)]
    ids = [p.packet_id for p in got]
    assert len(set(ids)) == 2 and broker.held("runsub") == 2
    broker.feed(sub, b"".join(_pkt(codec.PUBREC, i) for i in ids))  # PUBRECs of one read: one run
    assert broker.read(sub) == [_reply(codec.PUBREL, i) for i in ids]
    assert broker.held("runsub") == 0
    broker.feed(sub, _pkt(codec.PUBCOMP, ids[0]))
    sub.lost()
    pub.lost()
    broker.restart()
    # The publisher's ids still await PUBREL (a PUBLISH again is a duplicate); the subscriber owes one PUBREL.
    pub = broker.connect("runpub", clean=False, present=True)
    broker.feed(pub, codec.publish("r", b"b", 2, False, True, 6) + codec.publish("r", b"a", 2, False, True, 5))
    assert broker.read(pub) == [_reply(codec.PUBREC, 6), _reply(codec.PUBREC, 5)]
    broker.feed(pub, _pkt(codec.PUBREL, 5) + _pkt(codec.PUBREL, 6))
    assert broker.read(pub) == [_reply(codec.PUBCOMP, 5), _reply(codec.PUBCOMP, 6)]
    sub = broker.connect("runsub", clean=False, present=True)
    resumed = broker.rest + broker.read(sub)
    assert resumed == [_reply(codec.PUBREL, ids[1])] and broker.held("runsub") == 0
