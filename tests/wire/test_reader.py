"""FrameReader driven with hand-built byte strings: every frame kind, partial input, every error."""

from __future__ import annotations

import datetime
import struct

import pytest
from pamqp import commands

from lavinpy.wire import accel
from lavinpy.wire.constants import FRAME_ERROR, NOT_IMPLEMENTED, PROTOCOL_HEADER
from lavinpy.wire.errors import AMQPConnectionError, AMQPError
from lavinpy.wire.reader import (
    BODY_VIEW_MIN,
    Ack,
    AckRun,
    BadProtocolHeader,
    BodyFrame,
    ContentMessage,
    ContentRun,
    FrameReader,
    HeaderFrame,
    MethodFrame,
    Nack,
    Publish,
    Reject,
)
from tests.wire.frames import HEARTBEAT, describe, flatten, frame, header, method, opened, publish, shortstr


def connection_error(reader: FrameReader, data: bytes) -> AMQPConnectionError:
    with pytest.raises(AMQPConnectionError) as info:
        reader.feed(data)
    return info.value


# A stream with every frame kind, fast and slow paths.
STREAM = b"".join([
    publish(1, "amq.direct", "rk", 1),
    header(1, 16, b"\x90\x00\x0atext/plain\x02"),
    frame(3, 1, b"0123456789abcdef"),
    publish(2, "", "q", 3),
    header(2, 0),
    HEARTBEAT,
    method(1, 60, 80, struct.pack(">QB", 7, 1)),
    method(1, 60, 120, struct.pack(">QB", 2**64 - 1, 3)),
    method(1, 60, 90, struct.pack(">QB", 9, 0)),
    method(5, 50, 10, b"\x00\x00" + shortstr("queue") + b"\x02" + b"\x00\x00\x00\x00"),
    frame(3, 3, b""),
])


def test_protocol_header_then_frames_in_one_read():
    reader = FrameReader()
    events = reader.feed(PROTOCOL_HEADER + HEARTBEAT)
    assert [describe(e) for e in flatten(events)] == [("heartbeat",)]


def test_short_first_read_waits_for_the_whole_protocol_header():
    reader = FrameReader()
    for byte in PROTOCOL_HEADER[:-1]:
        assert reader.feed(bytes((byte,))) == []
        assert reader.expect_protocol_header
    assert reader.feed(PROTOCOL_HEADER[-1:] + HEARTBEAT[:3]) == []
    assert not reader.expect_protocol_header
    assert [describe(e) for e in flatten(reader.feed(HEARTBEAT[3:]))] == [("heartbeat",)]


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\n",
    b"AMQP\x00\x00\x09\x00",  # another revision
    b"AMQP\x01\x01\x00\x09",  # 0-9 legacy header
    b"AMQP\x00\x00\x08\x00",
    b"\x01\x00\x00\x00\x00\x00\x00\xce",
])
def test_bad_protocol_header(data):
    with pytest.raises(BadProtocolHeader) as info:
        FrameReader().feed(data)
    assert info.value.received == data[:8]


def test_bad_protocol_header_detected_before_eight_bytes():
    reader = FrameReader()
    assert reader.feed(b"AM") == []
    with pytest.raises(BadProtocolHeader):
        reader.feed(b"X")


def test_hot_methods_decode():
    events = flatten(opened().feed(STREAM))
    assert [describe(e) for e in flatten(events)] == [
        ("method", 1, "Basic.Publish",
         (("exchange", "amq.direct"), ("routing_key", "rk"), ("mandatory", True), ("immediate", False))),
        ("header", 1, 60, 16, b"\x90\x00\x0atext/plain\x02"),
        ("body", 1, b"0123456789abcdef"),
        ("method", 2, "Basic.Publish",
         (("exchange", ""), ("routing_key", "q"), ("mandatory", True), ("immediate", True))),
        ("header", 2, 60, 0, b"\x00\x00"),
        ("heartbeat",),
        ("method", 1, "Basic.Ack", (("delivery_tag", 7), ("multiple", True))),
        ("method", 1, "Basic.Nack", (("delivery_tag", 2**64 - 1), ("multiple", True), ("requeue", True))),
        ("method", 1, "Basic.Reject", (("delivery_tag", 9), ("requeue", False))),
        ("method", 5, "Queue.Declare",
         (("ticket", 0), ("queue", "queue"), ("passive", False), ("durable", True), ("exclusive", False),
          ("auto_delete", False), ("nowait", False), ("arguments", {}))),
        ("body", 3, b""),
    ]
    assert [type(e.method) for e in events if isinstance(e, MethodFrame)][:5] == [
        Publish, Publish, Ack, Nack, Reject]
    assert isinstance(events[9].method, commands.Queue.Declare)


