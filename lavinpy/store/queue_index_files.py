"""The durable side of a queue's index (queue_index.py): its ``enq``/``ack`` files, their buffers,
and what a flush must sync -- the entries handed to the OS and the queue directory's new names.

``QueueIndex`` builds on ``IndexFiles``; a transient queue has no files (``directory`` None), and every
method here is then a no-op.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from pathlib import Path

from lavinpy.store import changes
from lavinpy.store.entry_file import EntryFile
from lavinpy.store.queue_dir import QUEUE_NAME_FILE, sync_new_directory, write_name_file
from lavinpy.wire.position import ENTRY_SIZE


class IndexFiles:
    """The files of a queue's index and their buffers (the attributes are set by ``QueueIndex``)."""

    name: str
    directory: Path | None
    ack_file_max_bytes: int
    sync_metadata: bool
    _enq_pending: array | None
    _ack_pending: array | None
    _enq: EntryFile | None
    _ack: EntryFile | None
    _ack_room: int
    _has_directory: bool
    _new_names: bool

    def _measure_ack_room(self) -> None:
        """How many buffered acks take the ack file to its limit: the check once per ack is then a
        single comparison. Measured again whenever the file's size changes."""
        if self._ack is not None:
            self._ack_room = -(-(self.ack_file_max_bytes - self._ack.size) // ENTRY_SIZE)

    def ensure_directory(self) -> None:
        """Make the queue's directory and its ``.queue`` file if this is the first write (durable
        queue). Not synced here: the next flush syncs the new names (``take_new_directory``)."""
        if self._has_directory or self.directory is None:
            return
        directory = self.directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = self.name.encode("utf-8")
        name_file = directory / QUEUE_NAME_FILE
        write_name_file(name_file, name)  # synced with the names by the next flush (a crash before: see open)
        changes.replaced(name_file, name)
        self._new_names = True
        self._has_directory = True

    def set_fsync(self, syncs: bool, sync_later: Callable[[Path], None] | None = None) -> None:
        """Whether the fsync policy syncs (not ``never``): new names wait for a flush, and a file
        closed while idle with unsynced entries goes to ``sync_later`` (the store's next flush)."""
        self.sync_metadata = syncs
        for file in (self._enq, self._ack):
            if file is not None:
                file.sync_on_close = syncs
                file.sync_later = sync_later

    def _file_created(self) -> None:
        self._new_names = True

    def take_new_directory(self) -> Path | None:
        """The directory whose new names (itself, ``.queue``, a new ``enq``/``ack``) the next flush
        must make durable, or None; counted as synced (event-loop thread)."""
        if not self._new_names or not self.sync_metadata:
            return None
        self._new_names = False
        return self.directory

    @property
    def has_pending_writes(self) -> bool:
        """Buffered index entries not yet handed to the OS."""
        return bool(self._enq_pending or self._ack_pending)

    @property
    def has_unsynced(self) -> bool:
        """Bytes handed to the OS that a flush has not fsynced yet."""
        enq, ack = self._enq, self._ack
        return enq is not None and ack is not None and (enq.unsynced or ack.unsynced)

    def write_buffers(self) -> None:
        """Hand the buffered enq/ack entries to the OS (event-loop thread)."""
        for pending, file in ((self._enq_pending, self._enq), (self._ack_pending, self._ack)):
            if pending and file is not None:
                if not self._has_directory:
                    self.ensure_directory()
                file.append(pending)
                del pending[:]
        self._measure_ack_room()

    def take_unsynced_fds(self, include_acks: bool = True) -> list[int]:
        """Descriptors a flush must fsync, and marks them synced (event-loop thread).

        ``include_acks=False`` leaves the ack file for a later flush: a publisher confirm needs the
        enq entries on disk, while an ack lost in a crash only means a redelivery.
        """
        enq, ack = self._enq, self._ack
        if enq is None or ack is None or not (enq.unsynced or ack.unsynced):
            return []
        fds: list[int] = []
        enq.take_unsynced(fds)
        if include_acks:
            ack.take_unsynced(fds)
        return fds

    def mark_unsynced(self) -> None:
        """A flush failed: its files are not known to be on disk, so the next one syncs them."""
        for file in (self._enq, self._ack):
            if file is not None:
                file.mark_unsynced()
        if self._has_directory:
            self._new_names = True

    def fsync(self) -> None:
        """fsync the enq and ack files, and new names (event-loop thread: closed files are opened)."""
        for file in (self._enq, self._ack):
            if file is not None:
                file.fsync()
        directory = self.take_new_directory()
        if directory is not None:
            sync_new_directory(directory)

    def _close_files(self) -> None:
        for file in (self._enq, self._ack):
            if file is not None:
                file.close()

    @property
    def open_files(self) -> int:
        """Descriptors the index holds right now (0 when idle)."""
        return sum(1 for file in (self._enq, self._ack) if file is not None and file.is_open)
