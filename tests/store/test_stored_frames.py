"""A classic queue run's deliver frames written straight from a segment (``stored_frames``, compiled in
_cstore_frames.c, and its pure twin ``py_stored_frames``) give the bytes of reading the records and framing
them with the codec's ``deliver_run`` (each delivery's redelivered flag included), and stop at the first
record that way cannot take: another segment, a large record, a damaged one, names that are not UTF-8;
empty bodies and bodies of several frames are framed as the codec frames them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lavinpy.store import stamped_frames as sf
from lavinpy.store.accel import cstore
from lavinpy.store.message_store import LARGE_BODY, MessageStore
from lavinpy.store.segment import DATA_START
from lavinpy.wire import writer
from lavinpy.wire.position import SEGMENT_MASK
from tests.store.test_stamped_frames import fill, patch_record
from tests.wire.test_deliver_stamped import BLOCKS, FRAME_MAX

PATHS = [pytest.param(sf.py_stored_frames, id="pure")]
if cstore is not None:
    PATHS.append(pytest.param(cstore.stored_frames, id="compiled"))


def general_way(store: MessageStore, positions: list[int], tag: str, first_tag: int,
                redelivered: list[bool] | None) -> bytes:
    """What the broker sends for these records without the compiled frames: read, then framed."""
    return b"".join(writer.deliver_run_py(5, tag, first_tag, redelivered, store.read_many(positions), FRAME_MAX))


def frames(stored_frames: object, store: MessageStore, positions: list[int], start: int, tag: str, first_tag: int,
           redelivered: list[bool] | None) -> tuple[bytes, int, int, int]:
    segment, end = store.readable(positions[start] & SEGMENT_MASK)  # type: ignore[misc]
    return stored_frames(segment.view, positions, start, positions[start] & SEGMENT_MASK,  # type: ignore[operator]
                         DATA_START, end, segment.size, 5, tag, first_tag, redelivered, FRAME_MAX)


@pytest.mark.parametrize("stored_frames", PATHS)
@pytest.mark.parametrize("seed", range(3))
def test_frames_match_reading_then_framing(tmp_path: Path, stored_frames: object, seed: int) -> None:
    store = MessageStore(tmp_path, 64 * 1024)  # small segments: runs stop at their ends
    store.open()
    positions = fill(store, 400, seed)
    rng = random.Random(seed)
    rng.shuffle(positions)  # a queue's run may go back and forth between segments (requeued messages)
    positions.sort(key=lambda pos: (pos & SEGMENT_MASK, rng.random() < 0.2))
    taken_any = 0
    for _ in range(60):
        start = rng.randrange(len(positions))
        first_tag = rng.choice([1, 77, 2**40])
        redelivered = rng.choice([None, [rng.random() < 0.3 for _ in positions]])
        chunk, count, first_size, last_size = frames(stored_frames, store, positions, start, "ctag", first_tag,
                                                     redelivered)
        segment = positions[start] & SEGMENT_MASK
        same = next((k for k, pos in enumerate(positions[start:]) if pos & SEGMENT_MASK != segment),
                    len(positions) - start)
        assert count == same  # every record sound and small: the run ends at its segment's end
        run = positions[start:start + count]
        flags = None if redelivered is None else redelivered[start:start + count]
        assert chunk == general_way(store, run, "ctag", first_tag, flags)
        bodies = [len(m.body) for m in store.read_many(run)]
        assert (first_size, last_size) == ((bodies[0], bodies[-1]) if bodies else (0, 0))
        taken_any += count
    assert taken_any
    store.close()


@pytest.mark.parametrize("stored_frames", PATHS)
def test_a_run_stops_before_what_the_general_read_reports(tmp_path: Path, stored_frames: object) -> None:
    store = MessageStore(tmp_path, 1 << 20)
    store.open()
    block = BLOCKS[1]
    positions = [store.append("ex", "rk", block, b"m%d" % i, i) for i in range(10)]
    positions.append(store.append("ex", "rk", block, b"z" * LARGE_BODY, 10))  # read in place, not here
    positions += [store.append("ex", "rk", block, b"m%d" % i, i) for i in range(11, 14)]
    patch_record(store, positions[3], 9, 0xFF, fix_crc=True)  # the exchange name: not UTF-8, CRC sound
    patch_record(store, positions[6], 25, 0x00, fix_crc=False)  # its body's first byte: fails its CRC
    flags = [i % 2 == 1 for i in range(len(positions))]
    assert frames(stored_frames, store, positions, 0, "c", 1, flags)[1] == 3
    assert frames(stored_frames, store, positions, 4, "c", 1, flags)[1] == 2
    assert frames(stored_frames, store, positions, 7, "c", 1, None)[1] == 3  # up to the large one
    assert frames(stored_frames, store, positions, 11, "c", 1, flags)[1] == 3
    assert frames(stored_frames, store, positions, 0, "t" * 256, 1, None)[1] == 0  # no shortstr
    chunk = frames(stored_frames, store, positions, 11, "t" * 255, 9, flags)[0]
    assert chunk == general_way(store, positions[11:], "t" * 255, 9, flags[11:])
    with pytest.raises(TypeError):  # the flags are the positions' own
        frames(stored_frames, store, positions, 0, "c", 1, flags[1:])
    store.close()


def test_segment_stored_frames_frames_nothing_without_the_compiled_call(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store = MessageStore(tmp_path, 1 << 20)
    store.open()
    positions = [store.append("ex", "rk", BLOCKS[0], b"m%d" % i, i) for i in range(5)]
    flags = [False, True, False, False, True]
    got = sf.segment_stored_frames(store, positions, 1, 5, "c", 7, flags, FRAME_MAX)
    if sf.STORED_FRAMES_COMPILED:
        assert got[0] == general_way(store, positions[1:], "c", 7, flags[1:]) and got[1:] == (4, 2, 2)
    else:
        assert got == (b"", 0, 0, 0)
    monkeypatch.setattr(sf, "_stored_frames", None)
    assert sf.segment_stored_frames(store, positions, 0, 5, "c", 1, None, FRAME_MAX)[1] == 0
    store.close()
