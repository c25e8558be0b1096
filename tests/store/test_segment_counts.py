"""segment_counts: how many positions of a batch are in each segment, for lists and arrays of any size."""

from __future__ import annotations

import random
from array import array
from collections import Counter

import pytest

from lavinpy.store.index_files import segment_counts
from lavinpy.wire.position import make_pos


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
