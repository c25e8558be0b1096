"""The kinds of index a vhost store opens: ``VhostStore.open_queue(name, durable, kind=...)``.

A kind says how an index orders its ready messages; the ordering key of a recovered message
(priority, due time) comes from the broker as a function, so the store never reads properties.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lavinpy.store.delayed_index import DelayedIndex
from lavinpy.store.priority_index import PriorityIndex
from lavinpy.store.queue_index import QueueIndex
from lavinpy.store.record import StoredMessage
from lavinpy.store.stream_index import StreamIndex

if TYPE_CHECKING:
    from lavinpy.store.message_store import MessageStore

# Every index the store flushes, closes and deletes.
AnyIndex = QueueIndex | StreamIndex


@dataclass(frozen=True)
class Fifo:
    """A classic queue: first in, first out (requeued messages first)."""

    def build(self, name: str, messages: MessageStore, directory: Path | None, ack_file_max_bytes: int,
              close_fd: Callable[[int], None] = os.close) -> AnyIndex:
        return QueueIndex(name, messages, directory, ack_file_max_bytes, close_fd=close_fd)

    def matches(self, index: AnyIndex) -> bool:
        return type(index) is QueueIndex


@dataclass(frozen=True)
class ByPriority:
    """An x-max-priority queue; ``priority_of`` maps a property block to a level."""

    max_priority: int
    priority_of: Callable[[bytes], int]

    def build(self, name: str, messages: MessageStore, directory: Path | None, ack_file_max_bytes: int,
              close_fd: Callable[[int], None] = os.close) -> AnyIndex:
        return PriorityIndex(name, messages, directory, ack_file_max_bytes, max_priority=self.max_priority,
                             priority_of=self.priority_of, close_fd=close_fd)

    def matches(self, index: AnyIndex) -> bool:
        return isinstance(index, PriorityIndex)


@dataclass(frozen=True)
class ByDueTime:
    """A delayed exchange's held messages; ``due_of`` gives a record's due time (ms)."""

    due_of: Callable[[StoredMessage], int]

    def build(self, name: str, messages: MessageStore, directory: Path | None, ack_file_max_bytes: int,
              close_fd: Callable[[int], None] = os.close) -> AnyIndex:
        return DelayedIndex(name, messages, directory, ack_file_max_bytes, due_of=self.due_of, close_fd=close_fd)

    def matches(self, index: AnyIndex) -> bool:
        return isinstance(index, DelayedIndex)


@dataclass(frozen=True)
class Stream:
    """A stream's offset log (durable only)."""

    def build(self, name: str, messages: MessageStore, directory: Path | None, ack_file_max_bytes: int,
              close_fd: Callable[[int], None] = os.close) -> AnyIndex:
        if directory is None:
            raise ValueError(f"stream {name!r} must be durable")
        return StreamIndex(name, messages, directory, close_fd=close_fd)

    def matches(self, index: AnyIndex) -> bool:
        return isinstance(index, StreamIndex)


IndexKind = Fifo | ByPriority | ByDueTime | Stream
FIFO = Fifo()
STREAM = Stream()
