"""One message record inside a segment: an 8-byte header (length, CRC32) and a LavinMQ-ordered payload.

Layout (all lavinpy integers little-endian; the property block keeps its AMQP big-endian encoding)::

    u32 length      bytes of payload after the crc field; 0 = end of valid data
    u32 crc32       zlib.crc32 of the payload
    i64 timestamp   ms since the epoch
    u8  exchange name length, then UTF-8 bytes
    u8  routing key length, then UTF-8 bytes
    ... basic properties exactly as on the wire (u16 flags, then the present fields)
    u64 body size
    ... body

The CRC covers the whole payload, so a record that was only partly written when the process died or
the power went (any subset of its bytes reached the disk) is detected on read and on recovery.
See docs/storage.md.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from array import array
from collections.abc import Callable
from typing import NamedTuple, TypeAlias, cast

from lavinpy.store.accel import cstore
from lavinpy.store.jsonfile import pwrite_all
from lavinpy.wire.position import OFFSET_SHIFT
from lavinpy.wire.properties import PropertiesError, properties_length

HEADER = struct.Struct("<II")  # length, crc32
HEADER_SIZE = HEADER.size
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
# timestamp + two name-length bytes + body size: the fixed part of a payload
FIXED_PAYLOAD = 8 + 1 + 1 + 8

Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
WritableBuffer: TypeAlias = bytearray | memoryview | mmap.mmap

# zlib's CRC-32 function; the compiled one where it folds with carry-less multiplies (several times
# faster on long inputs: the large records written and read here through Python).
_crc32 = cstore.crc32 if cstore is not None and cstore.crc32_path() == "clmul" else zlib.crc32
crc32: Callable[[Buffer, int], int] = _crc32  # for the callers that run a CRC over pieces (reserved_record)
_pack_header_into = HEADER.pack_into
_unpack_header_from = HEADER.unpack_from
_pack_i64 = _I64.pack
_pack_u64 = _U64.pack
# An mmap indexes and slices like bytes, which is all properties_length does with its buffer.
_properties_length = cast("Callable[[Buffer, int, int], int]", properties_length)


class StoredMessage(NamedTuple):
    timestamp: int
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes


class CorruptRecord(Exception):
    """A record's length, CRC or field layout is wrong; the message says what and where."""


def encode_names(exchange: bytes, routing_key: bytes) -> bytes:
    """The exchange and routing key as they sit in a record (each a u8 length + bytes).

    The message store caches these per (exchange, routing key) so the hot path does not re-encode.
    """
    if len(exchange) > 255 or len(routing_key) > 255:
        raise ValueError("exchange name and routing key must be at most 255 bytes")
    return bytes((len(exchange),)) + exchange + bytes((len(routing_key),)) + routing_key


def record_size(exchange: bytes, routing_key: bytes, properties: bytes, body_len: int) -> int:
    """Total bytes a record takes in a segment, header included."""
    return HEADER_SIZE + FIXED_PAYLOAD + len(exchange) + len(routing_key) + len(properties) + body_len


def py_write_encoded(buf: WritableBuffer, offset: int, names: bytes, properties: bytes,
                     body: bytes | memoryview, timestamp: int) -> int:
    """Write a record whose names are already encoded (see ``encode_names``); returns bytes written.

    The caller has checked that the record fits. The payload goes first and the header last, so a
    process killed mid-write leaves a zero length (end of data) in front of the partial payload; a
    power loss that persists only some pages is caught by the CRC. The body is copied exactly once,
    into ``buf``; the CRC is computed on the source pieces with a running value.
    """
    head = _pack_i64(timestamp) + names + properties + _pack_u64(len(body))
    start = offset + HEADER_SIZE
    body_start = start + len(head)
    end = body_start + len(body)
    buf[start:body_start] = head
    buf[body_start:end] = body
    length = end - start
    _pack_header_into(buf, offset, length, _crc32(body, _crc32(head)))
    return length + HEADER_SIZE


