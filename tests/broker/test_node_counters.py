"""NodeCounters: the message-size histogram gives the same counts by run as one message at a time."""

from __future__ import annotations

from lavinpy.broker.stats import MESSAGE_SIZE_BOUNDS, NodeCounters


class _Body:
    """Stands in for a body of ``size`` bytes without allocating them (only its length is read)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def test_run_of_mixed_sizes_counts_as_single_observations():
    sizes = [0, 100, 101, 1_000, 1_001, 99_999, 100_000_000, 100_000_001, 5]
    one_by_one, by_run = NodeCounters(), NodeCounters()
    for size in sizes:
        one_by_one.observe_size(size)
    by_run.observe_sizes([_Body(size) for size in sizes])  # type: ignore[misc]
    assert by_run.size_buckets == one_by_one.size_buckets
    assert by_run.size_sum == one_by_one.size_sum == sum(sizes)
    # A bound belongs to its own bucket (le: less than or equal), as in RabbitMQ's histogram.
    assert one_by_one.size_buckets == [3, 2, 1, 1, 0, 0, 0, 1, 1]
    assert len(one_by_one.size_buckets) == len(MESSAGE_SIZE_BOUNDS) + 1


def test_run_of_one_size_adds_once_to_its_bucket():
    counters = NodeCounters()
    counters.observe_sizes([b"y" * 500] * 7)
    assert counters.size_buckets[1] == 7 and sum(counters.size_buckets) == 7
    assert counters.size_sum == 3_500
