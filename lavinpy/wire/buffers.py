"""Memory the blocking clients' read paths keep instead of giving it back a read or a batch at a time.

A page the process gets from the kernel anew costs a fault and the zeroing of 4 KiB (about 1.5 us)
the first time it is written. A Spark read task receives about 90 MB a million messages into a receive
buffer and copies their bodies into columns: freed and allocated again read after read and batch after
batch, that memory came back as fresh pages several thousand times a million messages.

- The receive buffer keeps its allocation (``drop_front``, and the compiled ``recv_append``).
- A batch's column buffers go to Arrow with the batch and come back here once nothing holds them
  (``column_room``).
"""

from __future__ import annotations

import sys
import threading
from typing import cast

from lavinpy.wire.accel import cclient

__all__ = ["column_room", "drop_front"]

# Columns smaller than this come from the allocator's own free lists anyway.
_KEPT_MIN = 64 << 10
# At most this many bytes of column buffers are kept a process (a read task's batches are ~1 MB).
_KEPT_MAX_BYTES = 16 << 20
_kept: list[bytearray] = []
_kept_lock = threading.Lock()


def drop_front(buf: bytearray, n: int) -> None:
    """``del buf[:n]``, but the buffer keeps its allocation (bytearray gives memory back whenever its
    size falls under half of it: a buffer emptied read after read would be reallocated each time)."""
    if cclient is not None:
        cclient.drop_front(buf, n)
    else:
        del buf[:n]


def _new(n: int) -> bytearray:
    # Not zeroed where the compiled module is built: every byte a column holds is written before it is read.
    return bytearray(n) if cclient is None else cast(bytearray, cclient.capacity(n))


def column_room(n: int) -> bytearray:
    """A bytearray of at least n bytes (at most 2n), its bytes undefined: room for a column.

    A kept buffer is handed out again once nothing but this module holds it: once Arrow has let go
    of the batch whose column it was (Arrow's buffer of a bytearray holds a reference to it)."""
    if n < _KEPT_MIN:
        return _new(n)
    with _kept_lock:
        for buf in _kept:
            # References: the list, `buf` and getrefcount's argument: nobody else holds it.
            if sys.getrefcount(buf) == 3 and n <= len(buf) <= 2 * n:
                return buf
        fresh = _new(n)
        if n <= _KEPT_MAX_BYTES // 4:
            total = sum(len(buf) for buf in _kept) + n
            for buf in list(_kept):
                if total <= _KEPT_MAX_BYTES:
                    break
                if sys.getrefcount(buf) == 4:  # the list, the copy of it, `buf`, the argument
                    _kept.remove(buf)
                    total -= len(buf)
            if total <= _KEPT_MAX_BYTES:
                _kept.append(fresh)
        return fresh
