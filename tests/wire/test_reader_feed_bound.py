"""The frame reader's bound on one feed: at most methods_per_feed general methods decoded a call (a
method's tables counting by their size), the rest of the read left undecoded for the next call, in order."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands

from lavinpy.wire.constants import PROTOCOL_HEADER
from lavinpy.wire.reader import AckRun, ContentRun, FrameReader, MethodFrame
from tests.wire.frames import describe, flatten, frame, header, method, publish


def _qos(channel: int, prefetch: int) -> bytes:
    return method(channel, 60, 10, struct.pack(">IHB", 0, prefetch, 0))


@pytest.mark.parametrize("compiled", [False, None])
def test_a_feed_decodes_at_most_methods_per_feed_general_methods(compiled):
    """One read of many small methods is decoded a bounded number of general methods at a time (the
    loop's time one feed takes is bounded); publishes and acks between them are not counted, the rest
    waits undecoded, and the calls with no more data (and with more) give the same events in the same
    order as one unbounded feed. Decoding a whole 256 KiB read of them before handling any held the loop
    for 91-199 ms."""
    stream = b"".join(
        _qos(1 + n % 3, n) + (publish(1, "", "q") + header(1, 1) + frame(3, 1, b"x") if n % 7 == 0 else b"")
        + (method(2, 60, 80, struct.pack(">QB", n + 1, 0)) if n % 5 == 0 else b"")
        for n in range(1000))
    tail = _qos(3, 4242)

    def described(events: list) -> list:
        return [describe(f) for e in flatten(events) for f in (e.frames() if isinstance(e, AckRun) else [e])]

    whole = described(FrameReader(compiled=compiled).feed(PROTOCOL_HEADER + stream + tail))
    reader = FrameReader(compiled=compiled, methods_per_feed=64)

    def qos_count(events: list) -> int:
        return sum(isinstance(e, MethodFrame) and e.method.name == "Basic.Qos" for e in events)

    events = reader.feed(PROTOCOL_HEADER + stream + tail[:5])  # ends in a partial frame
    assert qos_count(events) == 64 and reader.undecoded
    feeds = 1
    while reader.undecoded:
        more = reader.feed(b"")
        assert qos_count(more) <= 64
        events += more
        feeds += 1
    assert feeds == -(-1000 // 64)
    assert reader.buffered == 5
    events += reader.feed(tail[5:])
    assert not reader.undecoded and reader.buffered == 0
    assert described(events) == whole


@pytest.mark.parametrize("compiled", [False, None])
def test_large_tables_count_against_methods_per_feed_by_their_size(compiled):
    """A method's tables are checked and decoded in Python at about 0.4 ms a KiB: each KiB counts as one
    more method against methods_per_feed, so that a read of a few 60 KiB tables is not decoded in one feed
    (a queue.declare with a 98 KiB arguments table took 41 ms: a 256 KiB read of them held the loop for
    about 110 ms). Content is not counted: publishes with large headers are not split."""
    from pamqp import frame as pamqp_frame
    from pamqp import header as pamqp_header

    table = {f"k{i}": i for i in range(7000)}  # about 61 KiB encoded: two of them spend 100
    declare = pamqp_frame.marshal(commands.Queue.Declare(queue="q", arguments=table), 1)
    reader = FrameReader(compiled=compiled, methods_per_feed=100)
    events = reader.feed(PROTOCOL_HEADER + declare * 3)
    assert len(events) == 2 and reader.undecoded
    events += reader.feed(b"")
    assert len(events) == 3 and not reader.undecoded

    big = (publish(1, "", "q") + pamqp_frame.marshal(pamqp_header.ContentHeader(
        0, 1, commands.Basic.Properties(headers=table)), 1) + frame(3, 1, b"x"))
    reader = FrameReader(compiled=compiled, methods_per_feed=100)
    events = reader.feed(PROTOCOL_HEADER + big * 3)
    assert [type(e) for e in events] == [ContentRun] and len(events[0].bodies) == 3 and not reader.undecoded
