"""The MQTT connection's PUBACKs and QoS 2 replies after the disk (broker.ops.replies), without sockets: a
failed flush or replication closes the connection, with no PUBACK or PUBREC for the messages it could
not make durable and no PUBCOMP for a PUBREL it could not record, so the client sends them again
(answered only after a flush that succeeds); never a hang."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.effects import Effect
from lavinpy.mqtt.sessions import MQTTSessions
from tests.amqp.session_client import Harness
from tests.broker.durability_faults import FAILURES

WAIT = 5.0  # seconds an answer may take before the test calls it a hang


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)  # fsync "always": a QoS 1 message to a durable queue waits for the group commit
    yield h
    h.close()


def _subscribe(packet_id: int, topic: str, qos: int) -> bytes:
    name = topic.encode()
    return bytes((0x82, 2 + 2 + len(name) + 1)) + packet_id.to_bytes(2, "big") + len(name).to_bytes(2, "big") \
        + name + bytes((qos,))


async def _connected(sessions: MQTTSessions, present: bool = False) -> MQTTConnection:
    conn = sessions.new_connection(("127.0.0.1", 50001))
    conn.start()
    conn.receive_data(codec.encode_connect("dev", username="guest", password=b"guest", keepalive=60,
                                           clean_session=False))
    conn.receive_data(_subscribe(1, "a/b", 1))  # a durable queue: QoS 1, no clean session
    await asyncio.sleep(0.05)
    packets = codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))
    assert [kind for kind, _, _ in packets if kind != codec.PUBLISH] == [codec.CONNACK, codec.SUBACK]
    assert packets[0][2][0] == present
    conn.take_effects()
    return conn


async def _pubacks(conn: MQTTConnection, count: int) -> list[bytes]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    packets: list[tuple[int, int, bytes]] = []
    while len([p for p in packets if p[0] == codec.PUBACK]) < count:
        assert loop.time() < deadline, "no PUBACK (a hang)"
        await asyncio.sleep(0.005)
        packets += codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))
    return [body for kind, _, body in packets if kind == codec.PUBACK]


def test_pubacks_wait_for_the_disk_in_input_order(harness: Harness) -> None:
    async def scenario() -> None:
        conn = await _connected(MQTTSessions(harness.broker))
        conn.receive_data(codec.publish("a/b", b"1", 1, False, False, 7))
        conn.receive_data(codec.publish("a/c", b"2", 1, False, False, 8))  # unrouted: no wait of its own
        assert await _pubacks(conn, 2) == [b"\x00\x07", b"\x00\x08"]
        conn.lost()
    asyncio.run(scenario())


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_wait_closes_the_connection_without_its_puback(harness: Harness, failure: str) -> None:
    async def scenario() -> None:
        conn = await _connected(MQTTSessions(harness.broker))
        heal = FAILURES[failure](harness.broker)
        conn.receive_data(codec.publish("a/b", b"hi", 1, False, False, 7))
        conn.receive_data(codec.publish("a/c", b"after", 1, False, False, 8))  # behind it: never acked
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while Effect.CLOSE not in conn.take_effects():
            assert loop.time() < deadline, "no answer (a hang)"
            await asyncio.sleep(0.005)
        heal()
        await asyncio.sleep(0.05)
        packets = codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))
        assert codec.PUBACK not in [kind for kind, _, _ in packets]
        conn.lost()
    asyncio.run(scenario())


async def _packets_until_close(conn: MQTTConnection) -> list[tuple[int, int, bytes]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    packets: list[tuple[int, int, bytes]] = []
    while Effect.CLOSE not in conn.take_effects():
        assert loop.time() < deadline, "no answer (a hang)"
        await asyncio.sleep(0.005)
        packets += codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))
    return packets + codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_wait_withholds_pubrec_and_a_duplicate_waits_for_the_next_flush(harness: Harness,
                                                                                 failure: str) -> None:
    """QoS 2: no PUBREC for a message the store could not make durable; the client's PUBLISH again
    (its id remembered: not routed twice) gets its PUBREC only after a flush that succeeds."""
    async def scenario() -> None:
        sessions = MQTTSessions(harness.broker)
        conn = await _connected(sessions)
        heal = FAILURES[failure](harness.broker)
        conn.receive_data(codec.publish("a/b", b"once", 2, False, False, 9))
        assert codec.PUBREC not in [kind for kind, _, _ in await _packets_until_close(conn)]
        conn.lost()
        conn = await _connected(sessions, present=True)
        conn.receive_data(codec.publish("a/b", b"once", 2, False, True, 9))  # while the disk still fails
        assert codec.PUBREC not in [kind for kind, _, _ in await _packets_until_close(conn)]
        conn.lost()
        heal()
        conn = await _connected(sessions, present=True)
        conn.receive_data(codec.publish("a/b", b"once", 2, False, True, 9))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        packets: list[tuple[int, int, bytes]] = []
        while not packets:
            assert loop.time() < deadline, "no PUBREC (a hang)"
            await asyncio.sleep(0.005)
            packets = codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))
        assert [kind for kind, _, body in packets if kind != codec.PUBLISH] == [codec.PUBREC]
        queue = harness.broker.vhosts["/"].queues["mqtt-subscription-devqos1"]
        assert queue.message_count + queue.unacked_count == 1  # stored once
        conn.lost()
    asyncio.run(scenario())


@pytest.mark.parametrize("failure", FAILURES)
def test_a_pubrel_again_gets_its_pubcomp_only_after_a_flush(harness: Harness, failure: str) -> None:
    """The PUBCOMP withheld (its record's flush failed): the PUBREL again, the id already forgotten in
    memory, is answered only once a flush succeeds, so the id is never remembered again after a crash
    once the client has its PUBCOMP."""
    async def scenario() -> None:
        sessions = MQTTSessions(harness.broker)
        conn = await _connected(sessions)
        conn.receive_data(codec.publish("a/b", b"once", 2, False, False, 9))
        await asyncio.sleep(0.05)
        heal = FAILURES[failure](harness.broker)
        conn.receive_data(bytes((0x62, 0x02, 0x00, 0x09)))  # PUBREL
        assert codec.PUBCOMP not in [kind for kind, _, _ in await _packets_until_close(conn)]
        conn.lost()
        conn = await _connected(sessions, present=True)
        conn.receive_data(bytes((0x62, 0x02, 0x00, 0x09)))  # while the disk still fails
        assert codec.PUBCOMP not in [kind for kind, _, _ in await _packets_until_close(conn)]
        conn.lost()
        heal()
        conn = await _connected(sessions, present=True)
        conn.receive_data(bytes((0x62, 0x02, 0x00, 0x09)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        packets: list[tuple[int, int, bytes]] = []
        while not packets:
            assert loop.time() < deadline, "no PUBCOMP (a hang)"
            await asyncio.sleep(0.005)
            packets = codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))
        assert [(kind, body) for kind, _, body in packets if kind != codec.PUBLISH] == [(codec.PUBCOMP, b"\x00\x09")]
        conn.lost()
    asyncio.run(scenario())


@pytest.mark.parametrize("failure", FAILURES)
def test_a_qos2_delivery_waits_for_its_packet_id_on_disk(harness: Harness, failure: str) -> None:
    """A persistent session's QoS 2 PUBLISH goes out once the record of its packet id is durable (a
    crash before would send it again with another id: a second message to the client). A failed wait
    closes the connection without it; the session resumed, it comes with that id."""
    async def scenario() -> None:
        sessions = MQTTSessions(harness.broker)
        sub = sessions.new_connection(("127.0.0.1", 50002))
        sub.start()
        sub.receive_data(codec.encode_connect("sub2", username="guest", password=b"guest", clean_session=False)
                         + _subscribe(1, "x/y", 2))
        await asyncio.sleep(0.05)
        assert [kind for kind, _, _ in codec.PacketReader(1 << 20).feed(b"".join(sub.data_to_send()))] == [
            codec.CONNACK, codec.SUBACK]
        pub = await _connected(sessions)
        await asyncio.sleep(0.05)
        heal = FAILURES[failure](harness.broker)
        pub.receive_data(codec.publish("x/y", b"m", 2, False, False, 5))  # PUBREC withheld: it closes
        harness.run_soon()  # the delivery
        assert codec.PUBLISH not in [kind for kind, _, _ in await _packets_until_close(sub)]
        state = sub.subscriptions.qos2 if sub.subscriptions is not None else None
        assert state is not None and len(state.sent_ids) == 1
        (packet_id,) = state.sent_ids
        sub.lost()
        pub.lost()
        heal()
        sub = sessions.new_connection(("127.0.0.1", 50003))
        sub.start()
        sub.receive_data(codec.encode_connect("sub2", username="guest", password=b"guest", clean_session=False))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        packets: list[tuple[int, int, bytes]] = []
        while codec.PUBLISH not in [kind for kind, _, _ in packets]:
            assert loop.time() < deadline, "no PUBLISH (a hang)"
            await asyncio.sleep(0.005)
            harness.run_soon()
            packets += codec.PacketReader(1 << 20).feed(b"".join(sub.data_to_send()))
        (got,) = [codec.parse_publish(flags, body) for kind, flags, body in packets if kind == codec.PUBLISH]
        assert (got.payload, got.qos, got.packet_id) == (b"m", 2, packet_id)
        sub.lost()
    asyncio.run(scenario())
