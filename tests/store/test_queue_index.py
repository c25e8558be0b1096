"""QueueIndex on a real MessageStore and real files: ordering, requeue, purge, compaction, reopen."""

from __future__ import annotations

import logging
import os
import random
import tracemalloc
from array import array
from pathlib import Path

import pytest

from lavinpy.store.message_store import MessageStore
from lavinpy.store.queue_index import QueueIndex
from lavinpy.wire.position import enq_order_key, make_pos, pos_segment

SEGMENT_SIZE = 4096


def open_store(path: Path) -> MessageStore:
    store = MessageStore(path, segment_size=SEGMENT_SIZE)
    store.open()
    return store


def open_queue(store: MessageStore, path: Path | None, name: str = "q", **kw) -> QueueIndex:
    index = QueueIndex(name, store, path, **kw)
    index.open()
    return index


def publish(store: MessageStore, queues: list[QueueIndex], n: int, size: int = 100) -> list[int]:
    positions = []
    for i in range(n):
        pos = store.append("ex", "rk", b"\x00\x00", i.to_bytes(4, "little") * (size // 4))
        for q in queues:
            q.push(pos)
        positions.append(pos)
    return positions


def entries_of(path: Path) -> list[int]:
    data = path.read_bytes()
    return list(array("Q", data[: len(data) - len(data) % 8]))


@pytest.fixture
def store(tmp_path: Path):
    s = open_store(tmp_path)
    yield s
    s.close()


def test_fifo_order_and_peek(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q")
    positions = publish(store, [q], 50)
    assert q.ready_count == 50 and list(q) == positions
    assert q.peek() == positions[0]
    got = [q.shift() for _ in range(50)]
    assert got == positions
    assert q.shift() is None and q.peek() is None
    assert q.ready_count == 0 and q.unacked_count == 50


def test_many_chunks_keep_order(store: MessageStore) -> None:
    q = open_queue(store, None)
    positions = [make_pos(1, 4 + i) for i in range(10_000)]
    for p in positions:
        q.push(p)
    out = []
    while (p := q.shift()) is not None:
        out.append(p)
        if len(out) % 3000 == 0:  # pushes interleaved with a half-consumed head chunk
            q.push(make_pos(1, 100_000 + len(out)))
            positions.append(make_pos(1, 100_000 + len(out)))
    assert out == positions


def test_requeue_goes_first_in_enq_order(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q")
    positions = publish(store, [q], 100)  # spans several segments
    assert len({pos_segment(p) for p in positions}) > 1
    delivered = [q.shift() for _ in range(10)]
    shuffled = delivered[:]
    random.Random(1).shuffle(shuffled)
    for p in shuffled[:6]:
        q.requeue(p)
    assert q.ready_count == 96 and q.unacked_count == 4
    expected = sorted(shuffled[:6], key=enq_order_key) + positions[10:]
    assert list(q) == expected
    assert q.peek() == expected[0]
    assert [q.shift() for _ in range(96)] == expected


def test_ack_unknown_position_raises(store: MessageStore) -> None:
    q = open_queue(store, None)
    q.push(store.append("", "q", b"\x00\x00", b"x"))
    with pytest.raises(KeyError):
        q.ack(q.peek())  # ready, not unacked
    with pytest.raises(KeyError):
        q.requeue(q.peek())


def test_references_follow_push_and_ack(store: MessageStore, tmp_path: Path) -> None:
    a = open_queue(store, tmp_path / "a", "a")
    b = open_queue(store, None, "b")
    store.delete_unreferenced()
    positions = publish(store, [a, b], 60)
    first = pos_segment(positions[0])
    assert first != store.current_segment_id
    in_first = sum(1 for p in positions if pos_segment(p) == first)
    assert store.refcount(first) == 2 * in_first
    for q in (a, b):
        for _ in range(in_first):
            q.ack(q.shift())
    assert store.refcount(first) == 0
    assert first not in store.segment_ids()  # deleted once no queue references it


def test_drop_head_and_purge(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q")
    positions = publish(store, [q], 40)
    head = q.shift()  # max-length drop-head: the head is taken and removed without a delivery
    q.ack(head)
    assert head == positions[0]
    assert q.unacked_count == 0 and q.ready_count == 39
    kept = [q.shift(), q.shift()]
    q.requeue(kept[1])
    assert q.purge() == 38  # 36 never delivered + 1 requeued + the one before it
    assert q.ready_count == 0 and q.unacked_count == 1 and q.purge() == 0
    q.close(clean=False)
    q2 = open_queue(store, tmp_path / "q")
    assert list(q2) == [kept[0]]  # the unacked message comes back as ready


def test_reopen_is_enq_minus_ack(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q")
    positions = publish(store, [q], 30)
    acked = set()
    for i in range(20):
        p = q.shift()
        if i % 3:
            q.ack(p)
            acked.add(p)
    q.write_buffers()
    assert len(entries_of(tmp_path / "q" / "ack")) == len(acked)
    q.close(clean=False)  # no compaction: reopen must subtract ack from enq
    assert entries_of(tmp_path / "q" / "enq") == positions
    q2 = open_queue(store, tmp_path / "q")
    assert list(q2) == [p for p in positions if p not in acked]
    assert q2.unacked_count == 0


def test_clean_close_compacts(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q")
    positions = publish(store, [q], 30)
    for _ in range(10):
        q.ack(q.shift())
    unacked = q.shift()
    q.close(clean=True)
    assert (tmp_path / "q" / "ack").stat().st_size == 0
    assert entries_of(tmp_path / "q" / "enq") == [unacked] + positions[11:]
    assert not (tmp_path / "q" / "enq.tmp").exists()
    assert (tmp_path / "q" / ".queue").read_text() == "q"


def test_ack_file_limit_triggers_compaction(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q", ack_file_max_bytes=10 * 8)
    positions = publish(store, [q], 40)
    for i in range(25):
        p = q.shift()
        if i != 3:
            q.ack(p)
        q.write_buffers()
        assert (tmp_path / "q" / "ack").stat().st_size < 10 * 8
    # two compactions happened (after 10 and 20 acks); enq holds only live entries
    assert len(entries_of(tmp_path / "q" / "ack")) == 4
    enq = entries_of(tmp_path / "q" / "enq")
    assert enq[0] == positions[3] and positions[0] not in enq
    q.close(clean=False)
    q2 = open_queue(store, tmp_path / "q")
    assert list(q2) == [positions[3]] + positions[25:]


def test_compaction_keeps_requeued_and_unacked(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q")
    positions = publish(store, [q], 20)
    taken = [q.shift() for _ in range(6)]
    q.requeue(taken[4])
    q.requeue(taken[1])
    q.ack(taken[0])
    q.compact()
    assert entries_of(tmp_path / "q" / "enq") == positions[1:]
    assert not (tmp_path / "q" / "ack").exists()  # no ack was ever written: no ack file
    q.close(clean=False)
    assert list(open_queue(store, tmp_path / "q")) == positions[1:]


def test_transient_queue_writes_nothing_and_does_not_come_back(tmp_path: Path) -> None:
    store = open_store(tmp_path / "v")
    q = open_queue(store, None, "t")
    publish(store, [q], 10)
    q.ack(q.shift())
    q.write_buffers()
    assert not q.has_unsynced and not q.has_pending_writes
    assert sorted(p.name for p in (tmp_path / "v").iterdir() if p.is_dir()) == []
    q.close()
    store.close()
    store = open_store(tmp_path / "v")
    q2 = open_queue(store, None, "t")
    assert q2.ready_count == 0
    store.delete_unreferenced()
    assert store.segment_ids() == [store.current_segment_id]  # nothing kept the old segments
    store.close()


def test_partial_trailing_entries_are_cut(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q")
    positions = publish(store, [q], 5)
    q.ack(q.shift())
    q.close(clean=False)
    with open(tmp_path / "q" / "enq", "ab") as f:
        f.write(b"\x01\x02\x03")
    with open(tmp_path / "q" / "ack", "ab") as f:
        f.write(b"\xff" * 5)
    q2 = open_queue(store, tmp_path / "q")
    assert list(q2) == positions[1:]
    assert (tmp_path / "q" / "enq").stat().st_size == 5 * 8
    assert (tmp_path / "q" / "ack").stat().st_size == 8


def test_out_of_order_enq_is_kept_in_enq_order(store: MessageStore, tmp_path: Path) -> None:
    positions = publish(store, [], 50)
    scrambled = positions[:]
    random.Random(7).shuffle(scrambled)
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "enq").write_bytes(array("Q", scrambled).tobytes())
    q = open_queue(store, tmp_path / "q")
    assert list(q) == scrambled
    for seg in {pos_segment(p) for p in positions}:
        assert store.refcount(seg) == sum(1 for p in positions if pos_segment(p) == seg)


def test_invalid_entries_dropped_once_with_one_warning(store: MessageStore, tmp_path: Path, caplog) -> None:
    positions = publish(store, [], 10)
    bogus = [make_pos(999, 4), make_pos(store.current_segment_id, SEGMENT_SIZE - 8)]
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "enq").write_bytes(array("Q", positions[:5] + bogus + positions[5:]).tobytes())
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        q = open_queue(store, tmp_path / "q")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'q'" in warnings[0].getMessage() and " 2 " in warnings[0].getMessage()
    assert list(q) == positions
    q.close(clean=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        q = open_queue(store, tmp_path / "q")
    assert list(q) == positions and not caplog.records


def test_delete_releases_references_and_removes_directory(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q")
    store.delete_unreferenced()
    positions = publish(store, [q], 60)
    q.shift()
    segments = {pos_segment(p) for p in positions}
    q.delete()
    assert not (tmp_path / "q").exists()
    assert all(store.refcount(s) == 0 for s in segments)
    assert store.segment_ids() == [store.current_segment_id]


def test_write_buffers_and_unsynced_fds(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q")
    publish(store, [q], 3)
    assert q.has_pending_writes and not q.has_unsynced
    assert not (tmp_path / "q").exists()  # buffered until write_buffers, which makes the directory
    q.write_buffers()
    assert (tmp_path / "q" / "enq").stat().st_size == 24
    fds = q.take_unsynced_fds()
    assert len(fds) == 1 and not q.has_unsynced  # only enq changed
    for fd in fds:
        os.fsync(fd)
    q.fsync()
    assert q.take_unsynced_fds() == []
    # an ack and a push: a confirm-only flush (include_acks=False) leaves the ack file for later
    q.ack(q.shift())
    publish(store, [q], 1)
    q.write_buffers()
    enq_only = q.take_unsynced_fds(include_acks=False)
    assert len(enq_only) == 1 and q.has_unsynced
    ack_only = q.take_unsynced_fds()
    assert len(ack_only) == 1 and ack_only != enq_only and not q.has_unsynced
    q.mark_unsynced()  # a failed flush: both files are synced by the next one
    assert len(q.take_unsynced_fds()) == 2


def test_ready_entries_cost_about_eight_bytes(store: MessageStore) -> None:
    q = open_queue(store, None)
    pos = make_pos(5, 1 << 20)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200_000):
            q.push(pos + (i << 32))
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert (after - before) / 200_000 <= 16


def test_transient_messages_in_a_durable_queue_do_not_come_back(store: MessageStore, tmp_path: Path) -> None:
    q = open_queue(store, tmp_path / "q", ack_file_max_bytes=4 * 8)
    kept, dropped = [], []
    for i in range(12):
        pos = store.append("", "q", b"\x00\x00", b"m%d" % i)
        persistent = i % 2 == 0
        q.push(pos, persistent)
        (kept if persistent else dropped).append(pos)
    assert list(q) == sorted(kept + dropped, key=enq_order_key)
    assert q.transient_count == 6  # what messages_persistent leaves out
    # ack one of each kind; only the persistent ack reaches the ack file
    for _ in range(2):
        q.ack(q.shift())
    assert q.transient_count == 5 and q.ready_count + q.unacked_count - q.transient_count == 5
    q.write_buffers()
    assert entries_of(tmp_path / "q" / "ack") == [kept[0]]
    assert dropped[0] not in entries_of(tmp_path / "q" / "enq")
    # compaction (forced here, as the ack limit or a clean close would) must not write transient ones
    q.compact()
    assert entries_of(tmp_path / "q" / "enq") == kept[1:]
    q.close()
    q2 = open_queue(store, tmp_path / "q")
    assert list(q2) == kept[1:]


def test_memory_bytes_grow_with_ready_and_unacked_messages(store: MessageStore) -> None:
    q = open_queue(store, None)
    empty = q.memory_bytes()
    publish(store, [q], 1000)
    full = q.memory_bytes()
    assert full >= empty + 8 * 1000
    for _ in range(500):
        q.shift()  # unacked positions sit in a set: more than 8 bytes each
    assert q.memory_bytes() > full - 8 * 500
    assert q.transient_count == 0  # a transient queue keeps no persistence figure: nothing survives it