def test_light_classes_match_pamqp_names_and_attributes():
    for light, pamqp_cls in ((Publish, commands.Basic.Publish), (Ack, commands.Basic.Ack),
                             (Nack, commands.Basic.Nack), (Reject, commands.Basic.Reject)):
        assert light.name == pamqp_cls.name
        assert light.index == pamqp_cls.index
        assert set(light.__slots__) <= set(pamqp_cls.__slots__)


def test_events_hand_out_bytes_in_both_paths():
    reader = opened()
    whole = reader.feed(STREAM)
    parts = reader.feed(STREAM[:20]) + reader.feed(bytearray(STREAM[20:40]))
    parts += reader.feed(memoryview(STREAM[40:]))
    for event in flatten(whole + parts):
        if isinstance(event, BodyFrame):
            assert type(event.data) is bytes
        if isinstance(event, HeaderFrame):
            assert type(event.properties) is bytes
    assert [describe(e) for e in flatten(parts)] == [describe(e) for e in flatten(whole)]


def test_split_at_every_byte_boundary_gives_the_same_frames():
    expected = [describe(e) for e in flatten(opened().feed(STREAM))]
    data = PROTOCOL_HEADER + STREAM
    for cut in range(len(data) + 1):
        reader = FrameReader()
        events = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert [describe(e) for e in flatten(events)] == expected, cut
        assert reader.buffered == 0


def test_byte_by_byte():
    reader = FrameReader()
    events = []
    for byte in PROTOCOL_HEADER + STREAM:
        events += reader.feed(bytes((byte,)))
    assert [describe(e) for e in flatten(events)] == [describe(e) for e in flatten(opened().feed(STREAM))]


def test_frame_of_exactly_frame_max_is_accepted():
    reader = opened(4096)
    body = b"x" * (4096 - 8)
    assert [describe(e) for e in flatten(reader.feed(frame(3, 1, body)))] == [("body", 1, body)]


def test_oversized_frame_rejected_as_soon_as_its_size_is_read():
    reader = opened(4096)
    oversized = frame(3, 1, b"x" * (4096 - 7))
    err = connection_error(reader, oversized[:7])
    assert err.reply_code == FRAME_ERROR
    assert "4097" in err.text and "4096" in err.text
    assert err.text.startswith("FRAME_ERROR - ")


def test_frame_max_can_be_lowered_after_tune():
    reader = opened()
    reader.frame_max = 4096
    assert connection_error(reader, frame(3, 1, b"x" * 5000)).reply_code == FRAME_ERROR


def test_bad_frame_end():
    err = connection_error(opened(), frame(3, 1, b"abc", end=0xCD))
    assert err.reply_code == FRAME_ERROR and "0xcd" in err.text


@pytest.mark.parametrize("frame_type", [0, 4, 7, 9, 65, 255])
def test_unknown_frame_type(frame_type):
    assert connection_error(opened(), frame(frame_type, 0, b"abc")).reply_code == FRAME_ERROR
    # also refused before the payload arrives
    assert connection_error(opened(), frame(frame_type, 0, b"abc")[:8]).reply_code == FRAME_ERROR


def test_heartbeat_on_non_zero_channel():
    err = connection_error(opened(), frame(8, 1, b""))
    assert err.reply_code == FRAME_ERROR and "channel 1" in err.text


def test_heartbeat_with_payload():
    assert connection_error(opened(), frame(8, 0, b"x")).reply_code == FRAME_ERROR


