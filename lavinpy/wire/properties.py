"""Basic content properties in their AMQP wire encoding.

The broker keeps properties as the raw bytes a publisher sent (flags + fields, big-endian), stores
them in records as they are and sends them back to consumers unchanged; it decodes them only when
a feature needs a field.
"""

from __future__ import annotations

import datetime

from pamqp import commands

from lavinpy.wire import accel
from lavinpy.wire.constants import FRAME_ERROR, PRECONDITION_FAILED
from lavinpy.wire.errors import AMQPChannelError, AMQPConnectionError
from lavinpy.wire.field_table import (
    FieldTableError,
    Timestamp,
    decode_table,
    decode_value,
    encode_table,
    validate_table,
)

# Property flag bits of class basic (bit 15 first), and how each field is encoded.
_SHORTSTR, _TABLE, _OCTET, _TIMESTAMP = 0, 1, 2, 3
FIELDS: tuple[tuple[str, int, int], ...] = (
    ("content_type", 1 << 15, _SHORTSTR),
    ("content_encoding", 1 << 14, _SHORTSTR),
    ("headers", 1 << 13, _TABLE),
    ("delivery_mode", 1 << 12, _OCTET),
    ("priority", 1 << 11, _OCTET),
    ("correlation_id", 1 << 10, _SHORTSTR),
    ("reply_to", 1 << 9, _SHORTSTR),
    ("expiration", 1 << 8, _SHORTSTR),
    ("message_id", 1 << 7, _SHORTSTR),
    ("timestamp", 1 << 6, _TIMESTAMP),
    ("type", 1 << 5, _SHORTSTR),
    ("user_id", 1 << 4, _SHORTSTR),
    ("app_id", 1 << 3, _SHORTSTR),
    ("cluster_id", 1 << 2, _SHORTSTR),
)
_CONTINUATION = 1
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MAX_DATETIME_SECONDS = 253402300799  # the last second a datetime can hold


class PropertiesError(ValueError):
    """The property block is truncated or malformed."""


_HEADERS_BIT = 1 << 13


def validate_headers(buf: bytes | bytearray | memoryview, offset: int, end: int) -> None:
    """Check the headers table of a property block whose layout ``properties_end`` accepted.

    Raises FieldTableError (nesting, truncated or unknown values); returns at once without headers.
    Headers follow at most content_type and content_encoding, so no other field is walked.
    """
    flags = (buf[offset] << 8) | buf[offset + 1]
    if not flags & _HEADERS_BIT:
        return
    pos = offset + 2
    more = flags
    while more & _CONTINUATION:
        more = (buf[pos] << 8) | buf[pos + 1]
        pos += 2
    if flags & 0x8000:
        pos += 1 + buf[pos]
    if flags & 0x4000:
        pos += 1 + buf[pos]
    stop = pos + 4 + ((buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3])
    validate_table(buf, pos + 4, min(stop, end))


def properties_length(buf: bytes | bytearray | memoryview, offset: int = 0, end: int | None = None) -> int:
    """Length in bytes of the property block starting at ``offset`` (flags included).

    Skips each present field by its length prefix; tables are not decoded (see ``properties_end``).
    """
    return properties_end(buf, offset, len(buf) if end is None else end) - offset


# --- Fast walking, peeks and edits on the raw block -------------------------------------------------

_KIND_BY_NAME: dict[str, tuple[int, int]] = {name: (bit, kind) for name, bit, kind in FIELDS}
# pamqp calls the "type" property "message_type"; accept both spellings.
_KIND_BY_NAME["message_type"] = _KIND_BY_NAME["type"]
_FIXED_SIZE = {_OCTET: 1, _TIMESTAMP: 8}

# flags word -> kinds of the present fields, in wire order. At most 2**15 distinct entries, in
# practice a handful: publishers reuse the same property set for every message.
_kinds_cache: dict[int, tuple[int, ...]] = {}


def _present_kinds(flags: int) -> tuple[int, ...]:
    kinds = _kinds_cache.get(flags)
    if kinds is None:
        kinds = tuple(kind for _name, bit, kind in FIELDS if flags & bit)
        _kinds_cache[flags] = kinds
    return kinds


