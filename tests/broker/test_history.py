"""The sample history behind RabbitMQ's lengths_age/msg_rates_age: what a ring keeps, how points are
picked and shaped."""

from __future__ import annotations

import pytest

from lavinpy.broker.metrics.history import Window, append, length_details, new_ring, rate_details, summed
from lavinpy.broker.metrics.stats import FIELDS

ZERO = (0,) * len(FIELDS)


def _counts(**values: int) -> tuple[int, ...]:
    return tuple(values.get(name, 0) for name in FIELDS)


def test_an_idle_object_reuses_its_last_entry_and_the_ring_is_bounded() -> None:
    ring = new_ring(4)
    counts = _counts(publish=3)
    append(ring, counts, (3, 0))
    append(ring, _counts(publish=3), (3, 0))  # equal values, new tuples: the same entry again
    assert ring[0] is ring[1]
    append(ring, counts, (2, 1))  # lengths moved, counters not: the counters tuple is shared
    assert ring[2][0] is ring[0][0] and ring[2][1] == (2, 1)
    for _ in range(5):
        append(ring, counts, (0, 0))
    assert len(ring) == 4


def test_points_are_aligned_newest_first_and_stop_at_the_history() -> None:
    times = [10_000, 11_000, 12_000, 13_000, 14_000, 15_000]
    entries = [(ZERO, (n, 0)) for n in range(6)]  # depth n at tick n
    window = Window(age=10, incr=2)
    points = window.points(times, entries, now_ms=15_500)
    # 14000 -> the tick at 14000 (4), 12000 -> 2, 10000 -> 0; 8000 predates the history
    assert [(ts, e[1][0]) for ts, e in points] == [(14_000, 4), (12_000, 2), (10_000, 0)]
    # A younger object (three ticks) lines up with the newest ticks.
    young = entries[-3:]
    assert [e[1][0] for _, e in window.points(times, young, now_ms=15_500)] == [4]
    assert Window(age=0, incr=5).points(times, entries, now_ms=15_500) == [(15_000, entries[5])]
    assert window.points([], [], now_ms=15_500) == []


def test_window_parsing() -> None:
    assert Window.parse({}, "lengths") is None
    w = Window.parse({"lengths_age": "60", "lengths_incr": "5"}, "lengths")
    assert w is not None and (w.age, w.incr) == (60, 5)
    for bad in ({"lengths_age": "x"}, {"lengths_age": "60", "lengths_incr": "0"}, {"lengths_age": "-1"}):
        with pytest.raises(ValueError):
            Window.parse(bad, "lengths")


def test_details_have_rabbitmqs_shape() -> None:
    points = [(20_000, (_counts(publish=30, deliver=4, get=1), (5, 2))),
              (10_000, (_counts(publish=10, deliver=1), (1, 0)))]
    item: dict = {}
    length_details(item, points, [10_000, 20_000], [p[1] for p in reversed(points)])
    assert item["messages_details"]["samples"] == [{"sample": 7, "timestamp": 20_000},
                                                   {"sample": 1, "timestamp": 10_000}]
    assert item["messages_details"]["avg"] == 4.0 and item["messages_details"]["avg_rate"] == 0.6
    assert item["messages_ready_details"]["rate"] == 0.4  # (5 - 1) over the last 10 s
    stats = {"publish_details": {"rate": 2.0}, "deliver_get_details": {"rate": 0.4}, "other_details": {"rate": 1}}
    rate_details(stats, points, FIELDS)
    assert [s["sample"] for s in stats["publish_details"]["samples"]] == [30, 10]
    assert stats["publish_details"]["rate"] == 2.0 and stats["publish_details"]["avg_rate"] == 2.0
    assert [s["sample"] for s in stats["deliver_get_details"]["samples"]] == [5, 1]
    assert stats["other_details"] == {"rate": 1}  # not a counter: left as it was


def test_summed_rings_line_up_at_the_newest_tick() -> None:
    old, young = new_ring(), new_ring()
    for n in range(3):
        append(old, _counts(publish=n), (n, 0))
    append(young, _counts(publish=10), (10, 1))
    total = summed([old, young])
    assert [e[1] for e in total] == [(0, 0), (1, 0), (12, 1)]
    assert total[-1][0][FIELDS.index("publish")] == 12
    assert summed([]) == []