def py_write_run(buf: WritableBuffer, offset: int, limit: int, segment_id: int, names: bytes,
                 properties: bytes | list[bytes], bodies: list[bytes], start: int,
                 timestamp: int) -> tuple[int, int, bytes, int, int]:
    """Write ``bodies[start:]`` as records with the same names and properties while they fit below
    ``limit``: (index of the first body not written, end offset, positions packed as native u64,
    smallest and largest body written, 0 and 0 when none).

    One call per run of messages instead of one per message; the caller rolls the segment and
    calls again from the returned index. The smallest and largest body spare the message-size
    histogram a pass of its own over the run. ``properties`` is one block for every record or a list
    with one per body.
    """
    if isinstance(properties, list):
        return _write_records(lambda at, block, body: py_write_encoded(buf, at, names, block, body, timestamp),
                              offset, limit, segment_id, names, properties, bodies, start)
    # One block for the run (the common case): a loop of its own with the record written inline (the
    # shared loop's callback and a call a record cost the pure-Python path ~2.5 % of scenario a). The
    # head before the body size is the same for every record, so is its CRC's running value.
    prefix = _pack_i64(timestamp) + names + properties
    prefix_crc = _crc32(prefix)
    head_len = len(prefix) + 8
    fixed = HEADER_SIZE + head_len
    positions = array("Q")
    append = positions.append
    smallest, largest = -1, 0
    i = start
    end_at = len(bodies)
    while i < end_at:
        body = bodies[i]
        size = len(body)
        if offset + fixed + size > limit:
            break
        append(segment_id | (offset << OFFSET_SHIFT))
        # as py_write_encoded: the payload first, the header last
        tail = _pack_u64(size)
        body_start = offset + fixed
        buf[offset + HEADER_SIZE:body_start] = prefix + tail
        buf[body_start:body_start + size] = body
        _pack_header_into(buf, offset, head_len + size, _crc32(body, _crc32(tail, prefix_crc)))
        offset = body_start + size
        if size > largest:
            largest = size
        if size < smallest or smallest < 0:
            smallest = size
        i += 1
    return i, offset, positions.tobytes(), max(smallest, 0), largest


def file_write_run(fd: int, offset: int, limit: int, segment_id: int, names: bytes,
                   properties: bytes | list[bytes], bodies: list[bytes], start: int,
                   timestamp: int) -> tuple[int, int, bytes, int, int]:
    """``write_run`` into the file behind ``fd`` with ``pwritev``, for runs of large bodies: the
    kernel copies each body into the page cache once, and none of their pages is zero-filled into
    the segment's mapping, mapped and dropped again (the mapping sees the same page cache). Same
    records and results as ``write_run``; as there, each payload is written before its header."""
    stamp = _pack_i64(timestamp) + names

    def write_record(at: int, block: bytes, body: bytes) -> int:
        head = stamp + block + _pack_u64(len(body))
        pwrite_all(fd, (head, body), at + HEADER_SIZE)
        pwrite_all(fd, (HEADER.pack(len(head) + len(body), _crc32(body, _crc32(head))),), at)
        return HEADER_SIZE + len(head) + len(body)

    return _write_records(write_record, offset, limit, segment_id, names, properties, bodies, start)


def _write_records(write_record: Callable[[int, bytes, bytes], int], offset: int, limit: int, segment_id: int,
                   names: bytes, properties: bytes | list[bytes], bodies: list[bytes],
                   start: int) -> tuple[int, int, bytes, int, int]:
    """The loop of ``py_write_run`` and ``file_write_run``: ``write_record(offset, properties block,
    body)`` writes one record that fits and returns its size."""
    positions = array("Q")
    if isinstance(properties, list):
        if len(properties) != len(bodies):
            raise ValueError("write_run: one properties block per body")
        blocks = properties
    else:
        blocks = [properties] * len(bodies)
    fixed = HEADER_SIZE + FIXED_PAYLOAD - 2 + len(names)
    smallest, largest = -1, 0
    i = start
    while i < len(bodies):
        body = bodies[i]
        size = len(body)
        block = blocks[i]
        if offset + fixed + len(block) + size > limit:
            break
        positions.append(segment_id | (offset << OFFSET_SHIFT))
        offset += write_record(offset, block, body)
        if size > largest:
            largest = size
        if size < smallest or smallest < 0:
            smallest = size
        i += 1
    return i, offset, positions.tobytes(), max(smallest, 0), largest


