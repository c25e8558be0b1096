"""A stream run's deliver frames written straight from a segment (``stamped_frames``, compiled in
_cstore_frames.c, and its pure twin) give the bytes of reading the records and framing them with the
codec's stamped framing, and stop at the first record that way cannot take: another segment, a large
record, a damaged one, names that are not UTF-8, a block without a splice; empty bodies and bodies of
several frames are framed as the codec frames them."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest

from lavinpy.broker.queues import stream_stamps
from lavinpy.store import stamped_frames as sf
from lavinpy.store.accel import cstore
from lavinpy.store.message_store import LARGE_BODY, MessageStore
from lavinpy.store.segment import DATA_START
from lavinpy.wire import writer
from lavinpy.wire.position import OFFSET_SHIFT, SEGMENT_MASK
from tests.wire.test_deliver_stamped import BLOCKS, FRAME_MAX  # the same blocks as the codec's stamped framing

PATHS = [pytest.param(sf.py_stamped_frames, id="pure")]
if cstore is not None:
    PATHS.append(pytest.param(cstore.stamped_frames, id="compiled"))


def fill(store: MessageStore, count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    positions = []
    for i in range(count):
        body = rng.choice([b"", b"x" * (FRAME_MAX - 8), b"y" * (FRAME_MAX - 7), b"z" * (3 * FRAME_MAX),
                           rng.randbytes(rng.choice([1, 9, 300]))])
        positions.append(store.append(rng.choice(["", "amq.direct", "ex\u00e9"]), rng.choice(["a", f"k{i % 3}"]),
                                      BLOCKS[rng.randrange(len(BLOCKS))], body, 1000 + i))
    return positions


def general_way(store: MessageStore, positions: list[int], tag: str, first_tag: int, first_offset: int) -> bytes:
    """What the broker sends for these records without the compiled frames: read, then stamped and framed."""
    stamped = stream_stamps.stamped_run(store.read_many(positions), first_offset)
    return b"".join(writer.deliver_run_py(5, tag, first_tag, None, stamped, FRAME_MAX))


def taken(store: MessageStore, positions: list[int], start: int, splices: dict) -> int:
    """How many from ``start`` the frames take, said independently of both twins."""
    segment = positions[start] & SEGMENT_MASK
    n = 0
    for pos in positions[start:]:
        msg = store.read(pos)
        if pos & SEGMENT_MASK != segment or msg.properties not in splices:
            break
        n += 1
    return n


def frames(stamped_frames: object, store: MessageStore, positions: list[int], start: int, tag: str, first_tag: int,
           first_offset: int, splices: dict) -> tuple[bytes, int, int, int]:
    segment, end = store.readable(positions[start] & SEGMENT_MASK)  # type: ignore[misc]
    return stamped_frames(segment.view, positions, start, positions[start] & SEGMENT_MASK,  # type: ignore[operator]
                          DATA_START, end, segment.size, 5, tag, first_tag, first_offset, FRAME_MAX, splices)


@pytest.mark.parametrize("stamped_frames", PATHS)
@pytest.mark.parametrize("seed", range(3))
def test_frames_match_reading_then_framing(tmp_path: Path, stamped_frames: object, seed: int) -> None:
    store = MessageStore(tmp_path, 64 * 1024)  # small segments: runs stop at their ends
    store.open()
    positions = fill(store, 400, seed)
    stream_stamps._SPLICES.clear()
    stream_stamps.stamped_run(store.read_many(positions[:1]), 1)  # one block's splice only, at first
    rng = random.Random(seed)
    for round_ in range(60):
        if round_ == 30:
            stream_stamps.stamped_run(store.read_many(positions), 1)  # now every block's
        start = rng.randrange(len(positions))
        first_tag, first_offset = rng.choice([1, 77, 2**40]), rng.choice([1, 2**62, -5])
        chunk, count, first_size, last_size = frames(stamped_frames, store, positions, start, "ctag", first_tag,
                                                     first_offset, stream_stamps._SPLICES)
        assert count == taken(store, positions, start, stream_stamps._SPLICES)
        run = positions[start:start + count]
        assert chunk == general_way(store, run, "ctag", first_tag, first_offset)
        bodies = [len(m.body) for m in store.read_many(run)]
        assert (first_size, last_size) == ((bodies[0], bodies[-1]) if bodies else (0, 0))
    assert any(frames(stamped_frames, store, positions, i, "ctag", 1, 1, stream_stamps._SPLICES)[1]
               for i in range(0, len(positions), 7))
    store.close()


def patch_record(store: MessageStore, pos: int, at: int, value: int, fix_crc: bool) -> None:
    """Byte ``at`` of the record's payload set to ``value``, its CRC fixed or left stale."""
    segment = store.readable(pos & SEGMENT_MASK)[0]  # type: ignore[index]
    offset = pos >> OFFSET_SHIFT
    length = int.from_bytes(segment.mm[offset:offset + 4], "little")
    segment.mm[offset + 8 + at] = value
    if fix_crc:
        segment.mm[offset + 4:offset + 8] = zlib.crc32(segment.mm[offset + 8:offset + 8 + length]).to_bytes(4, "little")


