"""The per-vhost message store on real segment files: appends, reads, rollover, references, deletion."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lavinpy.store.message_store import MessageStore, MissingRecord
from lavinpy.store.record import CorruptRecord, StoredMessage
from lavinpy.store.segment import DATA_START, segment_name
from lavinpy.wire.position import make_pos, pos_offset, pos_segment

SEG = 4096  # small segments so that a few hundred messages roll over many times
PROPS = b"\x10\x00\x02"  # delivery_mode = 2


def open_store(path: Path, segment_size: int = SEG, recovered: bool = True) -> MessageStore:
    store = MessageStore(path, segment_size)
    store.open()
    if recovered:
        store.delete_unreferenced()
    return store


def body_of(i: int) -> bytes:
    return f"message {i} ".encode() * (i % 7 * 4)


def append_referenced(store: MessageStore, count: int) -> list[int]:
    """Append messages, each referenced by one queue right away (as the broker does)."""
    positions = []
    for i in range(count):
        pos = store.append("e", "k", PROPS, body_of(i))
        store.incref(pos_segment(pos))
        positions.append(pos)
    return positions


def segment_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("msgs.*"))


def test_first_open_creates_first_segment(tmp_path: Path) -> None:
    store = open_store(tmp_path / "vhost")
    assert store.segment_ids() == [1]
    assert store.current_segment_id == 1
    assert segment_files(tmp_path / "vhost") == ["msgs.0000000001"]
    assert store.disk_bytes() == SEG
    store.close()


def test_append_and_read_across_rollovers(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    positions = []
    for i in range(400):
        pos = store.append("ex", f"key.{i % 3}", PROPS, body_of(i), timestamp_ms=1000 + i)
        store.incref(pos_segment(pos))
        positions.append(pos)
    assert len(store.segment_ids()) > 10
    assert store.segment_ids() == sorted({pos_segment(p) for p in positions})
    for i, pos in enumerate(positions):
        assert store.is_valid(pos)
        assert store.read(pos) == StoredMessage(1000 + i, "ex", f"key.{i % 3}", PROPS, body_of(i))
    # Positions are increasing in (segment, offset) order and records never span a segment end.
    assert positions == sorted(positions, key=lambda p: (pos_segment(p), pos_offset(p)))
    assert all(DATA_START <= pos_offset(p) < SEG for p in positions)
    store.close()


def test_default_timestamp_and_memoryview_body(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    before = time.time_ns() // 1_000_000
    pos = store.append("", "q", b"\x00\x00", memoryview(b"--payload--")[2:-2])
    after = time.time_ns() // 1_000_000
    message = store.read(pos)
    assert message.body == b"payload"
    assert before <= message.timestamp <= after
    store.close()


def test_oversized_message_gets_own_segment(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    small = store.append("e", "k", PROPS, b"small")
    store.incref(pos_segment(small))
    big_body = bytes(range(256)) * 64  # 16 KiB, four times the segment size
    big = store.append("e", "k", PROPS, big_body)
    store.incref(pos_segment(big))
    assert pos_segment(big) == pos_segment(small) + 1
    assert pos_offset(big) == DATA_START
    big_file = tmp_path / segment_name(pos_segment(big))
    assert SEG < big_file.stat().st_size < SEG + len(big_body)
    after = store.append("e", "k", PROPS, b"after")
    store.incref(pos_segment(after))
    assert pos_segment(after) == pos_segment(big) + 1
    assert (tmp_path / segment_name(pos_segment(after))).stat().st_size == SEG
    assert store.read(big).body == big_body
    assert store.read(after).body == b"after"
    store.close()


def test_reopen_continues_after_last_record(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    positions = append_referenced(store, 100)
    segments = store.segment_ids()
    store.close()

    store = open_store(tmp_path, recovered=False)
    assert store.segment_ids() == segments
    assert store.current_segment_id == segments[-1]
    for pos in positions:
        store.incref(pos_segment(pos))
    store.delete_unreferenced()
    assert store.segment_ids() == segments
    for i, pos in enumerate(positions):
        assert store.read(pos).body == body_of(i)
    new = store.append("e", "k", PROPS, b"next")
    last_end = pos_offset(positions[-1]) + 8 + 8 + 2 + 2 + len(PROPS) + 8 + len(body_of(99))
    if pos_segment(new) == pos_segment(positions[-1]):
        assert pos_offset(new) == last_end
    else:  # it did not fit behind the last record
        assert pos_segment(new) == pos_segment(positions[-1]) + 1 and pos_offset(new) == DATA_START
        assert last_end + 8 + 8 + 2 + 2 + len(PROPS) + 8 + 4 > SEG
    assert store.read(new).body == b"next"
    assert store.read(positions[-1]).body == body_of(99)
    store.close()


def test_reopen_offset_is_exactly_after_last_record(tmp_path: Path) -> None:
    store = open_store(tmp_path, segment_size=1024 * 1024)
    first = store.append("e", "k", PROPS, b"one")
    store.close()
    store = open_store(tmp_path, segment_size=1024 * 1024)
    second = store.append("e", "k", PROPS, b"two")
    record_len = 8 + 8 + 1 + 1 + 1 + 1 + len(PROPS) + 8 + 3
    assert pos_segment(second) == pos_segment(first)
    assert pos_offset(second) == pos_offset(first) + record_len
    store.close()


def test_refcounts_delete_segments_but_never_the_current(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    positions = []
    for i in range(300):
        pos = store.append("e", "k", PROPS, body_of(i))
        store.incref(pos_segment(pos), 2)  # routed to two queues
        positions.append(pos)
    ids = store.segment_ids()
    assert len(ids) > 5
    first = ids[0]
    in_first = [p for p in positions if pos_segment(p) == first]
    assert store.refcount(first) == 2 * len(in_first)
    disk = store.disk_bytes()

    for pos in in_first:  # one queue acks everything: the other still references the segment
        store.decref(pos_segment(pos))
    assert (tmp_path / segment_name(first)).exists()
    for pos in in_first:
        store.decref(pos_segment(pos))
    assert store.refcount(first) == 0
    assert first not in store.segment_ids()  # forgotten at once; the file goes in a worker thread
    store.settle_removals()
    assert not (tmp_path / segment_name(first)).exists()
    assert store.disk_bytes() == disk - SEG
    assert not store.is_valid(in_first[0])
    with pytest.raises(MissingRecord):
        store.read(in_first[0])

    current = store.current_segment_id
    in_current = [p for p in positions if pos_segment(p) == current]
    store.decref(current, 2 * len(in_current))
    assert store.current_segment_id == current and (tmp_path / segment_name(current)).exists()
    assert store.read(in_current[-1]).body == body_of(299)
    store.close()


def test_rollover_deletes_unreferenced_segment_left_behind(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    first = store.append("e", "k", PROPS, b"x" * 1000)  # never referenced by a queue
    store.append("e", "k", PROPS, b"y" * 1000)
    while store.current_segment_id == pos_segment(first):
        store.append("e", "k", PROPS, b"z" * 1000)
    assert pos_segment(first) not in store.segment_ids()
    store.settle_removals()
    assert not (tmp_path / segment_name(pos_segment(first))).exists()
    assert store.segment_ids() == [store.current_segment_id]
    store.close()


def test_nothing_deleted_while_recovering(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    kept = []
    for i in range(200):
        pos = store.append("e", "k", PROPS, body_of(i))
        store.incref(pos_segment(pos))
        kept.append(pos)
    ids = store.segment_ids()
    store.close()

    store = open_store(tmp_path, recovered=False)
    assert store.recovering
    referenced = pos_segment(kept[-1]) - 2  # one queue still holds a message in this segment
    store.incref(referenced)
    store.incref(ids[0])
    store.decref(ids[0])  # reaching zero while recovering deletes nothing
    while store.current_segment_id == ids[-1]:  # neither does a rollover
        store.append("e", "k", PROPS, b"r" * 500)
    assert set(ids) <= set(store.segment_ids())
    deleted = store.delete_unreferenced()
    assert not store.recovering
    assert store.segment_ids() == [referenced, store.current_segment_id]
    assert deleted == len(ids) - 1  # every segment from before the reopen but the referenced one
    store.settle_removals()
    assert segment_files(tmp_path) == [segment_name(i) for i in store.segment_ids()]
    store.close()


def test_deletions_held_during_flush_happen_at_release(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    positions = []
    for i in range(100):
        pos = store.append("e", "k", PROPS, body_of(i))
        store.incref(pos_segment(pos))
        positions.append(pos)
    ranges = store.take_dirty()
    assert {seg.id for seg, _, _ in ranges} == set(store.segment_ids())
    old = store.segment_ids()[0]
    with store.deletions_held():
        worker = threading.Thread(target=store.sync_ranges, args=(ranges,))
        worker.start()
        for pos in positions:
            if pos_segment(pos) == old:
                store.decref(old)
        assert (tmp_path / segment_name(old)).exists()  # the worker may still be msync-ing it
        worker.join()
    store.settle_removals()
    assert not (tmp_path / segment_name(old)).exists()
    assert old not in store.segment_ids()
    store.close()


def test_nested_holds_and_reference_regained_before_release(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    pos = store.append("e", "k", PROPS, b"x" * 3000)
    store.incref(pos_segment(pos))
    store.append("e", "k", PROPS, b"y" * 3000)  # rolls over: the first segment is sealed
    seg = pos_segment(pos)
    store.hold_deletions()
    store.hold_deletions()
    store.decref(seg)
    store.release_deletions()
    assert seg in store.segment_ids()  # still held once
    store.incref(seg)  # referenced again (a requeue into another queue) before the release
    store.release_deletions()
    assert seg in store.segment_ids()
    with pytest.raises(RuntimeError):
        store.release_deletions()
    store.close()


def test_take_dirty_ranges(tmp_path: Path) -> None:
    store = open_store(tmp_path, segment_size=1024 * 1024)
    assert store.take_dirty() == []
    a = store.append("e", "k", PROPS, b"a")
    b = store.append("e", "k", PROPS, b"bb")
    ranges = store.take_dirty()
    assert len(ranges) == 1
    segment, start, end = ranges[0]
    assert segment.id == pos_segment(a) and start == pos_offset(a)
    assert end == store.valid_ends()[segment.id] and end > pos_offset(b)
    assert store.take_dirty() == []
    c = store.append("e", "k", PROPS, b"c")
    assert [(s.id, st) for s, st, _ in store.take_dirty()] == [(pos_segment(c), pos_offset(c))]
    store.sync_ranges(ranges)
    store.close()


def test_missing_segment_and_offsets_past_the_end(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    pos = store.append("e", "k", PROPS, b"hello")
    end = store.valid_ends()[pos_segment(pos)]
    assert store.is_valid(pos)
    assert not store.is_valid(make_pos(pos_segment(pos), end))
    assert not store.is_valid(make_pos(pos_segment(pos), 0))
    assert not store.is_valid(make_pos(99, DATA_START))
    with pytest.raises(MissingRecord):
        store.read(make_pos(pos_segment(pos), end))
    with pytest.raises(MissingRecord):
        store.read(make_pos(99, DATA_START))
    with pytest.raises(KeyError):  # MissingRecord is a KeyError
        store.read(make_pos(pos_segment(pos), SEG + 100))
    store.close()


def test_sealed_segment_valid_end_after_reopen(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    positions = append_referenced(store, 60)
    ends_before = store.valid_ends()
    store.close()
    store = open_store(tmp_path, recovered=False)
    ends = store.valid_ends()
    assert ends.keys() == ends_before.keys()
    for seg, end in ends.items():
        assert end <= ends_before[seg]  # data_end() never claims more than was written
        last = max(p for p in positions if pos_segment(p) == seg)
        assert pos_offset(last) < end
    assert all(store.is_valid(p) for p in positions)
    store.close()


def test_corrupt_record_read(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    pos = store.append("e", "k", PROPS, b"precious data")
    other = store.append("e", "k", PROPS, b"other")
    store.close()
    path = tmp_path / segment_name(pos_segment(pos))
    data = bytearray(path.read_bytes())
    data[pos_offset(pos) + 30] ^= 0x55
    path.write_bytes(bytes(data))
    store = open_store(tmp_path)
    with pytest.raises(CorruptRecord, match="msgs.0000000001"):
        store.read(pos)
    assert store.read(other).body == b"other"  # the damage stays with that one record
    store.close()


def test_unreadable_segment_is_treated_as_missing(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    positions = append_referenced(store, 150)
    ids = store.segment_ids()
    store.close()
    bad = ids[1]
    with open(tmp_path / segment_name(bad), "r+b") as f:
        f.write(b"\x09\x00\x00\x00")  # an unknown schema version
    newest = ids[-1]
    with open(tmp_path / segment_name(newest), "r+b") as f:
        f.write(b"\x00\x00\x00\x00")

    store = open_store(tmp_path, recovered=False)
    assert bad not in store.segment_ids() and newest not in store.segment_ids()
    # The newest file is unusable, so writing goes on in a fresh segment after it.
    assert store.current_segment_id == newest + 1
    assert (tmp_path / segment_name(bad)).exists()  # left on disk for inspection
    for pos in positions:
        if pos_segment(pos) in (bad, newest):
            assert not store.is_valid(pos)
            with pytest.raises(MissingRecord):
                store.read(pos)
    assert store.read(positions[0]).body == body_of(0)
    store.close()


def test_torn_tail_of_current_segment_after_crash(tmp_path: Path) -> None:
    store = open_store(tmp_path, segment_size=1024 * 1024)
    kept = store.append("e", "k", PROPS, b"kept")
    torn = store.append("e", "k", PROPS, b"t" * 5000)
    store.close()
    path = tmp_path / segment_name(pos_segment(torn))
    data = bytearray(path.read_bytes())
    end = pos_offset(torn) + 8 + 8 + 4 + len(PROPS) + 8 + 5000
    data[end - 2000:end] = bytes(2000)  # the kill happened while the body was being copied
    path.write_bytes(bytes(data))
    store = open_store(tmp_path, segment_size=1024 * 1024)
    assert not store.is_valid(torn)
    assert store.read(kept).body == b"kept"
    again = store.append("e", "k", PROPS, b"again")
    assert again == torn  # the torn space is reused
    assert store.read(again).body == b"again"
    store.close()


def _mapped_rss_kb(path_part: str) -> int:
    """Resident kB of this process's mappings of files whose path contains ``path_part``."""
    total = 0
    current = False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0]:
                current = len(fields) >= 6 and path_part in fields[5]
            elif current and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_release_memory_unmaps_sealed_pages_and_keeps_the_data(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, segment_size=1024 * 1024)
    store.open()
    body = bytes(range(256)) * 16  # 4 KiB
    positions = [store.append("ex", "rk", b"\x00\x00", body) for _ in range(1500)]  # ~6 MiB, 6 segments
    for pos in positions:
        store.incref(pos_segment(pos))
    # read newest first: the writer let its pages go, and reads behind the furthest one keep theirs
    assert all(store.read(pos).body == body for pos in reversed(positions))
    before = _mapped_rss_kb(str(tmp_path))
    assert before > 4000
    released = store.release_memory()
    assert released == len(store.segment_ids()) - 1  # every segment but the one being written
    after = _mapped_rss_kb(str(tmp_path))
    assert after <= 1100, (before, after)  # at most the current 1 MiB segment stays resident
    assert all(store.read(pos).body == body for pos in positions)
    store.close()


