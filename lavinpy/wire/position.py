"""Segment positions: where a message record lives, packed into one int.

A position is ``segment_id | (offset << 32)``. Written as 8 bytes little-endian it is exactly the
on-disk queue index entry (segment id uint32 LE, then byte offset uint32 LE), so an index file loads
with ``array('Q').frombytes(...)`` without any per-entry Python work.
"""

from __future__ import annotations

ENTRY_SIZE = 8  # bytes per index entry / packed position
_LOW32 = 0xFFFFFFFF


def make_pos(segment: int, offset: int) -> int:
    """Pack a segment id and a byte offset into one position."""
    return segment | (offset << 32)


def pos_segment(pos: int) -> int:
    """Segment id of a position (low 32 bits)."""
    return pos & _LOW32


def pos_offset(pos: int) -> int:
    """Byte offset of a position inside its segment (high 32 bits)."""
    return pos >> 32
