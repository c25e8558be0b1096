"""Segment files: creation, schema check, torn-tail recovery and the cheap data end."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from lavinpy.store.record import read_record, write_record
from lavinpy.store.segment import DATA_START, SCHEMA_VERSION, Segment, SegmentError, segment_name

SIZE = 64 * 1024


def fill(segment: Segment, bodies: list[bytes]) -> list[int]:
    """Append records back to back from the data start; returns their offsets."""
    offsets = []
    pos = DATA_START
    for body in bodies:
        offsets.append(pos)
        pos += write_record(segment.mm, pos, b"ex", b"rk", b"\x00\x00", body, 1234)
    return offsets


def end_of(segment: Segment, offset: int) -> int:
    return offset + read_record(segment.view, offset, segment.size)[1]


def test_create_writes_header_at_full_size(tmp_path: Path) -> None:
    segment = Segment.create(tmp_path, 1, SIZE)
    path = tmp_path / "msgs.0000000001"
    assert segment.path == path and segment.id == 1 and segment.size == SIZE
    assert path.stat().st_size == SIZE
    assert struct.unpack("<I", path.read_bytes()[:4])[0] == SCHEMA_VERSION
    assert segment.scan_write_position() == DATA_START
    assert segment.data_end() == DATA_START
    with pytest.raises(FileExistsError):
        Segment.create(tmp_path, 1, SIZE)
    segment.close()
    assert segment_name(12) == "msgs.0000000012"


def test_open_sees_written_records(tmp_path: Path) -> None:
    segment = Segment.create(tmp_path, 3, SIZE)
    offsets = fill(segment, [b"a" * 10, b"b" * 100, b""])
    end = end_of(segment, offsets[-1])
    segment.sync(DATA_START, end)
    segment.close()
    reopened = Segment.open(tmp_path, 3)
    assert reopened.scan_write_position() == end
    # The last record ends in zero bytes (empty body, size 0): data_end() is past every record start.
    assert offsets[-1] < reopened.data_end() <= end
    assert read_record(reopened.view, offsets[1], reopened.size)[0].body == b"b" * 100
    reopened.close()


def test_open_refuses_wrong_schema_and_short_files(tmp_path: Path) -> None:
    (tmp_path / segment_name(1)).write_bytes(struct.pack("<I", 7) + bytes(100))
    with pytest.raises(SegmentError, match="schema version 7"):
        Segment.open(tmp_path, 1)
    (tmp_path / segment_name(2)).write_bytes(b"\x01\x00")
    with pytest.raises(SegmentError, match="shorter"):
        Segment.open(tmp_path, 2)


def test_zero_tail_is_normal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    segment = Segment.create(tmp_path, 1, SIZE)
    offsets = fill(segment, [b"x" * 40] * 5)
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        assert segment.scan_write_position() == end_of(segment, offsets[-1])
    assert not caplog.records


@pytest.mark.parametrize("damage", ["zero_last_bytes", "garble_last_bytes", "length_past_file"])
def test_torn_last_record_is_cut_and_zeroed(tmp_path: Path, damage: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    segment = Segment.create(tmp_path, 1, SIZE)
    offsets = fill(segment, [b"x" * 40, b"y" * 40, b"z" * 300])
    last = offsets[-1]
    last_end = end_of(segment, last)
    if damage == "zero_last_bytes":
        segment.mm[last_end - 100:last_end] = bytes(100)
    elif damage == "garble_last_bytes":
        segment.mm[last_end - 3:last_end] = b"\xde\xad\xbe"
    else:
        struct.pack_into("<I", segment.mm, last, SIZE)
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        assert segment.scan_write_position() == last
    assert "discarded" in caplog.text
    assert segment.mm[last:last_end] == bytes(last_end - last)
    assert segment.data_end() == last
    # The earlier records are untouched, and a second scan finds a clean tail.
    assert read_record(segment.view, offsets[1], segment.size)[0].body == b"y" * 40
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        assert segment.scan_write_position() == last
    assert not caplog.records
    segment.close()


def test_partial_payload_without_header_is_zeroed(tmp_path: Path) -> None:
    # The writer puts the header last: a kill mid-record leaves payload bytes behind a zero length.
    segment = Segment.create(tmp_path, 1, SIZE)
    offsets = fill(segment, [b"a" * 20, b"b" * 500])
    last_end = end_of(segment, offsets[-1])
    segment.mm[offsets[-1]:offsets[-1] + 8] = bytes(8)
    assert segment.scan_write_position() == offsets[-1]
    assert segment.mm[offsets[-1]:last_end] == bytes(last_end - offsets[-1])


def test_corrupt_record_in_the_middle_is_not_a_tail(tmp_path: Path) -> None:
    segment = Segment.create(tmp_path, 1, SIZE)
    offsets = fill(segment, [b"a" * 20, b"b" * 20, b"c" * 20])
    segment.mm[offsets[1] + 20] ^= 0xFF
    # The record after the damaged one is intact, so the data goes on; the reader reports the damage.
    assert segment.scan_write_position() == end_of(segment, offsets[2])
    assert segment.mm[offsets[1] + 20] != 0


def test_data_end_is_after_last_nonzero_byte(tmp_path: Path) -> None:
    segment = Segment.create(tmp_path, 1, 1024 * 1024)
    assert segment.data_end() == DATA_START
    for where in (DATA_START, 5000, 65535, 65536, 65537, 300_001, 1024 * 1024 - 1):
        segment.mm[where] = 1
        assert segment.data_end() == where + 1
    segment.close()


def test_full_segment_scan(tmp_path: Path) -> None:
    segment = Segment.create(tmp_path, 1, 4096)
    pos = DATA_START
    count = 0
    while pos + 100 <= segment.size:
        pos += write_record(segment.mm, pos, b"", b"q", b"\x00\x00", b"." * 40, 0)
        count += 1
    assert count > 10
    assert segment.scan_write_position() == pos


def test_sync_unaligned_range_and_delete(tmp_path: Path) -> None:
    segment = Segment.create(tmp_path, 9, 3 * 1024 * 1024)
    segment.mm[70000:70010] = b"0123456789"
    segment.sync(70001, 70005)
    segment.sync(3 * 1024 * 1024 - 3, 3 * 1024 * 1024)
    segment.sync(10, 10)  # empty range: nothing to do
    segment.delete()
    assert not segment.path.exists()
    assert segment.closed
    segment.sync(0, 100)  # closed: a no-op, not an error
    segment.close()  # idempotent


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_unmapped_before_unlink(tmp_path: Path) -> None:
    segment = Segment.create(tmp_path, 1, SIZE)
    assert str(segment.path) in Path("/proc/self/maps").read_text()
    segment.delete()
    # A deleted file that is still mapped would show up here as "(deleted)" and keep its disk space.
    assert str(segment.path) not in Path("/proc/self/maps").read_text()
