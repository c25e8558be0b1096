"""Shared subscriptions at QoS 2 on the sans-IO MQTT 5 connection: granted QoS 2, delivered with the
PUBREC/PUBREL/PUBCOMP handshake; a message belongs to the member that answered PUBREC (its PUBREL owed
to that member's session, resent when it resumes), one whose member went before PUBREC goes to another
member: across the group each message is taken once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from lavinpy.broker.ops.publish import publish
from lavinpy.mqtt import codec, codec5
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.sessions import MQTTSessions
from lavinpy.wire.properties import encode_property_values
from tests.amqp.session_client import Harness

from .test_mqtt5_sansio import amqp_counters, connect, delivered, packets, publish5

GROUP_FILTER = "$share/g/jobs/#"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, fsync="never")
    yield h
    h.close()


def test_shared_qos2_granted_and_handshake(harness: Harness) -> None:
    sessions = MQTTSessions(harness.broker)
    member, _ = connect(sessions, "m")
    member.receive_data(codec5.encode_subscribe(1, [(GROUP_FILTER, 2)]))
    assert packets(member) == [(codec.SUBACK, 0, b"\x00\x01\x00\x02")]
    pub, _ = connect(sessions, "p")
    pub.receive_data(publish5("jobs/a", b"two", 2, 1) + publish5("jobs/a", b"one", 1, 2))
    harness.run_soon()
    got = delivered(member)
    assert [(p.payload, p.qos) for p, _ in got] == [(b"two", 2), (b"one", 1)]
    two = got[0][0].packet_id
    member.receive_data(codec5.ack(codec.PUBACK, two))  # a PUBACK does not settle a QoS 2 delivery
    harness.run_soon()
    queue = harness.broker.vhosts["/"].queues["mqtt-shared-g/jobs.#"]
    assert queue.unacked_count == 2
    member.receive_data(codec5.ack(codec.PUBREC, two) + codec5.ack(codec.PUBACK, got[1][0].packet_id))
    harness.run_soon()
    assert packets(member) == [(codec.PUBREL, 2, two.to_bytes(2, "big"))]
    assert queue.unacked_count == 0 and queue.message_count == 0  # left the group's queue at PUBREC
    member.receive_data(codec5.ack(codec.PUBCOMP, two))
    harness.run_soon()
    assert packets(member) == [] and not member.subscriptions.qos2.pubrel_owed


def test_shared_qos2_member_gone_before_and_after_pubrec(harness: Harness) -> None:
    """Member 0 answers PUBREC for some of its deliveries and goes: those stay its own (PUBREL resent
    when it resumes, to no other member); the rest go to the others. Each message is taken once."""
    sessions = MQTTSessions(harness.broker)
    props = {"session_expiry_interval": 60}  # persistent: the group's queue is durable, replies wait for the store
    loop = asyncio.new_event_loop()

    def feed(conn: MQTTConnection, data: bytes) -> None:
        async def run() -> None:
            conn.receive_data(data)
            for _ in range(5):
                await asyncio.sleep(0)
        loop.run_until_complete(run())
        harness.run_soon()

    def connect(client_id: str) -> MQTTConnection:
        conn = sessions.new_connection(("127.0.0.1", 50000))
        conn.start()
        feed(conn, codec5.encode_connect(client_id, username="guest", password=b"guest", properties=props))
        assert packets(conn)[0][2][:2] == b"\x00\x00"
        return conn

    members = [connect(f"m{i}") for i in range(3)]
    for conn in members:
        feed(conn, codec5.encode_subscribe(1, [(GROUP_FILTER, 2)]))
        assert packets(conn)[0][2] == b"\x00\x01\x00\x02"
    pub = connect("producer")
    count = 60
    feed(pub, b"".join(publish5("jobs/x", str(i).encode(), 2, i + 1) for i in range(count)))
    first = delivered(members[0])
    assert len(first) >= 2 and all(p.qos == 2 for p, _ in first)
    recd = first[: len(first) // 2]  # PUBREC answered: member 0 has taken these
    feed(members[0], b"".join(codec5.ack(codec.PUBREC, p.packet_id) for p, _ in recd))
    # Their PUBRELs; the window's room went to more deliveries, never answered.
    assert [k for k, _, _ in packets(members[0]) if k != codec.PUBLISH] == [codec.PUBREL] * len(recd)
    members[0].lost()  # gone before PUBCOMP for those, before PUBREC for the rest
    taken: dict[bytes, list[str]] = {}
    for p, _ in recd:
        taken.setdefault(p.payload, []).append("m0")
    for _ in range(60):  # members 1 and 2 answer every packet (PUBREC, then PUBCOMP) until all is done
        for i in (1, 2):
            replies = []
            for kind, flags, body in packets(members[i]):
                if kind == codec.PUBLISH:
                    p, _ = codec5.parse_publish(flags, body)
                    assert p.qos == 2
                    taken.setdefault(p.payload, []).append(f"m{i}")
                    replies.append(codec5.ack(codec.PUBREC, p.packet_id))
                elif kind == codec.PUBREL:
                    replies.append(codec5.ack(codec.PUBCOMP, int.from_bytes(body[:2], "big")))
            feed(members[i], b"".join(replies))
    assert set(taken) == {str(i).encode() for i in range(count)}
    assert all(len(v) == 1 for v in taken.values()), {k: v for k, v in taken.items() if len(v) > 1}
    # Member 0 resumes: its PUBRELs owed come again, and nothing else of the group's.
    again = sessions.new_connection(("127.0.0.1", 50000))
    again.start()
    feed(again, codec5.encode_connect("m0", username="guest", password=b"guest", clean_start=False,
                                      properties=props))
    out = packets(again)
    assert out[0][0] == codec.CONNACK and out[0][2][:2] == b"\x01\x00"  # session present
    assert sorted(int.from_bytes(b[:2], "big") for k, _, b in out if k == codec.PUBREL) == sorted(
        p.packet_id for p, _ in recd)
    assert [k for k, _, _ in out if k == codec.PUBLISH] == []
    feed(again, b"".join(codec5.ack(codec.PUBCOMP, p.packet_id) for p, _ in recd))
    assert not again.subscriptions.qos2.pubrel_owed
    loop.close()


def test_shared_amqp_publish_goes_out_at_qos2(harness: Harness) -> None:
    """A message from AMQP (no MQTT QoS of its own) goes out at the granted QoS 2, as to a member's own queue."""
    sessions = MQTTSessions(harness.broker)
    member, _ = connect(sessions, "am")
    member.receive_data(codec5.encode_subscribe(1, [(GROUP_FILTER, 2)]))
    packets(member)
    vhost = harness.broker.vhosts["/"]
    publish(vhost, vhost.exchanges["amq.topic"], "jobs.amqp", False, encode_property_values(), b"from-amqp",
            amqp_counters(harness), 1)
    harness.run_soon()
    [(p, _)] = delivered(member)
    assert p.qos == 2 and p.payload == b"from-amqp"
