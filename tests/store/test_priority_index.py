"""PriorityIndex on a real MessageStore/VhostStore and real enq/ack files."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from pamqp import commands

from lavinpy.broker.queues.priorities import message_priority, priority_kind
from lavinpy.store.message_store import MessageStore
from lavinpy.store.priority_index import PriorityIndex
from lavinpy.store.vhost_store import VhostStore
from lavinpy.wire.position import pos_segment
from lavinpy.wire.properties import encode_properties

SEG = 4096


def open_priority_index(store: VhostStore, name: str, durable: bool, max_priority: int) -> PriorityIndex:
    index = store.open_queue(name, durable, priority_kind(max_priority))
    assert isinstance(index, PriorityIndex)
    return index


def props(priority: int | None = None, persistent: bool = True) -> bytes:
    return encode_properties(commands.Basic.Properties(priority=priority, delivery_mode=2 if persistent else 1))


def publish(store: MessageStore, index: PriorityIndex, priority: int | None, tag: int,
            persistent: bool = True, pass_priority: bool = True) -> int:
    pos = store.append("ex", "rk", props(priority, persistent), tag.to_bytes(4, "big"))
    index.push(pos, persistent, priority if pass_priority else None)
    return pos


def tag_of(messages: MessageStore, pos: int) -> int:
    return int.from_bytes(messages.read(pos).body, "big")


def drain(index: PriorityIndex) -> list[int]:
    """Deliver and ack everything; returns the positions in delivery order."""
    out = []
    while (pos := index.shift()) is not None:
        out.append(pos)
        index.ack(pos)
    return out


def drain_tags(index: PriorityIndex) -> list[int]:
    """Like drain, but reads each message's tag before its ack can free the segment."""
    out = []
    while (pos := index.shift()) is not None:
        out.append(tag_of(index.messages, pos))
        index.ack(pos)
    return out


@pytest.fixture
def messages(tmp_path: Path) -> MessageStore:
    store = MessageStore(tmp_path / "msgs", SEG)
    store.open()
    store.delete_unreferenced()
    return store


def kind_args(max_priority: int) -> dict:
    kind = priority_kind(max_priority)
    return {"max_priority": kind.max_priority, "priority_of": kind.priority_of}


def transient_index(messages: MessageStore, max_priority: int = 10) -> PriorityIndex:
    index = PriorityIndex("pq", messages, None, **kind_args(max_priority))
    index.open()
    return index


def test_priority_order_and_fifo_within_a_level(messages: MessageStore) -> None:
    index = transient_index(messages)
    order = [(0, 1), (5, 2), (None, 3), (5, 4), (9, 5), (0, 6), (9, 7)]
    positions = {tag: publish(messages, index, prio, tag) for prio, tag in order}
    assert index.ready_count == 7 and len(index) == 7
    assert index.peek() == positions[5] and index.peek_priority() == 9
    assert list(index) == [positions[t] for t in (5, 7, 2, 4, 1, 3, 6)]
    assert drain_tags(index) == [5, 7, 2, 4, 1, 3, 6]
    assert index.ready_count == 0 and index.unacked_count == 0 and index.peek() is None


def test_priority_above_max_is_capped(messages: MessageStore) -> None:
    index = transient_index(messages, max_priority=3)
    publish(messages, index, 3, 1)
    publish(messages, index, 200, 2)  # same level as 3, so after it
    publish(messages, index, 1, 3)
    assert index.ready_by_priority() == {3: 2, 1: 1}
    assert drain_tags(index) == [1, 2, 3]
    assert message_priority(props(255), 10) == 10 and message_priority(props(None), 10) == 0


def test_priority_read_from_the_record_when_not_given(messages: MessageStore) -> None:
    index = transient_index(messages)
    publish(messages, index, 1, 1, pass_priority=False)
    publish(messages, index, 7, 2, pass_priority=False)
    assert drain_tags(index) == [2, 1]


def test_requeue_goes_back_to_the_head_of_its_own_level(messages: MessageStore) -> None:
    index = transient_index(messages)
    low = [publish(messages, index, 1, t) for t in (1, 2, 3)]
    high = [publish(messages, index, 8, t) for t in (10, 11)]
    for _ in range(4):
        index.shift()
    index.requeue(low[1])
    index.requeue(low[0])
    index.requeue(high[1])
    # high[0] stays unacked; ready: high[1], then low level: low[0], low[1] (requeued), low[2]
    assert list(index) == [high[1], low[0], low[1], low[2]]
    assert drain(index) == [high[1], low[0], low[1], low[2]]
    index.ack(high[0])
    with pytest.raises(KeyError):
        index.ack(high[0])
    with pytest.raises(KeyError):
        index.requeue(low[0])


