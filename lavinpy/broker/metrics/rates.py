"""Rates of counters read on demand, for figures no periodic sampler visits (a connection's bytes, a
vhost's queue lengths): the management API shows each with ``<name>_details: {"rate": r}``.

The rate is the change since a reference sample at least ``WINDOW`` seconds old (or since the first
sample, while there is none that old), so polling more often than RabbitMQ's 5 s does not turn
every reading into 0 or noise. Nothing runs between readings: idle connections cost nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

WINDOW = 5.0  # seconds, RabbitMQ's default collect_statistics_interval


class WindowRates:
    __slots__ = ("_older", "_newer")

    def __init__(self, values: Sequence[float] = (), now: float | None = None) -> None:
        start = (time.monotonic() if now is None else now, tuple(values))
        # (time, values) of two samples: rates are read against the older one.
        self._older: tuple[float, tuple[float, ...]] | None = start if values else None
        self._newer: tuple[float, tuple[float, ...]] | None = self._older

    def read(self, values: Sequence[float], now: float | None = None) -> list[float]:
        """Per-second rates of ``values`` (in order); 0.0 on the first reading of a new series."""
        now = time.monotonic() if now is None else now
        current = tuple(values)
        if self._older is None or self._newer is None or len(self._older[1]) != len(current):
            self._older = self._newer = (now, current)
            return [0.0] * len(current)
        if now - self._newer[0] >= WINDOW:
            self._older, self._newer = self._newer, (now, current)
        at, base = self._older
        elapsed = now - at
        if elapsed <= 0:
            return [0.0] * len(current)
        return [round((c - b) / elapsed, 1) for c, b in zip(current, base, strict=True)]
