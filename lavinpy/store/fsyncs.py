"""Several files fsynced at once: one journal commit can then cover them all, where one after the
other costs a commit each on ext4 and the like (bench/history.md, issue 31: a leader's flush of a
segment and an index file 0.54-0.65 ms at once against 1.0-1.9 ms one after the other).

``fsync_all`` uses the compiled store's C threads where it is built (no future, wake-up and GIL round
trip per file), ``pool_fsync_all`` a Python thread pool otherwise; both return each descriptor's errno.
"""

from __future__ import annotations

import errno
import os
from concurrent.futures import ThreadPoolExecutor, wait

from lavinpy.store.accel import cstore

_FSYNCS = ThreadPoolExecutor(4, thread_name_prefix="lavinpy-fsync")  # without the compiled store
FSYNC_ALL_MAX = 64  # the compiled fsync_all's limit


def pool_fsync_all(fds: list[int]) -> list[int]:
    """``os.fsync`` each descriptor at once from a thread pool; their errno values (0: synced). Every
    fsync runs, whatever the others' outcome, before any descriptor may be closed."""
    futures = [_FSYNCS.submit(os.fsync, fd) for fd in fds]
    wait(futures)
    errors = []
    for future in futures:
        exc = future.exception()
        if exc is not None and not isinstance(exc, OSError):
            raise exc
        errors.append(0 if exc is None else exc.errno or errno.EIO)
    return errors


def fsync_all(fds: list[int]) -> list[int]:
    """``pool_fsync_all`` from C threads without the GIL where the compiled store is built (more than
    FSYNC_ALL_MAX descriptors, e.g. a flush over many queues: that many at a time)."""
    if cstore is None:
        return pool_fsync_all(fds)
    errors: list[int] = []
    for start in range(0, len(fds), FSYNC_ALL_MAX):
        errors.extend(cstore.fsync_all(fds[start:start + FSYNC_ALL_MAX]))
    return errors


def fsync_together(fds: list[int]) -> None:
    """fsync ``fds`` at once (one alone in this thread); raises OSError for the first that failed,
    after all have run."""
    if len(fds) == 1:
        os.fsync(fds[0])
        return
    for err in fsync_all(fds):
        if err:
            raise OSError(err, os.strerror(err))