def properties_end(buf: bytes | bytearray | memoryview, offset: int, end: int) -> int:
    """Offset just past the property block starting at ``offset``; same rules as ``properties_length``.

    The frame reader calls this for every content header, so it avoids slicing and walks only the
    fields that are present.
    """
    if offset + 2 > end:
        raise PropertiesError("property flags truncated")
    flags = (buf[offset] << 8) | buf[offset + 1]
    pos = offset + 2
    if flags & _CONTINUATION:
        more = flags
        while more & _CONTINUATION:
            if pos + 2 > end:
                raise PropertiesError("property flags truncated")
            more = (buf[pos] << 8) | buf[pos + 1]
            pos += 2
    if not flags & 0xFFFC:
        return pos
    for kind in _present_kinds(flags & 0xFFFC):
        if kind == _SHORTSTR:
            if pos >= end:
                raise PropertiesError("property field truncated")
            pos += 1 + buf[pos]
        elif kind == _TABLE:
            if pos + 4 > end:
                raise PropertiesError("property table truncated")
            pos += 4 + ((buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3])
        else:
            pos += _FIXED_SIZE[kind]
        if pos > end:
            raise PropertiesError("property field truncated")
    return pos


def _flags_and_start(raw: bytes | bytearray | memoryview) -> tuple[int, int]:
    """The first flags word and the offset of the first field (after any continuation words)."""
    end = len(raw)
    if end < 2:
        raise PropertiesError("property flags truncated")
    flags = (raw[0] << 8) | raw[1]
    pos = 2
    more = flags
    while more & _CONTINUATION:
        if pos + 2 > end:
            raise PropertiesError("property flags truncated")
        more = (raw[pos] << 8) | raw[pos + 1]
        pos += 2
    return flags, pos


def _field_span(raw: bytes | bytearray | memoryview, bit: int) -> tuple[int, int, int, int]:
    """(flags, start, stop, fields_start) of the field ``bit``; start == stop when it is absent.

    When absent, ``start`` is where the field would be inserted.
    """
    flags, pos = _flags_and_start(raw)
    fields_start = pos
    end = len(raw)
    for _name, field_bit, kind in FIELDS:
        if field_bit == bit:
            if not flags & bit:
                return flags, pos, pos, fields_start
            start = pos
        elif not flags & field_bit:
            continue
        if kind == _SHORTSTR:
            if pos >= end:
                raise PropertiesError("property field truncated")
            pos += 1 + raw[pos]
        elif kind == _TABLE:
            if pos + 4 > end:
                raise PropertiesError("property table truncated")
            pos += 4 + int.from_bytes(raw[pos:pos + 4], "big")
        else:
            pos += _FIXED_SIZE[kind]
        if pos > end:
            raise PropertiesError("property field truncated")
        if field_bit == bit:
            return flags, start, pos, fields_start
    raise KeyError(bit)  # unreachable: every caller passes a bit from FIELDS


def peek_delivery_mode(raw: bytes | bytearray | memoryview) -> int | None:
    """delivery_mode (1 transient, 2 persistent) without decoding the rest, or None when absent."""
    if len(raw) >= 3 and raw[0] & 0xF0 == 0x10 and not raw[1] & _CONTINUATION:
        return raw[2]  # no variable-length field before it: it is the first field
    if len(raw) >= 2 and not raw[0] & 0x10:  # bit 12 lives in the high byte
        return None
    if len(raw) >= 7 and raw[0] & 0xF0 == 0x30 and not raw[1] & _CONTINUATION:
        # headers, then delivery mode (a message with identifiers or other headers): after the table
        at = 6 + int.from_bytes(raw[2:6], "big")
        if at < len(raw):
            return raw[at]
    _flags, start, stop, _ = _field_span(raw, 1 << 12)
    return raw[start] if stop > start else None


