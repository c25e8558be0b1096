"""NodeCounters: the message-size histogram gives the same counts by run (measured here or reported by
the store's run write) as one message at a time."""

from __future__ import annotations

import random

from lavinpy.broker.metrics.stats import MESSAGE_SIZE_BOUNDS, NodeCounters
from tests.helpers import make_store


class _Body:
    """Stands in for a body of ``size`` bytes without allocating them (only its length is read)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def _observe(counters: NodeCounters, bodies: list) -> None:
    """A run counted as the store's run write reports it: total, smallest and largest size."""
    sizes = [len(body) for body in bodies]
    counters.observe_run(bodies, 0, len(bodies), sum(sizes), min(sizes), max(sizes))


def test_run_of_mixed_sizes_counts_as_single_observations():
    sizes = [0, 100, 101, 1_000, 1_001, 99_999, 100_000_000, 100_000_001, 5]
    one_by_one, by_run = NodeCounters(), NodeCounters()
    for size in sizes:
        one_by_one.observe_size(size)
    _observe(by_run, [_Body(size) for size in sizes])
    assert by_run.size_buckets == one_by_one.size_buckets
    assert by_run.size_sum == one_by_one.size_sum == sum(sizes)
    # A bound belongs to its own bucket (le: less than or equal), as in RabbitMQ's histogram.
    assert one_by_one.size_buckets == [3, 2, 1, 1, 0, 0, 0, 1, 1]
    assert len(one_by_one.size_buckets) == len(MESSAGE_SIZE_BOUNDS) + 1


def test_run_of_one_size_adds_once_to_its_bucket():
    counters = NodeCounters()
    _observe(counters, [b"y" * 500] * 7)
    assert counters.size_buckets[1] == 7 and sum(counters.size_buckets) == 7
    assert counters.size_sum == 3_500


def test_runs_written_across_segments_count_as_single_observations(tmp_path):
    # The store's run write reports each piece's total, smallest and largest body (a piece per
    # segment: the small segments force several); counting from those equals counting each body.
    rng = random.Random(7)
    store = make_store(tmp_path, segment_size=4096, fsync="never")
    by_write, one_by_one = NodeCounters(), NodeCounters()
    try:
        runs = ([16] * 300, [150] * 40, [0, 100, 101, 999, 1_000, 1_001, 5],
                [rng.randrange(2_500) for _ in range(60)], [10_001] * 3)
        for sizes in runs:
            bodies = [b"b" * size for size in sizes]
            start = pieces = 0
            while start < len(bodies):
                done, positions, total, smallest, largest = store.messages.append_run("", "q", b"\x00\x00", bodies,
                                                                                      start, 1)
                assert len(positions) == done - start
                by_write.observe_run(bodies, start, done, total, smallest, largest)
                start, pieces = done, pieces + 1
            for size in sizes:
                one_by_one.observe_size(size)
            assert pieces > 1 or len(sizes) < 10
            assert by_write.size_buckets == one_by_one.size_buckets
            assert by_write.size_sum == one_by_one.size_sum
    finally:
        store.close()
