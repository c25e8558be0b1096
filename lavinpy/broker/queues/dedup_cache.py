"""An exchange's or queue's deduplication cache: the identifiers it saw, on disk (queues wing).

The cache is an insertion-ordered dict (identifier -> expiry ms, 0 for never) of at most
``cache_size`` entries: the oldest goes first, as LavinMQ's. Each identifier remembered is appended
to the object's file in the vhost directory (``store.append_file.append_soon``: the identifiers
waiting are written in one write by the next group commit, before the fsync its messages' publisher
confirms wait for, or after 20 ms; so a confirmed message's identifier survives a kill -9; streamed
to replication followers like every store change), so restarts, crashes and failovers keep the
cache. The file is rewritten with the live entries when it holds twice as many records as the cache
(and at least ``COMPACT_MIN_RECORDS``).

File: batches ``length u32, records, crc32 u32`` (little-endian; the CRC covers the records), a record
``key length u16, expiry ms u64, key bytes``. A torn or damaged batch (a crash mid-write) ends the
read there and is cut off.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..settings.deduplication import MAX_KEY_BYTES, MAX_TTL, DedupSettings

if TYPE_CHECKING:
    from ...store.append_file import AppendFile

log = logging.getLogger("lavinpy.dedup")

_HEAD = struct.Struct("<HQ")
_pack_head = _HEAD.pack
_U32 = struct.Struct("<I")
MESSAGE_TTL_HEADER = "x-cache-ttl"  # a message's own TTL for its identifier (LavinMQ's)
COMPACT_MIN_RECORDS = 65536  # a rewrite (with its fsync) at most once per this many new identifiers


def identifier(value: Any) -> bytes | None:
    """A header value as the cache's key (typed, so 1 and "1" differ); None when it cannot be one."""
    if isinstance(value, bytes):
        key = b"b" + value
    elif isinstance(value, str):
        key = b"s" + value.encode("utf-8", "surrogatepass")
    elif isinstance(value, bool):
        key = b"t" if value else b"f"
    elif isinstance(value, int):
        key = b"i" + str(value).encode()
    else:
        return None
    if len(key) > MAX_KEY_BYTES:  # bounded memory: a long identifier is remembered by its digest
        key = b"h" + hashlib.sha256(key).digest()
    return key


def _frame(records: bytes) -> bytes:
    """One write's records with their length and checksum (a torn write is found on reading)."""
    return _U32.pack(len(records)) + records + _U32.pack(zlib.crc32(records))


def file_name(kind: str, name: str) -> str:
    """The cache file of an exchange ("x") or queue ("q") in its vhost directory."""
    return f"dedup.{kind}.{hashlib.sha1(name.encode('utf-8', 'surrogatepass')).hexdigest()}"


class DedupCache:
    """One object's cache; ``file`` None keeps it in memory (a transient exchange or queue)."""

    def __init__(self, settings: DedupSettings, file: AppendFile | None = None) -> None:
        self.settings = settings
        self.header = settings.header
        self.entries: OrderedDict[bytes, int] = OrderedDict()
        self._file = file
        self._records = 0
        self._size = settings.cache_size
        self._ttl = settings.ttl_ms
        self._compact_at = 2 * max(settings.cache_size, COMPACT_MIN_RECORDS)
        if file is not None:
            file.frame = _frame
            self._load(file.open())

    def _load(self, data: bytes) -> None:
        view = memoryview(data)
        offset, end = 0, len(data)
        entries = self.entries
        while offset + 2 * _U32.size <= end:
            (size,) = _U32.unpack_from(view, offset)
            start, stop = offset + _U32.size, offset + _U32.size + size
            if stop + _U32.size > end or zlib.crc32(view[start:stop]) != _U32.unpack_from(view, stop)[0]:
                break
            at = start
            while at + _HEAD.size <= stop:
                length, expiry = _HEAD.unpack_from(view, at)
                key = bytes(view[at + _HEAD.size:at + _HEAD.size + length])
                at += _HEAD.size + length
                entries.pop(key, None)
                entries[key] = expiry
                self._records += 1
            offset = stop + _U32.size
        view.release()
        if offset != end:
            log.warning("%s: damaged tail of %d bytes cut off", self._file.path if self._file else "?", end - offset)
            assert self._file is not None
            self._file.truncate(offset)
        while len(entries) > self.settings.cache_size:
            entries.popitem(last=False)

    def seen(self, headers: Mapping[str, Any] | None, now_ms: int) -> bool:
        """Whether a message with these headers is a duplicate; if not, its identifier (if it has
        one) is remembered from now on. (Once per published message: kept to few calls.)"""
        if not headers:
            return False
        value = headers.get(self.header)
        if value is None:
            return False
        if type(value) is str and len(value) < MAX_KEY_BYTES // 4:  # the common case, inline
            key = b"s" + value.encode("utf-8", "surrogatepass")
        else:
            key = identifier(value)  # type: ignore[assignment]
            if key is None:
                return False
        entries = self.entries
        expiry = entries.get(key)
        if expiry is not None:
            if expiry == 0 or expiry > now_ms:
                return True
            del entries[key]  # expired: remembered again below, as new
        ttl = headers.get(MESSAGE_TTL_HEADER)
        if ttl is None or isinstance(ttl, bool) or not (isinstance(ttl, int) and 0 <= ttl <= MAX_TTL):
            ttl = self._ttl
        expiry = 0 if ttl is None else now_ms + ttl
        entries[key] = expiry
        if len(entries) > self._size:
            entries.popitem(last=False)
        file = self._file
        if file is not None:
            file.append_soon(_pack_head(len(key), expiry) + key)  # framed per write by _frame
            self._records += 1
            if self._records > self._compact_at:
                self.compact()
        return False

    def compact(self) -> None:
        """Rewrite the file with the live entries only (atomically; replicated as a replace)."""
        if self._file is None:
            return
        self._file.write_pending()  # in order: the replace must not be followed by older records
        pack = _HEAD.pack
        self._file.replace(_frame(b"".join(pack(len(key), expiry) + key for key, expiry in self.entries.items())))
        self._records = len(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def info(self, duplicates: int) -> dict[str, Any]:
        """The cache as the management API shows it, with the owner's count of duplicates."""
        return {"cache_size": self.settings.cache_size, "cache_entries": len(self.entries),
                "cache_ttl": self.settings.ttl_ms, "header": self.header, "duplicates": duplicates}