def varied_run_kind(blocks: list[bytes]) -> int:
    """Whether a publish run whose messages have their own property blocks can be taken whole as far
    as the blocks say: -1 not (a block too short, with an expiration, or possibly with CC/BCC (a byte
    test), or delivery modes that differ), 0 yes without headers, 1 yes with headers. The
    pure-Python twin of ``_cwire.varied_run_kind`` (which answers -2 where it leaves it to this one)."""
    with_headers = 0
    for block in blocks:
        if len(block) < 2 or block[0] & 0x01:  # expiration: bit 8, in the first flags byte
            return -1
        if block[0] & 0x20:  # headers: bit 13
            if b"CC" in block:
                return -1
            with_headers = 1
    first_mode = peek_delivery_mode(blocks[0])
    for block in blocks:
        if peek_delivery_mode(block) != first_mode:
            return -1
    return with_headers


def peek_priority(raw: bytes | bytearray | memoryview) -> int | None:
    """priority (0-255 on the wire) without decoding the rest, or None when absent."""
    if len(raw) >= 2 and not raw[0] & 0x08:  # bit 11
        return None
    if len(raw) >= 4 and raw[0] & 0xE0 == 0 and not raw[1] & _CONTINUATION:
        return raw[3 if raw[0] & 0x10 else 2]  # preceded at most by delivery_mode (one octet)
    _flags, start, stop, _ = _field_span(raw, 1 << 11)
    return raw[start] if stop > start else None


def peek_expiration(raw: bytes | bytearray | memoryview) -> str | None:
    """The expiration string (a per-message TTL in ms, as text), or None when absent."""
    if len(raw) >= 2 and not raw[0] & 0x01:  # bit 8
        return None
    _flags, start, stop, _ = _field_span(raw, 1 << 8)
    if stop == start:
        return None
    try:
        return bytes(raw[start + 1:stop]).decode("utf-8")
    except UnicodeDecodeError as err:
        raise PropertiesError(f"expiration is not UTF-8: {err}") from err


def peek_timestamp(raw: bytes | bytearray | memoryview) -> int | None:
    """The timestamp property (seconds since the epoch, as sent), or None when absent."""
    if len(raw) >= 2 and not raw[1] & 0x40:  # bit 6 lives in the low byte
        return None
    _flags, start, stop, _ = _field_span(raw, 1 << 6)
    return int.from_bytes(raw[start:stop], "big") if stop > start else None


def peek_headers(raw: bytes | bytearray | memoryview) -> dict | None:
    """The headers table, decoded on its own (the other fields are skipped), or None when absent."""
    if len(raw) >= 2 and not raw[0] & 0x20:  # bit 13
        return None
    _flags, start, stop, _ = _field_span(raw, 1 << 13)
    if stop == start:
        return None
    try:
        return decode_table(raw, start + 4, stop)
    except FieldTableError as err:
        raise PropertiesError(f"headers table malformed: {err}") from err


