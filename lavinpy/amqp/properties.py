"""Basic content properties in their AMQP wire encoding.

The broker keeps properties as the raw bytes a publisher sent (flags + fields, big-endian), stores
them in records as they are and sends them back to consumers unchanged; it decodes them only when
a feature needs a field.
"""

from __future__ import annotations

_U16 = int.from_bytes

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


class PropertiesError(ValueError):
    """The property block is truncated or malformed."""


def properties_length(buf: bytes | bytearray | memoryview, offset: int = 0, end: int | None = None) -> int:
    """Length in bytes of the property block starting at ``offset`` (flags included).

    Walks the flags and skips each present field by its length prefix; tables are not decoded.
    """
    if end is None:
        end = len(buf)
    pos = offset
    flag_words = []
    while True:
        if pos + 2 > end:
            raise PropertiesError("property flags truncated")
        flags = _U16(buf[pos:pos + 2], "big")
        pos += 2
        flag_words.append(flags)
        if not flags & _CONTINUATION:
            break
    flags = flag_words[0]
    for _name, bit, kind in FIELDS:
        if not flags & bit:
            continue
        if kind == _SHORTSTR:
            if pos >= end:
                raise PropertiesError("property field truncated")
            pos += 1 + buf[pos]
        elif kind == _TABLE:
            if pos + 4 > end:
                raise PropertiesError("property table truncated")
            pos += 4 + int.from_bytes(buf[pos:pos + 4], "big")
        elif kind == _OCTET:
            pos += 1
        else:
            pos += 8
        if pos > end:
            raise PropertiesError("property field truncated")
    return pos - offset
