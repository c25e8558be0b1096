"""The store's change feed: every mutation of a durable file, as an absolute operation.

A replication leader attaches one ``FileChanges`` listener for its data directory; every place in the
store that changes a durable file reports it here, with the path relative to the data directory.
Each operation is absolute (write these bytes at this offset, replace the whole file, set the size,
delete), so applying a suffix of the feed twice leaves the same files: that is what lets a follower
take a full copy while the leader keeps writing and then replay everything reported since.

With no listener attached every hook costs one ``is None`` check per batch or file operation; the
per-message paths are untouched (segment bytes are reported per group commit, from the dirty ranges
the flush collects anyway).

The feed is module-level rather than threaded through constructors because durable files are also
written by free functions (``jsonfile.write_bytes_atomic``) that the broker calls for users, vhosts
and policies; one process serves one data directory.
"""

from __future__ import annotations

import asyncio
import os
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class FileChanges(Protocol):
    """What a replication leader receives. Paths are relative to the data directory, '/'-separated."""

    def file_appended(self, rel_path: str, offset: int, data: bytes) -> None:
        """``data`` was written at ``offset`` (the file is created if absent)."""

    def file_replaced(self, rel_path: str, data: bytes) -> None:
        """The file now holds exactly ``data`` (atomic replace)."""

    def file_truncated(self, rel_path: str, size: int) -> None:
        """The file's size is now ``size`` (created if absent; grown with zeros or cut)."""

    def file_deleted(self, rel_path: str) -> None:
        """The file is gone."""

    def dir_deleted(self, rel_path: str) -> None:
        """The directory and everything in it are gone."""


class ReplicationBarrier(Protocol):
    """Tells when every in-sync follower acknowledged everything reported before the call."""

    def wait_replicated(self) -> asyncio.Future[None]:
        """Await the result. The stream position is taken at the call, not when it is awaited, so
        a flush can take it before its local sync and let the followers work meanwhile."""

    def on_replicated(self, callback: Callable[[], None]) -> None:
        """``wait_replicated`` as a plain callback, called on the event loop in the turn the last
        acknowledgement arrives (at once if none is outstanding): a flush's confirms go out without
        a further turn for a future's callbacks."""


class _Feed:
    __slots__ = ("listener", "root")

    def __init__(self) -> None:
        self.listener: FileChanges | None = None
        self.root = ""


feed = _Feed()


def attach(root: Path, listener: FileChanges | None) -> None:
    """Report the mutations of files under ``root`` to ``listener`` (None detaches)."""
    feed.root = os.path.abspath(root) + os.sep
    feed.listener = listener


def relative(path: Path | str) -> str | None:
    """``path`` relative to the attached data directory, or None when it lies outside it."""
    absolute = os.path.abspath(path)
    if not absolute.startswith(feed.root):
        return None
    return absolute[len(feed.root):].replace(os.sep, "/")


def appended(path: Path | str, offset: int, data: bytes | memoryview) -> None:
    listener = feed.listener
    if listener is not None and (rel := relative(path)) is not None:
        listener.file_appended(rel, offset, bytes(data))


def appended_fd(fd: int, path: Path | str, data: bytes | memoryview) -> None:
    """``data`` was just appended through ``fd`` (O_APPEND): it ends at the descriptor's position."""
    listener = feed.listener
    if listener is not None and (rel := relative(path)) is not None:
        end = os.lseek(fd, 0, os.SEEK_CUR)
        listener.file_appended(rel, end - len(data), bytes(data))


def replaced(path: Path | str, data: bytes | memoryview | array) -> None:
    listener = feed.listener
    if listener is not None and (rel := relative(path)) is not None:
        listener.file_replaced(rel, bytes(data))


def truncated(path: Path | str, size: int) -> None:
    listener = feed.listener
    if listener is not None and (rel := relative(path)) is not None:
        listener.file_truncated(rel, size)


def deleted(path: Path | str) -> None:
    listener = feed.listener
    if listener is not None and (rel := relative(path)) is not None:
        listener.file_deleted(rel)


def dir_deleted(path: Path | str) -> None:
    listener = feed.listener
    if listener is not None and (rel := relative(path)) is not None:
        listener.dir_deleted(rel)
