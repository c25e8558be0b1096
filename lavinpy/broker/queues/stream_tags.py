"""A stream's filter-value index: one byte per offset naming the set of ``x-stream-filter-value``
values its message carries, so a filtering consumer finds the next message that can match with one
search over bytes (``re`` in C) instead of reading every record: a segment, or any stretch, that holds
no candidate is passed over whole.

Tag 0 is a message without ``x-stream-filter-value``; tags 1..254 are the distinct value sets seen,
in the order they first appeared (a set includes the empty one: the header present with no value);
``UNKNOWN`` (255) is a message not classified yet (recovered from disk and not rebuilt yet, a
malformed headers table, or a value set past the 254th) and always counts as a candidate, so the
index can only pass over messages it knows do not match; a filter with header conditions (a table)
is decided on the record itself, the index only narrows by values.

The index lives in memory and is kept beside the stream's entries in ``filter_tags`` (``TagsFile``):
the value sets and the tags, appended by the vhost's periodic task (a write of the new tags, no
fsync) and on a clean stop (with an fsync), each write a frame with its own length and CRC32; a
retention trim rewrites it. A restart loads it instead of reading the records; only the offsets it
does not cover (written after the last append before a crash, or all when the file is missing or
damaged from its first bad frame on) start ``UNKNOWN``: ``rebuild()`` (the periodic task) classifies
a bounded number per call from the records, and a filtering consumer classifies what it reads. The
file is a store file like the entries: streamed to replication followers (appends, truncations and
rewrites), so a promoted follower loads it too. Tags past the entries (the entries lost a tail the
file had) are dropped on loading: an offset is never given another message's tag.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...store import changes
from ...store.jsonfile import FILE_MODE, write_bytes_atomic
from ...store.record import CorruptRecord, StoredMessage
from ...wire.properties import peek_headers
from .stream_filter import VALUE_HEADER, StreamFilter, message_values

if TYPE_CHECKING:
    from ...store.stream_index import StreamIndex

log = logging.getLogger("lavinpy.stream")

UNTAGGED = 0
UNKNOWN = 255
TAGS_FILE = "filter_tags"
_FRAME = struct.Struct("<cI")  # kind (b"S" a value set, b"T" tags), payload length; then payload, crc32
_CRC = struct.Struct("<I")
_OFFSET = struct.Struct("<Q")
_MAX_SETS = 255  # tags 0..254
VALUE_KEY = bytes((len(VALUE_HEADER),)) + VALUE_HEADER.encode()  # the header's key as a table holds it
_BLOCK_CACHE_MAX = 1024
TRIM_MIN = 65536  # tags of trimmed offsets dropped once this many (a copy of the rest each time)


def could_match(wanted: StreamFilter, tagged: bool, values: frozenset[str]) -> bool:
    """Whether a message with this tag can match ``wanted`` whatever its other headers hold; exact
    (the same as ``wanted.matches``) when the filter has no header conditions."""
    if not tagged:
        if wanted.match_unfiltered:
            return True
        # held values are none: all() holds only without values, any() only through a header pair
        return not wanted.values if wanted.match_all else bool(wanted.headers)
    if wanted.match_all:
        return wanted.values <= values
    return bool(wanted.values & values) or bool(wanted.headers)


class FilterTags:
    """The tags of one stream's offsets from ``base`` on."""

    def __init__(self, first_offset: int, count: int = 0) -> None:
        self.base = first_offset  # the offset of tags[0]
        self.tags = bytearray(b"\xff" * count)  # recovered entries: not classified yet
        # The recovered offsets [unknown_from, unknown_end) that the rebuild has not classified yet.
        self.unknown_from = first_offset
        self.unknown_end = first_offset + count
        self._sets: list[frozenset[str]] = [frozenset()]  # tag -> values (tag 0: untagged)
        self._ids: dict[frozenset[str], int] = {}
        self._by_block: dict[bytes, int] = {}  # property block -> tag: a stream's blocks repeat
        self._scanners: dict[StreamFilter, tuple[int, re.Pattern[bytes], bool]] = {}

    # --- classifying ----------------------------------------------------------------------------
    def tag_of_headers(self, headers: Mapping[str, Any] | None) -> int:
        """The tag of a message with these headers (None: a malformed table, UNKNOWN)."""
        if headers is None:
            return UNKNOWN
        if VALUE_HEADER not in headers:
            return UNTAGGED
        values = message_values(headers[VALUE_HEADER])
        tag = self._ids.get(values)
        if tag is None:
            if len(self._sets) >= _MAX_SETS:
                return UNKNOWN
            tag = len(self._sets)
            self._sets.append(values)
            self._ids[values] = tag
        return tag

    def tag_of(self, properties: bytes) -> int:
        """The tag of a message with this property block."""
        if VALUE_KEY not in properties:  # the header's key bytes are absent: the header is
            return UNTAGGED
        tag = self._by_block.get(properties)
        if tag is None:
            try:
                headers: Mapping[str, Any] | None = peek_headers(properties) or {}
            except ValueError:  # a malformed table: the record decides (it matches nothing tagged)
                headers = None
            tag = self.tag_of_headers(headers)
            if len(self._by_block) >= _BLOCK_CACHE_MAX:
                self._by_block.clear()
            self._by_block[bytes(properties)] = tag
        return tag

    @property
    def sets(self) -> list[frozenset[str]]:
        return self._sets

    def load_known(self, sets: list[frozenset[str]], first_offset: int, known: bytes) -> None:
        """Stored tags of the recovered offsets from ``first_offset`` on (``TagsFile``): no rebuild for them."""
        self._sets = list(sets)
        self._ids = {values: tag for tag, values in enumerate(sets) if tag}
        self._by_block.clear()
        self._scanners.clear()
        i = first_offset - self.base
        self.tags[i:i + len(known)] = known
        if self.unknown_from == first_offset:
            self.unknown_from = first_offset + len(known)

    # --- the log ----------------------------------------------------------------------------------
    def append(self, tag: int, count: int = 1) -> None:
        self.tags += bytes((tag,)) * count

    def get(self, offset: int) -> int:
        i = offset - self.base
        return self.tags[i] if 0 <= i < len(self.tags) else UNKNOWN

    def set(self, offset: int, tag: int) -> None:
        i = offset - self.base
        if 0 <= i < len(self.tags):
            self.tags[i] = tag

    def trim(self, first_offset: int) -> None:
        """Retention moved the stream's head: drop the tags before it once they are many."""
        dead = first_offset - self.base
        if dead > TRIM_MIN and dead * 2 > len(self.tags):
            del self.tags[:dead]
            self.base = first_offset
        self.unknown_from = max(self.unknown_from, first_offset)

    # --- searching --------------------------------------------------------------------------------
    def scanner(self, wanted: StreamFilter) -> tuple[re.Pattern[bytes], bool]:
        """A pattern finding the tags that can match ``wanted``, and whether a known tag it finds is
        a match without reading the message's other headers (the filter has only value conditions)."""
        cached = self._scanners.get(wanted)
        if cached is not None and cached[0] == len(self._sets):
            return cached[1], cached[2]
        tags = [tag for tag, values in enumerate(self._sets) if could_match(wanted, tag != UNTAGGED, values)]
        tags.append(UNKNOWN)
        pattern = re.compile(b"[" + b"".join(re.escape(bytes((t,))) for t in tags) + b"]")
        exact = not wanted.headers
        if len(self._scanners) > 256:
            self._scanners.clear()
        self._scanners[wanted] = (len(self._sets), pattern, exact)
        return pattern, exact

    def next_candidate(self, pattern: re.Pattern[bytes], start: int, stop: int) -> int:
        """The first offset in [start, stop) whose tag can match (``stop`` if none)."""
        lo = max(start - self.base, 0)
        hi = stop - self.base
        if lo >= hi:
            return stop
        found = pattern.search(self.tags, lo, hi)
        return stop if found is None else self.base + found.start()

    @property
    def rebuilding(self) -> bool:
        return self.unknown_from < self.unknown_end

    def decides(self, wanted: StreamFilter, tag: int) -> bool | None:
        """Whether a message with ``tag`` matches ``wanted``: True or False when the tag says it,
        None when the record must be read (an unknown tag, or a possible match on header conditions)."""
        if tag == UNKNOWN:
            return None
        if not could_match(wanted, tag != UNTAGGED, self._sets[tag]):
            return False
        return True if not wanted.headers else None

    def rebuild(self, index: StreamIndex, read_many: Callable[[list[int]], list[StoredMessage]], limit: int) -> None:
        """Classify up to ``limit`` of the recovered offsets from their records."""
        start = max(self.unknown_from, index.first_offset)
        stop = min(start + limit, self.unknown_end)
        offset = start
        while offset < stop:
            positions = index.get_many(offset, min(stop - offset, 4096))
            if not positions:
                break
            whole = positions[:positions.index(0)] if 0 in positions else positions  # up to a hole
            try:
                messages = read_many(whole) if whole else []
            except (CorruptRecord, KeyError):
                messages = []  # left unknown: a consumer reading it decides
            for i, msg in enumerate(messages):
                self.set(offset + i, self.tag_of(msg.properties))
            offset += max(len(messages), 1)
        self.unknown_from = max(offset, stop)


