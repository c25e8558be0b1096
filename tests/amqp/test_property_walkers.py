"""The stream queue's x-stream-offset edit walks the property block with the shared, bounds-checked
walker: a truncated block is refused instead of spliced into garbage."""

from __future__ import annotations

import pytest

from lavinpy.broker.stream_queue import with_stream_offset
from lavinpy.wire.properties import PropertiesError

# Flags say "headers present" but the table length is cut short, or claims more than the block holds.
TRUNCATED = [b"\x20\x00\x00\x00", b"\x20\x00\x00\x00\x00\x09abc", b"\xa0\x00\x05ab"]


@pytest.mark.parametrize("raw", TRUNCATED)
def test_stream_offset_refuses_a_truncated_block(raw: bytes) -> None:
    with pytest.raises(PropertiesError):
        with_stream_offset(raw, 7)
