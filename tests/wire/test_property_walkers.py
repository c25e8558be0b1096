"""The stream queue's x-stream-offset edit walks the property block with the shared, bounds-checked
walker: a truncated block is refused instead of spliced into garbage."""

from __future__ import annotations

import pytest

from lavinpy.broker.queues.stream import with_stream_offset
from lavinpy.wire.properties import PropertiesError

# Flags say "headers present" but the table length is cut short, or claims more than the block holds.
TRUNCATED = [b"\x20\x00\x00\x00", b"\x20\x00\x00\x00\x00\x09abc", b"\xa0\x00\x05ab"]


@pytest.mark.parametrize("raw", TRUNCATED)
def test_stream_offset_refuses_a_truncated_block(raw: bytes) -> None:
    with pytest.raises(PropertiesError):
        with_stream_offset(raw, 7)


# The cached splice (the bytes around the offset value) must stamp exactly as the general splice does,
# for every offset and whatever the block holds (a publisher's own x-stream-offset included).
@pytest.mark.parametrize("headers", [None, {}, {"a": 1}, {"x-stream-offset": "mine", "b": b"v"}])
@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_stream_offset_cached_splice_matches_the_general_one(headers: dict | None, content_type: str | None) -> None:
    from lavinpy.broker.queues.stream_stamps import _stamped_block
    from lavinpy.wire.properties import encode_property_values, peek_headers

    raw = encode_property_values(content_type=content_type, headers=headers, delivery_mode=2, message_id="m")
    for offset in (1, 2, 255, 1 << 40, -5, 1, (1 << 63) - 1):
        stamped = with_stream_offset(raw, offset)
        assert stamped == _stamped_block(raw, offset)
        decoded = peek_headers(stamped)
        assert decoded is not None and decoded["x-stream-offset"] == offset
        expected = {k: v for k, v in (headers or {}).items() if k != "x-stream-offset"}
        assert {k: v for k, v in decoded.items() if k != "x-stream-offset"} == expected
