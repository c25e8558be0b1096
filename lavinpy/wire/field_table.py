"""The one AMQP 0-9-1 field-table / field-array codec: validate, decode, encode.

Value types are RabbitMQ's (rabbit_binary_parser), one letter each:

    t bool   b int8   B uint8   s int16   u uint16   I int32   i uint32   l int64   L uint64
    f float32   d float64   D decimal (scale octet + int32)   S long string   x byte array
    T timestamp (uint64 seconds)   F table   A array   V void

``decode_table(..., typed=True)`` returns values that remember their wire type (``Int8(5)`` is an
``int`` that encodes back as ``b``), so ``encode_table(decode_table(b))`` gives back ``b`` for every
canonical encoding (booleans as 0/1, distinct keys). ``typed=False`` returns plain Python values.

Nesting is limited to ``MAX_DEPTH`` tables/arrays (see docs/wire.md): deeper input is refused by
``validate_table`` before anything recurses on it, so every decoder stays far from Python's
recursion limit and whatever the broker accepts from a client decodes again at boot.
"""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "MAX_DEPTH", "FieldTableError", "Float32", "Int8", "Int16", "Int32", "Int64", "RawLongStr",
    "Timestamp", "UInt8", "UInt16", "UInt32", "UInt64", "decode_table", "decode_array", "decode_value",
    "encode_table", "encode_array", "encode_value", "validate_table", "value_end", "check_nesting",
]

# RabbitMQ's own headers nest two levels (x-death: an array of tables); clients a handful. 64 leaves
# ample room while keeping the deepest decode ~200 Python frames below the default recursion limit.
MAX_DEPTH = 64

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MAX_DATETIME_SECONDS = 253402300799  # 9999-12-31T23:59:59Z, the last second a datetime can hold


