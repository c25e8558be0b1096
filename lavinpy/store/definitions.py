"""``definitions.amqp``: a vhost's durable exchanges, queues and bindings as AMQP method frames.

Layout: a 4-byte version (uint32 little-endian, 1), then complete AMQP method frames on channel 0
(type, channel, size, payload, 0xCE), one per declare/delete/bind/unbind of a durable object, in the
order they happened. Replaying the frames gives the current state. Deletes and unbinds make the log
longer than the state, so the log is rewritten (compacted) from the in-memory state at boot when it
holds any, and at run time after ``compact_deletes`` of them.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, BinaryIO

from pamqp import commands, encode
from pamqp import frame as pamqp_frame

from lavinpy.store.jsonfile import write_bytes_atomic

log = logging.getLogger(__name__)

VERSION = 1
HEADER = struct.pack("<I", VERSION)
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
COMMAND_TYPES: tuple[type, ...] = (
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

    The frame is built here rather than with ``pamqp.frame.marshal`` because pamqp's marshal rejects
    exchange and queue names outside ``[a-zA-Z0-9-_.:@#,/+ ]``, while AMQP (and RabbitMQ) allow any
    UTF-8 name, and a name the broker accepted must be storable.
    """
    payload = _METHOD_INDEX.pack(command.index) + _encode_fields(command)
    return _FRAME_HEADER.pack(FRAME_METHOD, 0, len(payload)) + payload + bytes((FRAME_END,))


def _encode_fields(command: Command) -> bytes:
    parts: list[bytes] = []
    bits: list[bool] = []
    for name in command.__slots__:
        kind = command.amqp_type(name)
        value = getattr(command, name)
        if kind == "bit":
            bits.append(bool(value))
            continue
        if bits:
            parts.append(_pack_bits(bits))
            bits = []
        parts.append(encode.by_type(value, kind))
    if bits:
        parts.append(_pack_bits(bits))
    return b"".join(parts)


def _pack_bits(bits: list[bool]) -> bytes:
    # Consecutive AMQP bit fields share octets, least significant bit first, 8 per octet.
    out = bytearray()
    for start in range(0, len(bits), 8):
        out.append(sum(1 << i for i, bit in enumerate(bits[start:start + 8]) if bit))
    return bytes(out)


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
        self._file: BinaryIO | None = None
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
        if version != VERSION:
            raise DefinitionsFileError(
                f"{self.path}: definitions file version {version}, this lavinpy reads version {VERSION}"
            )
        found, end, problem = decode_frames(data, len(HEADER))
        for command in found:
            self._apply(command)
        if problem is not None:
            log.warning(
                "%s: ignoring %d bytes after offset %d (%s); likely an interrupted write",
                self.path, len(data) - end, end, problem,
            )
            self._truncate(end)
        if self._removals_since_compact:
            self.compact()
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
        if self._file is None:
            raise RuntimeError(f"{self.path}: load() must be called before append()")
        self._file.write(encode_command(command))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._apply(command)
        if self._removals_since_compact >= self.compact_deletes:
            self.compact()

    def compact(self) -> None:
        """Rewrite the file as the current state only (via ``.tmp``, fsync, rename, fsync dir)."""
        data = HEADER + b"".join(encode_command(command) for command in self.current())
        self.close()
        try:
            write_bytes_atomic(self.path, data)
            self._removals_since_compact = 0
        finally:
            self._open_for_append()

    def current(self) -> list[Command]:
        """The current state, in an order that can be replayed: exchanges, queues, bindings."""
        return [*self._exchanges.values(), *self._queues.values(), *self._bindings.values()]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

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
        # The handle lives as long as the log (closed in close()/compact()), hence no context manager.
        self._file = open(self.path, "ab")  # noqa: SIM115

    def _truncate(self, size: int) -> None:
        with open(self.path, "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
