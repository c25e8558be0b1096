"""Several files fsynced at once: one journal commit can then cover them all, where one after the
other costs a commit each on ext4 and the like (bench/history.md, issue 31: a leader's flush of a
segment and an index file 0.54-0.65 ms at once against 1.0-1.9 ms one after the other).

``fsync_all`` uses the compiled store's C threads where it is built (no future, wake-up and GIL round
trip per file), ``pool_fsync_all`` a Python thread pool otherwise; both return each descriptor's errno.
``LoopFsyncs`` starts them from the event loop thread and returns at once (compiled store only): C
workers sync without the GIL and an eventfd the loop watches says when they are done, so that no
Python thread stands between a group commit and the disk (bench/history.md, issue 31: a Python
worker waits for a core and then for the GIL held by the busy loop thread, twice a flush).

The compiled paths call fdatasync for a regular file (``data_sync`` in _cstore.h; fsync for a
directory): its name is made durable on its own, and fdatasync puts its bytes, size and block
allocation on disk as fsync does, without the timestamps that the loop's writes into the same
segment during the sync keep changing. The thread pool (no compiled store) calls ``os.fsync``, which the fault tests
replace: the same durability, a little more journal work.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from lavinpy.store.accel import cstore

_FSYNCS = ThreadPoolExecutor(4, thread_name_prefix="lavinpy-fsync")  # without the compiled store
FSYNC_ALL_MAX = 64  # the compiled fsync_all's limit
# Whether a group commit's fsyncs start from the loop thread (LoopFsyncs); tests that watch os.fsync
# turn it off, and so does a build without eventfd.
ON_LOOP: bool = cstore is not None and hasattr(cstore, "fsync_starter")


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


class LoopFsyncs:
    """fsync a batch of descriptors at once in the compiled store's C workers, started from the event
    loop thread; ``done(errors, seconds)`` is called on the loop, in the turn that sees the batch
    finished, with each descriptor's errno (0: synced, as ``fsync_all``) and the time from the start
    to the last fsync's end. One batch at a time; the descriptors stay open until ``done``."""

    def __init__(self) -> None:
        if cstore is None:
            raise RuntimeError("LoopFsyncs needs the compiled store")
        self._starter: Any = cstore.fsync_starter()
        self._fd: int = self._starter.fileno()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop watching the eventfd
        self._done: Callable[[list[int], float], None] | None = None
        self.last: tuple[int, int, int] = (0, 0, 0)  # the last batch's posted, started, finished ns

    @property
    def running(self) -> bool:
        """Whether a batch was started and its ``done`` not called yet."""
        return self._done is not None

    def start(self, fds: list[int], done: Callable[[list[int], float], None]) -> None:
        """Hand ``fds`` to the C workers and return (on the running loop's thread)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # watched once per loop, not once per batch
            self._unwatch()
            loop.add_reader(self._fd, self._ready)
            self._loop = loop
        self._starter.start(fds)
        self._done = done

    def _ready(self) -> None:
        result = self._starter.result()
        if result is None or self._done is None:
            return
        done, self._done = self._done, None
        errors, posted, started, finished = result
        self.last = (posted, started, finished)
        done(errors, (finished - posted) / 1e9)

    def finish(self) -> None:
        """Block until a running batch is done and call its ``done`` here (a store's close)."""
        if self._done is not None:
            self._starter.wait()
            self._ready()

    def close(self) -> None:
        """``finish``, then stop watching the eventfd (closed with the starter)."""
        self.finish()
        self._unwatch()

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)
