"""Damaged files: the store must open (never raise out of open) and end in the documented state."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from lavinpy.store.datadir import sha1_name
from lavinpy.store.message_store import CorruptRecord
from lavinpy.store.vhost_store import VhostStore
from lavinpy.wire.position import pos_offset, pos_segment

SEGMENT_SIZE = 16 * 1024


def body_of(i: int) -> bytes:
    return i.to_bytes(4, "little") * 50


def segment_file(path: Path, segment: int) -> Path:
    return path / f"msgs.{segment:010d}"


def record_size_at(path: Path, pos: int) -> int:
    with open(segment_file(path, pos_segment(pos)), "rb") as f:
        f.seek(pos_offset(pos))
        return struct.unpack("<I", f.read(4))[0] + 8


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def populate(path: Path, n: int = 200) -> tuple[list[int], list[int]]:
    """Queue "a" gets the even messages, "b" the odd ones; crash-like close (no compaction)."""
    store = VhostStore(path, segment_size=SEGMENT_SIZE)
    store.open()
    a = store.open_queue("a", durable=True)
    b = store.open_queue("b", durable=True)
    store.finish_recovery()
    positions = []
    for i in range(n):  # push right after append: an unreferenced sealed segment is deleted
        pos = store.messages.append("", "q", b"\x00\x00", body_of(i))
        (a if i % 2 == 0 else b).push(pos)
        positions.append(pos)
    store.close(clean=False)
    return positions[0::2], positions[1::2]


def reopen(path: Path) -> VhostStore:
    store = VhostStore(path, segment_size=SEGMENT_SIZE)
    store.open()
    for name in store.queue_names_on_disk():
        store.open_queue(name, durable=True)
    store.finish_recovery()
    return store


def bodies(store: VhostStore, name: str) -> list[bytes]:
    return [store.messages.read(p).body for p in store.queues[name]]


def assert_append_works(store: VhostStore) -> None:
    pos = store.messages.append("", "q", b"\x00\x00", b"after the damage")
    store.queues["a"].push(pos)
    assert store.messages.read(pos).body == b"after the damage"


def test_zero_tail_is_normal(tmp_path: Path, caplog) -> None:
    a, b = populate(tmp_path)
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        store = reopen(tmp_path)
    assert not caplog.records
    assert bodies(store, "a") == [body_of(i) for i in range(0, 200, 2)]
    assert bodies(store, "b") == [body_of(i) for i in range(1, 200, 2)]
    store.close()


def readable(store: VhostStore, name: str) -> tuple[list[bytes], int]:
    """The bodies of a queue's readable messages, and how many are damaged."""
    good, damaged = [], 0
    for pos in store.queues[name]:
        try:
            good.append(store.messages.read(pos).body)
        except CorruptRecord:
            damaged += 1
    return good, damaged


