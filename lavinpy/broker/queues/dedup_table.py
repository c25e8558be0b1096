"""A deduplication cache's table: its identifiers (typed byte keys), their expiries and their order of
arrival, the oldest forgotten past the size, and the records the cache's file has not had yet.

``new_table`` gives the compiled table (``_cwire.dedup_table``: fixed-size slots over a byte ring that
holds the records as the file writes them) or, without the extension, ``DedupTable``, its pure-Python
twin (a dict, a deque of arrivals and the records as a list), which answers and renders the same.
A key is ``s`` + an ASCII string's text or another ``identifier`` byte string; a record is ``key length
u16, expiry ms u64, key bytes`` (the cache file's); ``take_framed`` gives the records not written yet as
the file's batch (``store.record.frame_batch``'s framing, the compiled table's without a second copy).
"""

from __future__ import annotations

import os
import struct
from collections import deque
from functools import partial
from typing import Protocol

from ...store.record import frame_batch
from ...wire import accel
from ...wire.properties import header_span

_pack_head = struct.Struct("<HQ").pack


class Table(Protocol):
    def get(self, key: bytes) -> int | None: ...
    def put(self, key: bytes, expiry: int) -> None: ...
    def run(self, name: bytes, limit: int, ttl_name: bytes, ttl: int, blocks: list[bytes], start: int,
            now_ms: int, duplicates: list[int]) -> tuple[int, int]: ...
    def take_framed(self, mark: int) -> bytes: ...
    def skip(self) -> None: ...
    def live(self) -> bytes: ...
    def __len__(self) -> int: ...


class DedupTable:
    """The pure-Python table (see the module's text). ``keep``: records are kept for ``take``."""

    def __init__(self, size: int, keep: bool) -> None:
        self._size = size
        self._keep = keep
        self._entries: dict[bytes, int] = {}
        self._arrivals: deque[bytes] = deque()  # the keys' places, oldest first
        # How many older places in ``_arrivals`` each key remembered anew has (skipped when they come up).
        self._stale: dict[bytes, int] = {}
        self._records: list[bytes] = []

    def get(self, key: bytes) -> int | None:
        """The key's expiry (0: never), or None when it is not remembered."""
        return self._entries.get(key)

    def put(self, key: bytes, expiry: int) -> None:
        """Remember the key (anew, the newest, when known); past the size the oldest is forgotten."""
        entries = self._entries
        if key in entries:
            del entries[key]
            self._stale[key] = self._stale.get(key, 0) + 1
        entries[key] = expiry
        self._arrivals.append(key)
        if self._keep:
            self._records.append(_pack_head(len(key), expiry) + key)
        if len(entries) > self._size:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        arrivals, stale = self._arrivals, self._stale
        while True:
            key = arrivals.popleft()
            count = stale.get(key)
            if count:  # an older place of a key remembered anew since
                if count == 1:
                    del stale[key]
                else:
                    stale[key] = count - 1
                continue
            del self._entries[key]
            return

    def run(self, name: bytes, limit: int, ttl_name: bytes, ttl: int, blocks: list[bytes], start: int,
            now_ms: int, duplicates: list[int]) -> tuple[int, int]:
        """A publish run's property blocks from ``start``, the common message only (a string identifier
        under ``name`` of fewer than ``limit`` ASCII bytes, no entry called ``ttl_name``): a new or
        expired identifier is remembered (expiring ``ttl`` ms after ``now_ms``; never for a negative
        ``ttl``), a live one's index goes to ``duplicates``, a block without the header is kept. Stops
        at any other message (the caller takes it the whole way): returns (where it stopped,
        ``len(blocks)`` at the end; the identifiers remembered). (The cache's constant arguments come
        first: it binds them once, and a run's call passes four.)"""
        if ttl >= 0 and now_ms < 0:
            raise ValueError("dedup_table_run: a time before the epoch")
        expiry = 0 if ttl < 0 else now_ms + ttl
        get, put = self._entries.get, self.put
        added = 0
        # The usual block (flags 0x20 or 0x30: headers, maybe a delivery mode after them) whose headers
        # table is this entry alone, a long string: its span read off without the general walk (the
        # span header_span gives it; anything else takes that walk).
        key_end = 7 + len(name)
        sole = bytes((len(name),)) + name + b"S" if len(name) < 256 else None
        for i in range(start, len(blocks)):
            block = blocks[i]
            table_end = 6 + int.from_bytes(block[2:6], "big")
            if len(block) > key_end + 4 and block[0] & 0xF0 in (0x20, 0x30) and not block[1] & 1 \
                    and block[6:key_end + 1] == sole \
                    and key_end + 5 + int.from_bytes(block[key_end + 1:key_end + 5], "big") == table_end <= len(block):
                span: tuple[int, int] | tuple[()] | None = (key_end, table_end)
            else:
                span = header_span(block, name)
            if span == ():
                continue
            if not span or block[span[0]] != 0x53 or span[1] - span[0] - 5 >= limit:
                return i, added
            text = block[span[0] + 5:span[1]]
            if not text.isascii() or ttl_name in block and header_span(block, ttl_name):  # (an entry of that name)
                return i, added
            key = b"s" + text
            known = get(key)
            if known is not None and (known == 0 or known > now_ms):
                duplicates.append(i)
                continue
            put(key, expiry)
            added += 1
        return len(blocks), added

    def take_framed(self, mark: int) -> bytes:
        """The records remembered since the last take (or ``skip``), oldest first, as one batch of the
        cache's file with this mark (none when negative): ``frame_batch``'s bytes."""
        records = b"".join(self._records)
        self._records.clear()
        return frame_batch(records, mark)

    def skip(self) -> None:
        """Drop the records not taken (the file is rewritten with the live ones instead)."""
        self._records.clear()

    def live(self) -> bytes:
        """The live identifiers' records, oldest first."""
        return b"".join([_pack_head(len(key), expiry) + key for key, expiry in self._entries.items()])

    def __len__(self) -> int:
        return len(self._entries)


class CompiledTable:
    """``_cwire.dedup_table`` behind ``Table``'s methods (each a ``partial``: one C call, no frame)."""

    def __init__(self, size: int, keep: bool) -> None:
        cwire = accel.cwire
        assert cwire is not None
        # (seeded per table: identifiers crafted to collide cannot be prepared in advance)
        table = cwire.dedup_table(size, int.from_bytes(os.urandom(8), "little"), keep)
        self.get = partial(cwire.dedup_table_get, table)
        self.put = partial(cwire.dedup_table_put, table)
        self.run = partial(cwire.dedup_table_run, table)
        self.take_framed = partial(cwire.dedup_table_take_framed, table)
        self.skip = partial(cwire.dedup_table_skip, table)
        self.live = partial(cwire.dedup_table_live, table)
        self._len = partial(cwire.dedup_table_len, table)

    def __len__(self) -> int:
        return int(self._len())


def new_table(size: int, keep: bool) -> Table:
    """The compiled table when the extension is built, else the pure-Python one."""
    if accel.cwire is not None and hasattr(accel.cwire, "dedup_table"):
        return CompiledTable(size, keep)
    return DedupTable(size, keep)
