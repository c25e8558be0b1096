"""The ``x-stream-offset`` header a stream stamps on every delivery: spliced into the raw property block,
once per block seen (``with_stream_offset``), then by one concatenation a delivery (``stamped_run``).
The splices (``_SPLICES``) are also what the compiled stamped framings (the codec's and the store's) read."""

from __future__ import annotations

from ...store.record import StoredMessage
from ...wire.accel import load
from ...wire.properties import append_header_entry, headers_span, peek_headers, replace_headers
from .stream_arguments import OFFSET_HEADER

# --- the delivered header ----------------------------------------------------------------------

_OFFSET_ENTRY = bytes((len(OFFSET_HEADER),)) + OFFSET_HEADER.encode() + b"l"

def _stamped_block(properties: bytes, offset: int) -> bytes:
    """``with_stream_offset`` by splicing the raw table (the general way)."""
    if _OFFSET_ENTRY[:-1] in properties:  # a publisher's own x-stream-offset header is replaced
        headers = dict(peek_headers(properties) or {})
        headers.pop(OFFSET_HEADER, None)
        properties = replace_headers(properties, headers)
    return append_header_entry(properties, _OFFSET_ENTRY + offset.to_bytes(8, "big", signed=True))


# A stream's messages mostly share a few property blocks: for each, the bytes before and after the
# 8-byte offset value of its stamped block, so stamping a delivery is one concatenation.
_SPLICES: dict[bytes, tuple[bytes, bytes]] = {}
_SPLICES_MAX = 1024


def with_stream_offset(properties: bytes, offset: int) -> bytes:
    """The property block with header ``x-stream-offset`` = ``offset`` as a signed 64-bit ``long``.

    Spliced into the raw table, so every other field and header keeps its exact bytes and type
    (re-encoding through pamqp would pick the smallest integer type for every header).
    """
    splice = _SPLICES.get(properties)
    if splice is None:
        stamped = _stamped_block(properties, 0)
        value_end = headers_span(stamped)[1]  # the entry is the table's last: its value ends it
        splice = (stamped[:value_end - 8], stamped[value_end:])
        if len(_SPLICES) >= _SPLICES_MAX:
            _SPLICES.clear()
        _SPLICES[bytes(properties)] = splice
    return splice[0] + offset.to_bytes(8, "big", signed=True) + splice[1]


def _stamp_offsets(messages: list[StoredMessage], start: int, first_offset: int,
                   splices: dict[bytes, tuple[bytes, bytes]], cls: type = StoredMessage
                   ) -> tuple[list[StoredMessage], int]:
    """``messages[start:]`` stamped with consecutive offsets from ``first_offset`` through ``splices``;
    stops at the first whose property block has no splice yet and returns its index too."""
    out: list[StoredMessage] = []
    for i in range(start, len(messages)):
        msg = messages[i]
        splice = splices.get(msg[3])
        if splice is None:
            return out, i
        offset = first_offset + i - start
        out.append(cls(msg[0], msg[1], msg[2], splice[0] + offset.to_bytes(8, "big", signed=True) + splice[1], msg[4]))
    return out, len(messages)


_cstream = load("lavinpy.wire._cstream")
stamp_offsets = _cstream.stamp_offsets if _cstream is not None else _stamp_offsets


def stamped_run(messages: list[StoredMessage], first_offset: int) -> list[StoredMessage]:
    """``with_stream_offset`` for a run of messages with consecutive offsets: one call for the run, and
    one more per property block not seen before."""
    stamped, i = stamp_offsets(messages, 0, first_offset, _SPLICES, StoredMessage)
    while i < len(messages):
        msg = messages[i]  # stamped the general way, which prepares its block's splice for the rest
        stamped.append(StoredMessage(msg.timestamp, msg.exchange, msg.routing_key,
                                     with_stream_offset(msg.properties, first_offset + i), msg.body))
        more, i = stamp_offsets(messages, i + 1, first_offset + i + 1, _SPLICES, StoredMessage)
        stamped += more
    return stamped
