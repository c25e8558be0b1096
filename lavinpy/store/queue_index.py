"""A queue's index: its ``enq``/``ack`` files and the compact in-memory list of its messages.

On disk a durable queue directory holds ``.queue`` (the name), ``enq`` (one 8-byte position per
message routed to the queue) and ``ack`` (one per message removed). The content is ``enq`` minus
``ack`` in ``enq`` order. In memory the ready messages are packed 8-byte positions in a
``ReadyList`` (ready_list.py, in C when built; no Python object per message); only unacked and
requeued messages are Python ints, in a set (the runs ``shift_many`` took kept whole while their acks
come in order: unacked_positions.py) and a heap (requeued_positions.py).

Nothing is on disk for a durable queue until its first index entry: the directory, its ``.queue``
file and the ``enq``/``ack`` files are made by the first write (the declaration itself is the
definitions record's), and their names are made durable by the next flush (``take_new_directory``).
The files are opened on demand through the node's ``OpenFiles`` budget and closed when idle, so an
empty or idle queue holds no descriptor.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, filterfalse
from pathlib import Path
from typing import TYPE_CHECKING

from lavinpy.store import changes, index_files
from lavinpy.store.entry_file import INDEX_FILES, EntryFile, OpenFiles
from lavinpy.store.index_files import (
    chunked_counts,
    enq_sorted,
    live_chunks,
    ready_chunks,
    recovered_chunks,
    segment_counts,
)
from lavinpy.store.jsonfile import fsync_dir
from lavinpy.store.queue_dir import QUEUE_NAME_FILE, sync_new_directory, write_name_file
from lavinpy.store.queue_index_files import IndexFiles
from lavinpy.store.ready_list import ReadyList
from lavinpy.store.requeued_positions import RequeuedPositions
from lavinpy.store.unacked_positions import UnackedPositions
from lavinpy.wire.position import ENTRY_SIZE, SEGMENT_MASK

if TYPE_CHECKING:
    from lavinpy.store.message_store import MessageStore

log = logging.getLogger("lavinpy.store")

ENQ_FILE = "enq"
ACK_FILE = "ack"
DEFAULT_ACK_FILE_MAX_BYTES = 16 * 1024 * 1024
STREAM_ENTRIES = 1 << 18  # entries per chunk read at recovery or written by compaction: 2 MiB


class QueueIndex(IndexFiles):
    """The message index of one queue. ``directory=None`` makes a transient (memory-only) queue.

    Thread use: everything runs in the event-loop thread except ``fsync()``, which a flush runs in a
    worker thread; descriptors are closed through ``close_fd`` so that the store can defer closes
    while such a flush is running.
    """

    def __init__(self, name: str, messages: MessageStore, directory: Path | None,
                 ack_file_max_bytes: int = DEFAULT_ACK_FILE_MAX_BYTES, *,
                 close_fd: Callable[[int], None] = os.close, files: OpenFiles | None = INDEX_FILES) -> None:
        self.name = name
        self.messages = messages
        self.directory = Path(directory) if directory is not None else None
        self.durable = directory is not None
        self.ack_file_max_bytes = ack_file_max_bytes
        self._incref = messages.incref
        self._decref = messages.decref
        # ready messages: requeued ones (heap of enq-order keys) come before the chunks
        self._ready = ReadyList()  # never-delivered ready positions, in enq order
        self._ready_count = 0
        self._requeued = RequeuedPositions()
        self._unacked = UnackedPositions()
        self._transient: set[int] = set()  # durable queue only: live entries without an enq entry
        # durable only: entries not yet handed to the OS, and the files
        self._enq_pending: array | None = None
        self._ack_pending: array | None = None
        self._enq: EntryFile | None = None
        self._ack: EntryFile | None = None
        self._ack_room = 0  # see _measure_ack_room
        # durable only: the directory exists (False: made by the first write); its new names (the
        # directory, .queue, enq, ack) are not durable until a flush syncs them
        self._has_directory = False
        self._new_names = False
        self.found_files: frozenset[str] | None = None  # names in the directory at open (None: not listed)
        self.sync_metadata = True  # whether making a directory or file needs syncing (fsync policy)
        if self.directory is not None:
            owner = f"queue {name!r}"
            self._enq_pending = array("Q")
            self._ack_pending = array("Q")
            self._enq = EntryFile(self.directory / ENQ_FILE, ENTRY_SIZE, owner, close_fd=close_fd, cache=files)
            self._ack = EntryFile(self.directory / ACK_FILE, ENTRY_SIZE, owner, close_fd=close_fd, cache=files)
            self._enq.on_create = self._ack.on_create = self._file_created
            self._measure_ack_room()
        self._is_open = False

    # ---- opening -----------------------------------------------------------------------------

    def open(self) -> None:
        """Load the queue from disk (durable) and take one reference per live entry."""
        if self._is_open:
            return
        self._is_open = True
        directory, enq_file, ack_file = self.directory, self._enq, self._ack
        if directory is None or enq_file is None or ack_file is None:
            return  # transient: memory only
        try:
            found = frozenset(os.listdir(directory))  # one call instead of a failed open per absent file
        except FileNotFoundError:
            self.found_files = frozenset()
            return  # declared, nothing written yet: the first write makes the directory
        self.found_files = found
        self._has_directory = True
        name_file = directory / QUEUE_NAME_FILE
        if QUEUE_NAME_FILE not in found or not name_file.stat().st_size:  # a crash before it was synced
            write_name_file(name_file, self.name.encode("utf-8"))
            self._new_names = True
        ack = ack_file.recover(create=False) if found.intersection((ACK_FILE, ACK_FILE + ".tmp")) else array("Q")
        ack_file.close()  # opened again by the next write (closed first: enq stays open while it is read)
        acked = set(ack) if ack else None  # the ack file is small: compaction keeps it under its limit
        has_enq = bool(found.intersection((ENQ_FILE, ENQ_FILE + ".tmp"))) and enq_file.open_recovered(create=False)
        # enq is read, filtered and checked a bounded chunk at a time, straight into the ready list:
        # a backlog of millions is in memory once (only an index kind with its own order, which takes
        # the whole array in load_ready, gets one)
        streams = type(self).load_ready is QueueIndex.load_ready
        live, dropped = array("Q"), 0
        if streams:
            self._ready.clear()
        for chunk, counts, chunk_dropped in recovered_chunks(
                enq_file.read_chunks(STREAM_ENTRIES) if has_enq else (), acked, self.messages.valid_ends()):
            dropped += chunk_dropped
            self.messages.note_references(chunk)
            for segment, count in counts.items():
                self._incref(segment, count)
            (self._ready if streams else live).extend(chunk)
        enq_file.close()
        del ack, acked
        self._measure_ack_room()
        if streams:
            self.record_loaded(len(self._ready))
        else:
            self.load_ready(live)
        if dropped:
            log.warning("queue %r: dropped %d index entries that point at a missing segment or past the "
                        "valid end of a segment", self.name, dropped)
            self.compact()  # rewrite enq so that the same entries are not reported again

    def load_ready(self, live: array) -> None:
        """Extension point: take the recovered live positions (enq order) as the ready list. (This
        class's own recovery streams the entries into the ready list instead of calling it.)"""
        self._ready.clear()
        self._ready.extend(live)
        self._ready_count = len(live)

    # ---- the message flow --------------------------------------------------------------------

    def push(self, pos: int, persistent: bool = True) -> None:
        """Append a message (already in the message store) to the tail of the queue.

        A transient message in a durable queue gets no enq entry, so it is gone after a restart;
        it is remembered in a set so that compaction does not write it either.
        """
        self._ready.push(pos)
        self.record_push(pos, persistent)

    def push_many(self, positions: array, persistent: bool, priority: int | None = None) -> None:
        """``push`` for a run of positions (an ``array('Q')``) of one persistence (``priority``: see PriorityIndex)."""
        self._ready.extend(positions)
        self.record_push_many(positions, persistent)

    def record_push_many(self, positions: array, persistent: bool) -> None:
        """``record_push`` for a run (not empty): one reference-count update per segment."""
        self._ready_count += len(positions)
        pending = self._enq_pending
        if pending is not None:
            if persistent:
                pending.extend(positions)
            else:
                self._transient.update(positions)
        if len(positions) == 1:
            self._incref(positions[0] & SEGMENT_MASK)
        else:
            for segment, n in segment_counts(positions).items():
                self._incref(segment, n)

    # ---- extension point ---------------------------------------------------------------------
    # An index kind with its own order of ready messages (store/priority_index.py,
    # store/delayed_index.py) keeps its ready list itself and overrides load_ready, push, peek, shift,
    # requeue, purge, ready_positions, live_positions, __iter__ (to take runs: push_many, shift_many,
    # ack_many, split_taken). It reports every move with the record_* methods below, which keep the
    # counts, the unacked set, the files and the segment references: those stay this class's alone.

    def record_push(self, pos: int, persistent: bool) -> None:
        """A message became ready: count it, write its enq entry, take its segment reference."""
        self._ready_count += 1
        pending = self._enq_pending
        if pending is not None:
            if persistent:
                pending.append(pos)
            else:
                self._transient.add(pos)
        self._incref(pos & SEGMENT_MASK)  # pos_segment inlined: once per message

    def record_loaded(self, count: int) -> None:
        """load_ready placed ``count`` recovered messages in the ready list."""
        self._ready_count = count

    def record_shift(self, pos: int) -> None:
        """The ready message ``pos`` was taken for delivery: it is unacked now."""
        self._ready_count -= 1
        self._unacked.add(pos)

    def record_requeue(self, pos: int) -> None:
        """The unacked message ``pos`` is ready again (KeyError if it is not unacked)."""
        if not self._unacked.remove(pos):
            raise KeyError(f"queue {self.name!r}: position {pos:#x} is not unacked")
        self._ready_count += 1

    def is_unacked(self, pos: int) -> bool:
        return pos in self._unacked

    def record_purge(self, removed: array) -> int:
        """Every ready message (``removed``) left at once: files, references, maybe compaction."""
        count = self._ready_count
        self._ready_count = 0
        self._record_removed(removed)
        return count

    def _record_removed(self, removed: array) -> None:
        pending = self._ack_pending
        if pending is not None:
            if self._transient:
                self._transient.difference_update(removed)
            pending.extend(removed)
        for segment, n in segment_counts(removed).items():
            self._decref(segment, n)
        if self._ack_file_full():
            self.compact()

    def peek(self) -> int | None:
        """The next message to deliver, or None; leaves it ready."""
        if self._requeued:
            return self._requeued.peek()
        return self._ready.peek()

    def shift(self) -> int | None:
        """Take the next ready message for delivery: it becomes unacked. None when empty."""
        if self._requeued:
            pos = self._requeued.pop()
        else:
            pos = self._ready.shift()
            if pos is None:
                return None
        self._ready_count -= 1
        self._unacked.add(pos)
        return pos

    def __init_subclass__(cls, **kwargs: object) -> None:
        # An index kind with its own shift/ack (priorities, delayed) gets the batch forms as loops
        # over them, so a batch never bypasses its bookkeeping.
        super().__init_subclass__(**kwargs)
        if cls.shift is not QueueIndex.shift and cls.shift_many is QueueIndex.shift_many:
            cls.shift_many = QueueIndex._shift_each  # type: ignore[method-assign]
        if cls.requeue is not QueueIndex.requeue and cls.requeue_many is QueueIndex.requeue_many:
            cls.requeue_many = QueueIndex._requeue_each  # type: ignore[method-assign]
        if cls.ack is not QueueIndex.ack and cls.ack_many is QueueIndex.ack_many:
            cls.ack_many = QueueIndex._ack_each  # type: ignore[method-assign]

    def _shift_each(self, count: int) -> list[int]:
        shift = self.shift
        taken = []
        for _ in range(count):
            pos = shift()
            if pos is None:
                break
            taken.append(pos)
        return taken

    def _ack_each(self, positions: list[int]) -> None:
        for pos in positions:
            self.ack(pos)

    def _requeue_each(self, positions: list[int]) -> None:
        for pos in positions:
            self.requeue(pos)

    def shift_many(self, count: int) -> list[int]:
        """``shift`` up to ``count`` times in one call: the next ready positions, now unacked (the
        requeued first: each was taken from the head before any never-delivered one now there)."""
        if self._requeued:
            taken = self._requeued.pop_many(count)
            if len(taken) < count:
                taken += self._ready.shift_many(count - len(taken))
        else:
            taken = self._ready.shift_many(count)
        if taken:
            self._ready_count -= len(taken)
            self._unacked.add_run(taken)
        return taken

    def split_taken(self, taken: list[int], parts: list[list[int]]) -> None:
        """What ``shift_many`` just returned went to several consumers as ``parts`` (each in
        order): each part's in-order acks then settle it without a set operation per position."""
        self._unacked.split_run(taken, parts)

    def ack_many(self, positions: list[int]) -> None:
        """``ack`` for many unacked positions: one reference-count update per segment."""
        bad = self._unacked.remove_many(positions)
        if bad is not None:
            raise KeyError(f"queue {self.name!r}: position {positions[bad]:#x} is not unacked")
        pending = self._ack_pending
        transient = self._transient
        if pending is None:  # a transient queue's few acks, counted from the list itself
            counts = segment_counts(positions)
        elif transient and not transient.isdisjoint(positions):  # as ack(): no ack entry without an enq entry
            counts = segment_counts(positions)
            pending.extend(array("Q", [pos for pos in positions if pos not in transient]))
            transient.difference_update(positions)
        else:
            packed, counts = index_files.packed_counts(positions)
            pending.frombytes(packed)
        if pending is not None and self._ack_file_full():
            self.compact()
        for segment, n in counts.items():
            self._decref(segment, n)

    def ack(self, pos: int) -> None:
        """Remove an unacked message for good (ack, reject, expiry, dead-lettering...)."""
        if not self._unacked.remove(pos):
            raise KeyError(f"queue {self.name!r}: position {pos:#x} is not unacked")
        pending = self._ack_pending
        if pending is not None:
            if self._transient and pos in self._transient:
                self._transient.discard(pos)
            else:
                pending.append(pos)
                if len(pending) >= self._ack_room:
                    self.compact()
        self._decref(pos & SEGMENT_MASK)  # pos_segment inlined: once per message

    def requeue(self, pos: int) -> None:
        """Put an unacked message back ahead of never-delivered ones, in enq order among requeued."""
        if not self._unacked.remove(pos):
            raise KeyError(f"queue {self.name!r}: position {pos:#x} is not unacked")
        self._requeued.push(pos)
        self._ready_count += 1

    def requeue_many(self, positions: list[int]) -> None:
        """``requeue`` for many unacked positions (a closing channel's): one heap build, not a push each."""
        if len(positions) == 1:  # a nack or reject of one
            self.requeue(positions[0])
            return
        bad = self._unacked.remove_many(positions)
        if bad is not None:
            raise KeyError(f"queue {self.name!r}: position {positions[bad]:#x} is not unacked")
        self._requeued.push_many(positions)
        self._ready_count += len(positions)

    def purge(self) -> int:
        """Remove every ready message (unacked ones stay); returns how many were removed."""
        if self._ready_count == 0:
            return 0
        if len(self._ready) > STREAM_ENTRIES:  # a backlog: not copied whole, nor an ack entry each
            return self._purge_backlog()
        removed = self.ready_positions()
        self._requeued.clear()
        self._ready.clear()
        return self.record_purge(removed)

    def _purge_backlog(self) -> int:
        """``purge`` of a huge ready list: read a chunk at a time, and enq rewritten with what stays
        (the unacked messages) before the segment references go."""
        transient = self._transient

        def forget_transient(chunks: Iterable[array]) -> Iterator[array]:
            for chunk in chunks:
                transient.difference_update(chunk)
                yield chunk

        counts = chunked_counts(forget_transient(self._ready_position_chunks()))
        count = self._ready_count
        self._requeued.clear()
        self._ready.clear()
        self._ready_count = 0
        self.compact()  # the purged messages are gone from enq before their segments may go
        for segment, n in counts.items():
            self._decref(segment, n)
        return count

    def _ready_position_chunks(self) -> Iterator[array]:
        """``ready_positions`` a bounded chunk at a time (whole from an index kind with its own)."""
        if type(self).ready_positions is not QueueIndex.ready_positions:
            yield self.ready_positions()
            return
        yield self._requeued.positions()
        yield from ready_chunks(self._ready, STREAM_ENTRIES)

    def _ack_file_full(self) -> bool:
        pending = self._ack_pending
        return pending is not None and len(pending) >= self._ack_room

    @property
    def ready_count(self) -> int:
        return self._ready_count

    @property
    def unacked_count(self) -> int:
        return len(self._unacked)

    @property
    def transient_count(self) -> int:
        """Live messages of a durable queue that have no enq entry (published non-persistent)."""
        return len(self._transient)

    def memory_bytes(self) -> int:
        """Bytes the index holds in memory: 8 per ready position, plus the unacked, requeued and
        transient sets (message bodies stay in the memory-mapped segments, shared by all queues)."""
        return (ENTRY_SIZE * self._ready_count + self._unacked.memory_bytes() + self._requeued.memory_bytes()
                + sys.getsizeof(self._transient))

    def __len__(self) -> int:
        return self._ready_count

    def __iter__(self) -> Iterator[int]:
        """Ready positions in delivery order."""
        yield from self._requeued.positions()
        yield from array("Q", self._ready.to_bytes())

    def unacked(self) -> Iterable[int]:
        return iter(self._unacked)

    def ready_positions(self) -> array:
        """All ready positions in delivery order, as one array."""
        out = self._requeued.positions()
        out.frombytes(self._ready.to_bytes())
        return out

    def live_positions(self) -> array:
        """Ready and unacked positions in the order a compacted ``enq`` keeps them (enq order)."""
        out = array("Q")
        for chunk in live_chunks(self._older_positions(), self._ready, set(), STREAM_ENTRIES):
            out.extend(chunk)
        return out

    def _older_positions(self) -> array:
        """The requeued and unacked messages' positions, in enq order."""
        return enq_sorted(self._unacked.to_array(), self._requeued.keys())

    def _live_chunks(self) -> Iterator[array]:
        """The persistent live positions (what a compacted ``enq`` holds) a bounded chunk at a time: the
        ready list is read in place, never copied whole. An index kind with its own ``live_positions``
        gives them whole."""
        if type(self).live_positions is not QueueIndex.live_positions:
            live, transient = self.live_positions(), self._transient
            return iter((array("Q", filterfalse(transient.__contains__, live)) if transient else live,))
        return live_chunks(self._older_positions(), self._ready, self._transient, STREAM_ENTRIES)

    # ---- files (the rest in queue_index_files.py) --------------------------------------------

    def compact(self) -> None:
        """Rewrite ``enq`` with the live entries and empty ``ack`` (crash-safe: tmp, fsync, rename)."""
        enq, ack = self._enq, self._ack
        if enq is None or ack is None or not self._is_open:
            return
        assert self._enq_pending is not None and self._ack_pending is not None
        if not self._has_directory:
            if self.directory is None or not any(len(chunk) for chunk in self._live_chunks()):
                return  # nothing was ever written and nothing is to be
            self.ensure_directory()
            sync_new_directory(self.directory)  # the rewrite below is durable at once: so its directory
        enq.rewrite_chunks(self._live_chunks())  # bounded chunks: a huge backlog is not copied whole
        # The new enq holds every live entry, so nothing buffered is needed any more; old acks go.
        ack.truncate(0)
        self._measure_ack_room()
        del self._enq_pending[:]
        del self._ack_pending[:]

    # ---- life cycle --------------------------------------------------------------------------

    def close(self, clean: bool = True) -> None:
        """Close the files. Clean: write buffers, compact if anything was acked, fsync."""
        enq, ack = self._enq, self._ack
        if enq is not None and ack is not None and self._is_open:
            self.write_buffers()
            if clean:
                if ack.size:
                    self.compact()
                self.fsync()
                enq.unsynced = ack.unsynced = False
            self._close_files()
        self._is_open = False

    def delete(self) -> None:
        """Drop every message (releasing its segment reference), close and remove the directory.

        The directory is removed at once, even while a flush may be fsyncing its (still open)
        descriptors, so that a queue of the same name can be declared again right away.
        """
        counts = chunked_counts(chain(self._ready_position_chunks(), (self._unacked.to_array(),)))
        self._requeued.clear()
        self._unacked.clear()
        self._transient.clear()
        self._ready.clear()
        self._ready_count = 0
        for pending in (self._enq_pending, self._ack_pending):
            if pending is not None:
                del pending[:]
        self._close_files()
        self._is_open = False
        for segment, n in counts.items():
            self._decref(segment, n)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            if self.directory.parent.exists():
                fsync_dir(self.directory.parent)
            changes.dir_deleted(self.directory)

    def __repr__(self) -> str:
        return (f"QueueIndex({self.name!r}, {'durable' if self.durable else 'transient'}, "
                f"ready={self._ready_count}, unacked={len(self._unacked)})")