@pytest.mark.parametrize(("class_id", "method_id"), [(60, 999), (999, 10), (10, 12), (0, 0)])
def test_unknown_method(class_id, method_id):
    err = connection_error(opened(), method(1, class_id, method_id, b""))
    assert err.reply_code == NOT_IMPLEMENTED
    assert (err.class_id, err.method_id) == (class_id, method_id)
    assert str(class_id) in err.text and str(method_id) in err.text


@pytest.mark.parametrize("payload", [
    b"\x00\x3c\x00\x28",  # publish without arguments
    b"\x00\x3c\x00\x28\x00\x00\x05ab",  # exchange name truncated
    b"\x00\x3c\x00\x28\x00\x00\x00\x02rk",  # no bits octet
    b"\x00\x3c\x00\x28\x00\x00\x00\x00\x00\x00",  # trailing byte
    b"\x00\x3c\x00\x28\x00\x00\x02\xff\xfe\x00\x00",  # exchange name not UTF-8
])
def test_malformed_publish(payload):
    err = connection_error(opened(), frame(1, 1, payload))
    assert err.reply_code == FRAME_ERROR
    assert (err.class_id, err.method_id) == (60, 40)
    assert "Basic.Publish" in err.text


@pytest.mark.parametrize(("method_id", "name"),
                         [(80, "Basic.Ack"), (120, "Basic.Nack"), (90, "Basic.Reject")])
@pytest.mark.parametrize("args", [b"", b"\x00" * 8, b"\x00" * 10])
def test_malformed_ack_family(method_id, name, args):
    err = connection_error(opened(), method(1, 60, method_id, args))
    assert err.reply_code == FRAME_ERROR and name in err.text and err.method_id == method_id


@pytest.mark.parametrize("args", [
    b"\x00\x00\x05qu",  # queue name truncated
    b"\x00\x00\x01q\x00\x00\x00\x00",  # arguments table truncated
    b"\x00\x00\x01q\x00\x00\x00\x00\x00\x00",  # one byte too many
    b"\x00\x00\x01q\x00\x00\x00\x00\x04\x01kZ\x00",  # unknown field type in the table
    b"\x00\x00\x01q\x00\x00\x00\x00\x09\x01kb\x01\x01kb\x02",  # table length runs past the frame
])
def test_malformed_pamqp_method(args):
    err = connection_error(opened(), method(3, 50, 10, args))
    assert err.reply_code == FRAME_ERROR
    assert (err.class_id, err.method_id) == (50, 10)
    assert "Queue.Declare" in err.text


def test_method_frame_too_short():
    assert connection_error(opened(), frame(1, 1, b"\x00\x3c")).reply_code == FRAME_ERROR


@pytest.mark.parametrize("payload", [
    struct.pack(">HHQ", 60, 0, 5),  # no property flags
    struct.pack(">HHQ", 60, 0, 5) + b"\x80\x00\x05ab",  # content_type truncated
    struct.pack(">HHQ", 60, 0, 5) + b"\x00\x00\x00",  # trailing byte after the properties
    struct.pack(">HHQ", 60, 0, 5) + b"\x20\x00\x00\x00\x00",  # headers table length truncated
    b"\x00",
])
def test_malformed_content_header(payload):
    assert connection_error(opened(), frame(2, 1, payload)).reply_code == FRAME_ERROR


def test_content_header_with_every_property_field():
    props = commands.Basic.Properties(
        content_type="a", content_encoding="b", headers={"k": 1}, delivery_mode=2, priority=3,
        correlation_id="c", reply_to="d", expiration="10", message_id="e",
        timestamp=datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC),
        message_type="f", user_id="g", app_id="h")
    props.cluster_id = "i"  # deprecated, refused by pamqp's constructor, still legal on the wire
    raw = props.marshal()
    assert raw[:2] == b"\xff\xfc"
    (event,) = opened().feed(header(4, 123, raw))
    assert describe(event) == ("header", 4, 60, 123, raw)