def py_stored_messages(timestamp: int, exchange: str, routing_key: str, properties: bytes | list[bytes],
                       bodies: list[bytes], start: int, count: int) -> list[StoredMessage]:
    """The records of ``bodies[start:start + count]`` as StoredMessage tuples (a run's deliveries in
    hand); ``properties`` one block for all or a list with one per body."""
    if start < 0 or count < 0 or start + count > len(bodies):
        raise IndexError("stored_messages: start or count out of range")
    if isinstance(properties, list):
        if len(properties) != len(bodies):
            raise ValueError("stored_messages: one properties block per body")
        return [StoredMessage(timestamp, exchange, routing_key, properties[i], bodies[i])
                for i in range(start, start + count)]
    return [StoredMessage(timestamp, exchange, routing_key, properties, body)
            for body in bodies[start:start + count]]


def write_record(buf: WritableBuffer, offset: int, exchange: bytes, routing_key: bytes, properties: bytes,
                 body: bytes | memoryview, timestamp: int) -> int:
    """Write one record at ``offset`` of a writable buffer (an mmap); returns bytes written."""
    return write_encoded(buf, offset, encode_names(exchange, routing_key), properties, body, timestamp)


def read_header(buf: Buffer, offset: int) -> tuple[int, int]:
    """(payload length, crc32) of the record at ``offset``."""
    return _unpack_header_from(buf, offset)


def record_length_at(buf: Buffer, offset: int) -> int:
    """Total size of the record at ``offset`` (header included), or 0 at the end of the data."""
    length = _U32.unpack_from(buf, offset)[0]
    return length + HEADER_SIZE if length else 0


def record_layout_ok(buf: Buffer, offset: int, end: int) -> bool:
    """Whether the record at ``offset`` adds up (length, names, properties, body size), its CRC unchecked."""
    try:
        read_record(buf, offset, end, verify=False, copy=False)
    except (CorruptRecord, PropertiesError, IndexError, ValueError):
        return False
    return True


def record_checks_out(buf: Buffer, offset: int, end: int) -> bool:
    """Whether a whole, undamaged record starts at ``offset`` (layout and CRC); for recovery scans."""
    try:  # the layout first: it rejects garbage without computing a CRC over it
        total = read_record(buf, offset, end, verify=False, copy=False)[1]
    except (CorruptRecord, PropertiesError, IndexError, ValueError):
        return False
    return _crc32(buf[offset + HEADER_SIZE:offset + total]) == _unpack_header_from(buf, offset)[1]


def py_read_record(buf: Buffer, offset: int, end: int, *, verify: bool = True,
                   copy: bool = True) -> tuple[StoredMessage, int]:
    """Decode and verify the record at ``offset``; returns (message, total record size).

    ``end`` bounds the record (the file size). Pass a memoryview for ``buf`` so that the CRC is
    computed in place: the body is then copied once, into the returned bytes. ``verify=False``
    skips the CRC but not the layout checks (salvaging a damaged record's fields); ``copy=False``
    only checks the record (the message returned has an empty body).
    """
    if offset + HEADER_SIZE > end:
        raise CorruptRecord(f"record header at offset {offset} runs past the end ({end})")
    length, crc = _unpack_header_from(buf, offset)
    start = offset + HEADER_SIZE
    stop = start + length
    if length < FIXED_PAYLOAD:
        raise CorruptRecord(f"record at offset {offset} has an invalid length {length}")
    if stop > end:
        raise CorruptRecord(f"record at offset {offset} of length {length} runs past the end ({end})")
    if verify and _crc32(buf[start:stop]) != crc:
        raise CorruptRecord(f"record at offset {offset} fails its CRC check")
    timestamp = _I64.unpack_from(buf, start)[0]
    p = start + 8
    ex_len = buf[p]
    exchange = bytes(buf[p + 1:p + 1 + ex_len])
    p += 1 + ex_len
    if p >= stop:
        raise CorruptRecord(f"record at offset {offset}: exchange name runs past the record")
    rk_len = buf[p]
    routing_key = bytes(buf[p + 1:p + 1 + rk_len])
    p += 1 + rk_len
    try:
        props_len = _properties_length(buf, p, stop)
    except PropertiesError as exc:
        raise CorruptRecord(f"record at offset {offset}: bad basic properties ({exc})") from None
    properties = bytes(buf[p:p + props_len])
    p += props_len
    if p + 8 > stop:
        raise CorruptRecord(f"record at offset {offset}: body size runs past the record")
    body_len = _U64.unpack_from(buf, p)[0]
    p += 8
    if p + body_len != stop:
        raise CorruptRecord(
            f"record at offset {offset}: body size {body_len} does not match the record length {length}")
    try:
        message = StoredMessage(timestamp, exchange.decode(), routing_key.decode(), properties,
                                bytes(buf[p:stop]) if copy else b"")
    except UnicodeDecodeError:
        raise CorruptRecord(f"record at offset {offset}: exchange or routing key is not UTF-8") from None
    return message, length + HEADER_SIZE