def _frame(kind: bytes, payload: bytes) -> bytes:
    return _FRAME.pack(kind, len(payload)) + payload + _CRC.pack(zlib.crc32(payload))


def _set_frame(tag: int, values: frozenset[str]) -> bytes:
    return _frame(b"S", bytes((tag,)) + json.dumps(sorted(values)).encode())


class TagsFile:
    """A stream's ``filter_tags`` file: frames ``kind u8, length u32, payload, crc32 u32`` (little-endian).
    ``S``: a value set's tag (u8) and its values (a JSON list), in the order of their tags; ``T``: the
    first offset (u64) of the tags that follow, contiguous with the previous ``T`` frame's."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / TAGS_FILE
        self.saved_sets = 1  # value sets written (tag 0, untagged, is implied)
        self.base = -1  # the first offset the file holds tags of (-1: no tags frame yet)
        self.end = -1  # the offset after the last one it holds

    def load(self, tags: FilterTags, first_offset: int, end_offset: int) -> None:
        """Fill ``tags`` (all unknown, as recovered) from the file for the offsets of
        [first_offset, end_offset) it holds; the rest stays for ``rebuild()``."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        sets: list[frozenset[str]] = [frozenset()]
        chunks: list[bytes] = []
        base = end = -1
        at, good = 0, 0
        while at + _FRAME.size + _CRC.size <= len(data):
            kind, size = _FRAME.unpack_from(data, at)
            start, stop = at + _FRAME.size, at + _FRAME.size + size
            if stop + _CRC.size > len(data) or zlib.crc32(data[start:stop]) != _CRC.unpack_from(data, stop)[0]:
                break
            payload = data[start:stop]
            if kind == b"S" and size >= 1 and payload[0] == len(sets):
                sets.append(frozenset(json.loads(payload[1:])))
            elif kind == b"T" and size >= _OFFSET.size:
                (offset,) = _OFFSET.unpack_from(payload)
                if base >= 0 and offset != end:
                    break
                if base < 0:
                    base = end = offset
                chunks.append(payload[_OFFSET.size:])
                end += size - _OFFSET.size
            else:
                break
            at = good = stop + _CRC.size
        if good != len(data):  # a torn last write (a crash) or damage: kept up to it, rebuilt after it
            log.warning("%s: damaged from byte %d of %d; the tags after it are rebuilt", self.path, good, len(data))
            os.truncate(self.path, good)
            changes.truncated(self.path, good)
        known = b"".join(chunks)
        lo, hi = max(base, first_offset), min(end, end_offset)
        if base < 0 or hi <= lo or foreign_tags(known[lo - base:hi - base], len(sets)):
            self.rewrite(tags)  # nothing usable: the file anew, from what ``tags`` knows (nothing yet)
            return
        tags.load_known(sets, lo, known[lo - base:hi - base])
        self.saved_sets, self.base, self.end = len(sets), lo, hi
        if end > end_offset or lo > base:  # tags past the entries, or before the stream's head: not kept
            self.rewrite(tags)

    def save(self, tags: FilterTags, sync: bool = False) -> None:
        """Append the value sets and the tags known since the last call (a trimmed head: rewritten)."""
        upto = tags.unknown_from if tags.rebuilding else tags.base + len(tags.tags)
        if self.base >= 0 and tags.base > self.base:
            self.rewrite(tags, sync)
            return
        start = self.end if self.base >= 0 else tags.base
        frames = [_set_frame(tag, tags.sets[tag]) for tag in range(self.saved_sets, len(tags.sets))]
        if upto > start:
            frames.append(_frame(b"T", _OFFSET.pack(start) + tags.tags[start - tags.base:upto - tags.base]))
        if not frames:
            return
        data = b"".join(frames)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
        except FileNotFoundError:
            return  # the stream's directory is gone (deleted)
        try:
            os.write(fd, data)
            changes.appended_fd(fd, self.path, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self.saved_sets = len(tags.sets)
        if upto > start:
            if self.base < 0:
                self.base = start
            self.end = upto

    def rewrite(self, tags: FilterTags, sync: bool = False) -> None:
        """The file anew: the value sets and the known tags from the stream's head on."""
        upto = tags.unknown_from if tags.rebuilding else tags.base + len(tags.tags)
        frames = [_set_frame(tag, tags.sets[tag]) for tag in range(1, len(tags.sets))]
        if upto > tags.base:
            frames.append(_frame(b"T", _OFFSET.pack(tags.base) + tags.tags[:upto - tags.base]))
        self._rewrite(b"".join(frames))
        self.saved_sets = len(tags.sets)
        self.base, self.end = (tags.base, upto) if upto > tags.base else (-1, -1)

    def _rewrite(self, data: bytes) -> None:
        try:
            write_bytes_atomic(self.path, data)
        except FileNotFoundError:
            pass  # the stream's directory is gone (deleted)
        self.saved_sets, self.base, self.end = 1, -1, -1


def foreign_tags(known: bytes, sets: int) -> bool:
    """Whether a stretch of tags holds one that names no value set of ``sets`` (nor ``UNKNOWN``)."""
    return bool(known.translate(None, bytes(range(sets)) + bytes((UNKNOWN,))))
