"""Dead-lettering on raw property bytes: the ``x-death`` history, the cycle rule, ``x-delivery-count``.

Headers are edited entry by entry on their wire encoding: the entries lavinpy does not change keep
their exact bytes (and so their exact AMQP types), and the entries it writes use RabbitMQ's types
(count is a long, time a timestamp in seconds, routing-keys an array of longstr).

The history follows RabbitMQ 3.13+/4.x: one ``x-death`` table per (queue, reason), most recent first;
dying again for the same queue and reason increments ``count`` and moves that table to the front
(its time, exchange and routing keys stay those of the first death). ``x-first-death-*`` are set once,
``x-last-death-*`` on every death. The dead-lettered copy loses its ``expiration``; the value is kept
as ``original-expiration`` in the new table.
"""

from __future__ import annotations

import struct

from lavinpy.wire.field_table import FieldTableError, value_end
from lavinpy.wire.field_table import decode_value as _decode_value
from lavinpy.wire.properties import (
    PropertiesError,
    headers_span,
    peek_expiration,
    replace_encoded_field,
    replace_field,
)

_U32 = struct.Struct(">I")

HeaderItems = list[tuple[str, bytes]]  # (key, tag byte + encoded value), in wire order


# --- raw header table access ---------------------------------------------------------------------------

def _split_entries(data: bytes, with_keys: bool) -> list:
    """Split a table's (or array's) content into raw entries, measured by the field-table codec."""
    out = []
    pos = 0
    end = len(data)
    try:
        while pos < end:
            key = ""
            if with_keys:
                size = data[pos]
                if pos + 1 + size >= end:
                    raise FieldTableError("field name or type truncated")
                key = data[pos + 1:pos + 1 + size].decode("utf-8", "surrogateescape")
                pos += 1 + size
            stop = value_end(data, pos, end)
            out.append((key, data[pos:stop]) if with_keys else data[pos:stop])
            pos = stop
    except FieldTableError as err:
        raise PropertiesError(f"field table malformed: {err}") from err
    return out


def header_items(properties: bytes) -> HeaderItems:
    """The headers table as (key, raw tagged value) pairs; empty when there are no headers."""
    start, stop = headers_span(properties)
    if start == stop:
        return []
    return _split_entries(properties[start + 4:stop], with_keys=True)


def with_header_items(properties: bytes, items: HeaderItems) -> bytes:
    """The same property block with its headers table made of ``items`` (other fields unchanged)."""
    body = b"".join(_encode_key(key) + value for key, value in items)
    return replace_encoded_field(properties, "headers", _U32.pack(len(body)) + body)


def set_header(items: HeaderItems, key: str, value: bytes, *, front: bool = False) -> None:
    """Replace ``key`` in place (or add it, at the end or the front) with a raw tagged value."""
    for i, (existing, _old) in enumerate(items):
        if existing == key:
            items[i] = (key, value)
            return
    if front:
        items.insert(0, (key, value))
    else:
        items.append((key, value))


def decode_value(raw: bytes) -> object:
    """Decode one raw tagged value with the field-table codec."""
    try:
        return _decode_value(raw)[0]
    except FieldTableError as err:
        raise PropertiesError(f"field value malformed: {err}") from err


def _encode_key(key: str) -> bytes:
    data = key.encode("utf-8", "surrogateescape")
    if len(data) > 255:
        raise ValueError(f"field name longer than 255 bytes: {key[:40]!r}...")
    return bytes((len(data),)) + data


def longstr(text: str | bytes) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return b"S" + _U32.pack(len(data)) + data


def long(value: int) -> bytes:
    return b"l" + value.to_bytes(8, "big", signed=True)


def signedint(value: int) -> bytes:
    return b"I" + value.to_bytes(4, "big", signed=True)


def timestamp(seconds: int) -> bytes:
    return b"T" + seconds.to_bytes(8, "big")


def array(values: list[bytes]) -> bytes:
    body = b"".join(values)
    return b"A" + _U32.pack(len(body)) + body


def table(items: HeaderItems) -> bytes:
    body = b"".join(_encode_key(key) + value for key, value in items)
    return b"F" + _U32.pack(len(body)) + body


# --- x-death --------------------------------------------------------------------------------------------

