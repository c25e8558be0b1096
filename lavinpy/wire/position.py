"""Segment positions: where a message record lives, packed into one int.

A position is ``segment_id | (offset << 32)``. Written as 8 bytes little-endian it is exactly the
on-disk queue index entry (segment id uint32 LE, then byte offset uint32 LE), so an index file loads
with ``array('Q').frombytes(...)`` without any per-entry Python work.
"""

from __future__ import annotations

ENTRY_SIZE = 8  # bytes per index entry / packed position
# The layout, for the few loops that must not pay a function call per entry (they say so):
# segment = pos & SEGMENT_MASK, offset = pos >> OFFSET_SHIFT.
SEGMENT_MASK = 0xFFFFFFFF
OFFSET_SHIFT = 32


def make_pos(segment: int, offset: int) -> int:
    """Pack a segment id and a byte offset into one position."""
    return segment | (offset << OFFSET_SHIFT)


def pos_segment(pos: int) -> int:
    """Segment id of a position (low 32 bits)."""
    return pos & SEGMENT_MASK


def pos_offset(pos: int) -> int:
    """Byte offset of a position inside its segment (high 32 bits)."""
    return pos >> OFFSET_SHIFT


def enq_order_key(pos: int) -> int:
    """Sort key that orders positions as they were appended: by segment, then by offset.

    A raw position has the offset in the high bits, so plain int order is not append order.
    """
    return ((pos & SEGMENT_MASK) << OFFSET_SHIFT) | (pos >> OFFSET_SHIFT)


def pos_from_order_key(key: int) -> int:
    """The position an ``enq_order_key`` was made from."""
    return ((key & SEGMENT_MASK) << OFFSET_SHIFT) | (key >> OFFSET_SHIFT)