def py_total_size(blocks: list[bytes], start: int, stop: int) -> int:
    """The bytes of ``blocks[start:stop]`` together (a varied run's property blocks)."""
    return sum(map(len, blocks[start:stop]))


_BATCH_MARK = struct.Struct("<HQ")
_BATCH_U32 = struct.Struct("<I")


def py_frame_batch(records: bytes, mark: int) -> bytes:
    """A batch of a deduplication cache's file: ``length u32``, the mark record (key length 0, ``mark``
    u64) when ``mark`` >= 0, ``records``, and the CRC-32 (zlib's) of the mark and records u32."""
    head = _BATCH_MARK.pack(0, mark) if mark >= 0 else b""
    crc = crc32(records, zlib.crc32(head)) if head else crc32(records, 0)
    return b"".join((_BATCH_U32.pack(len(head) + len(records)), head, records, _BATCH_U32.pack(crc)))


# The implementation in use: C when built (see accel.py), else the pure-Python reference above.
if cstore is not None:
    cstore.configure(StoredMessage, CorruptRecord)
    write_encoded = cstore.write_encoded
    write_run = cstore.write_run
    read_record = cstore.read_record
    stored_messages = cstore.stored_messages
    total_size: Callable[[list[bytes], int, int], int] = cstore.total_size
    frame_batch: Callable[[bytes, int], bytes] = cstore.frame_batch
    # read_run(buf, positions, start, segment, first, valid_end, size): the sound records of a run of
    # positions in one segment, up to the first that is not (see _cstore_read.c); None without C.
    read_run: Callable[..., list[StoredMessage]] | None = cstore.read_run
else:
    write_encoded = py_write_encoded
    write_run = py_write_run
    read_record = py_read_record
    stored_messages = py_stored_messages
    total_size = py_total_size
    frame_batch = py_frame_batch
    read_run = None


_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_PAGE = mmap.PAGESIZE

# A body at least this large read in place is checked a piece at a time, each piece's pages dropped
# from the mapping once its CRC is taken: it is sent over several turns (the socket writer takes 1 MiB
# at a time), and the whole body's pages would sit in the RSS meanwhile (16 MiB bodies: peak RSS 54-58
# MiB against 42 without them). A smaller one is sent within a turn or two, and faulting its pages in
# again for the send cost more than it saved.
_DROP_CHECKED_BODY = 4 * 1024 * 1024
_CHECK_PIECE = 1024 * 1024


def read_in_place(view: memoryview, offset: int, size: int) -> StoredMessage:
    """The record at ``offset``, checked as ``read_record`` does, with its body a slice of the
    segment's mapping instead of a copy: a large body (a record of 256 KiB or more: its length's
    upper bytes are set) is delivered from the page cache, never held whole in the heap. The slice
    keeps the mapping alive after the segment is closed or deleted (see Segment.close)."""
    mm = view.obj
    dropping = _DONTNEED is not None and type(mm) is mmap.mmap and offset + HEADER_SIZE <= size and \
        _unpack_header_from(view, offset)[0] >= _DROP_CHECKED_BODY
    message, total = read_record(view, offset, size, verify=not dropping, copy=False)
    stop = offset + total
    if dropping:
        assert isinstance(mm, mmap.mmap) and _DONTNEED is not None
        start, crc, value = offset + HEADER_SIZE, _unpack_header_from(view, offset)[1], 0
        dropped = (start + _PAGE - 1) & ~(_PAGE - 1)
        for piece in range(start, stop, _CHECK_PIECE):
            end = min(piece + _CHECK_PIECE, stop)
            value = crc32(view[piece:end], value)
            upto = end & ~(_PAGE - 1)
            if upto > dropped:
                mm.madvise(_DONTNEED, dropped, upto - dropped)
                dropped = upto
        if value != crc:
            raise CorruptRecord(f"record at offset {offset} fails its CRC check")
    names = len(message.exchange.encode()) + len(message.routing_key.encode())
    body_size = total - HEADER_SIZE - FIXED_PAYLOAD - names - len(message.properties)
    return message._replace(body=view[stop - body_size:stop])