def _death_tables(items: HeaderItems) -> list[bytes] | None:
    """The raw elements of the x-death array, or None when there is none (or it is not an array)."""
    for key, value in items:
        if key == "x-death":
            if value[:1] != b"A":
                return None
            return _split_entries(value[5:], with_keys=False)
    return None


def _table_field(raw_table: bytes, name: str) -> object:
    if raw_table[:1] != b"F":
        return None
    for key, value in _split_entries(raw_table[5:], with_keys=True):
        if key == name:
            found = decode_value(value)
            return found.decode("utf-8", "replace") if isinstance(found, bytes | bytearray) else found
    return None


def _bump_count(raw_table: bytes) -> bytes:
    fields = _split_entries(raw_table[5:], with_keys=True)
    count = 0
    for key, value in fields:
        if key == "count":
            found = decode_value(value)
            count = found if isinstance(found, int) else 0
    set_header(fields, "count", long(count + 1), front=True)
    return table(fields)


def dead_letter_properties(properties: bytes, *, queue: str, reason: str, exchange: str,
                           routing_keys: list[str], now_ms: int, drop_cc: bool = False) -> bytes:
    """The properties of the dead-lettered copy of a message leaving ``queue`` for ``reason``.

    ``exchange`` and ``routing_keys`` are those the message was published with (routing key plus CC
    keys, never BCC). ``drop_cc`` removes the CC header, as RabbitMQ does when the queue has a
    dead-letter routing key (the copy is then routed with that key only).
    """
    items = header_items(properties)
    deaths = _death_tables(items)
    entry = None
    others: list[bytes] = []
    for raw in deaths or ():
        if entry is None and _table_field(raw, "queue") == queue and _table_field(raw, "reason") == reason:
            entry = _bump_count(raw)
        else:
            others.append(raw)
    if entry is None:
        fields: HeaderItems = [
            ("count", long(1)),
            ("reason", longstr(reason)),
            ("queue", longstr(queue)),
            ("time", timestamp(now_ms // 1000)),
            ("exchange", longstr(exchange)),
            ("routing-keys", array([longstr(k) for k in routing_keys])),
        ]
        expiration = peek_expiration(properties)
        if expiration is not None:
            fields.append(("original-expiration", longstr(expiration)))
        entry = table(fields)
    if not deaths:
        for suffix, value in (("reason", reason), ("queue", queue), ("exchange", exchange)):
            set_header(items, "x-first-death-" + suffix, longstr(value))
    for suffix, value in (("reason", reason), ("queue", queue), ("exchange", exchange)):
        set_header(items, "x-last-death-" + suffix, longstr(value))
    set_header(items, "x-death", array([entry, *others]))
    if drop_cc:
        items = [(k, v) for k, v in items if k != "CC"]
    return replace_field(with_header_items(properties, items), "expiration", None)


def death_routing_keys(routing_key: str, properties: bytes) -> list[str]:
    """The routing key plus the CC keys, as recorded in ``x-death`` and used to re-route the copy."""
    keys = [routing_key]
    for key, value in header_items(properties):
        if key == "CC":
            cc = decode_value(value)
            if isinstance(cc, list):
                keys.extend(k.decode("utf-8", "replace") if isinstance(k, bytes | bytearray) else k
                            for k in cc if isinstance(k, str | bytes | bytearray))
    return keys


def should_drop_cycle(properties: bytes, target_queue: str) -> bool:
    """Whether a dead-lettered copy (with its new x-death entry) must not be delivered to ``target_queue``.

    RabbitMQ's rule: walking the history from the most recent death, if ``target_queue`` appears
    before any ``rejected`` death (that entry included), the message went round a fully automatic
    cycle (expiry, max length, delivery limit...) and is dropped; a rejection by a client anywhere in
    the cycle lets it through. Anything in the history that is not a table counts as client-made.
    """
    deaths = _death_tables(header_items(properties))
    for raw in deaths or ():
        if raw[:1] != b"F":
            return False
        if _table_field(raw, "reason") == "rejected":
            return False
        if _table_field(raw, "queue") == target_queue:
            return True
    return False


def delivery_count_properties(properties: bytes, count: int) -> bytes:
    """The properties with the ``x-delivery-count`` header set to ``count`` (a long, as RabbitMQ)."""
    items = header_items(properties)
    set_header(items, "x-delivery-count", long(count))
    return with_header_items(properties, items)
