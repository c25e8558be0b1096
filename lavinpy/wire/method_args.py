"""A general method's arguments decoded in one pass over its frame, each field checked as it is read.

pamqp's own ``unmarshal`` slices off the rest of the payload after every field, and its table decoder
after every entry, so a method whose arguments table holds many small entries costs time quadratic in
its size (a queue.declare with a 98 KiB table of 11,000 entries: 35-90 ms of the loop, every other
client waiting). This walks the payload once and fills the pamqp method object's slots with exactly
what pamqp's reading gives: unsigned octet/short/long, a signed longlong, bits packed eight to an
octet, short strings as strict UTF-8, long strings as text or, when not UTF-8, bytes; tables validated
first (``field_table.validate_table``: nesting bounded, every length inside its container), then read
as pamqp reads them (``args_table``: compiled in ``_cwire_table.c``, with its pure twin here).

Like RabbitMQ, the arguments must fill the frame exactly: a truncated field, or bytes left over, is
``ValueError`` (the reader answers 502 naming the method); a table that is refused is
``FieldTableError`` (a ``ValueError``) with the argument's name first in its path.
"""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal
from typing import Any

from lavinpy.wire import accel
from lavinpy.wire.field_table import FieldTableError, validate_table

__all__ = ["args_table", "args_table_py", "decimal_value", "decode_arguments", "timestamp_value"]

_INTS: dict[str, struct.Struct] = {
    "octet": struct.Struct(">B"), "short": struct.Struct(">H"), "long": struct.Struct(">I"),
    "longlong": struct.Struct(">q"),
}
_U32, _U64 = struct.Struct(">I"), struct.Struct(">Q")
_field_types: dict[type, tuple[tuple[str, str], ...]] = {}


def timestamp_value(seconds: int) -> datetime.datetime:
    """A 'T' value as pamqp reads it: UTC, a value past the year 2106 taken as milliseconds."""
    return datetime.datetime.fromtimestamp(seconds / 1000.0 if seconds > 0xFFFFFFFF else seconds, tz=datetime.UTC)


def decimal_value(scale: int, unscaled: int) -> Decimal:
    """A 'D' value as pamqp reads it (a power of ten times the unscaled int32)."""
    return Decimal(unscaled) * (Decimal(10) ** -scale)


# Fixed-width values by type letter (pamqp reads 'L' signed, as 'l').
_FIXED: dict[int, struct.Struct] = {
    ord("b"): struct.Struct(">b"), ord("B"): struct.Struct(">B"), ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"), ord("I"): struct.Struct(">i"), ord("i"): _U32, ord("l"): struct.Struct(">q"),
    ord("L"): struct.Struct(">q"), ord("f"): struct.Struct(">f"), ord("d"): struct.Struct(">d")}
_PREFIXED = frozenset(b"SxFA")


def args_table_py(buf: bytes, pos: int, end: int) -> dict[str, Any]:
    """The entries of the validated table ``buf[pos:end]`` as pamqp reads them (keys strict UTF-8, a
    repeated key's last value, 'x' a bytearray), each entry read once."""
    table: dict[str, Any] = {}
    while pos < end:
        key_end = pos + 1 + buf[pos]
        key = buf[pos + 1:key_end].decode("utf-8")
        table[key], pos = _args_value(buf, key_end)
    return table


def _args_value(buf: bytes, pos: int) -> tuple[Any, int]:
    tag = buf[pos]
    pos += 1
    fixed = _FIXED.get(tag)
    if fixed is not None:
        return fixed.unpack_from(buf, pos)[0], pos + fixed.size
    if tag in _PREFIXED:
        start = pos + 4
        stop = start + _U32.unpack_from(buf, pos)[0]
        if tag == 0x46:  # 'F'
            return args_table_py(buf, start, stop), stop
        if tag == 0x41:  # 'A'
            items = []
            while start < stop:
                item, start = _args_value(buf, start)
                items.append(item)
            return items, stop
        raw = buf[start:stop]
        if tag == 0x78:  # 'x'
            return bytearray(raw), stop
        try:  # 'S'
            return raw.decode("utf-8"), stop
        except UnicodeDecodeError:
            return raw, stop
    if tag == 0x74:  # 't'
        return buf[pos] != 0, pos + 1
    if tag == 0x54:  # 'T'
        return timestamp_value(_U64.unpack_from(buf, pos)[0]), pos + 8
    if tag == 0x44:  # 'D'
        return decimal_value(buf[pos], _FIXED[0x49].unpack_from(buf, pos + 1)[0]), pos + 5  # 'I': int32
    return None, pos  # 'V' (validation lets no other letter through)