def test_frames_before_an_error_are_kept_on_the_error():
    err = connection_error(opened(), HEARTBEAT + publish(1, "x", "y") + frame(9, 0, b""))
    assert [describe(e) for e in flatten(err.frames)][0] == ("heartbeat",)
    assert len(err.frames) == 2
    assert isinstance(err, AMQPError)


def test_buffer_holds_at_most_one_frame():
    reader = opened(4096)
    big = frame(3, 1, b"y" * (4096 - 8))
    stream = big * 3
    chunk = 1000
    events = []
    for i in range(0, len(stream), chunk):
        events += reader.feed(stream[i:i + chunk])
        assert reader.buffered <= 4096 + chunk
    assert len(events) == 3 and reader.buffered == 0


def test_publish_is_immutable_and_repeats_decode_alike():
    reader = opened()
    first, second = reader.feed(publish(1, "ex", "rk", 2) * 2)
    assert describe(first)[2:] == describe(second)[2:]
    with pytest.raises(AttributeError):
        first.method.exchange = "other"
    assert first.method.exchange == "ex"


def test_repeated_and_large_property_blocks():
    big = commands.Basic.Properties(content_type="t", headers={"k": "v" * 2000}).marshal()
    small = commands.Basic.Properties(content_type="t", priority=1).marshal()
    reader = opened()
    for props in (big, big, small, small):
        (event,) = reader.feed(header(1, 1, props))
        assert event.properties == props
    # the same block with a byte cut off is still refused, even though the full block was seen
    assert connection_error(reader, header(1, 1, small[:-1])).reply_code == FRAME_ERROR


def test_publish_header_and_body_in_one_read_come_as_one_event():
    """The common small message is fused; the same bytes split inside the header or the body are held
    back until the message is whole and come fused too; split before the header, the three frames."""
    props = b"\x90\x00\x0atext/plain\x02"
    data = publish(1, "amq.direct", "rk", 1) + header(1, 5, props) + frame(3, 1, b"hello")
    reader = opened()
    reader.feed(publish(1, "x", "y", 0) + header(1, 0, props))  # the property block is validated once
    (event,) = reader.feed(data)
    assert isinstance(event, ContentMessage)
    assert (event.channel, event.method.exchange, event.properties, event.body) == (1, "amq.direct", props, b"hello")
    publish_end = len(publish(1, "amq.direct", "rk", 1))
    for cut in (publish_end + 3, len(data) - 3):
        held = reader.feed(data[:cut])
        assert held == [] and reader.buffered == cut
        (whole,) = reader.feed(data[cut:])
        assert [describe(e) for e in whole.frames()] == [describe(e) for e in event.frames()]
    split = reader.feed(data[:publish_end]) + reader.feed(data[publish_end:])
    assert [type(e) for e in split] == [MethodFrame, HeaderFrame, BodyFrame]
    assert [describe(e) for e in split] == [describe(e) for e in event.frames()]


def test_frames_that_do_not_fit_together_are_not_fused():
    props = b"\x00\x00"
    reader = opened()
    cases = [
        publish(1, "", "q", 0) + header(2, 3, props) + frame(3, 2, b"abc"),  # header on another channel
        publish(1, "", "q", 0) + header(1, 4, props) + frame(3, 1, b"abc"),  # body shorter than announced
        publish(1, "", "q", 0) + header(1, 6, props) + frame(3, 1, b"abc") + frame(3, 1, b"def"),  # two bodies
    ]
    small = FrameReader(4096)
    small.expect_protocol_header = False
    oversized = publish(1, "", "q", 0) + header(1, 5000, props) + frame(3, 1, b"x" * 5000)
    with pytest.raises(AMQPConnectionError) as err:  # the body frame is over frame_max: no fusing
        small.feed(oversized)
    assert err.value.reply_code == 501
    for data in cases:
        events = reader.feed(data)
        assert not any(isinstance(e, ContentMessage) for e in events), data


