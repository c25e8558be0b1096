"""StreamIndex on a real VhostStore and real files: offsets, restart, timestamps, retention, holes, flush."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from array import array
from functools import partial
from pathlib import Path

from lavinpy.store.index_kinds import STREAM
from lavinpy.store.segment import segment_name
from lavinpy.store.stream_index import CHUNK_ENTRIES, META_FILE, StreamIndex
from lavinpy.store.vhost_store import VhostStore
from lavinpy.wire.position import make_pos, pos_segment
from tests import helpers

SEGMENT_SIZE = 4096
BODY = 400  # about 9 records per 4 KiB segment


# Every store here has small segments, so that a test spans several.
make_store = partial(helpers.make_store, segment_size=SEGMENT_SIZE)


def reopen(store: VhostStore, name: str = "s", clean: bool = True) -> tuple[VhostStore, StreamIndex]:
    store.close(clean=clean)
    store = make_store(store.path)
    index = store.open_queue(name, True, STREAM)
    store.finish_recovery()
    return store, index


def body(i: int, size: int = BODY) -> bytes:
    return i.to_bytes(4, "big") * (size // 4)


def append(store: VhostStore, index: StreamIndex, n: int, start: int = 0, ts: int | None = None,
           size: int = BODY) -> list[int]:
    offsets = []
    for i in range(start, start + n):
        pos = store.messages.append("", "s", b"\x00\x00", body(i, size), ts)
        offsets.append(index.append(pos))
    return offsets


def body_at(store: VhostStore, index: StreamIndex, offset: int) -> bytes | None:
    pos = index.get(offset)
    return None if pos is None else store.messages.read(pos).body


def segment_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith("msgs."))


def enq_entries(index: StreamIndex) -> int:
    return (index.directory / "enq").stat().st_size // 8


def test_offsets_start_at_one(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    assert (index.first_offset, index.next_offset, index.last_offset, index.count) == (1, 1, 0, 0)
    assert index.get(0) is None and index.get(1) is None
    assert append(store, index, 3) == [1, 2, 3]
    assert (index.first_offset, index.last_offset, index.next_offset, index.count) == (1, 3, 4, 3)
    assert [body_at(store, index, o) for o in (1, 2, 3)] == [body(0), body(1), body(2)]
    assert index.get(4) is None
    assert store.open_queue("s", True, STREAM) is index
    store.close()


def test_restart_returns_same_messages_for_old_offsets(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    n = 2 * CHUNK_ENTRIES + 7  # spans several in-memory chunks
    append(store, index, n, size=16)
    before = {o: index.get(o) for o in (1, CHUNK_ENTRIES, CHUNK_ENTRIES + 1, n)}
    for clean in (True, False):  # a clean stop, then a crash-like one (buffers handed to the OS only)
        store, index = reopen(store, clean=clean)
        assert (index.first_offset, index.next_offset, index.count) == (1, n + 1, n)
        assert {o: index.get(o) for o in before} == before
        assert body_at(store, index, n) == body(n - 1, 16)
    assert append(store, index, 1, start=n, size=16) == [n + 1]
    store.close()


def test_group_commit_flush_writes_and_syncs_the_stream(tmp_path: Path) -> None:
    async def run() -> None:
        store = make_store(tmp_path)
        index = store.open_queue("s", True, STREAM)
        store.finish_recovery()
        append(store, index, 5)
        assert store.pending and index.has_pending_writes and enq_entries(index) == 0
        await store.flush()
        assert not store.pending and not index.has_unsynced
        assert enq_entries(index) == 5
        store.close()

    asyncio.run(run())


def test_offset_for_timestamp(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    for i in range(20):
        pos = store.messages.append("", "s", b"\x00\x00", b"x", 1_000_000 + i * 10)
        index.append(pos)
    assert index.offset_for_timestamp(0) == 1
    assert index.offset_for_timestamp(1_000_000) == 1
    assert index.offset_for_timestamp(1_000_001) == 2
    assert index.offset_for_timestamp(1_000_050) == 6
    assert index.offset_for_timestamp(1_000_190) == 20
    assert index.offset_for_timestamp(1_000_191) == 21  # after the newest: only new messages
    store.close()


def test_retention_by_bytes_drops_whole_segments_and_survives_restart(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    append(store, index, 60)
    segments = index.segments()
    assert len(segments) >= 6
    per_segment = {seg: sum(1 for o in range(1, 61) if pos_segment(index.get(o)) == seg) for seg in segments}
    total = index.byte_size
    assert total > 5 * SEGMENT_SIZE
    dropped = index.trim(max_bytes=2 * SEGMENT_SIZE, max_age_ms=None, now_ms=0)
    kept = index.segments()
    # whole segments from the head, and the remaining size fits the limit
    assert kept == segments[len(segments) - len(kept):]
    assert dropped == sum(per_segment[s] for s in segments[: len(segments) - len(kept)])
    assert index.byte_size <= 2 * SEGMENT_SIZE < index.byte_size + SEGMENT_SIZE
    assert index.first_offset == 1 + dropped and index.next_offset == 61
    store.messages.settle_removals()  # dropped segments are unlinked by a worker thread
    files = segment_files(tmp_path)
    for seg in segments[: len(segments) - len(kept)]:
        assert segment_name(seg) not in files  # unreferenced: deleted
    assert body_at(store, index, index.first_offset) == body(dropped)
    assert body_at(store, index, 60) == body(59)
    assert index.get(dropped) is None

    store, index = reopen(store)
    assert (index.first_offset, index.next_offset) == (1 + dropped, 61)
    assert [body_at(store, index, o) for o in range(1 + dropped, 61)] == [body(i) for i in range(dropped, 60)]
    assert enq_entries(index) == 60 - dropped  # compacted at the clean stop
    store.close()


def test_retention_by_age_keeps_the_newest_segment(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    append(store, index, 30, ts=1_000)          # old
    old_segments = index.segments()
    append(store, index, 30, start=30, ts=900_000)  # new
    now = 1_000_000
    assert index.trim(None, max_age_ms=10_000_000, now_ms=now) == 0  # nothing is that old
    dropped = index.trim(None, max_age_ms=500_000, now_ms=now)
    # every segment whose newest record is old goes; the first kept one holds new records
    assert 0 < dropped <= 30
    assert all(seg not in index.segments() for seg in old_segments[:-1])
    ts_first_kept = store.messages.read(index.get(index.first_offset)).timestamp
    last_of_first_kept_segment = max(o for o in range(index.first_offset, 61)
                                     if pos_segment(index.get(o)) == index.segments()[0])
    assert store.messages.read(index.get(last_of_first_kept_segment)).timestamp == 900_000
    assert ts_first_kept in (1_000, 900_000)
    # everything old: all but the stream's newest segment go
    dropped2 = index.trim(None, max_age_ms=1, now_ms=10**12)
    assert len(index.segments()) == 1 and dropped2 > 0
    assert body_at(store, index, 60) == body(59)
    store.close()


def test_crash_after_trim_before_compaction_keeps_offsets(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    append(store, index, 60)
    dropped = index.trim(max_bytes=5 * SEGMENT_SIZE, max_age_ms=None, now_ms=0)
    assert 0 < dropped < 60 - dropped  # stale head smaller than the live part: no rewrite yet
    assert enq_entries(index) == 60  # the file still starts at offset 1
    meta = json.loads((index.directory / META_FILE).read_text())
    assert meta["first_offset"] == 1 + dropped
    store, index = reopen(store, clean=False)
    assert (index.first_offset, index.next_offset) == (1 + dropped, 61)
    assert [body_at(store, index, o) for o in range(1 + dropped, 61)] == [body(i) for i in range(dropped, 60)]
    store.close()


def test_lost_segment_in_the_middle_leaves_holes_not_shifted_offsets(tmp_path: Path, caplog) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    append(store, index, 40)
    victim = index.segments()[1]
    lost = [o for o in range(1, 41) if pos_segment(index.get(o)) == victim]
    store.close()
    os.unlink(tmp_path / segment_name(victim))
    store = make_store(tmp_path)
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    assert "lost records" in caplog.text
    assert index.next_offset == 41
    assert all(index.get(o) is None for o in lost)
    assert [body_at(store, index, o) for o in range(lost[-1] + 1, 41)] == [body(i) for i in range(lost[-1], 40)]
    assert victim not in index.segments()
    store, index = reopen(store)  # the holes are persisted: same offsets again
    assert index.next_offset == 41 and all(index.get(o) is None for o in lost)
    assert body_at(store, index, 40) == body(39)
    store.close()


def test_entries_past_the_valid_data_are_cut_from_the_tail(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    append(store, index, 5)
    last = index.get(5)
    store.close()
    # as after a power loss: index entries reached the disk, the records they point at did not
    bogus = array("Q", [make_pos(pos_segment(last), SEGMENT_SIZE - 8)] * 3)
    with open(index.directory / "enq", "ab") as f:
        f.write(bogus.tobytes())
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    assert index.next_offset == 6 and index.get(5) == last
    assert append(store, index, 1, start=5) == [6]
    store.close()


def test_delete_releases_segments_and_removes_the_directory(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    append(store, index, 40)
    old = index.segments()[:-1]
    store.delete_queue(index)  # type: ignore[arg-type]
    assert not index.directory.exists()
    assert "s" not in store.queues
    store.messages.settle_removals()
    files = segment_files(tmp_path)
    assert all(segment_name(seg) not in files for seg in old)
    store.close()