_compiled_table = accel.cwire.args_table if accel.cwire is not None else None


def args_table(buf: bytes, pos: int, end: int) -> dict[str, Any]:
    """The table ``buf[pos:end]`` validated and read as pamqp reads it: compiled when it can, else (and
    for every table the compiled reading does not take) the Python twin, which gives the verdict and
    its text: FieldTableError, or ValueError for a key not UTF-8 or a timestamp out of range."""
    try:
        if _compiled_table is not None and type(buf) is bytes:
            table = _compiled_table(buf, pos, end, timestamp_value, decimal_value)
            if table is not None:
                return table
        validate_table(buf, pos, end)
        return args_table_py(bytes(buf), pos, end)
    except (OverflowError, OSError) as err:  # a timestamp past what a datetime holds
        raise ValueError(f"timestamp out of range: {err}") from None


def _fields_of(cls: type) -> tuple[tuple[str, str], ...]:
    fields = _field_types.get(cls)
    if fields is None:
        fields = tuple((name, cls.amqp_type(name)) for name in cls.__slots__)  # type: ignore[attr-defined]
        unknown = {kind for _, kind in fields} - {"bit", "shortstr", "longstr", "table", *_INTS}
        if unknown:  # no AMQP 0-9-1 method has one; a pamqp that grew one must be taught here first
            raise TypeError(f"{cls.__name__} has argument types this decoder does not know: {sorted(unknown)}")
        _field_types[cls] = fields
    return fields


def decode_arguments(cls: type[Any], buf: bytes, pos: int, end: int) -> Any:
    """An instance of the pamqp method class ``cls`` with its arguments decoded from ``buf[pos:end]``."""
    # Skip __init__: every slot is set below, and __init__ would only validate defaults (and warn for
    # deprecated methods such as basic.recover-async).
    method: Any = object.__new__(cls)
    bit = 8  # the next bit's place in the current octet; 8: none begun
    for name, kind in _fields_of(cls):
        if kind == "bit":
            if bit == 8:
                if pos >= end:
                    raise ValueError(f"{name} truncated")
                bit = 0
                pos += 1
            setattr(method, name, buf[pos - 1] & (1 << bit) != 0)
            bit += 1
            continue
        bit = 8
        if kind == "shortstr":
            if pos >= end:
                raise ValueError(f"{name} truncated")
            start = pos + 1
            pos = start + buf[pos]
            if pos > end:
                raise ValueError(f"{name} truncated")
            value: Any = buf[start:pos].decode("utf-8")  # UnicodeDecodeError is a ValueError
        elif kind == "longstr" or kind == "table":
            if pos + 4 > end:
                raise ValueError(f"{name} truncated")
            start = pos + 4
            pos = start + _U32.unpack_from(buf, start - 4)[0]
            if pos > end:
                raise ValueError(f"{name} truncated")
            if kind == "table":
                try:
                    value = args_table(buf, start, pos)
                except FieldTableError as err:
                    err.path.insert(0, name)
                    raise
            else:
                raw = buf[start:pos]
                try:
                    value = raw.decode("utf-8")
                except UnicodeDecodeError:
                    value = raw
        else:
            fmt = _INTS[kind]
            if pos + fmt.size > end:
                raise ValueError(f"{name} truncated")
            value = fmt.unpack_from(buf, pos)[0]
            pos += fmt.size
        setattr(method, name, value)
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the arguments")
    return method