def test_torn_last_record_that_an_index_references_is_kept(tmp_path: Path, caplog) -> None:
    # The index entry reached the disk: not a torn tail to erase but a damaged record, skipped when read.
    a, b = populate(tmp_path)
    last = b[-1]  # the last record written, in the current segment
    size = record_size_at(tmp_path, last)
    patch(segment_file(tmp_path, pos_segment(last)), pos_offset(last) + size // 2, bytes(size - size // 2))
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        store = reopen(tmp_path)
    assert readable(store, "b") == ([body_of(i) for i in range(1, 199, 2)], 1)
    assert bodies(store, "a") == [body_of(i) for i in range(0, 200, 2)]
    assert any("referenced" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert "discarded" not in caplog.text
    assert_append_works(store)
    store.close()
    store = reopen(tmp_path)
    assert bodies(store, "a")[-1] == b"after the damage"
    assert readable(store, "b")[1] == 1
    store.close()


def test_truncated_segment_file(tmp_path: Path) -> None:
    a, b = populate(tmp_path)
    last = b[-1]
    path = segment_file(tmp_path, pos_segment(last))
    with open(path, "r+b") as f:
        f.truncate(pos_offset(last) + 10)  # cut inside the last record
    store = reopen(tmp_path)
    assert readable(store, "b") == ([body_of(i) for i in range(1, 199, 2)], 1)
    assert len(bodies(store, "a")) == 100
    for _ in range(50):  # appends go on, rolling over to a fresh segment when the short one is full
        assert_append_works(store)
    store.close()


def test_flipped_byte_damages_only_that_record(tmp_path: Path) -> None:
    a, b = populate(tmp_path)
    victim = a[3]
    assert pos_segment(victim) != pos_segment(b[-1])  # in a sealed segment, records follow it
    offset = pos_offset(victim) + record_size_at(tmp_path, victim) - 7  # inside the body
    path = segment_file(tmp_path, pos_segment(victim))
    data = bytearray(path.read_bytes()[offset:offset + 1])
    patch(path, offset, bytes([data[0] ^ 0x40]))
    store = reopen(tmp_path)  # opening does not read bodies: no exception here
    qa = store.queues["a"]
    assert qa.ready_count == 100
    good = []
    for pos in qa:  # the broker skips (reports, dead-letters) a damaged record on delivery
        try:
            good.append(store.messages.read(pos).body)
        except CorruptRecord:
            assert pos == victim
    assert len(good) == 99
    assert bodies(store, "b") == [body_of(i) for i in range(1, 200, 2)]
    with pytest.raises(CorruptRecord):
        store.messages.read(victim)
    store.close()


def test_garbage_ack_tail_is_ignored(tmp_path: Path) -> None:
    store = VhostStore(tmp_path, segment_size=SEGMENT_SIZE)
    store.open()
    q = store.open_queue("a", durable=True)
    store.finish_recovery()
    for i in range(10):
        q.push(store.messages.append("", "q", b"\x00\x00", body_of(i)))
    for _ in range(4):
        q.ack(q.shift())
    store.close(clean=False)
    ack = tmp_path / sha1_name("a") / "ack"
    assert ack.stat().st_size == 32
    with open(ack, "ab") as f:
        f.write(b"\xde\xad\xbe\xef\x01")  # a torn write after a crash
    store = reopen(tmp_path)
    assert bodies(store, "a") == [body_of(i) for i in range(4, 10)]
    assert ack.stat().st_size == 32
    store.close()


def test_missing_segment_drops_its_entries_with_one_warning(tmp_path: Path, caplog) -> None:
    a, b = populate(tmp_path)
    first = pos_segment(a[0])
    lost_a = sum(1 for p in a if pos_segment(p) == first)
    lost_b = sum(1 for p in b if pos_segment(p) == first)
    assert lost_a and lost_b and first != pos_segment(b[-1])
    segment_file(tmp_path, first).unlink()
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        store = reopen(tmp_path)
    for name, lost in (("a", lost_a), ("b", lost_b)):
        lines = [r.getMessage() for r in caplog.records if f"'{name}'" in r.getMessage()]
        assert len(lines) == 1 and f" {lost} " in lines[0], lines
    assert len(bodies(store, "a")) == 100 - lost_a
    assert len(bodies(store, "b")) == 100 - lost_b
    store.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        store = reopen(tmp_path)  # the entries were removed: no warning the second time
    assert not caplog.records
    assert len(bodies(store, "a")) == 100 - lost_a
    store.close()


def test_unreadable_segment_header_counts_as_missing(tmp_path: Path, caplog) -> None:
    a, b = populate(tmp_path)
    first = pos_segment(a[0])
    patch(segment_file(tmp_path, first), 0, b"\x09\x09\x09\x09")  # wrong schema version
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        store = reopen(tmp_path)
    in_first = sum(1 for p in a if pos_segment(p) == first)
    assert len(bodies(store, "a")) == 100 - in_first
    assert any("'a'" in r.getMessage() for r in caplog.records)
    assert_append_works(store)
    store.close()


def test_index_entries_past_the_valid_end(tmp_path: Path, caplog) -> None:
    """The index reached the disk but the last records did not (zeros where they should be)."""
    a, b = populate(tmp_path)
    start = pos_offset(a[-1])
    path = segment_file(tmp_path, pos_segment(a[-1]))
    patch(path, start, bytes(SEGMENT_SIZE - start))  # a[-1] and b[-1] never reached the disk
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        store = reopen(tmp_path)
    assert bodies(store, "a") == [body_of(i) for i in range(0, 198, 2)]
    assert bodies(store, "b") == [body_of(i) for i in range(1, 198, 2)]
    assert_append_works(store)
    store.close()


def test_a_flush_whose_pages_reached_the_disk_out_of_order(tmp_path: Path, caplog) -> None:
    """A flush syncs the segment and the index files at once, so a power loss during it can leave the
    index entries and some of the records on disk but not others: here a record in the middle of the
    last flush is zeros, the records after it and every index entry are there. The hole is a damaged
    message (never confirmed), skipped when read; every other message is kept and appends go on."""
    a, b = populate(tmp_path)
    hole = a[-3]
    assert pos_segment(hole) == pos_segment(b[-1])  # in the segment being written
    patch(segment_file(tmp_path, pos_segment(hole)), pos_offset(hole), bytes(record_size_at(tmp_path, hole)))
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        store = reopen(tmp_path)
    assert readable(store, "a") == ([body_of(i) for i in range(0, 200, 2) if i != 194], 1)
    assert bodies(store, "b") == [body_of(i) for i in range(1, 200, 2)]
    assert_append_works(store)
    store.close()
    store = reopen(tmp_path)
    good, damaged = readable(store, "a")
    assert (good[-1], damaged) == (b"after the damage", 1)
    store.close()


FIELD_OFFSETS = {"length": 3, "crc": 5, "header": 16, "body": -3}


@pytest.mark.parametrize("segment", ["current", "sealed"])
@pytest.mark.parametrize("field", list(FIELD_OFFSETS))
def test_flipped_byte_matrix(tmp_path: Path, caplog, segment: str, field: str) -> None:
    """Only the damaged record is unreadable; every other message of both queues is kept."""
    a, b = populate(tmp_path)
    victim = a[-3] if segment == "current" else a[3]  # records of both queues follow it
    assert (pos_segment(victim) == pos_segment(b[-1])) == (segment == "current")
    where = FIELD_OFFSETS[field]
    if where < 0:
        where += record_size_at(tmp_path, victim)
    path = segment_file(tmp_path, pos_segment(victim))
    offset = pos_offset(victim) + where
    patch(path, offset, bytes([path.read_bytes()[offset] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        store = reopen(tmp_path)
    assert "discarded" not in caplog.text
    index = a.index(victim)
    assert readable(store, "a") == ([body_of(i) for i in range(0, 200, 2) if i != 2 * index], 1)
    assert bodies(store, "b") == [body_of(i) for i in range(1, 200, 2)]
    # What can be dead-lettered (reason corrupt): the fields, when they still add up without the CRC.
    salvaged = store.messages.salvage(victim)
    if field in ("crc", "body"):
        assert salvaged is not None and salvaged.body[:8] == body_of(2 * index)[:8]
    else:
        assert salvaged is None
    assert_append_works(store)
    store.close()
    store = reopen(tmp_path)  # the appended record is found after the damaged one
    good, damaged = readable(store, "a")
    assert good[-1] == b"after the damage" and damaged == 1
    store.close()
