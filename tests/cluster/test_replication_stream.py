"""Streaming: a follower attached to a real broker gets every durable change while clients publish,
consume, compact and delete; confirms wait for the in-sync follower; a silent follower is dropped."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aio_pika
import pika
import pytest

from lavinpy import config as config_module
from lavinpy.broker.broker import Broker
from lavinpy.store.datadir import sha1_name

from .replication_harness import Leader, pause, replicated_hashes, start_follower, stop_process

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def leader(tmp_path: Path):
    # Small segments, ack files and definitions threshold: segment creation and deletion, index
    # compaction and definitions compaction all happen while the follower streams.
    node = Leader(tmp_path / "leader", segment_size=64 * 1024, ack_file_max_bytes=4096,
                  definitions_compact_deletes=4).start()
    yield node
    node.stop()


def queue_counts(data_dir: Path) -> dict[str, int]:
    """Open a broker on a copy of the data dir (as a promoted follower would) and count messages."""
    broker = Broker(config_module.load(None, env={}, overrides={"data_dir": str(data_dir)}))
    broker.open()
    try:
        return {name: q.message_count for name, q in broker.vhosts["/"].queues.items()}
    finally:
        broker.close()


async def publish_and_consume(url: str) -> dict[str, int]:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for i in range(6):
            await channel.declare_queue(f"q{i}", durable=True)
        # the first segments hold only q5's messages: deleting q5 deletes them
        await asyncio.gather(*(
            channel.default_exchange.publish(aio_pika.Message(b"early" * 50, delivery_mode=2), routing_key="q5")
            for _ in range(1000)))
        for batch in range(10):
            await asyncio.gather(*(
                channel.default_exchange.publish(
                    aio_pika.Message(f"m{batch}-{n}".encode() * 20, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=f"q{n % 6}")
                for n in range(300)))
        expected = {f"q{i}": 500 for i in range(6)}
        # consume and ack 400 of q0: ack file compactions (4096 bytes = 512 acks... and the close)
        consumer_channel = await connection.channel()
        queue = await consumer_channel.get_queue("q0")
        for _ in range(400):
            message = await queue.get(timeout=5)
            await message.ack()
        expected["q0"] -= 400
        # delete queues: their directories go, and the definitions log compacts (threshold 4)
        for name in ("q4", "q5", "x1", "x2", "x3"):
            if name.startswith("x"):
                await channel.declare_queue(name, durable=True)
            await channel.queue_delete(name)
            expected.pop(name, None)
        # a retry queue: nack with requeue writes its delivery-count file
        retry = await consumer_channel.declare_queue("retry", durable=True, arguments={"x-delivery-limit": 5})
        await asyncio.gather(*(channel.default_exchange.publish(aio_pika.Message(b"r", delivery_mode=2),
                                                                routing_key="retry") for _ in range(20)))
        for _ in range(10):
            message = await retry.get(timeout=5)
            await message.nack(requeue=True)
        # the head came back 6 times: past the limit of 5 it was dropped; the next one has a count of 4
        expected["retry"] = 19
        # delayed retries: a rejected message waits (its due time in the retry_due file, an hour away)
        held = await consumer_channel.declare_queue("held", durable=True, arguments={
            "x-queue-type": "quorum", "x-delayed-retry-type": "failed", "x-delayed-retry-min": 3_600_000})
        await channel.default_exchange.publish(aio_pika.Message(b"h", delivery_mode=2), routing_key="held")
        message = await held.get(timeout=5)
        await message.reject(requeue=True)
        expected["held"] = 0  # waiting, not ready: on the follower too
        # deduplication: the cache file, so a promoted follower still drops the duplicate
        dedup = await channel.declare_queue("dedup", durable=True, arguments={"x-message-deduplication": True})
        for ident in ("d1", "d2", "d1"):
            await channel.default_exchange.publish(
                aio_pika.Message(b"d", delivery_mode=2, headers={"x-deduplication-header": ident}),
                routing_key=dedup.name)
        expected["dedup"] = 2
        # a stream: its offset log
        await channel.declare_queue("events", durable=True, arguments={"x-queue-type": "stream"})
        await asyncio.gather(*(channel.default_exchange.publish(aio_pika.Message(b"e", delivery_mode=2),
                                                                routing_key="events") for _ in range(100)))
        expected["events"] = 100
        await consumer_channel.close()
        # one more confirmed batch after all that
        await asyncio.gather(*(
            channel.default_exchange.publish(aio_pika.Message(b"late", delivery_mode=2), routing_key="q1")
            for _ in range(50)))
        expected["q1"] += 50
        return expected


def test_stream_under_load_leaves_the_follower_byte_equal(leader: Leader, tmp_path: Path) -> None:
    follower_dir = tmp_path / "follower"
    follower = start_follower(follower_dir, leader.replication.port)
    try:
        leader.wait_caught_up("follower")
        assert leader.isr.members == ["leader", "follower"]
        expected = asyncio.run(publish_and_consume(leader.url))

        async def admin() -> None:  # users.json, vhosts.json and policies.json
            assert leader.server is not None
            broker = leader.server.broker
            broker.users.add_user("alice", "secret-password", ["management"])
            broker.vhosts["/"].set_policy("short", "^q1$", {"max-length": 10000})
            broker.users.add_vhost("other")
            broker.open_vhost("other")
        leader.call(admin)
        leader.flush_all()
        leader.wait_caught_up("follower")
        segments = sorted(p.name for p in (follower_dir / sha1_name("/")).glob("msgs.*"))
        assert segments and "msgs.0000000001" not in segments, "no segment was deleted and replicated"
    finally:
        output = stop_process(follower)
    assert "Traceback" not in output, output
    hashes = replicated_hashes(follower_dir)
    assert hashes == replicated_hashes(leader.data_dir)
    names = {rel.rpartition("/")[2] for rel in hashes}
    assert {"users.json", "vhosts.json", "policies.json", "delivery_counts", "definitions.amqp", "retry_due"} <= names
    assert any(name.startswith("dedup.q.") for name in names), names
    assert queue_counts(follower_dir) == expected
    broker = Broker(config_module.load(None, env={}, overrides={"data_dir": str(follower_dir)}))
    broker.open()
    try:  # as a promoted follower: the schedule and the cache are there
        vhost = broker.vhosts["/"]
        assert vhost.queues["held"].delayed_count == 1
        cache = vhost.queues["dedup"].dedup
        assert cache is not None and len(cache) == 2
    finally:
        broker.close()


@pytest.mark.parametrize("fsync", ["always", "never"])  # never: no local fsync, the follower's ack still counts
def test_confirms_wait_for_the_follower_and_a_silent_follower_is_dropped(fsync: str, tmp_path: Path) -> None:
    leader = Leader(tmp_path / "leader", fsync=fsync).start()
    follower = start_follower(tmp_path / "follower", leader.replication.port)
    try:
        leader.wait_caught_up("follower")
        connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("held", durable=True)
        started = time.monotonic()
        channel.basic_publish("", "held", b"before", pika.BasicProperties(delivery_mode=2))
        assert time.monotonic() - started < 2, "a confirm with a live follower took too long"

        pause(follower.pid)  # the follower stops reading and acknowledging
        started = time.monotonic()
        channel.basic_publish("", "held", b"held back", pika.BasicProperties(delivery_mode=2))
        confirmed = time.monotonic()
        # no confirm before the follower was dropped (3 s without an ack), and then at once
        assert confirmed - started > 2.5, f"confirmed after {confirmed - started:.2f} s, before the drop"
        assert confirmed - started < 6, f"confirms did not resume after the drop ({confirmed - started:.2f} s)"
        drop_time, members = leader.isr.writes[-1]
        assert members == ["leader"]
        assert drop_time <= confirmed, "the confirm went out before the ISR without the follower was written"
        assert all(not f["in_sync"] for f in leader.status())

        # resumed, it reconnects, full-syncs and is back in the ISR
        os.kill(follower.pid, signal.SIGCONT)
        leader.wait(lambda: leader.isr.members == ["leader", "follower"], 30, "the follower back in the ISR")
        started = time.monotonic()
        channel.basic_publish("", "held", b"after", pika.BasicProperties(delivery_mode=2))
        assert time.monotonic() - started < 2
        connection.close()
    finally:
        stop_process(follower)
        leader.stop()


def test_declare_and_bind_ok_wait_for_the_follower(leader: Leader, tmp_path: Path) -> None:
    follower_dir = tmp_path / "follower"
    follower = start_follower(follower_dir, leader.replication.port)
    try:
        leader.wait_caught_up("follower")
        connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        channel = connection.channel()
        started = time.monotonic()
        channel.queue_declare("before", durable=True)
        assert time.monotonic() - started < 2
        leader.wait_caught_up("follower")
        # the declare reached the follower's definitions log before the declare-ok
        assert b"before" in next(follower_dir.rglob("definitions.amqp")).read_bytes()

        os.kill(follower.pid, signal.SIGSTOP)
        started = time.monotonic()
        channel.queue_declare("while-stopped", durable=True)
        declared = time.monotonic()
        assert declared - started > 2.5, f"declare-ok after {declared - started:.2f} s, before the drop"
        assert leader.isr.writes[-1][1] == ["leader"] and leader.isr.writes[-1][0] <= declared
        started = time.monotonic()
        channel.queue_bind("while-stopped", "amq.direct", "k")  # no ISR follower left: at once
        assert time.monotonic() - started < 1
        connection.close()
    finally:
        stop_process(follower)


def test_a_follower_too_far_behind_is_dropped_and_catches_up_by_full_sync(leader: Leader, tmp_path: Path,
                                                                          caplog) -> None:
    follower_dir = tmp_path / "follower"
    follower = start_follower(follower_dir, leader.replication.port)
    try:
        leader.wait_caught_up("follower")
        assert leader.replication is not None
        leader.replication.max_backlog = 1024 * 1024  # the 256 MiB rule, scaled down
        leader.replication.ack_timeout = 60  # only the backlog may drop it here
        started = time.monotonic()
        published = publish_while_stopped(leader, follower.pid)
        assert time.monotonic() - started < 10
        assert any("dropped: more than 1048576 bytes behind" in r.getMessage() for r in caplog.records)
        os.kill(follower.pid, signal.SIGCONT)
        leader.flush_all()
        leader.wait_caught_up("follower")
        assert leader.isr.members == ["leader", "follower"]
    finally:
        stop_process(follower)
    assert replicated_hashes(follower_dir) == replicated_hashes(leader.data_dir)
    assert queue_counts(follower_dir)["bulk"] == published



def publish_while_stopped(leader: Leader, follower_pid: int) -> int:
    """20 kB messages published while the follower is stopped, with a group commit every 20 messages
    (as many confirming channels would cause), until the leader has dropped the follower: it queues the
    bytes for the follower until they pass the backlog limit, then drops it, well before the ack
    timeout. At least 400 (8 MB); more where the kernel's socket buffers to the stopped follower take
    more of them first. The number published."""
    connection = pika.BlockingConnection(pika.URLParameters(leader.url))
    channel = connection.channel()
    channel.queue_declare("bulk", durable=True)  # before: its declare-ok waits for the follower
    os.kill(follower_pid, signal.SIGSTOP)
    assert leader.server is not None
    store = leader.server.broker.vhosts["/"].store
    flushes = []
    published = 0
    while published < 400 or (leader.isr.members != ["leader"] and published < 4000):
        for _ in range(20):
            channel.basic_publish("", "bulk", b"x" * 20_000, pika.BasicProperties(delivery_mode=2))
        published += 20
        connection.process_data_events(0)
        time.sleep(0.01)  # let the leader read them
        flushes.append(asyncio.run_coroutine_threadsafe(store.flush(), leader.loop))
    for flush in flushes:
        flush.result(10)  # all resolve once the follower is out of the ISR
    assert leader.isr.members == ["leader"]
    connection.close()
    return published


def test_tx_commit_ok_waits_for_the_follower(leader: Leader, tmp_path: Path) -> None:
    follower = start_follower(tmp_path / "follower", leader.replication.port)
    try:
        leader.wait_caught_up("follower")
        connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        channel = connection.channel()
        channel.queue_declare("tx", durable=True)
        channel.tx_select()
        channel.basic_publish("", "tx", b"first", pika.BasicProperties(delivery_mode=2))
        started = time.monotonic()
        channel.tx_commit()
        # answered by the follower's ack, not by its drop
        assert time.monotonic() - started < leader.replication.ack_timeout
        assert leader.isr.members == ["leader", "follower"]
        leader.wait_quiet("follower")
        pause(follower.pid)
        channel.basic_publish("", "tx", b"second", pika.BasicProperties(delivery_mode=2))
        started = time.monotonic()
        channel.tx_commit()
        committed = time.monotonic()
        dropped_at, members = leader.isr.writes[-1]
        assert members == ["leader"] and started < dropped_at <= committed, (started, leader.isr.writes, committed)
        assert committed - started > 2.5, f"commit-ok after {committed - started:.2f} s, before the drop"
        connection.close()
    finally:
        stop_process(follower)


def test_http_api_changes_wait_for_the_follower(tmp_path: Path) -> None:
    # The management API's declares reply as AMQP's declare-ok does: once the follower has the change.
    import urllib.request

    from tests.helpers import free_port

    http_port = free_port()
    node = Leader(tmp_path / "leader", http_port=http_port).start()
    follower_dir = tmp_path / "follower"
    follower = start_follower(follower_dir, node.replication.port)

    def put_queue(name: str) -> tuple[float, float]:
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/api/queues/%2F/{name}", method="PUT",
                                         data=b'{"durable": true}', headers={"content-type": "application/json"})
        password = urllib.request.HTTPPasswordMgrWithDefaultRealm()
        password.add_password(None, f"http://127.0.0.1:{http_port}/", "guest", "guest")
        opener = urllib.request.build_opener(urllib.request.HTTPBasicAuthHandler(password))
        started = time.monotonic()
        with opener.open(request, timeout=30) as reply:
            assert reply.status in (201, 204)
        return started, time.monotonic()

    try:
        node.wait_caught_up("follower")
        started, answered = put_queue("http-before")
        assert answered - started < node.replication.ack_timeout and node.isr.members == ["leader", "follower"]
        assert b"http-before" in next(follower_dir.rglob("definitions.amqp")).read_bytes()
        node.wait_quiet("follower")
        pause(follower.pid)
        started, answered = put_queue("http-while-stopped")
        dropped_at, members = node.isr.writes[-1]
        assert members == ["leader"] and started < dropped_at <= answered, (started, node.isr.writes, answered)
        assert answered - started > 2.5, f"PUT answered after {answered - started:.2f} s, before the drop"
    finally:
        stop_process(follower)
        node.stop()
