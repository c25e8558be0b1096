"""An exchange's or queue's deduplication cache: the identifiers it saw, on disk (queues wing).

The cache is an insertion-ordered dict (identifier -> expiry ms, 0 for never) of at most
``cache_size`` entries: the oldest goes first, as LavinMQ's. Each identifier remembered is appended
to the object's file in the vhost directory (``store.append_file``: one write to the OS at once, so
a kill -9 keeps it; fsynced by the group commit before the message's publisher confirm; streamed to
replication followers like every store change), so restarts, crashes and failovers keep the cache.
The file is rewritten with the live entries when it holds twice as many records as the cache.

Record: ``key length u16, expiry ms u64, key bytes, crc32 u32`` (little-endian; the CRC covers the
rest). A torn or damaged tail (a crash mid-write) ends the read there and is cut off.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .deduplication import MAX_KEY_BYTES, MAX_TTL, DedupSettings

if TYPE_CHECKING:
    from ..store.append_file import AppendFile

log = logging.getLogger("lavinpy.dedup")

_HEAD = struct.Struct("<HQ")
_CRC = struct.Struct("<I")
MESSAGE_TTL_HEADER = "x-cache-ttl"  # a message's own TTL for its identifier (LavinMQ's)
COMPACT_MIN_RECORDS = 1024


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
        if file is not None:
            self._load(file.open())

    def _load(self, data: bytes) -> None:
        view = memoryview(data)
        offset, end = 0, len(data)
        entries = self.entries
        while offset + _HEAD.size + _CRC.size <= end:
            length, expiry = _HEAD.unpack_from(view, offset)
            stop = offset + _HEAD.size + length
            if stop + _CRC.size > end or zlib.crc32(view[offset:stop]) != _CRC.unpack_from(view, stop)[0]:
                break
            key = bytes(view[offset + _HEAD.size:stop])
            entries.pop(key, None)
            entries[key] = expiry
            offset = stop + _CRC.size
            self._records += 1
        view.release()
        if offset != end:
            log.warning("%s: damaged tail of %d bytes cut off", self._file.path if self._file else "?", end - offset)
            assert self._file is not None
            self._file.truncate(offset)
        while len(entries) > self.settings.cache_size:
            entries.popitem(last=False)

    def seen(self, headers: Mapping[str, Any] | None, now_ms: int) -> bool:
        """Whether a message with these headers is a duplicate; if not, its identifier (if it has
        one) is remembered from now on."""
        if not headers:
            return False
        key = identifier(headers.get(self.header))
        if key is None:
            return False
        entries = self.entries
        expiry = entries.get(key)
        if expiry is not None:
            if expiry == 0 or expiry > now_ms:
                return True
            del entries[key]  # expired: remembered again below, as new
        ttl = headers.get(MESSAGE_TTL_HEADER)
        if not (isinstance(ttl, int) and not isinstance(ttl, bool) and 0 <= ttl <= MAX_TTL):
            ttl = self.settings.ttl_ms
        expiry = 0 if ttl is None else now_ms + ttl
        entries[key] = expiry
        if len(entries) > self.settings.cache_size:
            entries.popitem(last=False)
        if self._file is not None:
            self._append(key, expiry)
        return False

    def _append(self, key: bytes, expiry: int) -> None:
        assert self._file is not None
        record = _HEAD.pack(len(key), expiry) + key
        self._file.append(record + _CRC.pack(zlib.crc32(record)))
        self._records += 1
        if self._records > 2 * max(self.settings.cache_size, COMPACT_MIN_RECORDS):
            self.compact()

    def compact(self) -> None:
        """Rewrite the file with the live entries only (atomically; replicated as a replace)."""
        if self._file is None:
            return
        parts = []
        for key, expiry in self.entries.items():
            record = _HEAD.pack(len(key), expiry) + key
            parts.append(record + _CRC.pack(zlib.crc32(record)))
        self._file.replace(b"".join(parts))
        self._records = len(parts)

    def __len__(self) -> int:
        return len(self.entries)

    def info(self, duplicates: int) -> dict[str, Any]:
        """The cache as the management API shows it, with the owner's count of duplicates."""
        return {"cache_size": self.settings.cache_size, "cache_entries": len(self.entries),
                "cache_ttl": self.settings.ttl_ms, "header": self.header, "duplicates": duplicates}
