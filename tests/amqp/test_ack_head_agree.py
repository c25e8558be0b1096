"""A read of basic.acks settled by the compiled calls (the whole read, ``_cwire.ack_read``; the acks
alone, ``_cwire.ack_head``) and by their pure twins (``AMQPConnection.receive_data`` and the Python path
of ``Deliveries.ack_run``) leaves the same state: every connection's output, every channel's books, the
consumers' windows, the queue index's unacked positions (set and runs), its ack record and transient set,
the segments' reference counts, the counters and the queue's counts, the connections' read counters and
input turns. Reads of one ack and of several, a read split inside a frame, acks with a heartbeat or with
multiple=true, in delivery order and out of it, an unknown tag, a channel-wide prefetch, a durable queue
with persistent and transient messages, a queue with a feature, a transaction. The freed windows' refill
from the queue's backlog (``_cwire.refill``, the first round of ``DeliveryScheduler.run_deliveries``) is
compared too, with the reads compiled and alone: the deliveries' bytes, books and counters, and the round
robin's state (each consumer's turn, the turn queue's order, the parked ones). On the pure path all runs
take the Python path (the scenario still checks its outcome)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from session_client import Client, Harness

from lavinpy.amqp import connection as amqp_connection
from lavinpy.amqp.connection_states import OPEN
from lavinpy.broker import scheduler
from lavinpy.broker.queues import stored_runs
from lavinpy.store.message_store import MessageStore
from lavinpy.store.record import CorruptRecord
from lavinpy.wire import accel

pytestmark = pytest.mark.both_paths

CONSUMERS = 3
PREFETCH = 4


HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def _ack(tag: int, channel: int = 1, multiple: bool = False) -> bytes:
    payload = struct.pack(">HHQB", 60, 80, tag, int(multiple))
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


class Setup:
    def __init__(self, path: Path, arguments: dict[str, Any], durable: bool, channel_wide: bool) -> None:
        self.harness = harness = Harness(path)
        self.publisher = harness.open_client(
            declare=commands.Queue.Declare(queue="work", durable=durable, arguments=arguments))
        self.clients: list[Client] = []
        for i in range(CONSUMERS):
            client = harness.open_client(("127.0.0.1", 40000 + i))
            client.send((1, commands.Basic.Qos(prefetch_count=PREFETCH, global_=channel_wide and i == 0)),
                        (1, commands.Basic.Consume(queue="work", consumer_tag=f"c{i}")))
            client.read()
            self.clients.append(client)
        self.queue = harness.broker.vhosts["/"].queues["work"]

    def publish(self, count: int) -> None:
        frames: list[Any] = []
        for i in range(count):
            mode = 2 if i % 3 else 1  # persistent and transient ones (the durable queue's transient set)
            frames += self.publisher.publish(1, "work", b"m%d" % i, properties=commands.Basic.Properties(
                delivery_mode=mode))
        self.publisher.send(*frames)
        self.harness.run_soon()

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, client in enumerate(self.clients):
            conn = client.conn
            out[f"out{i}"] = b"".join(bytes(piece) for piece in conn.data_to_send())
            out[f"reads{i}"] = (conn.recv_oct, conn.recv_cnt, conn._input_turn, conn.reader.buffered, conn.reader._need,
                                conn.state)
            for channel_id, channel in conn.channels.items():
                book = channel.deliveries.unacked
                runs = [(run.first, run.consumer.tag if run.consumer else None, list(run.positions), run.done,
                         run.settled, run.live) for run in book._runs]
                windows = [(c.tag, c.unacked, c.parked is not None) for c in channel.consumers.values()]
                out[f"book{i}.{channel_id}"] = (channel.deliveries.tag, book._head, book._count, runs, windows)
        index = self.queue.index
        unacked = index._unacked
        out["index"] = (sorted(unacked._loose), sorted((k, list(v[0]), v[1]) for k, v in unacked._runs.items()),
                        unacked._in_runs, None if index._ack_pending is None else list(index._ack_pending),
                        sorted(index._transient), index.ready_count, dict(index.messages._refs))
        consumers = self.queue.consumers  # the round robin's state: who is served next, who waits parked
        tag = {consumer: consumer.tag for consumer in consumers}
        out["turns"] = ([tag[c] for c in consumers._queue], sorted((tag[c], t) for c, t in consumers._turns.items()),
                        sorted((t, tag.get(c)) for t, c in consumers._back), consumers._next_turn,
                        sorted((c.tag, c.unacked, c.parked is not None) for c in consumers))
        stats = self.queue.stats
        counters = self.clients[0].conn.channels[1].deliveries.counters if 1 in self.clients[0].conn.channels else None
        out["counts"] = (stats.ack, stats.deliver, stats.redeliver, self.queue.corrupt_messages,
                         counters.ack if counters else None,
                         counters.deliver if counters else None, self.queue.message_count,
                         self.harness.broker._input_since_check)
        return out


def _scenario(setup: Setup) -> list[dict[str, Any]]:
    """Ack reads of each kind, the state after each."""
    c0, c1, c2 = setup.clients
    states = []

    def step(client: Client, data: bytes) -> None:
        client.conn.receive_data(data)
        setup.harness.run_soon()
        states.append(setup.state())

    setup.publish(40)
    states.append(setup.state())
    step(c0, _ack(1))  # the head alone
    step(c1, _ack(1) + _ack(2) + _ack(3))  # the head's first three in one read
    step(c2, _ack(2))  # out of order: the Python path
    step(c2, _ack(1))  # the head, with a settled mark behind it
    step(c1, _ack(4) + _ack(5))  # the rest of one round and the next's first

    def held(client: Client) -> list[int]:
        return list(client.conn.channels[1].deliveries.unacked)

    first, *rest = held(c0)
    step(c0, _ack(first)[:10])  # a read ending inside a frame: the reader holds it back
    step(c0, _ack(first)[10:] + b"".join(_ack(tag) for tag in rest))  # and its rest with more acks
    tags = held(c1)
    step(c1, b"".join(_ack(tag) for tag in tags) + HEARTBEAT)  # acks and a heartbeat in one read
    tags = held(c2)
    step(c2, _ack(tags[0]) + _ack(tags[-1], multiple=True))  # one ack, then multiple=true
    for _ in range(8):  # every consumer acks all it holds, in order, until the queue is drained
        for client in (c0, c1, c2):
            channel = client.conn.channels.get(1)
            if channel is None:
                continue
            tags = list(channel.deliveries.unacked)
            if tags:
                step(client, b"".join(_ack(tag) for tag in tags))
    step(c1, _ack(999))  # an unknown tag: 406, the channel closed
    return states


def _damage(monkeypatch: pytest.MonkeyPatch, body: bytes, inside: list[bool], raised: list[bool]) -> None:
    """The message with ``body`` reads as damaged (a CRC mismatch): ``read_many`` of a run with it and its
    own ``read`` raise CorruptRecord, and a run framed from its segment stops before it (as at a record that
    fails its CRC); each raise of ``read_many`` notes whether a compiled refill was running."""
    read_many, read = MessageStore.read_many, MessageStore.read
    stored_frames = stored_runs.segment_stored_frames

    def framed_before(store: MessageStore, positions: list[int], start: int, *args: Any) -> Any:
        end = next((i for i in range(start, len(positions)) if read(store, positions[i]).body == body), len(positions))
        flags = args[3]
        return stored_frames(store, positions[:end], start, *args[:3], None if flags is None else flags[:end],
                             *args[4:])

    def damaged_run(store: MessageStore, positions: list[int]) -> list[Any]:
        messages = read_many(store, positions)
        if any(msg.body == body for msg in messages):
            raised.append(inside[0])
            raise CorruptRecord("CRC mismatch")
        return messages

    def damaged_one(store: MessageStore, pos: int) -> Any:
        msg = read(store, pos)
        if msg.body == body:
            raise CorruptRecord("CRC mismatch")
        return msg

    monkeypatch.setattr(MessageStore, "read_many", damaged_run)
    monkeypatch.setattr(MessageStore, "read", damaged_one)
    monkeypatch.setattr(stored_runs, "segment_stored_frames", framed_before)


def _drive(path: Path, compiled: str, monkeypatch: pytest.MonkeyPatch, arguments: dict[str, Any] | None = None,
           durable: bool = False, channel_wide: bool = False, refills: list[bool] | None = None,
           damaged: list[bool] | None = None) -> tuple[list[bool], list[dict[str, Any]]]:
    """``compiled``: "read" (the whole read compiled, the acks compiled when it declines), "acks" (the acks
    alone compiled) or "" (both pure); the calls' answers in the order they came. ``refills``: the freed
    windows' refill from the backlog compiled too (``_cwire.refill``), its answers appended there; None:
    the scheduler's Python round. ``damaged``: message 21 reads as damaged (``_damage``'s notes there)."""
    calls: list[bool] = []
    ack_head, ack_read = amqp_connection.ack_head, amqp_connection._ack_read
    refill = scheduler._refill
    inside = [False]
    if refills is not None and refill is not None:
        def counted_refill(work: Any) -> bool:
            inside[0] = True
            try:
                done = refill(work)
            finally:
                inside[0] = False
            refills.append(done)
            return done
        monkeypatch.setattr(scheduler, "_refill", counted_refill)
    else:
        monkeypatch.setattr(scheduler, "_refill", None)
    if damaged is not None:
        _damage(monkeypatch, b"m20", inside, damaged)
    if compiled and ack_head is not None:
        def counted(deliveries: Any, tags: list[int]) -> bool:
            done = ack_head(deliveries, tags)
            calls.append(done)
            return done
        monkeypatch.setattr(amqp_connection, "ack_head", counted)
    else:
        monkeypatch.setattr(amqp_connection, "ack_head", None)
    if compiled == "read" and ack_read is not None:
        def counted_read(conn: Any, data: bytes) -> bool:
            done = ack_read(conn, data)
            if conn.state == OPEN and conn.channels:  # (the login's and the publisher's reads not counted)
                calls.append(done)
            return done
        monkeypatch.setattr(amqp_connection, "_ack_read", counted_read)
    else:
        monkeypatch.setattr(amqp_connection, "_ack_read", None)
    setup = Setup(path, arguments or {}, durable, channel_wide)
    try:
        return calls, _scenario(setup)
    finally:
        monkeypatch.undo()
        setup.harness.close()


@pytest.mark.parametrize(("durable", "channel_wide"), [(False, False), (True, False), (False, True)])
def test_a_plain_queues_ack_reads_leave_the_same_state_either_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  durable: bool, channel_wide: bool) -> None:
    refills: list[bool] = []
    calls, compiled = _drive(tmp_path / "c", "read", monkeypatch, durable=durable, channel_wide=channel_wide,
                             refills=refills)
    _, read_alone = _drive(tmp_path / "r", "read", monkeypatch, durable=durable, channel_wide=channel_wide)
    head_calls, acks_compiled = _drive(tmp_path / "a", "acks", monkeypatch, durable=durable, channel_wide=channel_wide,
                                       refills=[])
    _, pure = _drive(tmp_path / "p", "", monkeypatch, durable=durable, channel_wide=channel_wide)
    _, refill_alone = _drive(tmp_path / "f", "", monkeypatch, durable=durable, channel_wide=channel_wide, refills=[])
    assert compiled == pure
    assert read_alone == pure
    assert acks_compiled == pure
    assert refill_alone == pure
    assert pure[-1]["counts"][:4] == (40, 40, 0, 0)  # every message acked once, then the unknown tag closed the channel
    assert pure[-1]["index"][5] == 0  # drained
    assert b"unknown delivery tag 999" in pure[-1]["out1"]  # channel.close 406, the books empty
    assert pure[-1]["book1.1"][2] == 0
    if accel.COMPILED:  # the common case engaged, and the others went to the Python path
        assert calls.count(True) >= 5 and False in calls
        assert head_calls.count(True) >= 5 and False in head_calls
        if not channel_wide:  # a consumer's freed window refilled from the backlog, and the other cases declined
            assert refills.count(True) >= 5 and False in refills
        else:  # (a channel-wide prefetch in the vhost: the Python round)
            assert True not in refills


def test_a_queue_with_a_feature_is_left_to_the_python_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arguments = {"x-message-ttl": 60_000}
    refills: list[bool] = []
    calls, compiled = _drive(tmp_path / "c", "read", monkeypatch, arguments, refills=refills)
    _, pure = _drive(tmp_path / "p", "", monkeypatch, arguments)
    assert compiled == pure
    assert pure[-1]["counts"][0] == 40
    assert True not in calls
    assert True not in refills


def test_acks_in_a_transaction_wait_for_the_commit(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    try:
        publisher = harness.open_client(declare=commands.Queue.Declare(queue="work"))
        publisher.send(*publisher.publish(1, "work", b"a"), *publisher.publish(1, "work", b"b"))
        publisher.read()
        client = harness.open_client(("127.0.0.1", 40100))
        client.send((1, commands.Tx.Select()), (1, commands.Basic.Consume(queue="work", consumer_tag="c")))
        client.read()
        queue = harness.broker.vhosts["/"].queues["work"]
        client.send(_ack(1) + _ack(2))
        harness.run_soon()
        assert queue.stats.ack == 0 and queue.unacked_count == 2
        client.send((1, commands.Tx.Commit()))
        client.read()
        assert queue.stats.ack == 2 and queue.unacked_count == 0
    finally:
        harness.close()


def test_a_damaged_record_in_a_refill_is_removed_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record that reads as damaged in a freed window's refill: reported, removed from the queue, its turn
    given back to the consumer and the rest of the round delivered, whichever path reads it."""
    raised: list[bool] = []
    refills: list[bool] = []
    _, compiled = _drive(tmp_path / "c", "read", monkeypatch, refills=refills, damaged=raised)
    _, pure = _drive(tmp_path / "p", "", monkeypatch, damaged=[])
    assert compiled == pure
    assert pure[-1]["counts"][:4] == (39, 39, 0, 1)  # one fewer delivered and acked, one damaged
    assert pure[-1]["index"][5] == 0
    if accel.COMPILED:
        assert raised == [True]  # it was the compiled refill's read that met it
