"""Hypothesis fuzzing of FrameReader: whatever a client sends, the reader returns frames or raises a
protocol error, and never holds more than one frame plus one read in memory."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from lavinpy.wire import writer
from lavinpy.wire.constants import PROTOCOL_HEADER
from lavinpy.wire.errors import AMQPError
from lavinpy.wire.reader import (
    AckRun,
    BadProtocolHeader,
    BodyFrame,
    ContentMessage,
    ContentRun,
    FrameReader,
    HeaderFrame,
    MethodFrame,
)

FRAME_MAX = 4096
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

def flatten(events: list) -> list:
    """Frame events with fused publishes (ContentMessage) expanded into their three frames and runs
    of acks (AckRun, which a cut may split in two) into one frame each."""
    out: list = []
    for event in events:
        out.extend(event.frames() if isinstance(event, (ContentMessage, ContentRun, AckRun)) else [event])
    return out



def valid_frames() -> st.SearchStrategy[bytes]:
    """One frame (or a content triple) from the writer or pamqp."""
    names = st.text(max_size=12)
    return st.one_of(
        st.builds(lambda ch, ex, rk, m: writer.method_frame(ch, commands.Basic.Publish(0, ex, rk, m)),
                  st.integers(0, 3), st.sampled_from(["", "amq.direct", "x"]), names, st.booleans()),
        st.builds(lambda ch, body: b"".join(writer.content_frames(ch, b"\x10\x00\x02", body, FRAME_MAX)),
                  st.integers(0, 3), st.binary(max_size=9000)),
        st.builds(writer.basic_ack, st.integers(0, 3), st.integers(0, 2**64 - 1), st.booleans()),
        st.builds(writer.basic_nack, st.integers(0, 3), st.integers(0, 2**64 - 1), st.booleans(), st.booleans()),
        st.builds(lambda ch, q, args: writer.method_frame(ch, commands.Queue.Declare(0, q, False, True,
                                                                                     arguments=args)),
                  st.integers(0, 3), st.sampled_from(["q", "orders", ""]),
                  st.dictionaries(st.text(min_size=1, max_size=5), st.integers(-1000, 1000), max_size=3)),
        st.builds(lambda *a: b"".join(writer.deliver(*a, FRAME_MAX)), st.integers(0, 3), names,
                  st.integers(0, 2**64 - 1), st.booleans(), names, names, st.just(b"\x00\x00"),
                  st.binary(max_size=100)),
        st.just(writer.HEARTBEAT),
    )


streams = st.lists(valid_frames(), min_size=1, max_size=6).map(b"".join)


def feed_in_chunks(reader: FrameReader, data: bytes, cuts: list[int]) -> list:
    """Feed ``data`` cut at ``cuts``; check the memory bound after every read."""
    events: list = []
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for start, stop in zip(bounds, bounds[1:], strict=False):
        events += reader.feed(data[start:stop])
        assert reader.buffered <= reader.frame_max + (stop - start)
    return events


def feed_expecting_only_protocol_errors(data: bytes, cuts: list[int]) -> list:
    reader = FrameReader(FRAME_MAX)
    try:
        return feed_in_chunks(reader, data, cuts)
    except (AMQPError, BadProtocolHeader):
        assert reader.buffered <= FRAME_MAX + len(data)
        return []


def describe(event: object) -> tuple:
    if isinstance(event, MethodFrame):
        return ("m", event.channel, event.method.name,
                tuple(getattr(event.method, n) for n in type(event.method).__slots__))
    if isinstance(event, HeaderFrame):
        return ("h", event.channel, event.class_id, event.body_size, event.properties)
    if isinstance(event, BodyFrame):
        return ("b", event.channel, event.data)
    return ("heartbeat",)


@FUZZ
@given(st.binary(max_size=2000), st.lists(st.integers(0, 5000), max_size=8))
def test_random_bytes_after_the_protocol_header(data, cuts):
    feed_expecting_only_protocol_errors(PROTOCOL_HEADER + data, cuts)


@FUZZ
@given(st.binary(max_size=200), st.lists(st.integers(0, 300), max_size=4))
def test_random_bytes_from_the_start(data, cuts):
    feed_expecting_only_protocol_errors(data, cuts)


@FUZZ
@given(st.binary(min_size=3, max_size=3), st.integers(0, 2**32 - 1), st.binary(max_size=300),
       st.lists(st.integers(0, 400), max_size=4))
def test_random_frame_headers_with_random_sizes(type_and_channel, size, payload, cuts):
    data = PROTOCOL_HEADER + type_and_channel + size.to_bytes(4, "big") + payload
    feed_expecting_only_protocol_errors(data, cuts)


@FUZZ
@given(streams, st.lists(st.tuples(st.integers(0, 100_000), st.integers(0, 255)), min_size=1, max_size=4),
       st.lists(st.integers(0, 100_000), max_size=5))
def test_mutated_valid_streams(stream, flips, cuts):
    data = bytearray(PROTOCOL_HEADER + stream)
    for where, value in flips:
        data[where % len(data)] = value
    feed_expecting_only_protocol_errors(bytes(data), cuts)


@FUZZ
@given(streams, st.integers(0, 100_000), st.integers(1, 50), st.lists(st.integers(0, 100_000), max_size=5))
def test_valid_streams_with_bytes_deleted(stream, where, count, cuts):
    data = PROTOCOL_HEADER + stream
    where %= len(data)
    feed_expecting_only_protocol_errors(data[:where] + data[where + count:], cuts)


@FUZZ
@given(streams, st.lists(st.integers(0, 100_000), max_size=10))
def test_valid_streams_give_the_same_frames_however_they_are_cut(stream, cuts):
    whole = FrameReader(FRAME_MAX).feed(PROTOCOL_HEADER + stream)
    reader = FrameReader(FRAME_MAX)
    parts = feed_in_chunks(reader, PROTOCOL_HEADER + stream, cuts)
    assert [describe(e) for e in flatten(parts)] == [describe(e) for e in flatten(whole)]
    assert reader.buffered == 0