class FieldTableError(ValueError):
    """A field table or array that cannot be accepted.

    ``reason`` says what is wrong, ``path`` where (table keys and array indexes from the outside in),
    ``too_deep`` whether it is only the nesting limit (the bytes themselves are well formed).
    """

    def __init__(self, reason: str, too_deep: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_deep = too_deep
        self.path: list[str | int] = []

    def where(self) -> str:
        """The path as text, e.g. ``'x-death'[0]'queue'`` (long paths shortened); empty at the top."""
        parts = [f"[{p}]" if isinstance(p, int) else repr(p) for p in self.path]
        if len(parts) > 8:
            parts = [*parts[:4], f"...({len(parts) - 6} more)...", *parts[-2:]]
        return "".join(parts)

    def __str__(self) -> str:
        where = self.where()
        return f"{self.reason} at {where}" if where else self.reason


# --- Typed values: plain Python types that remember their wire letter -------------------------------

class _TypedInt(int):
    __slots__ = ()
    tag = b""
    fmt: struct.Struct

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


class Int8(_TypedInt):
    __slots__ = ()
    tag, fmt = b"b", struct.Struct(">b")


class UInt8(_TypedInt):
    __slots__ = ()
    tag, fmt = b"B", struct.Struct(">B")


class Int16(_TypedInt):
    __slots__ = ()
    tag, fmt = b"s", struct.Struct(">h")


class UInt16(_TypedInt):
    __slots__ = ()
    tag, fmt = b"u", struct.Struct(">H")


class Int32(_TypedInt):
    __slots__ = ()
    tag, fmt = b"I", struct.Struct(">i")


class UInt32(_TypedInt):
    __slots__ = ()
    tag, fmt = b"i", struct.Struct(">I")


class Int64(_TypedInt):
    __slots__ = ()
    tag, fmt = b"l", struct.Struct(">q")


class UInt64(_TypedInt):
    __slots__ = ()
    tag, fmt = b"L", struct.Struct(">Q")


class Timestamp(_TypedInt):
    """A timestamp (seconds) that ``datetime`` cannot hold; in-range ones decode as UTC datetimes."""

    __slots__ = ()
    tag, fmt = b"T", struct.Struct(">Q")


class Float32(float):
    """A 32-bit float; ``raw`` keeps the exact 4 bytes (a NaN's payload would not survive a double)."""

    __slots__ = ("raw",)
    raw: bytes | bytearray | memoryview

    def __repr__(self) -> str:
        return f"Float32({float(self)!r})"


class RawLongStr(bytes):
    """A long string ('S') that is not UTF-8: kept as bytes, encoded back as 'S' (not 'x')."""

    __slots__ = ()


_INT_BY_TAG: dict[int, type[_TypedInt]] = {
    ord(cls.tag): cls for cls in (Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, UInt64)}
_FIXED_WIDTH: dict[int, int] = {  # tag -> bytes after the tag
    ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4, ord("i"): 4,
    ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("T"): 8, ord("V"): 0}
_LENGTH_PREFIXED = frozenset(b"SxFA")
_TABLE, _ARRAY = ord("F"), ord("A")


# --- Validation: one pass, no values built ----------------------------------------------------------

def validate_table(buf: bytes | bytearray | memoryview, pos: int, end: int, depth: int = 1) -> None:
    """Check the table entries in ``buf[pos:end]`` (after its 4-byte length) without decoding them.

    Raises FieldTableError when an entry is truncated, a type letter is unknown, a length runs past
    its table, or tables/arrays nest deeper than ``MAX_DEPTH`` (``depth`` is this table's level).
    Whatever passes decodes with ``decode_table``.
    """
    if depth > MAX_DEPTH:
        raise FieldTableError(f"tables and arrays nested deeper than {MAX_DEPTH} levels", too_deep=True)
    if depth == 1 and end > len(buf):
        raise FieldTableError(f"table length runs {end - len(buf)} bytes past its buffer")
    while pos < end:
        key_end = pos + 1 + buf[pos]
        if key_end >= end:  # the key and at least a type letter must fit
            raise FieldTableError("field name or type truncated")
        key = bytes(buf[pos + 1:key_end])
        try:
            pos = _check_value(buf, key_end, end, depth)
        except FieldTableError as err:
            err.path.insert(0, key.decode("utf-8", "surrogateescape"))
            raise


def check_nesting(value: Any, depth: int = 1) -> None:
    """Refuse a table built in Python (e.g. from JSON) whose dicts and lists nest deeper than
    ``MAX_DEPTH``, as ``validate_table`` refuses such wire bytes: what the management API accepts must
    encode, route and decode at boot like what an AMQP client could send. ``depth`` is ``value``'s
    level when it is a dict or list; the recursion stops at ``MAX_DEPTH`` + 1 whatever the input."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return
    if depth > MAX_DEPTH:
        raise FieldTableError(f"tables and arrays nested deeper than {MAX_DEPTH} levels", too_deep=True)
    for key, item in items:
        try:
            check_nesting(item, depth + 1)
        except FieldTableError as err:
            err.path.insert(0, key)
            raise


def _validate_array(buf: bytes | bytearray | memoryview, pos: int, end: int, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise FieldTableError(f"tables and arrays nested deeper than {MAX_DEPTH} levels", too_deep=True)
    index = 0
    while pos < end:
        try:
            pos = _check_value(buf, pos, end, depth)
        except FieldTableError as err:
            err.path.insert(0, index)
            raise
        index += 1


def _check_value(buf: bytes | bytearray | memoryview, pos: int, end: int, depth: int) -> int:
    """Offset after the tagged value at ``pos`` (which is < end), nested content checked."""
    tag = buf[pos]
    pos += 1
    width = _FIXED_WIDTH.get(tag)
    if width is not None:
        pos += width
        if pos > end:
            raise FieldTableError(f"{chr(tag)!r} value truncated")
        return pos
    if tag not in _LENGTH_PREFIXED:
        raise FieldTableError(f"unknown field type 0x{tag:02x}")
    if pos + 4 > end:
        raise FieldTableError(f"{chr(tag)!r} length truncated")
    start = pos + 4
    stop = start + ((buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3])
    if stop > end:
        raise FieldTableError(f"{chr(tag)!r} length {stop - start} runs past the end of its container")
    if tag == _TABLE:
        validate_table(buf, start, stop, depth + 1)
    elif tag == _ARRAY:
        _validate_array(buf, start, stop, depth + 1)
    return stop


def value_end(buf: bytes | bytearray | memoryview, pos: int, end: int, depth: int = 1) -> int:
    """Offset just past the tagged value at ``pos`` (validated on the way, as ``validate_table``)."""
    if pos >= end:
        raise FieldTableError("field value truncated")
    return _check_value(buf, pos, end, depth)


# --- Decoding (input already validated: lengths and depth are trusted) -------------------------------

def decode_table(buf: bytes | bytearray | memoryview, pos: int, end: int, *,
                 typed: bool = True) -> dict[str, Any]:
    """Validate and decode the entries in ``buf[pos:end]`` (after the 4-byte length) into a dict.

    Keys that are not UTF-8 are decoded with surrogateescape, so they encode back to the same bytes.
    A repeated key keeps its last value.
    """
    validate_table(buf, pos, end)
    return _decode_table(buf if isinstance(buf, bytes) else bytes(buf), pos, end, typed)


def decode_array(buf: bytes | bytearray | memoryview, pos: int, end: int, *, typed: bool = True) -> list[Any]:
    """Validate and decode the values in ``buf[pos:end]`` (after the 4-byte length) into a list."""
    if end > len(buf):
        raise FieldTableError(f"array length runs {end - len(buf)} bytes past its buffer")
    _validate_array(buf, pos, end, 1)
    return _decode_array(buf if isinstance(buf, bytes) else bytes(buf), pos, end, typed)


def decode_value(buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None, *,
                 typed: bool = True) -> tuple[Any, int]:
    """(value, offset after it) of the tagged value at ``pos``, validated first."""
    end = len(buf) if end is None else end
    value_end(buf, pos, end)
    return _decode_value(buf if isinstance(buf, bytes) else bytes(buf), pos, typed)


def _decode_table(buf: bytes, pos: int, end: int, typed: bool) -> dict[str, Any]:
    table: dict[str, Any] = {}
    while pos < end:
        key_end = pos + 1 + buf[pos]
        key = buf[pos + 1:key_end].decode("utf-8", "surrogateescape")
        table[key], pos = _decode_value(buf, key_end, typed)
    return table


def _decode_array(buf: bytes, pos: int, end: int, typed: bool) -> list[Any]:
    items = []
    while pos < end:
        item, pos = _decode_value(buf, pos, typed)
        items.append(item)
    return items


def _decode_value(buf: bytes, pos: int, typed: bool) -> tuple[Any, int]:
    tag = buf[pos]
    pos += 1
    int_type = _INT_BY_TAG.get(tag)
    if int_type is not None:
        width = int_type.fmt.size
        value = int_type.fmt.unpack_from(buf, pos)[0]
        return (int_type(value) if typed else value), pos + width
    if tag == 0x53:  # 'S'
        stop = pos + 4 + _U32.unpack_from(buf, pos)[0]
        raw = buf[pos + 4:stop]
        try:
            return raw.decode("utf-8"), stop
        except UnicodeDecodeError:
            return (RawLongStr(raw) if typed else raw), stop
    if tag == 0x74:  # 't'
        return buf[pos] != 0, pos + 1
    if tag == _TABLE:
        stop = pos + 4 + _U32.unpack_from(buf, pos)[0]
        return _decode_table(buf, pos + 4, stop, typed), stop
    if tag == _ARRAY:
        stop = pos + 4 + _U32.unpack_from(buf, pos)[0]
        return _decode_array(buf, pos + 4, stop, typed), stop
    if tag == 0x54:  # 'T'
        seconds = _U64.unpack_from(buf, pos)[0]
        if seconds <= _MAX_DATETIME_SECONDS:
            return _EPOCH + datetime.timedelta(seconds=seconds), pos + 8
        return (Timestamp(seconds) if typed else seconds), pos + 8
    if tag == 0x78:  # 'x'
        stop = pos + 4 + _U32.unpack_from(buf, pos)[0]
        return buf[pos + 4:stop], stop
    if tag == 0x64:  # 'd'
        return _F64.unpack_from(buf, pos)[0], pos + 8
    if tag == 0x66:  # 'f'
        value = _F32.unpack_from(buf, pos)[0]
        if not typed:
            return value, pos + 4
        single = Float32(value)
        single.raw = buf[pos:pos + 4]
        return single, pos + 4
    if tag == 0x44:  # 'D': scale octet, then the unscaled value as int32
        return Decimal(_I32.unpack_from(buf, pos + 1)[0]).scaleb(-buf[pos]), pos + 5
    if tag == 0x56:  # 'V'
        return None, pos
    raise FieldTableError(f"unknown field type 0x{tag:02x}")  # unreachable after validation


# --- Encoding ------------------------------------------------------------------------------------

def encode_table(table: dict[str, Any] | None) -> bytes:
    """The 4-byte length and the entries of ``table`` (None encodes as an empty table)."""
    if not table:
        return b"\x00\x00\x00\x00"
    body = b"".join(_encode_key(key) + encode_value(value) for key, value in table.items())
    return _U32.pack(len(body)) + body


def encode_array(items: list[Any] | tuple[Any, ...]) -> bytes:
    """The 4-byte length and the tagged values of ``items``."""
    body = b"".join(encode_value(item) for item in items)
    return _U32.pack(len(body)) + body


def _encode_key(key: str | bytes) -> bytes:
    data = key.encode("utf-8", "surrogateescape") if isinstance(key, str) else bytes(key)
    if len(data) > 255:
        raise ValueError(f"field name longer than 255 bytes: {data[:40]!r}...")
    return bytes((len(data),)) + data


def encode_value(value: Any) -> bytes:
    """One tagged value. Typed values keep their letter; plain ones get RabbitMQ's clients' choice
    (bool t, int I or l, float d, str S, bytes x, datetime T, Decimal D, dict F, list A, None V)."""
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, _TypedInt):
        try:
            return value.tag + value.fmt.pack(value)
        except struct.error as err:
            raise ValueError(f"{value!r} does not fit its type") from err
    if isinstance(value, int):
        if -(1 << 31) <= value < 1 << 31:
            return b"I" + _I32.pack(value)
        if -(1 << 63) <= value < 1 << 63:
            return b"l" + struct.pack(">q", value)
        raise ValueError(f"integer {value} does not fit a signed 64-bit field")
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogateescape")
        return b"S" + _U32.pack(len(data)) + data
    if isinstance(value, RawLongStr):
        return b"S" + _U32.pack(len(value)) + value
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        return b"x" + _U32.pack(len(data)) + data
    if isinstance(value, Float32):
        return b"f" + value.raw if hasattr(value, "raw") else b"f" + _F32.pack(value)
    if isinstance(value, float):
        return b"d" + _F64.pack(value)
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, list | tuple):
        return b"A" + encode_array(value)
    if value is None:
        return b"V"
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:  # naive datetimes are taken as UTC, as pamqp does
            value = value.replace(tzinfo=datetime.UTC)
        seconds = (value - _EPOCH) // datetime.timedelta(seconds=1)
        if seconds < 0:
            raise ValueError(f"timestamp {value} is before 1970")
        return b"T" + _U64.pack(seconds)
    if isinstance(value, Decimal):
        return b"D" + _encode_decimal(value)
    raise TypeError(f"cannot encode {type(value).__name__} in an AMQP field table")


def _encode_decimal(value: Decimal) -> bytes:
    try:
        _sign, _digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise ValueError(f"decimal {value} is not finite")
        scale = -exponent if exponent < 0 else 0
        unscaled = int(value.scaleb(scale))
    except InvalidOperation as err:
        raise ValueError(f"decimal {value} cannot be encoded") from err
    if scale > 255 or not -(1 << 31) <= unscaled < 1 << 31:
        raise ValueError(f"decimal {value} does not fit an AMQP decimal (scale octet, int32 value)")
    return _U8.pack(scale) + _I32.pack(unscaled)
