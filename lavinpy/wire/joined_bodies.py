"""A read batch's bodies kept joined: a scan's bodies as one bytes object and their ends (no bytes object
a body until one is asked for), and the join of a batch's parts into an Arrow binary array's buffers."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from itertools import accumulate, islice
from typing import Any, cast, overload

from lavinpy.wire.accel import cclient

__all__ = ["JoinedBodies", "join_bodies"]

_I32S = struct.Struct("<i")
_I32_PAIR = struct.Struct("<ii")
_BIG_ENDIAN = sys.byteorder == "big"  # Arrow's offsets are little-endian; array("i") is native


class JoinedBodies(Sequence[bytes]):
    """Bodies ``start..stop`` of a scan's joined bodies (``scan_stream_deliveries(..., joined=True)``):
    a read sequence of bytes without a bytes object a body; slices share the buffers. Arrow takes
    them as a binary array's buffers (``join_bodies``)."""

    __slots__ = ("data", "ends", "start", "stop")

    def __init__(self, data: bytes, ends: bytes, start: int = 0, stop: int | None = None) -> None:
        self.data = data
        self.ends = ends
        self.start = start
        self.stop = len(ends) // 4 - 1 if stop is None else stop

    @classmethod
    def of_scan(cls, joined: list[bytes] | tuple[bytes, bytes]) -> JoinedBodies:
        """From a joined scan's bodies slot: (data, ends)."""
        data, ends = joined
        return cls(data, ends)

    def __len__(self) -> int:
        return self.stop - self.start

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            first, last, step = index.indices(len(self))
            if step != 1:
                return list(self)[index]
            return JoinedBodies(self.data, self.ends, self.start + first, self.start + max(first, last))
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("JoinedBodies index out of range")
        lo, hi = _I32_PAIR.unpack_from(self.ends, 4 * (self.start + index))
        return self.data[lo:hi]

    def __iter__(self) -> Iterator[bytes]:
        data = self.data
        ends = _I32S.iter_unpack(self.ends[4 * self.start:4 * (self.stop + 1)])
        lo = next(ends)[0]
        for (hi,) in ends:
            yield data[lo:hi]
            lo = hi

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, bytes | str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JoinedBodies({list(self)!r})"


def join_bodies(parts: list[Sequence[bytes]]) -> tuple[bytes, bytes] | None:
    """The ends (little-endian int32, one more than the bodies) and data buffers of an Arrow binary
    array of the parts' bodies in order, or None (a part that is not JoinedBodies and not a list of
    bytes, or over 2 GiB in all). JoinedBodies' bytes are copied once, rebased in C when compiled."""
    if cclient is not None:
        return cast("tuple[bytes, bytes] | None", cclient.join_bodies(
            [(p.data, p.ends, p.start, p.stop) if type(p) is JoinedBodies else p for p in parts]))
    return _join_bodies(parts)


def _join_bodies(parts: list[Sequence[bytes]]) -> tuple[bytes, bytes] | None:
    # The ends go into a native int32 array: a JoinedBodies part's own ends are taken as bytes (rebased
    # by map when it does not start at the join's end), a list's are summed by accumulate; no Python
    # step a body.
    ends = array("i", [0])
    pieces: list[bytes] = []
    total = 0
    for part in parts:
        if type(part) is JoinedBodies:
            lo = _I32S.unpack_from(part.ends, 4 * part.start)[0]
            hi = _I32S.unpack_from(part.ends, 4 * part.stop)[0]
            if total + hi - lo > 0x7FFFFFFF:
                return None
            pieces.append(part.data[lo:hi])
            run = array("i")
            run.frombytes(part.ends[4 * part.start + 4:4 * part.stop + 4])
            if _BIG_ENDIAN:
                run.byteswap()
            base = total - lo
            ends.extend(run if base == 0 else map(base.__add__, run))
            total += hi - lo
        elif type(part) is list and all(type(item) is bytes for item in part):
            size = sum(map(len, part))
            if total + size > 0x7FFFFFFF:
                return None
            pieces.extend(part)
            ends.extend(islice(accumulate(map(len, part), initial=total), 1, None))
            total += size
        else:
            return None
    if _BIG_ENDIAN:
        ends.byteswap()
    return ends.tobytes(), b"".join(pieces)