@pytest.mark.both_paths
@pytest.mark.parametrize("reading", ["sealed", "current"])
def test_a_consumer_behind_the_writer_keeps_only_the_pages_near_its_reads(tmp_path: Path, reading: str) -> None:
    """Reads fault a segment's pages in again after the writer let them go; those far behind the
    furthest read leave the mapping as the reads go on, instead of the whole segment staying resident."""
    store = MessageStore(tmp_path, segment_size=8 * 1024 * 1024)
    store.open()
    body = bytes(range(256)) * 4  # 1 KiB, as scenario b's
    positions = [store.append("ex", "rk", b"\x00\x00", body) for _ in range(7000)]  # ~7.3 MiB, one segment
    for pos in positions:
        store.incref(pos_segment(pos))
    if reading == "sealed":
        store.append("ex", "rk", b"\x00\x00", bytes(1024 * 1024))  # does not fit: the first one is sealed
        assert pos_segment(positions[-1]) != store.current_segment_id
    assert _mapped_rss_kb(str(tmp_path)) <= 2100  # the writer kept at most 512 KiB (+ the record that rolled)
    for i in range(0, len(positions), 256):  # delivery runs, as a consumer with prefetch 256 reads
        assert [m.body for m in store.read_many(positions[i:i + 256])] == [body] * len(positions[i:i + 256])
    assert store.read(positions[-1]).body == body
    rss = _mapped_rss_kb(str(tmp_path))
    assert rss <= 1600, rss  # before: the 7.3 MiB read through stayed resident
    store.close()
