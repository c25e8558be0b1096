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

The index lives in memory and is rebuilt after a restart: every recovered offset starts ``UNKNOWN``,
``rebuild()`` (the vhost's periodic task) classifies a bounded number per call from the records, and
a filtering consumer classifies what it reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ...store.record import CorruptRecord, StoredMessage
from ...wire.properties import peek_headers
from .stream_filter import VALUE_HEADER, StreamFilter, message_values

if TYPE_CHECKING:
    from ...store.stream_index import StreamIndex

UNTAGGED = 0
UNKNOWN = 255
_MAX_SETS = 255  # tags 0..254
_KEY = bytes((len(VALUE_HEADER),)) + VALUE_HEADER.encode()  # the header's key as a table holds it
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
        if _KEY not in properties:  # the header's key bytes are absent: the header is
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
