"""Segment files made and removed off the event loop.

Creating a segment (reserving its blocks, writing and syncing its header) and removing one (unmapping
it, unlinking a file of several MiB) cost milliseconds each, up to a hundred on a busy disk: with big
bodies they were 12-16 % of the loop. Here the next segment is made ahead by a worker thread under a
temporary name (``.msgs.NNNNNNNNNN.tmp``, never replicated, removed at the next open after a crash) and
takes its name only when the writer rolls over to it; a segment no queue references any more leaves the
store's books on the loop and is unmapped and unlinked by another worker thread.

Durability is as before: the rename at the roll happens before any record is written into the segment,
and the directory entry is synced with the segment's first range (``Segment.name_unsynced``) before a
confirm of a message in it goes out. A removal not done when the process dies leaves an unreferenced
segment, deleted at the next start as any other.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from lavinpy.store import changes
from lavinpy.store.segment import Segment, segment_name

log = logging.getLogger("lavinpy.store")

PREPARED_SUFFIX = ".tmp"
REMOVED_SUFFIX = ".removed" + PREPARED_SUFFIX  # also matched by remove_leftovers' pattern

# A worker thread waits this long for more work before it ends: under a steady stream of big bodies a
# segment is made and one removed every few milliseconds, and a thread start per segment (the loop
# waits for the new thread to run) was a tenth of the loop's time with 1 MiB bodies.
WORKER_LINGER_SECONDS = 1.0


class _Worker:
    """Runs what is submitted in order, in one thread started when there is work and ending when there
    has been none for WORKER_LINGER_SECONDS: an idle broker keeps no thread for its segment files."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)
        self._tasks: deque[tuple[Future, Callable[..., Any], tuple]] = deque()
        self._running = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            self._tasks.append((future, fn, args))
            if self._running:
                self._more.notify()
            else:
                self._running = True
                threading.Thread(target=self._drain, name=self._name, daemon=True).start()
        return future

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._tasks:
                    self._more.wait(WORKER_LINGER_SECONDS)
                    if not self._tasks:
                        self._running = False
                        return
                future, fn, args = self._tasks.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)

    def after_fork(self) -> None:
        """A child starts with no thread: work its parent had queued is the parent's."""
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)
        self._tasks.clear()
        self._running = False


_maker = _Worker("segment-make")
_remover = _Worker("segment-remove")


def _after_fork() -> None:
    _maker.after_fork()
    _remover.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def prepared_path(directory: Path, segment_id: int) -> Path:
    return directory / ("." + segment_name(segment_id) + PREPARED_SUFFIX)


def removed_path(path: Path) -> Path:
    """The name a segment file takes until ``unlink_later`` has unlinked it: a leftover of a process
    that died before is removed at the next open, as a segment made ahead is (``remove_leftovers``)."""
    return path.with_name("." + path.name + REMOVED_SUFFIX)


def unlink_later(path: Path) -> Future:
    """Unlink ``path`` in the removal worker thread: a written segment of several MiB takes milliseconds
    to unlink (its blocks are freed), which a cluster follower's replication thread must not wait for."""
    return _remover.submit(_unlink, path)


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def _remove(segment: Segment) -> None:
    segment.close()
    segment.path.unlink(missing_ok=True)


class SegmentFiles:
    """One store's segment made ahead and its removals in flight (loop thread, except the workers)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._prepared: Future[Segment] | None = None
        self._prepared_id = 0
        self._removals: list[Future[None]] = []

    @property
    def preparing(self) -> bool:
        return self._prepared is not None

    def prepare(self, segment_id: int, size: int) -> None:
        """Make segment ``segment_id`` of ``size`` bytes ahead, in a worker thread."""
        if self._prepared is not None:
            return
        self._prepared_id = segment_id
        self._prepared = _maker.submit(Segment.create_unnamed, prepared_path(self.directory, segment_id),
                                         segment_id, size)

    def take(self, segment_id: int, size: int) -> Segment | None:
        """The prepared segment, named ``segment_id`` now, if it is that one and of ``size`` bytes
        (waiting for it if it is still being made); else None (one prepared in vain is removed). The
        size must match: a message larger than a segment gets one sized to fit, and the next one the
        regular size, as when created on the loop."""
        future, self._prepared = self._prepared, None
        if future is None:
            return None
        try:
            segment = future.result()
        except OSError as exc:  # a full disk: the caller creates it on the loop and gets the error there
            log.debug("%s: making segment %d ahead failed: %s", self.directory, self._prepared_id, exc)
            return None
        if self._prepared_id != segment_id or segment.size != size:
            self._removals.append(_remover.submit(_remove, segment))
            return None
        segment.adopt(self.directory / segment_name(segment_id))
        return segment

    def remove(self, segment: Segment) -> None:
        """Unmap and unlink ``segment`` in a worker thread (the store has forgotten it already)."""
        changes.deleted(segment.path)
        self._removals = [f for f in self._removals if not f.done()]
        self._removals.append(_remover.submit(_remove, segment))

    def settle(self) -> None:
        """Wait until every removal asked for is done (the files are gone from the disk)."""
        removals, self._removals = self._removals, []
        for future in removals:
            try:
                future.result()
            except OSError as exc:
                log.warning("%s: removing a segment failed: %s", self.directory, exc)

    def close(self) -> None:
        """Settle, and remove a segment made ahead and not used."""
        future, self._prepared = self._prepared, None
        if future is not None:
            try:
                _remove(future.result())
            except OSError:
                pass
        self.settle()

    def remove_leftovers(self) -> None:
        """Segments made ahead by a process that stopped before using them."""
        for path in self.directory.glob(".msgs.*" + PREPARED_SUFFIX):
            path.unlink(missing_ok=True)
