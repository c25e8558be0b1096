"""The index of an ``x-max-priority`` queue: highest priority first, FIFO within a priority.

``PriorityIndex`` is a ``QueueIndex`` (same ``enq``/``ack`` files, same durability, compaction, flush and
close) whose ready list is split by priority: one transient ``QueueIndex`` per level holds that level's
ready positions in its packed chunks, so a message still costs ~8 bytes in memory. The per-level lists
do no reference counting (the outer index does it, once per message). On open the levels are rebuilt
by reading each recovered message's ``priority`` property from its record; within a level the order
is the ``enq`` order, so FIFO within a priority holds across restarts. A compacted ``enq`` keeps each
level's order (levels are written one after the other).

The subclass relies on a few internals of ``QueueIndex`` (its pending enq/ack buffers, transient set,
unacked set and reference callbacks); the tests exercise each of them against real files.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lavinpy.store.message_store import MissingRecord
from lavinpy.store.queue_index import DEFAULT_ACK_FILE_MAX_BYTES, QueueIndex
from lavinpy.store.record import CorruptRecord
from lavinpy.wire.properties import PropertiesError, peek_priority

if TYPE_CHECKING:
    from lavinpy.store.message_store import MessageStore
    from lavinpy.store.vhost_store import VhostStore

MAX_PRIORITY = 255


class _NoRefs:
    """Stands in for the message store of the per-level lists: only the outer index counts references."""

    @staticmethod
    def incref(segment_id: int, n: int = 1) -> None:
        pass

    decref = incref


_NO_REFS = _NoRefs()


def message_priority(properties: bytes, max_priority: int) -> int:
    """The level of a message: its priority property capped to ``max_priority``; absent means 0."""
    try:
        priority = peek_priority(properties)
    except PropertiesError:
        return 0
    if priority is None:
        return 0
    return min(priority, max_priority)


class PriorityIndex(QueueIndex):
    """A QueueIndex whose ready messages come out by priority (``push(pos, persistent, priority)``)."""

    def __init__(self, name: str, messages: MessageStore, directory: Path | None,
                 ack_file_max_bytes: int = DEFAULT_ACK_FILE_MAX_BYTES, *, max_priority: int,
                 close_fd: Callable[[int], None] = os.close) -> None:
        if not 1 <= max_priority <= MAX_PRIORITY:
            raise ValueError(f"max_priority must be between 1 and {MAX_PRIORITY}, not {max_priority}")
        self.max_priority = max_priority
        self._levels: list[QueueIndex | None] = [None] * (max_priority + 1)  # created on first use
        self._top = -1  # no level above this one has ready messages
        self._level_of: dict[int, int] = {}  # unacked position -> its level (unacked are few)
        super().__init__(name, messages, directory, ack_file_max_bytes, close_fd=close_fd)

    def _level(self, level_no: int) -> QueueIndex:
        level = self._levels[level_no]
        if level is None:
            level = QueueIndex(f"{self.name} [priority {level_no}]", _NO_REFS, None)  # type: ignore[arg-type]
            level.open()
            self._levels[level_no] = level
        return level

    def _clamp(self, priority: int | None) -> int:
        if priority is None or priority < 0:
            return 0
        return min(priority, self.max_priority)

    def _top_level(self) -> int:
        """The highest level with ready messages, or -1 (amortised O(1): _top only moves down here)."""
        levels = self._levels
        top = self._top
        while top >= 0:
            level = levels[top]
            if level is not None and level.ready_count:
                break
            top -= 1
        self._top = top
        return top

    # ---- loading -----------------------------------------------------------------------------

    def _load_ready(self, live: array) -> None:
        """Spread the recovered positions over the levels, reading each message's priority."""
        read = self.messages.read
        max_priority = self.max_priority
        for pos in live:
            try:
                level_no = message_priority(read(pos).properties, max_priority)
            except (CorruptRecord, MissingRecord):
                level_no = 0  # the queue will close itself when it tries to deliver it
            self._level(level_no).push(pos)
            if level_no > self._top:
                self._top = level_no
        self._ready_count = len(live)

    # ---- the message flow --------------------------------------------------------------------

    def push(self, pos: int, persistent: bool = True, priority: int | None = None) -> None:
        """Append a message to the tail of its level. ``priority=None`` reads it from the record."""
        if priority is None:
            priority = message_priority(self.messages.read(pos).properties, self.max_priority)
        level_no = self._clamp(priority)
        self._level(level_no).push(pos)
        if level_no > self._top:
            self._top = level_no
        self._ready_count += 1
        self._record_push(pos, persistent)

    def peek(self) -> int | None:
        top = self._top_level()
        return None if top < 0 else self._levels[top].peek()  # type: ignore[union-attr]

    def peek_priority(self) -> int | None:
        """The level of the next message to deliver, or None when there is none."""
        top = self._top_level()
        return None if top < 0 else top

    def shift(self) -> int | None:
        top = self._top_level()
        if top < 0:
            return None
        pos = self._levels[top].shift()  # type: ignore[union-attr]
        assert pos is not None
        self._ready_count -= 1
        self._unacked.add(pos)
        self._level_of[pos] = top
        return pos

    def ack(self, pos: int) -> None:
        if pos not in self._unacked:
            raise KeyError(f"queue {self.name!r}: position {pos:#x} is not unacked")
        # Leave the level first: the base ack may compact, and compaction lists the levels' unacked.
        self._levels[self._level_of.pop(pos)].ack(pos)  # type: ignore[union-attr]
        super().ack(pos)

    def requeue(self, pos: int) -> None:
        """Back to the head of its own level, ahead of never-delivered messages of that level."""
        if pos not in self._unacked:
            raise KeyError(f"queue {self.name!r}: position {pos:#x} is not unacked")
        self._unacked.remove(pos)
        level_no = self._level_of.pop(pos)
        self._levels[level_no].requeue(pos)  # type: ignore[union-attr]
        self._ready_count += 1
        if level_no > self._top:
            self._top = level_no

    def purge(self) -> int:
        count = self._ready_count
        if count == 0:
            return 0
        removed = self._ready_array()
        for level in self._levels:
            if level is not None:
                level.purge()
        self._ready_count = 0
        self._top = -1
        self._record_removed(removed)
        return count

    def ready_by_priority(self) -> dict[int, int]:
        """Ready messages per level (levels with none are left out)."""
        return {n: level.ready_count for n, level in enumerate(self._levels) if level is not None and level.ready_count}

    def __iter__(self) -> Iterator[int]:
        """Ready positions in delivery order."""
        for level in reversed(self._levels):
            if level is not None:
                yield from level

    def _ready_array(self) -> array:
        out = array("Q")
        for level in reversed(self._levels):
            if level is not None:
                out.extend(level._ready_array())
        return out

    def _live_array_all(self) -> array:
        """Ready and unacked positions, level after level, each level in enq order."""
        out = array("Q")
        for level in self._levels:
            if level is not None:
                out.extend(level._live_array_all())
        return out

    def delete(self) -> None:
        super().delete()
        for level in self._levels:
            if level is not None:
                level.delete()
        self._levels = [None] * (self.max_priority + 1)
        self._level_of.clear()
        self._top = -1

    def __repr__(self) -> str:
        kind = "durable" if self.durable else "transient"
        return (f"PriorityIndex({self.name!r}, {kind}, max_priority={self.max_priority}, "
                f"ready={self._ready_count}, unacked={len(self._unacked)})")