def test_purge_drop_head_and_references(messages: MessageStore) -> None:
    index = transient_index(messages)
    positions = [publish(messages, index, i % 4, i) for i in range(200)]
    segments = {pos_segment(p) for p in positions}
    assert sum(messages.refcount(s) for s in segments) == 200
    top = index.shift()  # drop-head: the head is taken and removed without a delivery
    index.ack(top)
    assert tag_of(messages, top) == 3  # the head is the oldest message of the highest level
    held = index.shift()
    assert index.purge() == 198
    assert index.ready_count == 0 and list(index) == [] and index.unacked_count == 1
    assert sum(messages.refcount(s) for s in segments) == 1  # only the unacked one is referenced
    index.ack(held)
    assert all(messages.refcount(s) == 0 for s in segments)


def open_vhost(path: Path) -> VhostStore:
    store = VhostStore(path, segment_size=SEG, fsync="never")
    store.open()
    return store


def test_durable_survives_clean_restart_with_order(tmp_path: Path) -> None:
    store = open_vhost(tmp_path)
    index = open_priority_index(store, "pq", durable=True, max_priority=5)
    assert store.queues["pq"] is index
    rng = random.Random(7)
    expected: dict[int, list[int]] = {}
    for tag in range(300):
        prio = rng.choice([None, 0, 1, 3, 5, 9])
        publish(store.messages, index, prio, tag)
        expected.setdefault(min(prio or 0, 5), []).append(tag)
    acked = [index.shift() for _ in range(50)]  # the 50 highest go
    for pos in acked:
        index.ack(pos)
    requeued = index.shift()
    index.requeue(requeued)
    unacked = index.shift()  # delivered, not acked: ready again after a restart
    before = [tag_of(store.messages, p) for p in index]
    store.close()

    store = open_vhost(tmp_path)
    index = open_priority_index(store, "pq", durable=True, max_priority=5)
    store.finish_recovery()
    unacked_tag = tag_of(store.messages, unacked)
    after = drain_tags(index)
    # the unacked message is ready again in its place; everything else keeps its order
    level_order = [t for level in sorted(expected, reverse=True) for t in expected[level]][50:]
    assert after == level_order
    assert before == [t for t in level_order if t != unacked_tag]
    store.close()


def test_durable_unclean_restart_and_transient_messages(tmp_path: Path) -> None:
    store = open_vhost(tmp_path)
    index = open_priority_index(store, "pq", durable=True, max_priority=9)
    keep = publish(store.messages, index, 2, 1)
    publish(store.messages, index, 9, 2, persistent=False)  # not written to enq
    gone = publish(store.messages, index, 5, 3)
    assert index.shift() is not None  # the transient one (priority 9)
    pos = index.shift()
    assert pos == gone
    index.ack(pos)
    asyncio.run(store.flush())
    store.close(clean=False)

    store = open_vhost(tmp_path)
    index = open_priority_index(store, "pq", durable=True, max_priority=9)
    store.finish_recovery()
    assert list(index) == [keep]
    store.close()


def test_compaction_keeps_levels_and_drops_acked(tmp_path: Path) -> None:
    store = VhostStore(tmp_path, segment_size=SEG, fsync="never", ack_file_max_bytes=8 * 16)
    store.open()
    index = open_priority_index(store, "pq", durable=True, max_priority=3)
    tags = {}
    for tag in range(60):
        tags[publish(store.messages, index, tag % 4, tag)] = tag
    for _ in range(40):  # acks go past ack_file_max_bytes: compaction runs several times
        index.ack(index.shift())
    remaining = [tags[p] for p in index]
    enq_entries = (store.queue_path("pq") / "enq").stat().st_size // 8
    assert enq_entries <= 60 - 16  # compacted: acked entries left the enq file
    store.close()

    store = open_vhost(tmp_path)
    index = open_priority_index(store, "pq", durable=True, max_priority=3)
    store.finish_recovery()
    assert [tag_of(store.messages, p) for p in index] == remaining
    store.close()


def test_delete_releases_references_and_files(tmp_path: Path) -> None:
    store = open_vhost(tmp_path)
    index = open_priority_index(store, "pq", durable=True, max_priority=3)
    positions = [publish(store.messages, index, i % 3, i) for i in range(30)]
    index.shift()
    store.delete_queue(index)
    assert not store.queue_path("pq").exists()
    assert all(store.messages.refcount(pos_segment(p)) == 0 for p in positions)
    assert "pq" not in store.queues
    store.close()


def test_open_priority_index_refuses_a_plain_one(tmp_path: Path) -> None:
    store = open_vhost(tmp_path)
    store.open_queue("plain", durable=True)
    with pytest.raises(ValueError):
        open_priority_index(store, "plain", durable=True, max_priority=3)
    with pytest.raises(ValueError):
        PriorityIndex("x", store.messages, None, **kind_args(0))
    store.close()


def test_memory_stays_packed(messages: MessageStore) -> None:
    import tracemalloc

    index = transient_index(messages, max_priority=5)
    pos = messages.append("ex", "rk", props(1), b"x")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(50_000):
        index.push(pos, True, i % 6)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert used / 50_000 < 16, f"{used / 50_000:.1f} bytes per message"