def test_bad_headers_are_refused_on_their_channel_and_parsing_goes_on() -> None:
    from lavinpy.wire.reader import RefusedFrame

    reader = FrameReader()
    reader.feed(PROTOCOL_HEADER)
    bad_table = b"\x01kZ"  # unknown type letter
    bad = b"\x20\x00" + struct.pack(">I", len(bad_table)) + bad_table
    events = reader.feed(frame(2, 3, struct.pack(">HHQ", 60, 0, 0) + bad)
                         + frame(2, 4, struct.pack(">HHQ", 60, 0, 0) + b"\x10\x00\x02"))
    assert [type(e).__name__ for e in events] == ["RefusedFrame", "HeaderFrame"]
    refused = events[0]
    assert isinstance(refused, RefusedFrame) and refused.channel == 3
    assert refused.error.reply_code == 406
    assert refused.error.text == "PRECONDITION_FAILED - invalid headers property: unknown field type 0x5a at 'k'"


def test_too_deep_method_arguments_are_a_channel_error_naming_the_argument() -> None:
    from lavinpy.wire.reader import RefusedFrame

    deep: dict = {}
    for _ in range(80):
        deep = {"n": deep}
    declare = commands.Queue.Declare(queue="q", arguments={"x-custom": deep})
    reader = FrameReader()
    reader.feed(PROTOCOL_HEADER)
    payload = struct.pack(">HH", 50, 10) + declare.marshal()
    (event,) = reader.feed(frame(1, 5, payload))
    assert isinstance(event, RefusedFrame) and event.channel == 5
    assert (event.error.reply_code, event.error.class_id, event.error.method_id) == (406, 50, 10)
    assert "invalid queue.declare: tables and arrays nested deeper than 64 levels at 'arguments''x-custom'" \
        in event.error.text
    with pytest.raises(AMQPConnectionError) as err:  # on channel 0 there is no channel to close
        FrameReader().feed(PROTOCOL_HEADER + frame(1, 0, payload))
    assert err.value.reply_code == 406


@pytest.mark.parametrize("compiled", [False, True])
def test_consecutive_acks_of_a_channel_form_one_run(compiled):
    """basic.ack frames with multiple=false become one AckRun per channel and stretch; a multiple=true
    ack, another frame or another channel ends the run, so the order of everything is kept."""
    if compiled and not accel.COMPILED:
        pytest.skip("the compiled codec is not selected")

    def ack(channel: int, tag: int, multiple: bool = False) -> bytes:
        return method(channel, 60, 80, struct.pack(">QB", tag, 1 if multiple else 0))

    data = (PROTOCOL_HEADER + ack(1, 1) + ack(1, 2) + ack(1, 3) + ack(2, 1) + ack(1, 4) + ack(1, 5, True)
            + ack(1, 6) + method(1, 60, 90, struct.pack(">QB", 7, 0)) + ack(1, 8) + frame(8, 0, b"") + ack(1, 9))
    events = FrameReader(compiled=compiled).feed(data)
    described = [(type(e).__name__, e.channel, e.tags) if isinstance(e, AckRun)
                 else (type(e).__name__, e.channel, type(getattr(e, "method", None)).__name__) for e in events]
    assert described == [("AckRun", 1, [1, 2, 3]), ("AckRun", 2, [1]), ("AckRun", 1, [4]),
                         ("MethodFrame", 1, "Ack"), ("AckRun", 1, [6]), ("MethodFrame", 1, "Reject"),
                         ("AckRun", 1, [8]), ("HeartbeatFrame", 0, "NoneType"), ("AckRun", 1, [9])]
    assert events[3].method.multiple is True and events[3].method.delivery_tag == 5
    assert [(f.channel, f.method.delivery_tag, f.method.multiple) for f in events[0].frames()] == [
        (1, 1, False), (1, 2, False), (1, 3, False)]


