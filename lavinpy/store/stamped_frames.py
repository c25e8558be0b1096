"""A delivery run framed straight from the store's segment: basic.deliver + content header + body frames
for a run of records, without a message tuple, a timestamp int or a body bytes object a record. A
stream's run has each record's ``x-stream-offset`` stamped into its property block (the splices the
stream queue keeps: ``splices[block]`` is the stamped block's bytes before and after the 8-byte value);
a classic queue's run has its blocks as stored and each delivery's redelivered flag.

Compiled in _cstore_frames.c; ``py_stamped_frames`` and ``py_stored_frames`` are its reference twins
(tests/store/test_stamped_frames.py and test_stored_frames.py run both over the same segments). Without
the C extension ``segment_frames`` and ``segment_stored_frames`` frame nothing and the broker reads and
frames each run the general way (``MessageStore.read_many``, then the codec's ``deliver_stamped_run`` or
``deliver_run``), which gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable

from lavinpy.store.accel import cstore
from lavinpy.store.message_store import MessageStore
from lavinpy.store.record import CorruptRecord, py_read_record
from lavinpy.store.segment import DATA_START, READ_KEEP_MAPPED
from lavinpy.wire import writer
from lavinpy.wire.position import OFFSET_SHIFT, SEGMENT_MASK

LARGE_LENGTH = 1 << 18  # records from 256 KiB on are read in place (message_store.read_in_place)
_READ_BEHIND = 2 * READ_KEEP_MAPPED  # as MessageStore.read_many drops a segment's pages behind its reads

Splices = dict[bytes, tuple[bytes, bytes]]
Frames = tuple[bytes, int, int, int]  # (frames, records framed, first body size, last body size)
_NONE: Frames = (b"", 0, 0, 0)


def py_stamped_frames(buf: memoryview, positions: list[int], start: int, segment: int, first: int, valid_end: int,
                      size: int, channel: int, consumer_tag: str, first_tag: int, first_offset: int, frame_max: int,
                      splices: Splices) -> Frames:
    """The frames of ``writer.deliver_stamped_run`` for the records at ``positions[start:]`` while they
    are in ``segment`` at an offset in [first, valid_end), not large, sound (as ``read_many``'s
    compiled run takes them) and with a splice for their block; delivery tags from ``first_tag``,
    offsets from ``first_offset``."""
    size = min(size, len(buf))
    frames: list[bytes | memoryview] = []
    bodies: list[int] = []
    if len(consumer_tag.encode()) > 255 or 0 < frame_max <= 8:  # the general framing says what is wrong
        return _NONE
    for i in range(start, len(positions)):
        pos = positions[i]
        offset = pos >> OFFSET_SHIFT
        if (pos & SEGMENT_MASK != segment or not first <= offset < valid_end or offset + 4 > size
                or int.from_bytes(buf[offset:offset + 4], "little") >= LARGE_LENGTH):
            break
        try:
            msg = py_read_record(buf, offset, size)[0]
        except CorruptRecord:
            break
        splice = splices.get(msg.properties)
        if splice is None:
            break
        k = len(bodies)
        stamped = splice[0] + (first_offset + k).to_bytes(8, "big", signed=True) + splice[1]
        frames += writer.deliver_py(channel, consumer_tag, first_tag + k, False, msg.exchange, msg.routing_key,
                                    stamped, msg.body, frame_max)
        bodies.append(len(msg.body))
    if not bodies:
        return _NONE
    return b"".join(frames), len(bodies), bodies[0], bodies[-1]


def py_stored_frames(buf: memoryview, positions: list[int], start: int, segment: int, first: int, valid_end: int,
                     size: int, channel: int, consumer_tag: str, first_tag: int, redelivered: list[bool] | None,
                     frame_max: int) -> Frames:
    """The frames of ``writer.deliver_run`` for the records at ``positions[start:]`` while they are in
    ``segment`` at an offset in [first, valid_end), not large and sound (as ``read_many``'s compiled run
    takes them), their property blocks as stored; delivery tags from ``first_tag``, ``redelivered[i]``
    (None: none) the flag of ``positions[i]``'s."""
    if redelivered is not None and len(redelivered) != len(positions):
        raise TypeError("stored_frames: redelivered is not as long as positions")
    size = min(size, len(buf))
    frames: list[bytes | memoryview] = []
    bodies: list[int] = []
    if len(consumer_tag.encode()) > 255 or 0 < frame_max <= 8:  # the general framing says what is wrong
        return _NONE
    for i in range(start, len(positions)):
        pos = positions[i]
        offset = pos >> OFFSET_SHIFT
        if (pos & SEGMENT_MASK != segment or not first <= offset < valid_end or offset + 4 > size
                or int.from_bytes(buf[offset:offset + 4], "little") >= LARGE_LENGTH):
            break
        try:
            msg = py_read_record(buf, offset, size)[0]
        except CorruptRecord:
            break
        again = redelivered is not None and bool(redelivered[i])
        frames += writer.deliver_py(channel, consumer_tag, first_tag + len(bodies), again, msg.exchange,
                                    msg.routing_key, msg.properties, msg.body, frame_max)
        bodies.append(len(msg.body))
    if not bodies:
        return _NONE
    return b"".join(frames), len(bodies), bodies[0], bodies[-1]


_stamped_frames: Callable[..., Frames] | None = getattr(cstore, "stamped_frames", None)
FRAMES_COMPILED = _stamped_frames is not None
_stored_frames: Callable[..., Frames] | None = getattr(cstore, "stored_frames", None)
STORED_FRAMES_COMPILED = _stored_frames is not None


def segment_frames(store: MessageStore, positions: list[int], channel: int, consumer_tag: str, first_tag: int,
                   first_offset: int, frame_max: int, splices: Splices) -> Frames:
    """The compiled ``stamped_frames`` of the run's records from its first, as far as they are in that
    segment and it takes them; nothing framed without the C extension or when the segment is gone (the
    caller's general read says why)."""
    if _stamped_frames is None or not positions:
        return _NONE
    segment_id = positions[0] & SEGMENT_MASK
    found = store.readable(segment_id)
    if found is None:
        return _NONE
    segment, end = found
    framed = _stamped_frames(segment.view, positions, 0, segment_id, DATA_START, end, segment.size, channel,
                             consumer_tag, first_tag, first_offset, frame_max, splices)
    if (count := framed[1]) and (last := positions[count - 1] >> OFFSET_SHIFT) - segment.read_released > _READ_BEHIND:
        segment.read_through(last)
    return framed


def segment_stored_frames(store: MessageStore, positions: list[int], start: int, channel: int, consumer_tag: str,
                          first_tag: int, redelivered: list[bool] | None, frame_max: int) -> Frames:
    """The compiled ``stored_frames`` of a classic queue's run from ``positions[start]``, as far as they are
    in that segment and it takes them; nothing framed without the C extension or when the segment is gone
    (the caller's general read says why)."""
    if _stored_frames is None or start >= len(positions):
        return _NONE
    segment_id = positions[start] & SEGMENT_MASK
    found = store.readable(segment_id)
    if found is None:
        return _NONE
    segment, end = found
    framed = _stored_frames(segment.view, positions, start, segment_id, DATA_START, end, segment.size, channel,
                            consumer_tag, first_tag, redelivered, frame_max)
    if (count := framed[1]) and (last := positions[start + count - 1] >> OFFSET_SHIFT) - segment.read_released \
            > _READ_BEHIND:  # as read_many drops a segment's pages behind its reads
        segment.read_through(last)
    return framed
