"""An exchange's or queue's deduplication cache: the identifiers it saw, on disk (queues wing).

The cache is a table (``dedup_table``: compiled fixed-size slots over a ring of the records, or its
pure-Python twin) of at most ``cache_size`` identifiers with their expiry (ms, 0 for never) in their
order of arrival: the oldest goes first, as LavinMQ's; an expired identifier seen again is remembered
anew, the newest. Each identifier remembered is appended to the object's file in the vhost directory
(``store.append_file.write_soon``: the table's records since the last write are framed and written in
one write by the next group commit, or after 20 ms; always after their messages' index entries, so that a
kill -9 never leaves an identifier without its message; streamed to replication followers like every
store change), so restarts, crashes and failovers keep the cache. The file is rewritten with the
live entries, at such a write, when it holds twice as many records as the cache (and at least
``COMPACT_MIN_RECORDS``).

When the file is fsynced: an exchange's, with the group commit its messages' publisher confirms wait
for. A queue's (``recover_from``), only with the group commits that sync the queues' ack files (the
periodic flush, every 0.2 s by default) and at a clean close: what it holds beyond its last fsync
stands for messages still in the queue, and a restart reads their identifiers back from their
headers (``_recover_queued``: the messages from the segment named in the file's last batch on). A
kill -9 loses nothing (the page cache keeps every write; the read-back even adds the identifiers of
stored messages whose records were not written yet). A power loss can forget only the identifiers
of messages removed from the queue (acknowledged, expired, dead-lettered, purged) in the moments
before it, whose removal reached the disk while their records did not: at most one periodic flush
interval plus one flush.

File: batches ``length u32, records, crc32 u32`` (little-endian; the CRC covers the records), a record
``key length u16, expiry ms u64, key bytes``. A record with an empty key is a queue cache's mark:
its "expiry" is the message store's segment at the write, before which every identifier not in the
file was stored. A torn or damaged batch (a crash mid-write) ends the read there and is cut off.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import zlib
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from ...store.message_store import CorruptRecord, MissingRecord
from ...store.record import frame_batch
from ...wire.position import SEGMENT_MASK
from ...wire.properties import peek_header
from ..settings.deduplication import MAX_KEY_BYTES, MAX_TTL, DedupSettings
from .dedup_table import new_table

if TYPE_CHECKING:
    from ...store.append_file import AppendFile
    from ...store.message_store import MessageStore
    from ...store.queue_index import QueueIndex

log = logging.getLogger("lavinpy.dedup")

_HEAD = struct.Struct("<HQ")
_pack_head = _HEAD.pack
_U32 = struct.Struct("<I")
MESSAGE_TTL_HEADER = "x-cache-ttl"  # a message's own TTL for its identifier (LavinMQ's)
_TTL_NAME = MESSAGE_TTL_HEADER.encode()  # a byte test: only a block holding the name is looked into
_NO_TTL = object()  # no x-cache-ttl header: the cache's own TTL
COMPACT_MIN_RECORDS = 65536  # a rewrite (with its fsync) at most once per this many new identifiers


def identifier(value: Any) -> bytes | str | None:
    """A header value as the cache's key (typed, so 1 and "1" differ); None when it cannot be one.

    A short ASCII string (the common identifier: a UUID, a hash, a counter) is its own key, which
    costs nothing to make and hashes once; on disk it is the record ``s`` + its bytes, as any string.
    Every other value is a typed byte string, which no ``str`` equals."""
    if isinstance(value, str):
        if len(value) < MAX_KEY_BYTES and value.isascii():
            return value
        key = b"s" + value.encode("utf-8", "surrogatepass")
    elif isinstance(value, bytes):
        key = b"b" + value
    elif isinstance(value, bool):
        key = b"t" if value else b"f"
    elif isinstance(value, int):
        key = b"i" + str(value).encode()
    else:
        return None
    if len(key) > MAX_KEY_BYTES:  # bounded memory: a long identifier is remembered by its digest
        key = b"h" + hashlib.sha256(key).digest()
    return key


def _stored_key(record: bytes) -> bytes | str:
    """A key read from the file as ``identifier`` makes it (a short ASCII string back to ``str``)."""
    if record[:1] == b"s" and len(record) <= MAX_KEY_BYTES and record.isascii():
        return record[1:].decode("ascii")
    return record


def file_name(kind: str, name: str) -> str:
    """The cache file of an exchange ("x") or queue ("q") in its vhost directory."""
    return f"dedup.{kind}.{hashlib.sha1(name.encode('utf-8', 'surrogatepass')).hexdigest()}"


class DedupCache:
    """One object's cache; ``file`` None keeps it in memory (a transient exchange or queue).
    ``recover_from``: a durable queue's (recovered) index and the vhost's message store: the file is
    then fsynced only with the ack files, and the identifiers of queued messages it may lack are read
    back from their headers here (see the module's text)."""

    def __init__(self, settings: DedupSettings, file: AppendFile | None = None,
                 recover_from: tuple[QueueIndex, MessageStore] | None = None) -> None:
        self.settings = settings
        self.header = settings.header
        self._header_key = settings.header.encode("utf-8", "surrogateescape")
        # The identifiers, and the records remembered since the last write (rendered into the file's
        # batch once per write, by the file's ``render``).
        self._table = new_table(settings.cache_size, file is not None)
        self._file = file
        self._write_queued = False  # the file's write_soon was asked for the unwritten identifiers
        self._records = 0
        self._ttl = settings.ttl_ms
        # A publish run's table call with the cache's constants bound (one C call; four arguments a run).
        self._run = partial(self._table.run, self._header_key, MAX_KEY_BYTES, _TTL_NAME,
                            -1 if self._ttl is None else self._ttl)
        self._compact_at = 2 * max(settings.cache_size, COMPACT_MIN_RECORDS)
        self._messages: MessageStore | None = None  # a queue's: each batch marked with its segment
        self._mark: int | None = None  # the segment the file's last intact batch names (None: no mark)
        if file is not None:
            file.render = self._render_unwritten
            self._load(file.open())
            if recover_from is not None:
                index, self._messages = recover_from
                self._recover_queued(index, self._messages)
                file.sync_with_acks = True

    def _load(self, data: bytes) -> None:
        view = memoryview(data)
        offset, end = 0, len(data)
        put = self._table.put
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
                if not length:  # a queue cache's mark: the message segment at this write
                    self._mark = expiry
                    continue
                put(key, expiry)  # a later record of a key: remembered anew, the newest
                self._records += 1
            offset = stop + _U32.size
        view.release()
        if offset != end:
            log.warning("%s: damaged tail of %d bytes cut off", self._file.path if self._file else "?", end - offset)
            assert self._file is not None
            self._file.truncate(offset)
        self._table.skip()  # (the file has them)

    def _recover_queued(self, index: QueueIndex, messages: MessageStore) -> None:
        """Remember the identifiers of the queue's messages stored from the file's mark's segment on
        (all of them without a mark), as they were published (each message's time), and queue them
        for the file: the ones it lost after its last fsync, or never got (a kill -9 between the
        messages' index entries and their records)."""
        mark = self._mark
        if mark is None and not index.ready_count + index.unacked_count:
            return
        # (a segment before the mark's too: a large message's record is placed before its identifier
        # is asked, and the segment may roll meanwhile)
        first = 0 if mark is None else max(mark - 1, 0)
        header, header_key = self.header, self._header_key
        for pos in index.live_positions():
            if pos & SEGMENT_MASK < first:
                continue
            try:
                message = messages.read(pos)
            except (MissingRecord, CorruptRecord):
                continue  # (recovery reports it where the queue reads it)
            properties = message.properties
            value = peek_header(properties, header, header_key)
            if value is None:
                continue
            ttl = peek_header(properties, MESSAGE_TTL_HEADER, _TTL_NAME) if _TTL_NAME in properties else None
            self._seen(value, _NO_TTL if ttl is None else ttl, message.timestamp)

    def seen(self, headers: Mapping[str, Any] | None, now_ms: int) -> bool:
        """Whether a message with these headers is a duplicate; if not, its identifier (if it has
        one) is remembered from now on. (Once per published message: kept to few calls.)"""
        if not headers:
            return False
        value = headers.get(self.header)
        if value is None:
            return False
        return self._seen(value, headers.get(MESSAGE_TTL_HEADER, _NO_TTL) if MESSAGE_TTL_HEADER in headers
                          else _NO_TTL, now_ms)

    def seen_in(self, properties: bytes, now_ms: int) -> bool:
        """``seen`` for a message's raw property block: the identifier (and a message TTL, when the
        block holds its name) found without decoding the headers table (a publish run's messages)."""
        value = peek_header(properties, self.header, self._header_key)
        if value is None:
            return False
        ttl = peek_header(properties, MESSAGE_TTL_HEADER, _TTL_NAME) if _TTL_NAME in properties else None
        return self._seen(value, _NO_TTL if ttl is None else ttl, now_ms)

    def new_in(self, blocks: list[bytes], now_ms: int) -> list[int] | None:
        """``seen_in`` for a publish run's property blocks, in order: the indexes of the messages that
        are not duplicates, or None when none is. The usual message (its identifier a short ASCII
        string, no TTL header of its own) is found, looked up and remembered, its record kept for the
        file, by the table's ``run`` (one compiled call for the run); any other goes through ``seen_in``.
        (Once per publish run: the usual run is one table call and a few tests.)"""
        duplicates: list[int] = []
        at, added = self._run(blocks, 0, now_ms, duplicates)
        if added and self._file is not None:  # (``_written_soon`` inline)
            self._records += added
            if not self._write_queued:
                self._write_queued = True
                self._file.write_soon()
        if at < len(blocks):
            self._new_in_rest(blocks, at, now_ms, duplicates)
        if not duplicates:
            return None
        dropped = set(duplicates)
        return [i for i in range(len(blocks)) if i not in dropped]

    def _new_in_rest(self, blocks: list[bytes], at: int, now_ms: int, duplicates: list[int]) -> None:
        """``new_in`` from a message the table's run stopped at: it the whole way (``seen_in``), then the
        run again from the next, and so on."""
        count = len(blocks)
        while at < count:
            if self.seen_in(blocks[at], now_ms):
                duplicates.append(at)
            at += 1
            if at < count:
                at, added = self._run(blocks, at, now_ms, duplicates)
                if added and self._file is not None:
                    self._written_soon(added)

    def _written_soon(self, added: int) -> None:
        """``added`` identifiers were queued for the file: a write is due, and maybe a rewrite."""
        if not self._write_queued:
            self._write_queued = True
            self._file.write_soon()  # type: ignore[union-attr]  # the write renders the records
        self._records += added
        # (a due rewrite waits for that write: now it would hold identifiers whose messages are not
        # stored yet, and a kill -9 then would make their publishers' retries "duplicates")

    def _seen(self, value: Any, ttl: Any, now_ms: int) -> bool:
        """``seen`` for an identifier's header value and the message's TTL header value (``_NO_TTL``
        without one)."""
        if type(value) is str and len(value) < MAX_KEY_BYTES and value.isascii():  # the common case, inline
            key = b"s" + value.encode("ascii")
        else:
            typed = identifier(value)
            if typed is None:
                return False
            key = b"s" + typed.encode("ascii") if isinstance(typed, str) else typed
        table = self._table
        known = table.get(key)
        if known is not None and (known == 0 or known > now_ms):
            return True
        if ttl is _NO_TTL or isinstance(ttl, bool) or not (isinstance(ttl, int) and 0 <= ttl <= MAX_TTL):
            ttl = self._ttl
        expiry = 0 if ttl is None else now_ms + ttl
        table.put(key, expiry)  # (an expired one anew, as the newest)
        if self._file is not None:
            self._written_soon(1)
        return False

    def _render_unwritten(self) -> bytes:
        """The file's ``render``: the identifiers remembered since the last write, as one framed batch
        (the table's ``take_framed``: one call, the records copied once); or, when the file has grown
        enough, nothing: the file rewritten with the live entries. (Called once the index entries of
        those identifiers' messages are with the OS: a group commit or ``write_in_order`` hands them
        over first.)"""
        self._write_queued = False
        if self._records > self._compact_at:
            self._table.skip()
            self._rewrite()
            return b""
        messages = self._messages
        return self._table.take_framed(-1 if messages is None else messages.current_segment_id)

    def _mark_now(self) -> int:
        """A queue cache's mark: the segment being written now, recorded before a batch's records (every
        message whose identifier is not in the file up to there is stored from there on); -1 for none."""
        messages = self._messages
        return -1 if messages is None else messages.current_segment_id

    def compact(self) -> None:
        """Rewrite the file with the live entries only (atomically; replicated as a replace)."""
        if self._file is None:
            return
        self._file.write_in_order()  # in order: the replace must not be followed by older records
        self._rewrite()

    def _rewrite(self) -> None:
        assert self._file is not None
        self._file.replace(frame_batch(self._table.live(), self._mark_now()))
        self._records = len(self._table)

    @property
    def durable(self) -> bool:
        """Whether the cache is on disk: a duplicate's confirm then waits for the group commit, so
        that it is never sent before the original message it stands for is durable."""
        return self._file is not None

    def __len__(self) -> int:
        return len(self._table)

    @property
    def entries(self) -> dict[bytes | str, int]:
        """The identifiers (as ``identifier`` makes them) and their expiries, oldest first (a copy)."""
        data, entries = self._table.live(), {}
        at = 0
        while at < len(data):
            length, expiry = _HEAD.unpack_from(data, at)
            entries[_stored_key(data[at + _HEAD.size:at + _HEAD.size + length])] = expiry
            at += _HEAD.size + length
        return entries

    def info(self, duplicates: int) -> dict[str, Any]:
        """The cache as the management API shows it, with the owner's count of duplicates."""
        return {"cache_size": self.settings.cache_size, "cache_entries": len(self._table),
                "cache_ttl": self.settings.ttl_ms, "header": self.header, "duplicates": duplicates}