@pytest.mark.parametrize("compiled", [False, None])
def test_large_body_frame_split_across_reads(compiled):
    """A large body frame arriving in pieces comes out whole and intact; the Python parser hands
    it out as a view of its input rather than another copy."""
    data = bytes(range(256)) * (BODY_VIEW_MIN // 256 + 10)
    frame = struct.pack(">BHI", 3, 1, len(data)) + data + b"\xce"
    reader = FrameReader(1 << 20, compiled=compiled)
    assert reader.feed(PROTOCOL_HEADER) == []
    events = []
    for i in range(0, len(frame), 50_000):
        events += reader.feed(frame[i:i + 50_000])
    assert reader.buffered == 0
    (event,) = events
    assert isinstance(event, BodyFrame) and event.channel == 1 and event.data == data
    if compiled is False:
        assert type(event.data) is memoryview


@pytest.mark.parametrize("compiled", [False, True])
def test_publishes_with_property_blocks_never_seen_are_fused_each(compiled):
    """Per-message properties (a message id each) still arrive as fused publishes (what publish runs
    take), in order, with each block as sent; a bad headers table is not fused and still refused."""
    if compiled and not accel.COMPILED:
        pytest.skip("the compiled codec is not selected")
    blocks = [b"\x20\x00" + struct.pack(">I", 10) + shortstr("id") + b"S" + struct.pack(">I", 2) + b"%02d" % i
              for i in range(20)]
    bad = b"\x20\x00" + struct.pack(">I", 4) + shortstr("id") + b"?"  # an unknown field type
    data = b"".join(publish(1, "", "q") + header(1, 3, props) + frame(3, 1, b"b%02d" % i)
                    for i, props in enumerate([*blocks[:10], bad, *blocks[10:]]))
    events = FrameReader(compiled=compiled).feed(PROTOCOL_HEADER + data)
    fused = [e for e in events if isinstance(e, ContentMessage)]
    assert [e.properties for e in fused] == blocks
    assert [e.body for e in fused] == [b"b%02d" % i for i in range(21) if i != 10]
    from lavinpy.wire.reader import RefusedFrame
    assert any(isinstance(e, RefusedFrame) for e in events)  # the bad block: refused as before


@pytest.mark.parametrize("compiled", [False, None])
@pytest.mark.parametrize("read_size", [65_536, 100_000, 262_144, 262_144 + 7])
def test_large_messages_read_in_pieces_come_out_as_sent(compiled, read_size):
    """Reads that end inside a large body frame (most do: the rest of that frame is joined alone, the
    input after it parsed where it is) give the same messages, in order, as the stream read whole;
    a bad frame after such a piece is still refused."""
    bodies = [bytes([i]) * (BODY_VIEW_MIN + 1000 * i) for i in range(9)]
    stream = b"".join(publish(1, "", "q") + header(1, len(body)) + frame(3, 1, body) for body in bodies)
    reader = FrameReader(1 << 20, compiled=compiled)
    events = reader.feed(PROTOCOL_HEADER)
    for i in range(0, len(stream), read_size):
        events += reader.feed(stream[i:i + read_size])
    assert reader.buffered == 0
    got = [f.data for f in flatten(events) if isinstance(f, BodyFrame)]
    assert got == bodies
    assert [f for f in flatten(events) if isinstance(f, MethodFrame)] != []
    reader.feed(frame(3, 1, b"x" * 70_000)[:50_000])
    with pytest.raises(AMQPConnectionError):
        reader.feed(b"x" * 20_007 + b"\x00")  # the frame end octet is wrong


@pytest.mark.parametrize("compiled", [False, None])
def test_a_message_split_across_reads_comes_out_fused(compiled):
    """A read that ends inside the one body frame of a message (a 256 KiB read of 64 KiB bodies nearly
    always does) or inside its header frame holds the whole message back: the next read gives it as
    one fused publish, as the messages wholly inside a read are. Cut between its frames, that message
    comes as its three frames. Small and large bodies mixed, a message on another channel
    between, and a body in two frames (never fused) all come out as sent, in order."""
    props = b"\x10\x00\x02"  # delivery mode 2
    sizes = [BODY_VIEW_MIN, 10, BODY_VIEW_MIN + 4000, 0, 3000, BODY_VIEW_MIN - 1]
    messages = []
    stream = b""
    frame_ends = set()  # cuts between a message's frames
    for i, size in enumerate(sizes):
        body = bytes([i + 1]) * size
        channel = 2 if i == 3 else 1
        key = f"key-{i}" * (i + 1)
        messages.append((channel, key, body))
        stream += publish(channel, "amq.direct", key)
        frame_ends.add(len(stream))
        stream += header(channel, size, props)
        if size:
            frame_ends.add(len(stream))
            stream += frame(3, channel, body)
    split = b"s" * 5000  # a body in two frames after them
    stream += publish(1, "", "q") + header(1, len(split), props) + frame(3, 1, split[:2000]) + frame(3, 1, split[2000:])
    for cut in [*range(1, len(stream), 997), *range(BODY_VIEW_MIN - 50, BODY_VIEW_MIN + 200)]:
        reader = FrameReader(1 << 17, compiled=compiled)
        events = reader.feed(PROTOCOL_HEADER)
        for piece in (stream[:cut], stream[cut:cut + 200_000], stream[cut + 200_000:]):
            events += reader.feed(piece)
        assert reader.buffered == 0
        fused = [e for e in events if isinstance(e, ContentMessage)]
        if cut in frame_ends:
            assert len(fused) == len(messages) - 1
            continue
        assert [(e.channel, e.method.routing_key, e.body) for e in fused] == messages, cut
        assert all(e.properties == props for e in fused)
        rest = flatten(events[len(fused):])
        assert [type(e) for e in rest] == [MethodFrame, HeaderFrame, BodyFrame, BodyFrame], cut
        assert b"".join(e.data for e in rest[2:]) == split


@pytest.mark.parametrize("compiled", [False, None])
def test_a_large_body_size_cut_before_its_body_frame_head_is_not_waited_for(compiled):
    """A read that ends a few bytes into the body frame of a message whose header announces more than a
    frame's worth is not held back: the next bytes are parsed at once (here an oversized frame, refused)
    instead of being buffered up to the announced body size."""
    reader = FrameReader(131072, compiled=compiled)
    assert reader.feed(PROTOCOL_HEADER) == []
    start = publish(1, "", "q") + header(1, 2**40) + b"\x03\x00\x01"
    assert [describe(e)[0] for e in reader.feed(start)] == ["method", "header"]
    err = connection_error(reader, b"\xff" * 100_000)
    assert err.reply_code == FRAME_ERROR
    assert reader.buffered < 200_000


@pytest.mark.parametrize("compiled", [False, None])
def test_reader_gathers_alike_publishes_into_runs(compiled):
    """Publishes with the same channel, method and property block become one ContentRun, whose messages
    are those sent; a key, a block or a channel of its own ends the run. The compiled reader also hands
    out one property object while the bytes repeat, so that a publish run compares blocks by identity."""
    sent = [(1, "ab", b"\x80\x00\x01a", b"1"), (1, "ab", b"\x80\x00\x01a", b"2"), (1, "ab", b"\x80\x00\x01a", b""),
            (1, "ba", b"\x80\x00\x01a", b"3"), (1, "ba", b"\x80\x00\x01b", b"4"), (2, "ba", b"\x80\x00\x01b", b"5"),
            (2, "ba", b"\x80\x00\x01b", b"6")]
    data = b"".join(publish(channel, "", key) + header(channel, len(body), props)
                    + (frame(3, channel, body) if body else b"") for channel, key, props, body in sent)
    events = FrameReader(compiled=compiled).feed(PROTOCOL_HEADER + data)
    assert [(type(e).__name__, e.channel, e.method.routing_key, e.properties,
             e.bodies if type(e) is ContentRun else e.body) for e in events] == [
        ("ContentRun", 1, "ab", b"\x80\x00\x01a", [b"1", b"2", b""]),
        ("ContentMessage", 1, "ba", b"\x80\x00\x01a", b"3"),
        ("ContentMessage", 1, "ba", b"\x80\x00\x01b", b"4"),
        ("ContentRun", 2, "ba", b"\x80\x00\x01b", [b"5", b"6"])]
    messages = [m for e in events for m in (e.messages() if type(e) is ContentRun else [e])]
    assert [(m.channel, m.method.routing_key, m.properties, m.body) for m in messages] == sent
    # the run's frames are its messages' frames
    assert [describe(f) for f in flatten(events)] == [describe(f) for f in flatten(messages)]
    if compiled is None and accel.COMPILED:
        assert events[1].properties is events[0].properties and events[3].properties is events[2].properties
