"""A vhost directory: its message store, its queue indexes and the group-commit flush.

``await flush()`` resolves once everything appended, pushed and acked before the call is on disk
under the fsync policy and, when a replication barrier is set, acknowledged by every in-sync
follower. Concurrent callers share one flush (group commit). The disk work (an fsync of the message
segments and the index files at once, see ``_sync``) runs off the event loop so that it keeps serving
clients meanwhile: with the compiled store the loop starts the fsyncs in C workers and an eventfd tells
it when they are done (``fsyncs.LoopFsyncs``); otherwise, and for a flush that must also make new
names durable, a Python worker thread runs ``_sync``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from lavinpy.progress import Progress
from lavinpy.store import changes, fsyncs
from lavinpy.store.append_file import AppendFile
from lavinpy.store.changes import ReplicationBarrier
from lavinpy.store.datadir import sha1_name
from lavinpy.store.delivery_counts import DeliveryCounts
from lavinpy.store.fsyncs import LoopFsyncs, fsync_together
from lavinpy.store.index_kinds import FIFO, AnyIndex, IndexKind
from lavinpy.store.message_store import DEFAULT_SEGMENT_SIZE, DirtyRange, MessageStore
from lavinpy.store.queue_index import (
    DEFAULT_ACK_FILE_MAX_BYTES,
    ENQ_FILE,
    QUEUE_NAME_FILE,
    QueueIndex,
    sync_new_directory,
)
from lavinpy.store.segment import open_ranges
from lavinpy.store.sync_timing import SYNC_TIMES
from lavinpy.wire.position import ENTRY_SIZE

log = logging.getLogger("lavinpy.store")

FSYNC_POLICIES = ("always", "batch", "never")
RECOVERY_PROGRESS_MIN_ENTRIES = 1_000_000  # a smaller backlog is read back too fast to report


class SyncedFile(Protocol):
    """What the group commit asks of a file it syncs."""

    @property
    def has_unsynced(self) -> bool: ...

    def take_unsynced_fds(self) -> list[int]: ...

    def mark_unsynced(self) -> None: ...

    close_fd: Callable[[int], None]


class VhostStore:
    """Storage of one vhost. Use from one event loop thread; ``open()`` before anything else."""

    def __init__(self, path: Path, *, segment_size: int = DEFAULT_SEGMENT_SIZE, fsync: str = "always",
                 fsync_interval_ms: int = 50, ack_file_max_bytes: int = DEFAULT_ACK_FILE_MAX_BYTES) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        self.path = Path(path)
        self.fsync_policy = fsync
        self.fsync_interval = fsync_interval_ms / 1000
        self.ack_file_max_bytes = ack_file_max_bytes
        self.messages = MessageStore(self.path, segment_size)
        self._queues: dict[str, AnyIndex] = {}
        self._delivery_counts: dict[str, DeliveryCounts] = {}
        self._count_files: set[str] = set()  # the files of DeliveryCounts' subclasses opened (their keys)
        self._append_files: dict[str, AppendFile] = {}
        self._synced_files: list[SyncedFile] = []  # registered by their owners (the definitions log)
        self._sync_paths: list[Path] = []  # index files closed while idle before a flush synced them
        self._executor: ThreadPoolExecutor | None = None
        self._loop_fsyncs: LoopFsyncs | None = None  # made by the first flush that uses it
        self.fsyncs_on_loop = True  # with fsyncs.ON_LOOP: fsyncs may start from the loop (_syncs_on_loop)
        # group commit state
        self._next: asyncio.Future[None] | None = None  # resolved by the flush after the running one
        self._next_since = 0.0  # loop time the first waiter of _next arrived
        self._next_acks = True  # whether a waiter of _next needs the ack files synced too
        self.flush_syncs_acks = True  # whether the flush being taken syncs the ack files (AppendFile.sync_with_acks)
        self._flusher: asyncio.Task[None] | None = None
        self._sync_token: object | None = None  # set while a worker thread syncs
        self._deferred_closes: list[int] = []
        self.flush_count = 0  # flushes that reached the disk (tests, metrics)
        self.barrier: ReplicationBarrier | None = None  # set by a replication leader
        self._is_open = False
        self._recovery: Progress | None = None  # from open() to finish_recovery()

    # ---- life cycle --------------------------------------------------------------------------

    def open(self) -> None:
        """Open the message store. Then open_queue() each durable queue, then finish_recovery()."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.messages.open()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lavinpy-flush")
        self._is_open = True
        # Reading the queue indexes of a large backlog takes a while: the log says how far it got.
        self._recovery = Progress(f"{self.path}: recovering queue indexes", self._index_entries_on_disk(),
                                  unit="index entries", log=log, min_total=RECOVERY_PROGRESS_MIN_ENTRIES)

    def _index_entries_on_disk(self) -> int:
        entries = 0
        for entry in self.path.iterdir():
            if (entry / QUEUE_NAME_FILE).is_file():
                entries += self._enq_entries(entry)
        return entries

    @staticmethod
    def _enq_entries(directory: Path) -> int:
        try:
            return (directory / ENQ_FILE).stat().st_size // ENTRY_SIZE
        except OSError:
            return 0

    def finish_recovery(self) -> None:
        """All durable queues are open: delete the segments that no queue references."""
        if self._recovery is not None:
            self._recovery.finish()
            self._recovery = None
        deleted = self.messages.delete_unreferenced()
        if deleted:
            log.info("%s: deleted %d unreferenced message segments", self.path, deleted)

    def queue_names_on_disk(self) -> list[str]:
        """Names of the durable queues that have a directory here (from their ``.queue`` files)."""
        names = []
        for entry in sorted(self.path.iterdir()):
            name_file = entry / QUEUE_NAME_FILE
            if entry.is_dir() and name_file.is_file():
                names.append(name_file.read_bytes().decode("utf-8"))
        return names

    def queue_path(self, name: str) -> Path:
        return self.path / sha1_name(name)

    def open_queue(self, name: str, durable: bool, kind: IndexKind = FIFO) -> AnyIndex:
        """Open (durable: load from disk) the index of a queue, a stream or a delayed exchange's held
        messages, as ``kind`` orders it (``index_kinds``); the same object if already open.

        Every index opened here takes part in the group-commit flush and is closed (compacted) with
        the store; descriptors close through the store so that a close never races a worker's fsync.
        """
        index = self._queues.get(name)
        if index is not None:
            if index.durable != durable:
                state = "durable" if index.durable else "transient"
                raise ValueError(f"queue {name!r} is already open as {state}")
            if not kind.matches(index):
                raise ValueError(f"queue {name!r} is already open as a {type(index).__name__}")
            return index
        directory = self.queue_path(name) if durable else None
        recovering = self._enq_entries(directory) if directory is not None and self._recovery is not None else 0
        index = kind.build(name, self.messages, directory, self.ack_file_max_bytes, self._close_fd)
        if isinstance(index, QueueIndex):
            index.set_fsync(self.fsync_policy != "never", self._sync_path_later)
        index.open()
        if recovering and self._recovery is not None:
            self._recovery.advance(recovering)
        self._queues[name] = index
        return index

    def open_delivery_counts(self, index: QueueIndex, kind: type[DeliveryCounts] = DeliveryCounts) -> DeliveryCounts:
        """The delivery counts of an open queue, loaded from its directory (durable queues); ``kind``
        ``RetryDueTimes``: its delayed retries' due times, the same kind of file."""
        key = index.name if kind is DeliveryCounts else f"{index.name}\0{kind.FILE}"
        counts = self._delivery_counts.get(key)
        if counts is not None:
            return counts

        def sync_acks() -> None:  # what compaction needs on disk before it forgets a count
            index.write_buffers()
            index.fsync()

        counts = kind(index.name, index.directory, sync_removals=sync_acks, close_fd=self._close_fd,
                      prepare_directory=index.ensure_directory)
        found = index.found_files if index.durable else frozenset()
        if found is None or found.intersection((kind.FILE, kind.FILE + ".tmp")):  # none: nothing to read
            counts.open(index if counts.durable else None)
        self._delivery_counts[key] = counts
        if kind is not DeliveryCounts:
            self._count_files.add(kind.FILE)
        return counts

    def open_append_file(self, name: str) -> AppendFile:
        """A file of the vhost's own in its directory (``append_file``), synced with the group commit
        and reported to the change feed; the same object if already open. ``open()`` it before use."""
        appended = self._append_files.get(name)
        if appended is None:
            appended = self._append_files[name] = AppendFile(self.path / name, self._close_fd, self._flush_waits,
                                                                  self._write_index_buffers,
                                                                  lambda: self.flush_syncs_acks)
        return appended

    def delete_append_file(self, name: str) -> None:
        """Remove a file of the vhost's own (its owner was deleted): closed, unlinked, replicated."""
        appended = self._append_files.pop(name, None)
        if appended is not None:
            appended.close(clean=False)
        path = self.path / name
        if path.exists():
            path.unlink()
            changes.deleted(path)

    def register_synced_file(self, file: SyncedFile) -> None:
        """A file of another owner (the vhost's definitions log) that the group commit syncs; it closes
        its descriptor through ``file.close_fd``, which this sets (a close waits for a running sync)."""
        file.close_fd = self._close_fd
        if file not in self._synced_files:
            self._synced_files.append(file)

    def _flush_waits(self) -> bool:
        """Whether durable() waits for anything: a sync, or in a cluster the followers."""
        return self.fsync_policy != "never" or self.barrier is not None

    def delete_queue(self, index: AnyIndex) -> None:
        """Remove a queue: its messages lose this reference and its directory goes."""
        if self._queues.get(index.name) is index:
            del self._queues[index.name]
        # its counts and the other files of that kind (by key: a scan of every queue's would make closing
        # a vhost of many transient queues quadratic)
        for key in (index.name, *(f"{index.name}\0{file}" for file in self._count_files)):
            counts = self._delivery_counts.pop(key, None)
            if counts is not None:
                counts.delete()
        index.delete()

    @property
    def queues(self) -> dict[str, AnyIndex]:
        return self._queues

    def close(self, clean: bool = True) -> None:
        """Clean close: wait for a running sync, compact and close every index, sync the segments.

        ``clean=False`` leaves the files as a killed process would (buffers handed to the OS but no
        compaction and no sync): tests use it for crash-like restarts.
        """
        if not self._is_open:
            return
        self._is_open = False
        if self._executor is not None:
            self._executor.shutdown(wait=True)  # a running sync finishes first
            self._executor = None
        if self._loop_fsyncs is not None:
            self._loop_fsyncs.close()  # likewise (its completion runs here)
            self._loop_fsyncs = None
        self._end_sync()
        for index in self._queues.values():
            index.close(clean=clean)
        self._queues.clear()
        for counts in self._delivery_counts.values():  # after the indexes: their acks are on disk
            counts.close(clean=clean)
        self._delivery_counts.clear()
        for appended in self._append_files.values():
            appended.close(clean=clean)
        self._append_files.clear()
        paths, self._sync_paths = self._sync_paths, []
        if clean:
            for path in paths:
                sync_path(path)
        for synced_file in self._synced_files:  # still open (their owners close them): synced here
            if clean:
                for fd in synced_file.take_unsynced_fds():
                    os.fsync(fd)
            synced_file.close_fd = os.close  # no flush runs any more
        self._synced_files.clear()
        if clean:
            ranges = self.messages.take_dirty()
            self._report_ranges(ranges)
            self.messages.sync_ranges(ranges)
        self.messages.close()
        # Everything is on disk now: release whoever still waits for a flush.
        if self._next is not None and not self._next.done():
            self._next.set_result(None)
        self._next = None

    # ---- group commit ------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether a durable queue has index entries not yet flushed (a periodic flush is due)."""
        if self.fsync_policy == "never":  # flushing only hands the buffers to the OS
            return any(q.has_pending_writes for q in self._queues.values())
        return (any(q.has_pending_writes or q.has_unsynced for q in self._queues.values() if q.durable)
                or any(c.has_unsynced for c in self._delivery_counts.values())
                or any(f.has_unsynced for f in self._append_files.values())
                or any(f.has_unsynced for f in self._synced_files) or bool(self._sync_paths))

    async def flush(self, acks: bool = True) -> None:
        """Resolve once everything appended/pushed/acked before the call is on disk (per policy).

        ``acks=False`` (publisher confirms): only messages and their enq entries must be on disk;
        ack files are synced by the next full flush (a lost ack means a redelivery, not a loss).
        """
        # shield: a cancelled caller must not cancel the flush other callers share
        await asyncio.shield(self.durable(acks))

    def durable(self, acks: bool = True) -> asyncio.Future[None]:
        """``flush`` as a future, joining the group commit at the call: a caller that must first wait
        for something else (an earlier batch's confirms) does not hold its own messages out of the
        flushes that run meanwhile. The future is shared by every caller of this flush: add a done
        callback, or await it through ``asyncio.shield`` (cancelling it would cancel theirs too)."""
        loop = asyncio.get_running_loop()
        if not self._is_open:  # closed: the clean close already put everything on disk
            return _done(loop)
        if self.fsync_policy == "never" and self.barrier is None:
            self._write_index_buffers()
            for appended in self._append_files.values():
                appended.write_pending()
            return _done(loop)
        waiter = self._next
        if waiter is None:
            waiter = self._next = loop.create_future()
            self._next_since = loop.time()
            self._next_acks = acks
        else:
            self._next_acks = self._next_acks or acks
        if self._flusher is None:
            self._flusher = loop.create_task(self._run_flushes())
        return waiter

    async def _run_flushes(self) -> None:
        """Run flushes back to back while callers wait; each covers all callers that came before it."""
        loop = asyncio.get_running_loop()
        replicating: asyncio.Future[None] | None = None  # the last flush, until the followers have it
        took = 0.0  # how long the last local sync took
        try:
            while self._next is not None and self._is_open:
                if replicating is not None and not replicating.done() and took > 0:
                    # The followers still write the last flush, and its confirms wait for them: the
                    # next flush waits too (one local sync's time at most, so that a stalled follower
                    # does not stall the stream), and takes what comes meanwhile. Fewer, larger
                    # flushes: one fsync and one batch less on every node.
                    await asyncio.wait([replicating], timeout=took)
                    if not self._is_open:
                        break
                if self.fsync_policy == "batch":
                    delay = self._next_since + self.fsync_interval - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                        if not self._is_open:
                            break
                waiter, self._next = self._next, None
                started = loop.time()
                try:
                    await self._flush_once(waiter, self._next_acks)
                except Exception as exc:
                    if not waiter.done():
                        waiter.set_exception(exc)
                    log.error("%s: flush failed: %s", self.path, exc)
                took = loop.time() - started
                replicating = waiter if self.barrier is not None else None
        finally:
            self._flusher = None

    def _write_index_buffers(self) -> None:
        for index in self._queues.values():
            if index.has_pending_writes:
                index.write_buffers()

    async def _flush_once(self, waiter: asyncio.Future[None], acks: bool = True) -> None:
        """Put what was written on the local disk; ``waiter`` resolves once the followers have it too
        (the next flush may start while they acknowledge this one)."""
        self.flush_syncs_acks = acks
        # Loop thread: hand buffered bytes to the OS and collect what the worker must sync. The
        # followers get the message bytes before the index entries that point at them.
        ranges = self.messages.take_dirty()
        self._report_ranges(ranges)
        self._write_index_buffers()
        synced: list[AnyIndex | DeliveryCounts | AppendFile | SyncedFile] = []
        fds: list[int] = []
        directories: list[Path] = []
        for index in self._queues.values():
            taken = index.take_unsynced_fds(acks)
            directory = index.take_new_directory() if isinstance(index, QueueIndex) else None
            if taken or directory is not None:
                synced.append(index)
                fds.extend(taken)
                if directory is not None:
                    directories.append(directory)
        others: list[DeliveryCounts | AppendFile | SyncedFile] = [
            *self._delivery_counts.values(), *self._append_files.values(), *self._synced_files]
        paths, self._sync_paths = self._sync_paths, []  # after the writes above: they may close files
        for synced_with in others:
            taken = synced_with.take_unsynced_fds()
            if taken:
                synced.append(synced_with)
                fds.extend(taken)
        outstanding = 1 if self.barrier is None else 2  # the local sync, and the followers'

        def one_done() -> None:
            nonlocal outstanding
            outstanding -= 1
            if not outstanding:
                _resolve(waiter)

        # The followers' sends first: their write and fsync take longer than ours (a local sync started
        # before the sends ended later, and so did the followers', bench/history.md).
        if self.barrier is not None:  # taken now: the followers write this flush's bytes while we do
            self.barrier.on_replicated(one_done)
        if self.fsync_policy == "never":  # replicated: the followers' acks are the commit
            ranges, fds, directories, paths = [], [], [], []
        if (ranges or fds) and self._syncs_on_loop(ranges, directories, paths):
            await self._sync_on_loop(synced, ranges, fds, one_done)
            return
        if ranges or fds or directories or paths:
            try:
                await self._sync_in_worker(synced, ranges, fds, directories, paths)
            except BaseException:
                self._sync_paths.extend(paths)  # not known to be on disk: the next flush tries again
                raise
        one_done()

    async def wait_replicated(self) -> None:
        """Resolve once every in-sync follower has what was written before the call (at once alone)."""
        if self.barrier is not None:
            await self.barrier.wait_replicated()

    @staticmethod
    def _report_ranges(ranges: list[DirtyRange]) -> None:
        """Report written segment bytes to the change feed: once per flush, from the dirty ranges."""
        if changes.feed.listener is not None:
            for segment, start, end in ranges:
                changes.appended(segment.path, start, segment.mm[start:end])

    async def _sync_in_worker(self, synced: list[AnyIndex | DeliveryCounts | AppendFile | SyncedFile],
                              ranges: list[DirtyRange], fds: list[int], directories: list[Path],
                              paths: list[Path]) -> None:
        token = self._begin_sync()
        try:
            assert self._executor is not None
            await asyncio.get_running_loop().run_in_executor(self._executor, self._sync, ranges, fds, directories,
                                                             paths)
        except BaseException:
            for index in synced:  # not known to be on disk: the next flush tries again
                index.mark_unsynced()
            raise
        finally:
            if self._sync_token is token:
                self._end_sync()
        self.flush_count += 1

    def _syncs_on_loop(self, ranges: list[DirtyRange], directories: list[Path], paths: list[Path]) -> bool:
        """Whether this flush's fsyncs start from the loop (``_sync_on_loop``): compiled store, and no
        name to make durable first (a new segment's, a new queue directory's, a file closed while idle:
        a few a second at most, in the worker thread)."""
        if not (fsyncs.ON_LOOP and self.fsyncs_on_loop) or directories or paths:
            return False
        if any(end > start and segment.name_unsynced and not segment.closed for segment, start, end in ranges):
            return False
        if self._loop_fsyncs is None:
            self._loop_fsyncs = LoopFsyncs()
        return not self._loop_fsyncs.running  # a cancelled flush's batch still runs: the worker takes this one

    def _sync_on_loop(self, synced: list[AnyIndex | DeliveryCounts | AppendFile | SyncedFile],
                      ranges: list[DirtyRange], fds: list[int], on_synced: Callable[[], None]) -> asyncio.Future[None]:
        """``_sync_in_worker``'s work with the fsyncs started here and finished in C workers; ``on_synced``
        is called in the loop turn that sees them done (a flush's confirms go out in that turn when the
        followers already have it), then the returned future resolves (or fails as the fsync did)."""
        token = self._begin_sync()
        segment_fds: list[int] = []
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(errors: list[int], seconds: float) -> None:
            for fd in segment_fds:
                os.close(fd)
            if self._sync_token is token:
                self._end_sync()
            SYNC_TIMES.observe(seconds)
            failed = next((err for err in errors if err), 0)
            if failed:  # not known to be on disk: the next flush tries again
                for index in synced:
                    index.mark_unsynced()
                result: BaseException | None = OSError(failed, os.strerror(failed))
            else:
                self.flush_count += 1
                on_synced()
                result = None
            if not finished.done() and not finished.get_loop().is_closed():
                if result is None:
                    finished.set_result(None)
                else:
                    finished.set_exception(result)

        try:
            segment_fds = open_ranges(ranges)  # opens only: no segment name waits to be made durable
            if segment_fds or fds:
                assert self._loop_fsyncs is not None
                self._loop_fsyncs.start(segment_fds + fds, done)
        except BaseException:
            for fd in segment_fds:
                os.close(fd)
            for index in synced:
                index.mark_unsynced()
            if self._sync_token is token:
                self._end_sync()
            raise
        if not (segment_fds or fds):  # the segments went meanwhile (a close): nothing to sync
            done([], 0.0)
        return finished

    def _sync(self, ranges: list[DirtyRange], fds: list[int], directories: list[Path], paths: list[Path]) -> None:
        """Worker thread: the message segments and the open index files at once, then the files
        closed while idle (by path) and the names of new queue directories and files.

        At once, not message bytes first: one journal commit then covers the segments and the index
        files (0.54-0.65 against 1.0-1.9 ms a flush, bench/history.md). A confirm waits for all of
        them, as before. What a crash can leave is an index entry on disk whose record is not; the
        kernel's own writeback could always do that (the entries go to the OS before this sync), a
        follower's batch is synced the same way, and recovery drops such an entry (it points past the
        segment's valid end) or reports it as damaged when read: a message never confirmed.
        """
        started = time.perf_counter()
        segment_fds = open_ranges(ranges)
        try:
            fsync_together(segment_fds + fds)
        finally:
            for fd in segment_fds:
                os.close(fd)
        for path in paths:
            sync_path(path)
        for directory in directories:
            sync_new_directory(directory)
        SYNC_TIMES.observe(time.perf_counter() - started)

    def _begin_sync(self) -> object:
        token = object()
        self._sync_token = token
        self.messages.hold_deletions()
        return token

    def _end_sync(self) -> None:
        if self._sync_token is None:
            return
        self._sync_token = None
        deferred, self._deferred_closes = self._deferred_closes, []
        for fd in deferred:
            os.close(fd)
        self.messages.release_deletions()

    def _sync_path_later(self, path: Path) -> None:
        self._sync_paths.append(path)

    def _close_fd(self, fd: int) -> None:
        """Close an index descriptor, or later if a worker thread may be fsyncing it right now."""
        if self._sync_token is not None:
            self._deferred_closes.append(fd)
        else:
            os.close(fd)

    def __repr__(self) -> str:
        return f"VhostStore({str(self.path)!r}, fsync={self.fsync_policy!r}, queues={len(self._queues)})"


def sync_path(path: Path) -> None:
    """fsync a file by name (its written pages, whichever descriptor wrote them); gone: nothing to do."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return  # its queue was deleted
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _done(loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    future = loop.create_future()
    future.set_result(None)
    return future


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
