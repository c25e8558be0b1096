"""Deliveries as columns: lists (DeliveryChunk), or with the offsets and bodies already Arrow arrays
(ArrowChunk).

A read's scan (lavinpy.wire.client.scan_stream_arrow) writes the offsets and bodies of a receive
buffer's deliveries straight into Arrow buffers: no int and no bytes object is made a delivery, and
the batch builder joins arrays instead of packing lists. The rare chunk that is cut item by item (a
range's first or last, a delivery with its offset away from the end of its headers) goes through lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from lavinpy.wire.client import binary_buffers, int64_bounds, pack_int64s


class Delivery(NamedTuple):
    """One stream message. A tuple, because a reader creates hundreds of thousands per second."""

    offset: int
    exchange: str
    routing_key: str
    properties: list[Any]  # ordered as lavinpy.wire.properties.PROPERTY_NAMES; headers without x-stream-offset
    body: bytes


class DeliveryChunk(NamedTuple):
    """Consecutive deliveries as columns, one list each, in delivery order. Deliveries with the same
    properties share one property list (read-only)."""

    offsets: list[int]
    exchanges: list[str]
    routing_keys: list[str]
    properties: list[list[Any]]
    bodies: list[bytes]

    @classmethod
    def of_rows(cls, rows: list[Delivery]) -> DeliveryChunk:
        return cls(*(list(column) for column in zip(*rows, strict=True)))

    def rows(self) -> Iterator[Delivery]:
        return map(Delivery, *self)

    def head(self, n: int) -> DeliveryChunk:
        return DeliveryChunk._make(column[:n] for column in self)

    def keep(self, indices: list[int]) -> DeliveryChunk:
        return DeliveryChunk._make([column[i] for i in indices] for column in self)


class ArrowChunk(NamedTuple):
    """DeliveryChunk's columns with the offsets (int64) and bodies (binary) as Arrow arrays."""

    offsets: pa.Array | None  # null where a delivery has no offset; None when none has (a queue's)
    exchanges: list[str]
    routing_keys: list[str]
    properties: list[list[Any]]
    bodies: pa.Array
    low: int  # the least and greatest offset present (0 and 0 without)
    high: int

    @property
    def size(self) -> int:
        return len(self.exchanges)

    @classmethod
    def of_scan(cls, offsets: bytes, validity: bytes | None, valid: int, low: int, high: int, exchanges: list[str],
                routing_keys: list[str], properties: list[list[Any]], ends: bytes, data: pa.Buffer) -> ArrowChunk:
        """From scan_stream_arrow's buffers (wrapped, not copied); data: the bodies joined."""
        n = len(exchanges)
        column = None
        if valid:
            bitmap = None if validity is None else pa.py_buffer(validity)
            column = pa.Array.from_buffers(pa.int64(), n, [bitmap, pa.py_buffer(offsets)], null_count=n - valid)
        bodies = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ends), data])
        return cls(column, exchanges, routing_keys, properties, bodies, low, high)

    @classmethod
    def of_lists(cls, chunk: DeliveryChunk) -> ArrowChunk:
        offsets, bodies = chunk.offsets, chunk.bodies
        column = None
        low = high = 0
        bounds = int64_bounds(offsets)  # None: empty, or a None (or out of range) among them
        packed = pack_int64s(offsets) if bounds is not None else None
        if packed is not None and bounds is not None:
            column = pa.Array.from_buffers(pa.int64(), len(offsets), [None, pa.py_buffer(packed)])
            low, high = bounds
        elif offsets and offsets.count(None) < len(offsets):  # type: ignore[arg-type]
            column = pa.array(offsets, pa.int64())
            present = [offset for offset in offsets if offset is not None]
            low, high = min(present), max(present)
        buffers = binary_buffers(bodies)
        if buffers is None:
            body_column = pa.array(bodies, pa.binary())
        else:
            body_column = pa.Array.from_buffers(pa.binary(), len(bodies), [None, *map(pa.py_buffer, buffers)])
        return cls(column, chunk.exchanges, chunk.routing_keys, chunk.properties, body_column, low, high)

    def to_lists(self) -> DeliveryChunk:
        offsets = [None] * self.size if self.offsets is None else self.offsets.to_pylist()
        return DeliveryChunk(offsets, self.exchanges, self.routing_keys, self.properties,  # type: ignore[arg-type]
                             self.bodies.to_pylist())

    def rows(self) -> Iterator[Delivery]:
        return self.to_lists().rows()

    def last_offset(self) -> int | None:
        return None if self.offsets is None or not self.size else self.offsets[-1].as_py()

    def slice(self, start: int, stop: int | None = None) -> ArrowChunk:
        """Deliveries start..stop (the arrays sliced without a copy)."""
        offsets = None if self.offsets is None else self.offsets[start:stop]
        low = high = 0
        if offsets is not None and offsets.null_count < len(offsets):
            bounds = pc.min_max(offsets).as_py()
            low, high = bounds["min"], bounds["max"]
        return ArrowChunk(offsets, self.exchanges[start:stop], self.routing_keys[start:stop],
                          self.properties[start:stop], self.bodies[start:stop], low, high)


def as_arrow(chunk: ArrowChunk | DeliveryChunk) -> ArrowChunk:
    return chunk if isinstance(chunk, ArrowChunk) else ArrowChunk.of_lists(chunk)


def joined(chunks: list[ArrowChunk]) -> ArrowChunk:
    """The chunks as one (the arrays copied once into one each; list.extend copies references in C)."""
    if len(chunks) == 1:
        return chunks[0]
    with_offsets = [chunk for chunk in chunks if chunk.offsets is not None]
    offsets = None
    low = high = 0
    if with_offsets:
        offsets = pa.concat_arrays([pa.nulls(chunk.size, pa.int64()) if chunk.offsets is None else chunk.offsets
                                    for chunk in chunks])
        low = min(chunk.low for chunk in with_offsets)
        high = max(chunk.high for chunk in with_offsets)
    lists: list[list[Any]] = [[], [], []]
    for chunk in chunks:
        lists[0].extend(chunk.exchanges)
        lists[1].extend(chunk.routing_keys)
        lists[2].extend(chunk.properties)
    bodies = pa.concat_arrays([chunk.bodies for chunk in chunks])
    return ArrowChunk(offsets, lists[0], lists[1], lists[2], bodies, low, high)