def open_custom_index(store: VhostStore, name: str, durable: bool,
                      factory: Callable[..., QueueIndex]) -> QueueIndex:
    """Open an index of a QueueIndex subclass and register it with the store, like ``open_queue``.

    Registered indexes take part in the store's group-commit flush and are closed (compacted) with
    it. ``factory(name, messages, directory, ack_file_max_bytes, close_fd=...)`` builds the index.
    """
    existing = store.queues.get(name)
    if existing is not None:
        if existing.durable != durable:
            raise ValueError(f"queue {name!r} is already open as {'durable' if existing.durable else 'transient'}")
        return existing
    directory = store.queue_path(name) if durable else None
    # The store's close function defers closing a descriptor a running flush may be fsyncing.
    close_fd = getattr(store, "_close_fd", os.close)
    index = factory(name, store.messages, directory, store.ack_file_max_bytes, close_fd=close_fd)
    index.open()
    store.queues[name] = index
    return index


def open_priority_index(store: VhostStore, name: str, durable: bool, max_priority: int) -> PriorityIndex:
    """``VhostStore.open_queue`` for an x-max-priority queue."""
    index = open_custom_index(store, name, durable, lambda *args, **kwargs: PriorityIndex(
        *args, max_priority=max_priority, **kwargs))
    if not isinstance(index, PriorityIndex):
        raise ValueError(f"queue {name!r} is already open without priorities")
    return index