def headers_table(raw: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(start, end) of the entries of the headers table of a block whose first flags word says it has
    one and no continuation word follows; None when the content type, the content encoding or the
    table runs past the block. The pure-Python twin of _props.h's headers_table."""
    pos = 2
    size = len(raw)
    for bit in (0x80, 0x40):  # content type, content encoding (short strings)
        if raw[0] & bit:
            if pos >= size:
                return None
            pos += 1 + raw[pos]
    if pos + 4 > size:
        return None
    end = pos + 4 + int.from_bytes(raw[pos:pos + 4], "big")
    return (pos + 4, end) if end <= size else None


def header_span(raw: bytes, name: bytes) -> tuple[int, int] | tuple[()] | None:
    """(start, end) of the tagged value of the last headers entry called ``name``; () when there is
    no such entry (or no headers); None when a flag continuation word or a malformed table keeps
    this walk from telling (``peek_header`` then decodes the table). The pure-Python twin of
    ``_cwire.header_span``, which gives the same answers."""
    if len(raw) < 2 or raw[1] & _CONTINUATION:
        return None
    if not raw[0] & 0x20:
        return ()
    table = headers_table(raw)
    if table is None:
        return None
    pos, end = table
    found: tuple[int, int] | tuple[()] = ()
    size = len(name)
    while pos < end:
        key_end = pos + 1 + raw[pos]
        if key_end >= end:
            return None
        try:
            stop = _skip_value(raw, key_end, end)
        except (FieldTableError, KeyError):
            return None
        if key_end - pos - 1 == size and raw[pos + 1:key_end] == name:
            found = (key_end, stop)
        pos = stop
    return found


def _skip_value(raw: bytes, pos: int, end: int) -> int:
    """Offset after the tagged value at ``pos`` by its width or length (nested content not walked)."""
    tag = raw[pos]
    if tag in _LENGTH_TAGS:
        if pos + 5 > end:
            raise FieldTableError("length truncated")
        stop = pos + 5 + int.from_bytes(raw[pos + 1:pos + 5], "big")
    else:
        stop = pos + 1 + _VALUE_WIDTH[tag]
    if stop > end:
        raise FieldTableError("value truncated")
    return stop


_LENGTH_TAGS = frozenset(b"SxFA")
_VALUE_WIDTH = {ord(t): w for t, w in (("V", 0), ("t", 1), ("b", 1), ("B", 1), ("s", 2), ("u", 2), ("I", 4),
                                       ("i", 4), ("f", 4), ("D", 5), ("l", 8), ("L", 8), ("d", 8), ("T", 8))}
def header_key(raw: bytes, name: bytes, limit: int) -> str | tuple[int, int] | tuple[()] | None:
    """The value of the last headers entry called ``name`` as a ``str`` when it is a long string of
    fewer than ``limit`` ASCII bytes (a deduplication identifier's usual form, found and decoded in
    one call); otherwise what ``header_span`` answers. The pure-Python twin of ``_cwire.header_key``."""
    span = header_span(raw, name)
    if span and raw[span[0]] == 0x53 and span[1] - span[0] - 5 < limit:
        text = raw[span[0] + 5:span[1]]
        if text.isascii():
            return text.decode("ascii")
    return span


_header_span = accel.cwire.header_span if accel.cwire is not None else header_span
find_header_key = accel.cwire.header_key if accel.cwire is not None else header_key
# (the compiled one answers -2 for a block it leaves to varied_run_kind)
fast_varied_run_kind = accel.cwire.varied_run_kind if accel.cwire is not None else varied_run_kind


def peek_header(raw: bytes, name: str, key: bytes | None = None) -> object:
    """One header's value, decoded as ``peek_headers(raw)[name]`` would be, or None when absent,
    without decoding the rest of the table (a deduplication identifier on every message). For a
    well formed table (every block the frame reader accepted); the other entries are not checked.
    ``key``: ``name`` as the table's bytes, when the caller keeps it (UTF-8, surrogateescape)."""
    if len(raw) >= 2 and not raw[0] & 0x20:
        return None
    span = _header_span(raw, name.encode("utf-8", "surrogateescape") if key is None else key)
    if span is None:
        headers = peek_headers(raw)  # (raises on a malformed table, as the whole decode does)
        return None if headers is None else headers.get(name)
    if not span:
        return None
    start, stop = span
    if raw[start] == 0x53:  # 'S', the usual identifier: as field_table decodes it
        try:
            return raw[start + 5:stop].decode("utf-8")
        except UnicodeDecodeError:
            pass
    try:
        return decode_value(raw, start, stop)[0]
    except FieldTableError as err:
        raise PropertiesError(f"headers table malformed: {err}") from err


def _encode_field(name: str, kind: int, value: object) -> bytes:
    if kind == _SHORTSTR:
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)  # type: ignore[call-overload]
        if len(data) > 255:
            raise ValueError(f"{name} longer than 255 bytes")
        return bytes((len(data),)) + data
    if kind == _TABLE:
        return encode_table(value)  # type: ignore[arg-type]
    if kind == _OCTET:
        if not isinstance(value, int) or not 0 <= value <= 255:
            raise ValueError(f"{name} must be an int 0-255")
        return bytes((value,))
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        value = (value - _EPOCH) // datetime.timedelta(seconds=1)
    if not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise ValueError(f"{name} must be a datetime or an int of seconds")
    return value.to_bytes(8, "big")


