"""segment_counts: how many positions of a run lie in each segment, whatever the run's length and order;
packed_counts (a queue's run of acks: its entries packed and its segments counted, in one pass where
compiled) gives the same counts and array("Q", ...)'s bytes, with its errors."""

from __future__ import annotations

import random
from array import array
from collections import Counter

import pytest

from lavinpy.store.accel import cstore
from lavinpy.store.index_files import packed_counts, py_packed_counts, segment_counts
from lavinpy.wire.position import OFFSET_SHIFT, SEGMENT_MASK, make_pos


def positions(segments: list[int], rng: random.Random) -> list[int]:
    return [segment | (rng.randrange(1 << 20) << OFFSET_SHIFT) for segment in segments]


def test_counts_agree_with_a_counter_of_segment_ids() -> None:
    rng = random.Random(34)
    for n in (0, 1, 5, 16, 17, 40, 300, 5000):
        for layout in ("one", "two runs", "runs down", "a run again", "mixed", "last differs"):
            if layout == "one":
                segments = [9] * n
            elif layout == "two runs":
                segments = [9] * (n // 2) + [10] * (n - n // 2)
            elif layout == "runs down":
                segments = [12] * (n // 3) + [11] * (n // 3) + [2] * (n - 2 * (n // 3))
            elif layout == "a run again":
                segments = [3] * (n // 3) + [4] * (n // 3) + [3] * (n - 2 * (n // 3))
            elif layout == "mixed":
                segments = [rng.choice((1, 2, 3, 1 << 31)) for _ in range(n)]
            else:
                segments = [4] * (n - 1) + [5] if n else []
            entries = positions(segments, rng)
            want = dict(Counter(pos & SEGMENT_MASK for pos in entries))
            assert dict(segment_counts(array("Q", entries))) == want, (n, layout)
            assert dict(segment_counts(entries)) == want, (n, layout)
            for pack in (packed_counts, py_packed_counts):
                packed, counts = pack(entries)
                assert bytes(packed) == array("Q", entries).tobytes() and dict(counts) == want, (n, layout)


@pytest.mark.parametrize("size", [0, 1, 16, 17, 64, 65, 4096, 4097])
@pytest.mark.parametrize("segments", [1, 3])
def test_counts_per_segment_match_a_counter_of_the_segment_ids(size: int, segments: int) -> None:
    rng = random.Random(size * 10 + segments)
    positions = [make_pos(rng.randrange(7, 7 + segments), rng.randrange(1 << 30)) for _ in range(size)]
    expected = dict(Counter(pos & 0xFFFFFFFF for pos in positions))
    assert dict(segment_counts(positions)) == expected
    assert dict(segment_counts(array("Q", positions))) == expected


def test_a_batch_that_leaves_its_segment_only_at_the_end_is_counted_in_both() -> None:
    positions = [make_pos(2, 40 * i) for i in range(40)] + [make_pos(3, 0)]
    assert dict(segment_counts(positions)) == {2: 40, 3: 1}
    assert dict(segment_counts(array("Q", positions))) == {2: 40, 3: 1}


@pytest.mark.skipif(cstore is None, reason="the compiled store is not built")
@pytest.mark.parametrize("bad", [-1, 1 << 64, "x", None, 1.5])
def test_packed_counts_refuse_what_the_array_refuses(bad: object) -> None:
    entries = [make_pos(1, 8), bad, make_pos(2, 0)]
    with pytest.raises((TypeError, OverflowError)) as compiled:
        cstore.pack_counted(entries)
    with pytest.raises((TypeError, OverflowError)) as pure:
        py_packed_counts(entries)  # type: ignore[arg-type]
    assert compiled.type is pure.type
