"""How long the store's flushes spend in fsync: a node-wide histogram read by the metrics.

One observation per flush (the message segments' and the index files' fdatasync, fsync without the
compiled store), taken when the flush's sync is done: a few hundred a second at most, so a lock
costs nothing that matters and keeps the counts exact when several vhosts flush at once.
"""

from __future__ import annotations

import threading
from bisect import bisect_left

# Upper bounds in seconds: from a fast NVMe flush (well under a millisecond) to a stalled disk.
FSYNC_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class SyncTimes:
    """Per-bucket counts (not cumulative; the last is +Inf) and the total time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.buckets = [0] * (len(FSYNC_BOUNDS) + 1)
        self.total_seconds = 0.0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.buckets[bisect_left(FSYNC_BOUNDS, seconds)] += 1
            self.total_seconds += seconds

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self.buckets), self.total_seconds


# The node's flushes; a module-level object because every vhost's store adds to one family.
SYNC_TIMES = SyncTimes()