def replace_field(raw: bytes | bytearray | memoryview, name: str, value: object) -> bytes:
    """The same property block with field ``name`` set to ``value`` (None removes it).

    Every other field keeps its exact bytes. Names are those of ``FIELDS``; "message_type" is accepted
    for "type". Raises KeyError for an unknown name, ValueError for a value the field cannot hold.
    """
    _bit, kind = _KIND_BY_NAME[name]
    return replace_encoded_field(raw, name, None if value is None else _encode_field(name, kind, value))


def replace_encoded_field(raw: bytes | bytearray | memoryview, name: str, encoded: bytes | None) -> bytes:
    """The same property block with field ``name`` set to its wire encoding ``encoded`` (None removes it);
    for headers, ``encoded`` is the 4-byte length and the entries."""
    bit = _KIND_BY_NAME[name][0]
    flags, start, stop, fields_start = _field_span(raw, bit)
    new_flags = flags & ~bit if encoded is None else flags | bit
    raw_bytes = bytes(raw)
    return (new_flags.to_bytes(2, "big") + raw_bytes[2:fields_start] + raw_bytes[fields_start:start]
            + (encoded or b"") + raw_bytes[stop:])


def headers_span(raw: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(start, stop) of the headers table, its 4-byte length included; start == stop (where it would
    be inserted) when there are no headers. Raises PropertiesError when the block is truncated."""
    _flags, start, stop, _fields_start = _field_span(raw, _HEADERS_BIT)
    return start, stop


def append_header_entry(raw: bytes | bytearray | memoryview, entry: bytes) -> bytes:
    """The same property block with one encoded table entry (name, tag, value) added at the end of
    its headers, which are created when absent; every other byte is kept."""
    flags, start, stop, fields_start = _field_span(raw, _HEADERS_BIT)
    raw_bytes = bytes(raw)
    if start == stop:
        return ((flags | _HEADERS_BIT).to_bytes(2, "big") + raw_bytes[2:start] + len(entry).to_bytes(4, "big")
                + entry + raw_bytes[start:])
    size = stop - start - 4 + len(entry)
    return raw_bytes[:start] + size.to_bytes(4, "big") + raw_bytes[start + 4:stop] + entry + raw_bytes[stop:]


def replace_headers(raw: bytes | bytearray | memoryview, headers: dict | None) -> bytes:
    """The same property block with its headers table replaced (None removes the field)."""
    return replace_field(raw, "headers", headers)


# --- Full decode / encode ---------------------------------------------------------------------------

PROPERTY_NAMES: tuple[str, ...] = tuple(name for name, _bit, _kind in FIELDS)


def property_values(buf: bytes | bytearray | memoryview, offset: int = 0, end: int | None = None, *,
                    typed: bool = True) -> list[object]:
    """Every field of the property block ``buf[offset:end]``, in ``PROPERTY_NAMES`` order (None: absent).

    ``typed`` (the broker): header values keep their wire types, a timestamp is a datetime (a
    ``Timestamp`` int past year 9999). Otherwise (clients): plain Python values, a timestamp in
    epoch seconds. Short strings that are not UTF-8 decode with surrogateescape.
    Raises PropertiesError when the block is truncated, has trailing bytes, or a table is malformed.
    """
    if offset or end is not None or not isinstance(buf, bytes):
        buf = bytes(buf[offset:end])  # only the block: callers may pass a whole receive buffer
        offset = 0
    data = buf
    stop_at = len(data)
    block_end = properties_end(data, offset, stop_at)
    if block_end != stop_at:
        raise PropertiesError(f"property block has {stop_at - block_end} trailing bytes")
    flags = (data[offset] << 8) | data[offset + 1]
    pos = offset + 2
    more = flags
    while more & _CONTINUATION:
        more = (data[pos] << 8) | data[pos + 1]
        pos += 2
    values: list[object] = [None] * len(FIELDS)
    for index, (_name, bit, kind) in enumerate(FIELDS):
        if not flags & bit:
            continue
        if kind == _SHORTSTR:
            stop = pos + 1 + data[pos]
            value: object = data[pos + 1:stop].decode("utf-8", "surrogateescape")
        elif kind == _TABLE:
            stop = pos + 4 + int.from_bytes(data[pos:pos + 4], "big")
            try:
                value = decode_table(data, pos + 4, stop, typed=typed)
            except FieldTableError as err:
                raise PropertiesError(f"headers table malformed: {err}") from err
        elif kind == _OCTET:
            stop = pos + 1
            value = data[pos]
        else:
            stop = pos + 8
            seconds = int.from_bytes(data[pos:stop], "big")
            if not typed:
                value = seconds
            elif seconds <= _MAX_DATETIME_SECONDS:
                value = _EPOCH + datetime.timedelta(seconds=seconds)
            else:
                value = Timestamp(seconds)
        values[index] = value
        pos = stop
    return values


def decode_properties(raw: bytes | bytearray | memoryview) -> commands.Basic.Properties:
    """Decode a whole property block into pamqp's ``Basic.Properties`` (typed ``property_values``)."""
    props = commands.Basic.Properties()
    for name, value in zip(PROPERTY_NAMES, property_values(raw), strict=True):
        if value is not None:
            setattr(props, "message_type" if name == "type" else name, value)
    return props


def encode_property_values(**values: object) -> bytes:
    """The property block (flags + present fields) of the given fields; None or missing: absent.

    Names are those of ``PROPERTY_NAMES`` ("message_type" is accepted for "type"); a timestamp may
    be a datetime or an int of epoch seconds. Raises KeyError / ValueError as ``replace_field``.
    """
    for name in values:
        if name not in _KIND_BY_NAME:
            raise KeyError(name)
    if "message_type" in values:
        values.setdefault("type", values.pop("message_type"))
    flags = 0
    parts = []
    for name, bit, kind in FIELDS:
        value = values.get(name)
        if value is not None:
            flags |= bit
            parts.append(_encode_field(name, kind, value))
    return flags.to_bytes(2, "big") + b"".join(parts)


def encode_properties(props: commands.Basic.Properties) -> bytes:
    """Encode pamqp ``Basic.Properties`` to the wire block (flags + present fields)."""
    return props.marshal()


# Property blocks already checked by check_content_properties (the frame reader's cache). Bounded in
# count (cleared when full) and in size (only small blocks are kept), so a client cannot grow it beyond about 2 MiB.
VALID_PROPS_MAX = 4096
VALID_PROPS_MAX_FRAME = 512
valid_props: set[bytes] = set()


def check_content_properties(src: bytes, props_at: int, fend: int, class_id: int) -> AMQPChannelError | None:
    """Check the property block at ``props_at``: None when it is good.

    Raises 501 unless the block fills the header frame exactly (the framing is broken); returns a
    channel error (406) when its headers table is not acceptable (the frame itself is sound).
    """
    try:
        props_end = properties_end(src, props_at, fend)
    except PropertiesError as err:
        raise AMQPConnectionError(FRAME_ERROR, f"cannot decode content header: {err}", class_id)
    if props_end != fend:
        raise AMQPConnectionError(
            FRAME_ERROR, f"content header has {fend - props_end} bytes after its properties", class_id)
    if not src[props_at] & 0x20:  # no headers table: nothing more to check
        return None
    try:
        validate_headers(src, props_at, fend)
    except FieldTableError as err:
        return AMQPChannelError(PRECONDITION_FAILED, f"invalid headers property: {err}", 60, 40)
    return None


def _fixed_props_lengths() -> dict[int, int]:
    """Block length for each flags word whose present fields are all fixed-size (no length to walk)."""
    delivery_mode, priority, timestamp = 1 << 12, 1 << 11, 1 << 6
    lengths = {}
    for flags in range(8):
        word = ((delivery_mode if flags & 1 else 0) | (priority if flags & 2 else 0)
                | (timestamp if flags & 4 else 0))
        lengths[word] = 2 + (1 if flags & 1 else 0) + (1 if flags & 2 else 0) + (8 if flags & 4 else 0)
    return lengths


FIXED_PROPS_LEN = _fixed_props_lengths()
