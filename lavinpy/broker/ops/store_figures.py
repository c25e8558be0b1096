"""What the faces read of the store, through the model: the node's flush (fsync) timings.

The metrics face reports them; it reads them here so that no face imports the store.
"""

from __future__ import annotations

from ...store.sync_timing import FSYNC_BOUNDS, SYNC_TIMES

__all__ = ["FSYNC_BOUNDS", "fsync_times"]


def fsync_times() -> tuple[list[int], float]:
    """The flush-time histogram of every vhost's store: per-bucket counts (bounds FSYNC_BOUNDS, the
    last bucket +Inf; not cumulative) and the total seconds."""
    return SYNC_TIMES.snapshot()
