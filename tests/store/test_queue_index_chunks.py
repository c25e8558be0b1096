"""A queue's recovery and compaction a bounded chunk at a time: the same queue as in one piece, and a
backlog in memory once (the ready list), not two or three times."""

from __future__ import annotations

import logging
import random
import tracemalloc
from array import array
from collections.abc import Callable
from pathlib import Path

import pytest

from lavinpy.store import changes, queue_index
from lavinpy.store.entry_file import EntryFile
from lavinpy.store.message_store import MessageStore
from lavinpy.store.queue_index import QueueIndex
from lavinpy.wire.position import make_pos
from tests.store.test_entry_file import Feed


@pytest.fixture
def store(tmp_path: Path):
    s = MessageStore(tmp_path, segment_size=4096)
    s.open()
    yield s
    s.close()


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_index, "STREAM_ENTRIES", 7)  # chunks end everywhere, segments too


def open_queue(store: MessageStore, path: Path, **kw) -> QueueIndex:
    q = QueueIndex("q", store, path, **kw)
    q.open()
    return q


def publish(store: MessageStore, n: int) -> list[int]:
    return [store.append("ex", "rk", b"\x00\x00", bytes([i % 256]) * 150) for i in range(n)]


def peak_of(action: Callable[[], object]) -> int:
    """Bytes allocated at the peak of ``action`` above what was allocated before it."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        action()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_recovery_in_chunks_is_enq_minus_ack_with_the_same_references(store: MessageStore, tmp_path: Path,
                                                                       small_chunks: None) -> None:
    positions = publish(store, 120)  # several segments: chunk and segment ends fall apart
    q = open_queue(store, tmp_path / "q")
    for pos in positions:
        q.push(pos)
    rng = random.Random(3)
    acked = set()
    for _ in range(60):
        pos = q.shift()
        if rng.random() < 0.6:
            q.ack(pos)
            acked.add(pos)
    q.close(clean=False)
    refs = {s: store.refcount(s) for s in store.segment_ids()}
    q2 = open_queue(store, tmp_path / "q")
    assert list(q2) == [p for p in positions if p not in acked] and q2.ready_count == len(positions) - len(acked)
    # q's references are still held (it was not deleted), so q2's own doubled the live ones
    for s, n in refs.items():
        assert store.refcount(s) == 2 * n
    assert q2.shift_many(1000) == [p for p in positions if p not in acked]


def test_invalid_entries_in_several_chunks_are_dropped_once(store: MessageStore, tmp_path: Path,
                                                            small_chunks: None, caplog) -> None:
    positions = publish(store, 40)
    bogus = [make_pos(999, 4), make_pos(store.current_segment_id, 4096 - 8), make_pos(998, 0)]
    entries = positions[:3] + bogus[:1] + positions[3:20] + bogus[1:] + positions[20:]
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "enq").write_bytes(array("Q", entries).tobytes() + b"\x01\x02")  # and a torn entry
    (tmp_path / "q" / "enq.tmp").write_bytes(b"left by an interrupted rewrite")
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        q = open_queue(store, tmp_path / "q")
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("partial entry" in m for m in messages)
    assert sum("dropped 3 index entries" in m for m in messages) == 1
    assert list(q) == positions
    assert (tmp_path / "q" / "enq").read_bytes() == array("Q", positions).tobytes()  # compacted
    assert not (tmp_path / "q" / "enq.tmp").exists()


def test_compaction_in_chunks_keeps_enq_order_and_leaves_transient_out(store: MessageStore, tmp_path: Path,
                                                                       small_chunks: None) -> None:
    positions = publish(store, 60)
    q = open_queue(store, tmp_path / "q")
    scrambled = positions[:]
    random.Random(5).shuffle(scrambled)  # pushed out of append order: the merge path
    transient = set(scrambled[::9])
    for pos in scrambled:
        q.push(pos, persistent=pos not in transient)
    taken = q.shift_many(25)
    for pos in taken[::2]:
        q.ack(pos)
    for pos in taken[1::4]:
        q.requeue(pos)
    q.compact()
    live = q.live_positions()
    assert sorted(live) == sorted(set(scrambled) - set(taken[::2]))
    enq = array("Q", (tmp_path / "q" / "enq").read_bytes())
    assert list(enq) == [p for p in live if p not in transient]
    q.close(clean=False)
    assert sorted(open_queue(store, tmp_path / "q")) == sorted(p for p in live if p not in transient)


def test_compaction_with_many_unacked_in_runs_writes_them_first_in_enq_order(store: MessageStore,
                                                                             tmp_path: Path) -> None:
    """Hundreds unacked (more than a comparison sort's share of the compiled sort), held as the runs
    several consumers took, some settled, some requeued, then compaction: enq holds the requeued and
    unacked ones first, in enq order, then the ready ones, as a restart reads them back."""
    positions = publish(store, 900)
    q = open_queue(store, tmp_path / "q")
    for pos in positions:
        q.push(pos)
    acked: set[int] = set()
    for _ in range(3):
        taken = q.shift_many(200)  # the requeued ones first, then new ones
        q.split_taken(taken, [taken[:80], taken[80:150], taken[150:]])  # three consumers' shares
        q.ack_many(taken[150:170])
        acked.update(taken[150:170])
        for pos in taken[5:9]:
            q.requeue(pos)
    q.compact()
    enq = list(array("Q", (tmp_path / "q" / "enq").read_bytes()))
    assert len(acked) == 60
    assert enq == [p for p in positions if p not in acked]  # appended in order: enq order is append order
    assert enq == list(q.live_positions())
    q.close(clean=False)
    reopened = open_queue(store, tmp_path / "q")
    assert list(reopened) == enq


def test_compaction_in_chunks_reports_one_whole_replacement(store: MessageStore, tmp_path: Path,
                                                            small_chunks: None) -> None:
    positions = publish(store, 50)
    q = open_queue(store, tmp_path / "q")
    for pos in positions:
        q.push(pos)
    q.write_buffers()
    for _ in range(10):
        q.ack(q.shift())
    recorder = Feed()
    changes.attach(tmp_path, recorder)
    try:
        q.compact()
    finally:
        changes.attach(tmp_path, None)
    replaced = [op for op in recorder.ops if op[0] == "replace"]
    assert replaced == [("replace", "q/enq", array("Q", positions[10:]).tobytes())]
    assert (tmp_path / "q" / "enq").read_bytes() == replaced[0][2]


def test_a_failed_chunked_rewrite_leaves_the_old_file(tmp_path: Path) -> None:
    file = EntryFile(tmp_path / "enq", 8, "queue 'q'")
    file.recover()
    file.append(array("Q", range(10)))

    def chunks():
        yield array("Q", [7])
        raise OSError("disk gone")

    recorder = Feed()
    changes.attach(tmp_path, recorder)
    try:
        with pytest.raises(OSError, match="disk gone"):
            file.rewrite_chunks(chunks())
    finally:
        changes.attach(tmp_path, None)
    assert recorder.ops == []
    assert (tmp_path / "enq").read_bytes() == array("Q", range(10)).tobytes()
    assert not (tmp_path / "enq.tmp").exists()
    file.rewrite_chunks(iter([array("Q", [1, 2]), b"", array("Q", [3])]))
    assert (tmp_path / "enq").read_bytes() == array("Q", [1, 2, 3]).tobytes() and file.size == 24
    file.append(array("Q", [4]))
    assert (tmp_path / "enq").read_bytes() == array("Q", [1, 2, 3, 4]).tobytes()
    file.close()


BACKLOG = 400_000  # 3.2 MB of entries


def test_recovering_a_backlog_holds_it_in_memory_once(store: MessageStore, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_index, "STREAM_ENTRIES", 1 << 14)
    pos = publish(store, 1)[0]
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "enq").write_bytes((array("Q", [pos]) * BACKLOG).tobytes())
    q = QueueIndex("q", store, tmp_path / "q")
    peak = peak_of(q.open)
    assert q.ready_count == BACKLOG
    assert peak < 8 * BACKLOG + (1 << 20), peak  # the ready list and a chunk, not the file twice more


def test_compacting_a_backlog_copies_a_chunk_at_a_time(store: MessageStore, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_index, "STREAM_ENTRIES", 1 << 14)
    pos = publish(store, 1)[0]
    q = open_queue(store, tmp_path / "q")
    q.push_many(array("Q", [pos]) * BACKLOG, True)
    q.write_buffers()
    q.ack(q.shift())
    peak = peak_of(q.compact)
    assert (tmp_path / "q" / "enq").stat().st_size == 8 * (BACKLOG - 1)
    assert peak < 1 << 20, peak


def test_purging_a_backlog_keeps_the_unacked_and_rewrites_enq(store: MessageStore, tmp_path: Path,
                                                              small_chunks: None) -> None:
    positions = publish(store, 80)
    q = open_queue(store, tmp_path / "q")
    transient = set(positions[::5])
    for pos in positions:
        q.push(pos, persistent=pos not in transient)
    q.write_buffers()
    taken = q.shift_many(30)
    for pos in taken[:10]:
        q.ack(pos)
    for pos in taken[10:15]:
        q.requeue(pos)
    unacked = taken[15:]
    assert q.purge() == 80 - 30 + 5
    assert q.ready_count == 0 and list(q) == [] and sorted(q.unacked()) == sorted(unacked)
    assert q.transient_count == len(transient.intersection(unacked))
    for s in store.segment_ids():
        assert store.refcount(s) == sum(1 for p in unacked if p & 0xFFFFFFFF == s)
    kept = [p for p in unacked if p not in transient]
    assert list(array("Q", (tmp_path / "q" / "enq").read_bytes())) == kept
    ack = tmp_path / "q" / "ack"
    assert not ack.exists() or ack.stat().st_size == 0  # the acks of the rewrite's dropped entries went
    q.push(positions[0])  # still usable: the next push and ack go to the files as usual
    q.ack(q.shift())
    q.close(clean=False)
    q2 = open_queue(store, tmp_path / "q")
    assert list(q2) == kept


def test_purging_or_deleting_a_backlog_copies_a_chunk_at_a_time(store: MessageStore, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_index, "STREAM_ENTRIES", 1 << 14)
    pos = publish(store, 1)[0]
    segment = pos & 0xFFFFFFFF
    for name in ("purged", "deleted"):
        q = QueueIndex(name, store, tmp_path / name)
        q.open()
        q.push_many(array("Q", [pos]) * BACKLOG, True)
        q.write_buffers()
        q.ack(q.shift())
        assert store.refcount(segment) == BACKLOG - 1
        peak = peak_of(q.purge if name == "purged" else q.delete)
        assert store.refcount(segment) == 0
        assert peak < 1 << 20, (name, peak)
    assert (tmp_path / "purged" / "enq").stat().st_size == 0 and not (tmp_path / "deleted").exists()
