"""``definitions.amqp``: a vhost's durable exchanges, queues and bindings as AMQP method frames.

Layout (version 2): a 4-byte version (uint32 little-endian, 2), then one record per
declare/delete/bind/unbind of a durable object, in the order they happened: a u32 length and a u32
CRC-32 of the frame (little-endian), then a complete AMQP method frame on channel 0 (type, channel,
size, payload, 0xCE). Replaying the frames gives the current state. A record that fails its CRC or
cannot be decoded is skipped with an error naming its offset; the records after it are kept (a
damaged length is passed by searching for the next record that checks out). Version 1 files (the
frames without length and CRC) are read the same way and rewritten as version 2. Deletes and unbinds make the log
longer than the state, so the log is rewritten (compacted) from the in-memory state at boot when it
holds any, and at run time after ``compact_deletes`` of them.

An append is handed to the OS at once (a killed process keeps it). Alone, the log fsyncs each
append before returning; once a vhost store's group commit syncs it (``group_commit``), appends
are only marked unsynced, the ``on_append`` hook lets the owner join the next flush, and its -ok
replies wait for that flush: many declarations, one fsync.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from pamqp import commands
from pamqp import frame as pamqp_frame

from lavinpy.store import changes
from lavinpy.store.jsonfile import FILE_MODE, write_bytes_atomic
from lavinpy.wire.frames import method_fields

log = logging.getLogger(__name__)

VERSION = 2
VERSION_1 = 1  # frames without a length and CRC: still read, rewritten as version 2 at load
HEADER = struct.pack("<I", VERSION)
_RECORD_HEADER = struct.Struct("<II")  # frame length, crc32 of the frame
_MIN_FRAME = 8 + 4  # frame header, method index, frame end
FRAME_METHOD = 1
FRAME_END = 0xCE
_FRAME_HEADER = struct.Struct(">BHI")  # AMQP frame header: type, channel, payload size (big-endian)
_METHOD_INDEX = struct.Struct(">I")

Declare = commands.Exchange.Declare | commands.Queue.Declare
Binding = commands.Exchange.Bind | commands.Queue.Bind
Command = (
    commands.Exchange.Declare
    | commands.Exchange.Delete
    | commands.Exchange.Bind
    | commands.Exchange.Unbind
    | commands.Queue.Declare
    | commands.Queue.Delete
    | commands.Queue.Bind
    | commands.Queue.Unbind
)
COMMAND_TYPES = (
    commands.Exchange.Declare,
    commands.Exchange.Delete,
    commands.Exchange.Bind,
    commands.Exchange.Unbind,
    commands.Queue.Declare,
    commands.Queue.Delete,
    commands.Queue.Bind,
    commands.Queue.Unbind,
)
# Commands that make the log longer than the state it describes.
REMOVAL_TYPES: tuple[type, ...] = (
    commands.Exchange.Delete,
    commands.Exchange.Unbind,
    commands.Queue.Delete,
    commands.Queue.Unbind,
)


class DefinitionsFileError(ValueError):
    """The definitions file cannot be used (wrong version)."""


def encode_command(command: Command) -> bytes:
    """One complete channel-0 method frame, byte-identical to ``pamqp.frame.marshal(command, 0)``.

    The fields are encoded with ``method_fields`` rather than pamqp's marshal, which rejects exchange
    and queue names outside ``[a-zA-Z0-9-_.:@#,/+ ]``, while AMQP (and RabbitMQ) allow any UTF-8 name,
    and a name the broker accepted must be storable.
    """
    payload = _METHOD_INDEX.pack(command.index) + method_fields(command)
    return _FRAME_HEADER.pack(FRAME_METHOD, 0, len(payload)) + payload + bytes((FRAME_END,))


def encode_record(command: Command) -> bytes:
    """One version-2 record: length, CRC-32, then the frame."""
    frame = encode_command(command)
    return _RECORD_HEADER.pack(len(frame), zlib.crc32(frame)) + frame


def decode_frame(frame: bytes) -> Command:
    """The command of one whole method frame; ValueError says why it cannot be used."""
    if len(frame) < _MIN_FRAME:
        raise ValueError("frame too short")
    frame_type, channel, size = _FRAME_HEADER.unpack_from(frame, 0)
    if frame_type != FRAME_METHOD or channel != 0 or frame[-1] != FRAME_END \
            or size != len(frame) - _FRAME_HEADER.size - 1:
        raise ValueError("not a channel-0 method frame")
    try:
        _, _, command = pamqp_frame.unmarshal(frame)
    except Exception as exc:  # any garbage (or nesting too deep to decode) may reach the decoder
        raise ValueError(f"undecodable frame ({type(exc).__name__}: {exc})") from None
    if not isinstance(command, COMMAND_TYPES):
        raise ValueError(f"unexpected method {type(command).__name__}")
    return command


class LoadReport:
    """What a load found besides valid records: errors by offset, and a cut-off tail."""

    def __init__(self) -> None:
        self.errors: list[tuple[int, str]] = []
        self.tail: tuple[int, str] | None = None  # (offset, why) of an interrupted last write


def _v2_record_at(data: bytes, pos: int) -> int:
    """End of the version-2 record at ``pos`` if its length fits and its CRC matches, else -1."""
    if pos + _RECORD_HEADER.size > len(data):
        return -1
    length, crc = _RECORD_HEADER.unpack_from(data, pos)
    end = pos + _RECORD_HEADER.size + length
    if length < _MIN_FRAME or end > len(data) or zlib.crc32(data[pos + _RECORD_HEADER.size:end]) != crc:
        return -1
    return end


def _v1_frame_at(data: bytes, pos: int) -> int:
    """End of the version-1 frame at ``pos`` if it is framed as a channel-0 method frame, else -1."""
    if pos + _FRAME_HEADER.size + 1 > len(data):
        return -1
    frame_type, channel, size = _FRAME_HEADER.unpack_from(data, pos)
    end = pos + _FRAME_HEADER.size + size + 1
    if frame_type != FRAME_METHOD or channel != 0 or end > len(data) or data[end - 1] != FRAME_END:
        return -1
    return end


def decode_log(data: bytes, version: int, report: LoadReport) -> list[Command]:
    """Every usable command of a definitions file's body (after its 4-byte version).

    A bad record is skipped (noted in ``report.errors``); when its length cannot be trusted the next
    record is found by trying each following offset. Bytes after the last valid record in which no
    record starts are an interrupted write when they run past the end of the file (``report.tail``),
    and damage otherwise.
    """
    v2 = version == VERSION
    found: list[Command] = []
    pos = len(HEADER)
    while pos < len(data):
        end = _v2_record_at(data, pos) if v2 else _v1_frame_at(data, pos)
        if end >= 0:
            try:
                found.append(decode_frame(data[pos + _RECORD_HEADER.size:end] if v2 else data[pos:end]))
            except ValueError as exc:
                report.errors.append((pos, str(exc)))
            pos = end
            continue
        start = pos
        pos += 1
        while pos < len(data) and not _resyncs(data, pos, v2):
            pos += 1
        if pos < len(data):
            report.errors.append((start, f"damaged record ({pos - start} bytes skipped)"))
        elif _runs_past_end(data, start, v2) or not data[start:].strip(b"\0"):
            report.tail = (start, "an incomplete last record")
        else:
            report.errors.append((start, f"damaged record ({pos - start} bytes skipped)"))
    return found


def _resyncs(data: bytes, pos: int, v2: bool) -> bool:
    end = _v2_record_at(data, pos) if v2 else _v1_frame_at(data, pos)
    if end < 0:
        return False
    if v2:
        return True  # a CRC match is as good as it gets
    try:  # version 1 has no checksum: a frame must also decode to count
        decode_frame(data[pos:end])
    except ValueError:
        return False
    return True


def _runs_past_end(data: bytes, pos: int, v2: bool) -> bool:
    head = _RECORD_HEADER if v2 else _FRAME_HEADER
    if pos + head.size > len(data):
        return True
    if v2:
        length, crc = _RECORD_HEADER.unpack_from(data, pos)
        # A complete last record whose length alone is damaged still matches its CRC: damage, not a tail.
        return (pos + _RECORD_HEADER.size + length > len(data)
                and zlib.crc32(data[pos + _RECORD_HEADER.size:]) != crc)
    size = _FRAME_HEADER.unpack_from(data, pos)[2]
    return pos + _FRAME_HEADER.size + size + 1 > len(data)


def decode_frames(data: bytes, offset: int) -> tuple[list[Command], int, str | None]:
    """Decode frames from ``offset``: (commands, end of the last whole frame, why decoding stopped)."""
    found: list[Command] = []
    view = memoryview(data)
    while offset < len(data):
        if len(data) - offset < _FRAME_HEADER.size + 1:
            return found, offset, "truncated frame header"
        frame_type, channel, size = _FRAME_HEADER.unpack_from(data, offset)
        end = offset + _FRAME_HEADER.size + size + 1
        if end > len(data):
            return found, offset, f"truncated frame (needs {end - offset} bytes, {len(data) - offset} left)"
        if frame_type != FRAME_METHOD or channel != 0 or data[end - 1] != FRAME_END:
            return found, offset, "not a channel-0 method frame"
        try:
            _, _, command = pamqp_frame.unmarshal(bytes(view[offset:end]))
        except Exception as exc:  # any garbage may reach the decoder; all of it means "stop here"
            return found, offset, f"undecodable frame ({exc})"
        if not isinstance(command, COMMAND_TYPES):
            return found, offset, f"unexpected method {type(command).__name__}"
        found.append(command)
        offset = end
    return found, offset, None


def _freeze(value: Any) -> Hashable:
    """A hashable, order-insensitive form of an AMQP field value (tables compare by content and type)."""
    if isinstance(value, dict):
        return ("table", tuple((key, _freeze(value[key])) for key in sorted(value)))
    if isinstance(value, list | tuple):
        return ("array", tuple(_freeze(item) for item in value))
    return (type(value).__name__, value)


def binding_key(command: Binding | commands.Exchange.Unbind | commands.Queue.Unbind) -> tuple:
    """(kind, source exchange, destination, routing key, arguments): what identifies a binding."""
    arguments = _freeze(command.arguments or {})
    if isinstance(command, commands.Queue.Bind | commands.Queue.Unbind):
        return ("queue", command.exchange, command.queue, command.routing_key, arguments)
    return ("exchange", command.source, command.destination, command.routing_key, arguments)


class DefinitionsLog:
    """Append-only log of durable definitions for one vhost, with an in-memory model of the state."""

    def __init__(self, path: Path, compact_deletes: int = 8192) -> None:
        self.path = Path(path)
        self.compact_deletes = compact_deletes
        self._exchanges: dict[str, commands.Exchange.Declare] = {}
        self._queues: dict[str, commands.Queue.Declare] = {}
        self._bindings: dict[tuple, Binding] = {}
        self._removals_since_compact = 0
        self.damaged_records = 0  # records the last load() skipped as damaged
        self._fd = -1
        # closes the descriptor: a store's group commit defers it while a flush may be syncing it
        self.close_fd: Callable[[int], None] = os.close
        self._size = 0  # bytes in the file (the offset of the next record)
        self.unsynced = False  # appended since the last sync
        self.group_commit = False  # a store's flush syncs the file (else: fsync per append)
        self.on_append: Callable[[], None] | None = None
        self._apply_by_type: dict[type, Callable[[Any], None]] = {
            commands.Exchange.Declare: self._declare_exchange,
            commands.Exchange.Delete: self._delete_exchange,
            commands.Exchange.Bind: self._bind,
            commands.Exchange.Unbind: self._unbind,
            commands.Queue.Declare: self._declare_queue,
            commands.Queue.Delete: self._delete_queue,
            commands.Queue.Bind: self._bind,
            commands.Queue.Unbind: self._unbind,
        }

    # -- public API ---------------------------------------------------------------------------

    def load(self) -> list[Command]:
        """Replay the file and return the current state: exchange, then queue declares, then binds."""
        self.close()
        self._exchanges.clear()
        self._queues.clear()
        self._bindings.clear()
        self._removals_since_compact = 0
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            write_bytes_atomic(self.path, HEADER)
            self._open_for_append()
            return []
        if len(data) < len(HEADER):
            # Only an interrupted creation can leave this; there is nothing to lose.
            log.warning("%s: %d-byte file has no complete header; starting it afresh", self.path, len(data))
            write_bytes_atomic(self.path, HEADER)
            self._open_for_append()
            return []
        (version,) = struct.unpack_from("<I", data, 0)
        if version not in (VERSION, VERSION_1):
            raise DefinitionsFileError(
                f"{self.path}: definitions file version {version}, this lavinpy reads versions "
                f"{VERSION_1} and {VERSION}"
            )
        report = LoadReport()
        self.damaged_records = 0
        for command in decode_log(data, version, report):
            self._apply(command)
        self.damaged_records = len(report.errors)
        for offset, problem in report.errors:
            log.error("%s: definition record at offset %d skipped: %s; the definitions after it are kept",
                      self.path, offset, problem)
        if report.errors:
            kept = self.path.with_name(f"{self.path.name}.damaged-{time.time_ns() // 1_000_000}")
            write_bytes_atomic(kept, data)
            log.error("%s: the file as found is kept as %s", self.path, kept.name)
        if report.tail is not None:
            offset, problem = report.tail
            log.warning("%s: ignoring %d bytes after offset %d (%s); likely an interrupted write",
                        self.path, len(data) - offset, offset, problem)
        if version != VERSION or report.errors or report.tail is not None or self._removals_since_compact:
            self.compact()  # rewritten as the state it describes, in the current format
        else:
            self._open_for_append()
        return self.current()

    def append(self, command: Command) -> None:
        """Append one command durably (fsynced on return), then update the state.

        Passive declares change nothing and are not written.
        """
        if not isinstance(command, COMMAND_TYPES):
            raise TypeError(f"cannot store {type(command).__name__} in definitions.amqp")
        if isinstance(command, commands.Exchange.Declare | commands.Queue.Declare) and command.passive:
            return
        fd = self._fd
        if fd < 0:
            raise RuntimeError(f"{self.path}: load() must be called before append()")
        record = encode_record(command)
        written = os.write(fd, record)
        while written < len(record):  # a regular file takes it whole but for a full disk; finish or raise
            written += os.write(fd, record[written:])
        offset = self._size
        self._size += len(record)
        if changes.feed.listener is not None:
            changes.appended(self.path, offset, record)
        if self.group_commit:
            self.unsynced = True
        else:
            os.fsync(fd)
        self._apply(command)
        if self._removals_since_compact >= self.compact_deletes:
            self.compact()
        if self.on_append is not None:
            self.on_append()

    # -- group commit (a vhost store's flush) ---------------------------------------------------

    @property
    def has_unsynced(self) -> bool:
        return self.unsynced

    def take_unsynced_fds(self) -> list[int]:
        """The descriptor a flush must fsync, counted as synced (event-loop thread)."""
        if not self.unsynced or self._fd < 0:
            return []
        self.unsynced = False
        return [self._fd]

    def mark_unsynced(self) -> None:
        """A flush that took the descriptor failed: the next one syncs it again."""
        self.unsynced = True

    def sync(self) -> None:
        """fsync now what was appended and not synced (no event loop to wait in)."""
        if self.unsynced and self._fd >= 0:
            os.fsync(self._fd)
            self.unsynced = False

    def compact(self) -> None:
        """Rewrite the file as the current state only (via ``.tmp``, fsync, rename, fsync dir)."""
        data = HEADER + b"".join(encode_record(command) for command in self.current())
        self.close()
        try:
            write_bytes_atomic(self.path, data)
            self._removals_since_compact = 0
            self.unsynced = False  # the new file is on disk
        finally:
            self._open_for_append()

    def current(self) -> list[Command]:
        """The current state, in an order that can be replayed: exchanges, queues, bindings."""
        return [*self._exchanges.values(), *self._queues.values(), *self._bindings.values()]

    def close(self) -> None:
        if self._fd >= 0:
            if self.unsynced:
                os.fsync(self._fd)
                self.unsynced = False
            fd, self._fd = self._fd, -1
            self.close_fd(fd)

    # -- state model --------------------------------------------------------------------------

    def _apply(self, command: Command) -> None:
        self._apply_by_type[type(command)](command)
        if isinstance(command, REMOVAL_TYPES):
            self._removals_since_compact += 1

    def _declare_exchange(self, command: commands.Exchange.Declare) -> None:
        self._exchanges[command.exchange] = command

    def _declare_queue(self, command: commands.Queue.Declare) -> None:
        self._queues[command.queue] = command

    def _delete_exchange(self, command: commands.Exchange.Delete) -> None:
        name = command.exchange
        self._exchanges.pop(name, None)
        # Bindings from the exchange, and exchange-to-exchange bindings to it, go with it.
        self._drop_bindings(lambda kind, src, dest: src == name or (kind == "exchange" and dest == name))

    def _delete_queue(self, command: commands.Queue.Delete) -> None:
        name = command.queue
        self._queues.pop(name, None)
        self._drop_bindings(lambda kind, source, dest: kind == "queue" and dest == name)

    def _bind(self, command: Binding) -> None:
        self._bindings[binding_key(command)] = command

    def _unbind(self, command: commands.Exchange.Unbind | commands.Queue.Unbind) -> None:
        self._bindings.pop(binding_key(command), None)

    def _drop_bindings(self, matches: Callable[[str, str, str], bool]) -> None:
        for key in [key for key in self._bindings if matches(key[0], key[1], key[2])]:
            del self._bindings[key]

    # -- file handling ------------------------------------------------------------------------

    def _open_for_append(self) -> None:
        # The descriptor lives as long as the log (closed in close()/compact()).
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                           FILE_MODE)
        self._size = os.fstat(self._fd).st_size
