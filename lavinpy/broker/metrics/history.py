"""Sample history: what the stats sampler saw on its last ticks, kept so a page load can draw the
last minutes at once (RabbitMQ's ``lengths_age``/``msg_rates_age`` query parameters).

One ring per queue, vhost and the node; each entry is one tick's ``(counters, lengths)`` pair.
The tick times live once in the sampler (every object is sampled on every tick, so the i-th newest
entry of any ring belongs to the i-th newest tick). An idle object appends the very tuple it
appended last time, so its ring costs a pointer per tick, not a new tuple.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

# Ten minutes of 5-second ticks (RabbitMQ's default retention for object samples).
HISTORY_TICKS = 121
# At most this many points per series in one reply (an age/incr pair asking for more is cut).
MAX_POINTS = 1000

Entry = tuple[tuple[int, ...], tuple[int, int]]
Ring = deque  # deque[Entry]


def new_ring(ticks: int = HISTORY_TICKS) -> Ring:
    return deque(maxlen=ticks)


def append(ring: Ring, counts: tuple[int, ...], lengths: tuple[int, int]) -> None:
    """One tick of an object; reuses the last entry when nothing changed since."""
    if ring:
        last = ring[-1]
        if last[0] is counts or last[0] == counts:
            if last[1] == lengths:
                ring.append(last)
                return
            counts = last[0]
        elif last[1] == lengths:
            lengths = last[1]
    ring.append((counts, lengths))


def summed(rings: Sequence[Ring]) -> list[Entry]:
    """Several objects' rings added tick by tick, newest aligned (a user who sees some vhosts only)."""
    if not rings:
        return []
    depth = max(len(r) for r in rings)
    out: list[Entry] = []
    for back in range(depth, 0, -1):
        parts = [r[-back] for r in rings if len(r) >= back]
        counts = tuple(sum(column) for column in zip(*(p[0] for p in parts), strict=True))
        lengths = (sum(p[1][0] for p in parts), sum(p[1][1] for p in parts))
        out.append((counts, lengths))
    return out


class Window:
    """The ``age``/``incr`` pair of one query (seconds), as RabbitMQ's management API reads it."""

    __slots__ = ("age", "incr")

    def __init__(self, age: int, incr: int) -> None:
        self.age, self.incr = age, incr

    @classmethod
    def parse(cls, query: Mapping[str, str], prefix: str) -> Window | None:
        """``<prefix>_age`` and ``<prefix>_incr`` from the query; None when absent. ValueError when bad."""
        age, incr = query.get(prefix + "_age"), query.get(prefix + "_incr")
        if age is None:
            return None
        try:
            window = cls(int(age), int(incr) if incr is not None else 5)
        except ValueError:
            raise ValueError(f"{prefix}_age and {prefix}_incr must be whole seconds") from None
        if window.age < 0 or window.incr < 1:
            raise ValueError(f"{prefix}_age must be >= 0 and {prefix}_incr >= 1")
        return window

    def points(self, times: Sequence[int], entries: Sequence[Entry], now_ms: int) -> list[tuple[int, Entry]]:
        """(timestamp, entry) newest first, one every ``incr`` seconds over the last ``age``: each
        point takes the newest tick at or before its time. Points older than the history are left out."""
        incr_ms = self.incr * 1000
        n = min(len(entries), len(times))
        # deques cannot be sliced: walk back from the newest tick of each by offset
        t_base, e_base = len(times) - n, len(entries) - n
        target = now_ms - now_ms % incr_ms  # aligned to incr, as RabbitMQ's timestamps are
        oldest = target - self.age * 1000  # age/incr + 1 points when the history reaches back so far
        out: list[tuple[int, Entry]] = []
        i = n - 1
        while i >= 0 and target >= oldest and len(out) < MAX_POINTS:
            while i >= 0 and times[t_base + i] > target:
                i -= 1
            if i < 0:
                break
            out.append((target, entries[e_base + i]))
            target -= incr_ms
        return out


def _details(points: list[tuple[int, int]], rate: float) -> dict[str, Any]:
    """RabbitMQ's ``*_details`` with samples: the current rate, the samples newest first, their mean
    value and the mean rate across them."""
    samples = [{"sample": value, "timestamp": ts} for ts, value in points]
    if len(points) > 1:
        span = (points[0][0] - points[-1][0]) / 1000
        avg_rate = round((points[0][1] - points[-1][1]) / span, 1) if span else 0.0
    else:
        avg_rate = 0.0
    avg = round(sum(v for _, v in points) / len(points), 1) if points else 0.0
    return {"rate": rate, "samples": samples, "avg_rate": avg_rate, "avg": avg}


def length_details(item: dict[str, Any], points: list[tuple[int, Entry]], times: Sequence[int],
                   entries: Sequence[Entry]) -> None:
    """Add ``messages_details``, ``messages_ready_details``, ``messages_unacknowledged_details``
    with samples to a queue, vhost or overview's ``queue_totals``; a rate the reply lacks is the
    change between the last two ticks."""
    for name, pick in (("messages", lambda e: e[1][0] + e[1][1]), ("messages_ready", lambda e: e[1][0]),
                       ("messages_unacknowledged", lambda e: e[1][1])):
        series = [(ts, pick(e)) for ts, e in points]
        rate = (item.get(name + "_details") or {}).get("rate")
        if rate is None:
            rate = 0.0
            if len(entries) > 1 and len(times) > 1 and times[-1] > times[-2]:
                rate = round((pick(entries[-1]) - pick(entries[-2])) * 1000 / (times[-1] - times[-2]), 1)
        item[name + "_details"] = _details(series, rate)


def rate_details(stats: dict[str, Any], points: list[tuple[int, Entry]], fields: Sequence[str]) -> None:
    """Add samples (cumulative counts, as RabbitMQ's) to each ``<field>_details`` of a
    ``message_stats`` object; ``deliver_get`` is the sum of its four parts."""
    index = {name: i for i, name in enumerate(fields)}
    parts = [index[n] for n in ("deliver", "deliver_no_ack", "get", "get_no_ack")]
    for key in list(stats):
        if not key.endswith("_details"):
            continue
        name = key[:-len("_details")]
        if name == "deliver_get":
            series = [(ts, sum(e[0][i] for i in parts)) for ts, e in points]
        elif name in index:
            series = [(ts, e[0][index[name]]) for ts, e in points]
        else:
            continue
        stats[key] = _details(series, stats[key].get("rate", 0.0))