@pytest.mark.parametrize("stamped_frames", PATHS)
def test_a_run_stops_before_what_the_general_read_reports(tmp_path: Path, stamped_frames: object) -> None:
    store = MessageStore(tmp_path, 1 << 20)
    store.open()
    block = BLOCKS[0]
    positions = [store.append("ex", "rk", block, b"m%d" % i, i) for i in range(10)]
    positions.append(store.append("ex", "rk", block, b"z" * LARGE_BODY, 10))  # read in place, not here
    positions += [store.append("ex", "rk", block, b"m%d" % i, i) for i in range(11, 14)]
    stream_stamps._SPLICES.clear()
    stream_stamps.stamped_run(store.read_many(positions[:1]), 1)
    splices = stream_stamps._SPLICES
    patch_record(store, positions[3], 9, 0xFF, fix_crc=True)  # the exchange name: not UTF-8, CRC sound
    patch_record(store, positions[6], 25, 0x00, fix_crc=False)  # its body's first byte: fails its CRC
    assert frames(stamped_frames, store, positions, 0, "c", 1, 1, splices)[1] == 3
    assert frames(stamped_frames, store, positions, 4, "c", 1, 1, splices)[1] == 2
    assert frames(stamped_frames, store, positions, 7, "c", 1, 1, splices)[1] == 3  # up to the large one
    assert frames(stamped_frames, store, positions, 11, "c", 1, 1, splices)[1] == 3
    assert frames(stamped_frames, store, positions, 0, "t" * 256, 1, 1, splices)[1] == 0  # no shortstr
    chunk = frames(stamped_frames, store, positions, 11, "t" * 255, 9, 12, splices)[0]
    assert chunk == general_way(store, positions[11:], "t" * 255, 9, 12)
    store.close()


def test_segment_frames_frames_nothing_without_the_compiled_call(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = MessageStore(tmp_path, 1 << 20)
    store.open()
    positions = [store.append("ex", "rk", BLOCKS[0], b"m%d" % i, i) for i in range(5)]
    stream_stamps._SPLICES.clear()
    stream_stamps.stamped_run(store.read_many(positions[:1]), 1)
    got = sf.segment_frames(store, positions, 5, "c", 1, 1, FRAME_MAX, stream_stamps._SPLICES)
    if sf.FRAMES_COMPILED:
        assert got[0] == general_way(store, positions, "c", 1, 1) and got[1:] == (5, 2, 2)
    else:
        assert got == (b"", 0, 0, 0)
    monkeypatch.setattr(sf, "_stamped_frames", None)
    assert sf.segment_frames(store, positions, 5, "c", 1, 1, FRAME_MAX, stream_stamps._SPLICES)[1] == 0
    store.close()
