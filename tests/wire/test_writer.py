"""Frame builders: exact bytes against pamqp, frame_max splitting, and writer -> reader round trips."""

from __future__ import annotations

import struct
import warnings

import pytest
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from lavinpy.wire import writer
from lavinpy.wire.constants import PROTOCOL_HEADER
from lavinpy.wire.reader import BodyFrame, FrameReader, HeaderFrame, HeartbeatFrame, MethodFrame

PROPS = commands.Basic.Properties(content_type="text/plain", delivery_mode=2, headers={"a": "b"}).marshal()


def read_all(data: bytes, frame_max: int = 131072) -> list:
    reader = FrameReader(frame_max)
    events = reader.feed(PROTOCOL_HEADER + data)
    assert reader.buffered == 0
    return events


def pamqp_content(channel: int, body: bytes, props: bytes = PROPS) -> bytes:
    """Header + single body frame as pamqp encodes them."""
    content_header = pamqp_header.ContentHeader(body_size=len(body))
    flags = struct.unpack(">H", props[:2])[0]
    content_header.properties.unmarshal(flags, props[2:])
    out = pamqp_frame.marshal(content_header, channel)
    if body:
        out += pamqp_frame.marshal(pamqp_body.ContentBody(body), channel)
    return out


def test_heartbeat_bytes():
    assert writer.HEARTBEAT == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    assert isinstance(read_all(writer.HEARTBEAT)[0], HeartbeatFrame)


@pytest.mark.parametrize(("tag", "multiple"), [(1, False), (2**63 - 1, True)])
def test_basic_ack_matches_pamqp(tag, multiple):
    expected = pamqp_frame.marshal(commands.Basic.Ack(tag, multiple), 7)
    assert writer.basic_ack(7, tag, multiple) == expected


def test_delivery_tags_are_unsigned_64_bit():
    # pamqp's longlong is signed; AMQP delivery tags are not, and the hand-written paths use all 64 bits.
    (event,) = read_all(writer.basic_ack(1, 2**64 - 1, False))
    assert event.tags == [2**64 - 1]
    (event,) = read_all(writer.basic_ack(1, 2**64 - 1, True))
    assert event.method.delivery_tag == 2**64 - 1


@pytest.mark.parametrize("multiple", [False, True])
@pytest.mark.parametrize("requeue", [False, True])
def test_basic_nack_matches_pamqp(multiple, requeue):
    expected = pamqp_frame.marshal(commands.Basic.Nack(42, multiple, requeue), 65535)
    assert writer.basic_nack(65535, 42, multiple, requeue) == expected
    (event,) = read_all(writer.basic_nack(65535, 42, multiple, requeue))
    assert (event.method.delivery_tag, event.method.multiple, event.method.requeue) == (42, multiple, requeue)


def test_basic_nack_requeue_defaults_to_false():
    assert writer.basic_nack(1, 5, False) == pamqp_frame.marshal(commands.Basic.Nack(5, False, False), 1)


def test_content_frames_match_pamqp():
    assert b"".join(writer.content_frames(3, PROPS, b"hello", 131072)) == pamqp_content(3, b"hello")


def test_content_frames_empty_body_sends_no_body_frame():
    frames = writer.content_frames(3, b"\x00\x00", b"", 131072)
    assert len(frames) == 1
    (event,) = read_all(frames[0])
    assert isinstance(event, HeaderFrame) and event.body_size == 0


@pytest.mark.parametrize("size", [4087, 4088, 4089, 10000, 3 * 4088])
def test_content_frames_split_by_frame_max(size):
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frames = writer.content_frames(1, PROPS, memoryview(body), 4096, class_id=60)
    assert all(len(f) <= 4096 for f in frames)
    assert len(frames) == 1 + -(-size // 4088)
    events = read_all(b"".join(frames), 4096)
    assert events[0].body_size == size and events[0].properties == PROPS
    assert all(isinstance(e, BodyFrame) for e in events[1:])
    assert b"".join(e.data for e in events[1:]) == body


def test_content_frames_class_id():
    (event,) = read_all(writer.content_frames(1, b"\x00\x00", b"", 4096, class_id=70)[0])
    assert event.class_id == 70


def test_deliver_small_message_is_one_write_equal_to_pamqp():
    frames = writer.deliver(2, "ctag-1", 99, True, "amq.direct", "key", PROPS, b"body", 131072)
    assert len(frames) == 1
    deliver = commands.Basic.Deliver("ctag-1", 99, True, "amq.direct", "key")
    assert frames[0] == pamqp_frame.marshal(deliver, 2) + pamqp_content(2, b"body")


def test_deliver_round_trip_with_unicode_names():
    frames = writer.deliver(1, "tag-é", 1, False, "ex-ß", "ключ", b"\x00\x00", b"", 4096)
    assert len(frames) == 1
    method, head = read_all(frames[0])
    assert isinstance(method, MethodFrame) and method.method.name == "Basic.Deliver"
    assert dict(method.method) == {"consumer_tag": "tag-é", "delivery_tag": 1, "redelivered": False,
                                   "exchange": "ex-ß", "routing_key": "ключ"}
    assert head.body_size == 0


def test_deliver_large_body_is_split():
    body = b"z" * 10000
    frames = writer.deliver(1, "c", 1, False, "", "q", PROPS, body, 4096)
    assert len(frames) == 1 + 3 and all(len(f) <= 4096 for f in frames)
    events = read_all(b"".join(frames), 4096)
    assert [type(e) for e in events] == [MethodFrame, HeaderFrame, BodyFrame, BodyFrame, BodyFrame]
    assert b"".join(e.data for e in events[2:]) == body


def test_deliver_body_exactly_one_frame():
    body = b"z" * 4088
    (only,) = writer.deliver(1, "c", 1, False, "", "q", b"\x00\x00", body, 4096)
    assert read_all(only, 4096)[2].data == body


def test_get_ok_matches_pamqp():
    frames = writer.get_ok(1, 5, False, "ex", "rk", 17, PROPS, b"payload", 131072)
    get_ok = commands.Basic.GetOk(5, False, "ex", "rk", 17)
    assert frames == [pamqp_frame.marshal(get_ok, 1) + pamqp_content(1, b"payload")]
    method, head, body = read_all(frames[0])
    assert dict(method.method) == dict(get_ok)


def test_return_matches_pamqp():
    frames = writer.return_(4, 312, "NO_ROUTE", "ex", "rk", PROPS, b"", 131072)
    ret = commands.Basic.Return(312, "NO_ROUTE", "ex", "rk")
    assert frames == [pamqp_frame.marshal(ret, 4) + pamqp_content(4, b"")]
    method, head = read_all(frames[0])
    assert dict(method.method) == dict(ret) and head.body_size == 0


def test_return_large_body():
    frames = writer.return_(4, 312, "NO_ROUTE", "ex", "rk", PROPS, b"q" * 5000, 4096)
    events = read_all(b"".join(frames), 4096)
    assert b"".join(e.data for e in events[2:]) == b"q" * 5000


def test_short_string_over_255_bytes_is_refused():
    with pytest.raises(ValueError):
        writer.deliver(1, "x" * 256, 1, False, "", "", b"\x00\x00", b"", 4096)
    with pytest.raises(ValueError):
        writer.get_ok(1, 1, False, "", "é" * 128, 0, b"\x00\x00", b"", 4096)
    # 255 bytes is fine
    (frame,) = writer.deliver(1, "x" * 255, 1, False, "", "", b"\x00\x00", b"", 4096)
    assert read_all(frame)[0].method.consumer_tag == "x" * 255


def _commands() -> list:
    """One instance of every method the broker sends or receives, with non-default arguments."""
    table = {"x-max-length": 10, "x-dead-letter-exchange": "dlx", "nested": {"a": [1, "two", True]},
             "flag": False, "f": 1.5}
    c = commands
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # basic.recover-async is deprecated in 0-9-1
        recover_async = c.Basic.RecoverAsync(True)
    return [
        c.Connection.Start(0, 9, {"product": "lavinpy", "capabilities": {"publisher_confirms": True}},
                           "PLAIN AMQPLAIN", "en_US"),
        c.Connection.StartOk({"product": "test"}, "PLAIN", "\x00guest\x00guest", "en_US"),
        c.Connection.Secure("challenge"), c.Connection.SecureOk("response"),
        c.Connection.Tune(2047, 131072, 60), c.Connection.TuneOk(2047, 131072, 60),
        c.Connection.Open("/vhost"), c.Connection.OpenOk(),
        c.Connection.Close(320, "CONNECTION_FORCED - bye", 60, 40), c.Connection.CloseOk(),
        c.Connection.Blocked("low on disk"), c.Connection.Unblocked(),
        c.Connection.UpdateSecret("secret", "refresh"), c.Connection.UpdateSecretOk(),
        c.Channel.Open(), c.Channel.OpenOk(), c.Channel.Flow(False), c.Channel.FlowOk(True),
        c.Channel.Close(404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10), c.Channel.CloseOk(),
        c.Exchange.Declare(0, "ex", "topic", False, True, True, False, True, table), c.Exchange.DeclareOk(),
        c.Exchange.Delete(0, "ex", True, False), c.Exchange.DeleteOk(),
        c.Exchange.Bind(0, "dest", "src", "a.#", True, table), c.Exchange.BindOk(),
        c.Exchange.Unbind(0, "dest", "src", "a.*", False, table), c.Exchange.UnbindOk(),
        c.Queue.Declare(0, "q", True, False, True, False, True, table),
        c.Queue.DeclareOk("amq.gen-abc", 10, 2),
        c.Queue.Bind(0, "q", "ex", "rk", True, table), c.Queue.BindOk(),
        c.Queue.Purge(0, "q", True), c.Queue.PurgeOk(5),
        c.Queue.Delete(0, "q", True, True, False), c.Queue.DeleteOk(3),
        c.Queue.Unbind(0, "q", "ex", "rk", table), c.Queue.UnbindOk(),
        c.Basic.Qos(0, 100, True), c.Basic.QosOk(),
        c.Basic.Consume(0, "q", "ctag", True, True, False, True, {"x-priority": 5}),
        c.Basic.ConsumeOk("ctag"), c.Basic.Cancel("ctag", True), c.Basic.CancelOk("ctag"),
        c.Basic.Publish(0, "ex", "rk", True, True), c.Basic.Publish(0, "", "", False, False),
        c.Basic.Return(312, "NO_ROUTE", "ex", "rk"),
        c.Basic.Deliver("ctag", 2**63 - 1, True, "ex", "rk"),
        c.Basic.Get(0, "q", True), c.Basic.GetOk(7, True, "ex", "rk", 9), c.Basic.GetEmpty(),
        c.Basic.Ack(11, True), c.Basic.Reject(12, False), c.Basic.Reject(13, True),
        recover_async, c.Basic.Recover(False), c.Basic.RecoverOk(),
        c.Basic.Nack(14, False, True), c.Basic.Nack(15, True, False),
        c.Tx.Select(), c.Tx.SelectOk(), c.Tx.Commit(), c.Tx.CommitOk(), c.Tx.Rollback(), c.Tx.RollbackOk(),
        c.Confirm.Select(True), c.Confirm.SelectOk(),
    ]


def test_every_pamqp_command_is_covered():
    covered = {type(m) for m in _commands()}
    assert covered == set(commands.INDEX_MAPPING.values())


@pytest.mark.parametrize("command", _commands(), ids=lambda m: m.name)
def test_method_frame_round_trip(command):
    data = writer.method_frame(9, command)
    assert data == pamqp_frame.marshal(command, 9)
    (event,) = read_all(data)
    assert isinstance(event, MethodFrame) and event.channel == 9
    decoded = event.method
    assert decoded.name == command.name
    for name in type(decoded).__slots__:
        assert getattr(decoded, name) == getattr(command, name), name


def test_method_frame_round_trip_in_one_stream_split_anywhere():
    data = PROTOCOL_HEADER + b"".join(writer.method_frame(i % 3, m) for i, m in enumerate(_commands()))
    whole = FrameReader().feed(data)
    assert len(whole) == len(_commands())
    for cut in range(0, len(data), 37):
        reader = FrameReader()
        parts = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert [e.method.name for e in parts] == [e.method.name for e in whole]


def test_deliver_reuses_cached_pieces_correctly():
    first = writer.deliver(1, "c", 1, False, "ex", "rk", b"\x00\x00", b"a", 4096)
    again = writer.deliver(1, "c", 2, True, "ex", "rk", b"\x00\x00", b"b", 4096)
    other_channel = writer.deliver(2, "c", 3, False, "ex", "rk", b"\x00\x00", b"c", 4096)
    events = read_all(b"".join(first + again + other_channel))
    assert [(e.channel, e.method.delivery_tag, e.method.redelivered) for e in events[::3]] == [
        (1, 1, False), (1, 2, True), (2, 3, False)]
    assert [e.data for e in events[2::3]] == [b"a", b"b", b"c"]


@pytest.mark.parametrize("size", [writer.PIECE_MIN - 8, 131064, 131065, 3 * 131064, 1_000_000])
@pytest.mark.parametrize("frame_max", [4096, writer.PIECE_MIN + 8, 131072])
def test_large_deliver_sends_the_body_as_slices(size, frame_max):
    """Frames of PIECE_MIN bytes or more (smaller ones are joined as before): the body goes out as
    memoryview slices of itself (never copied), the frame heads and ends around them, every frame
    within frame_max."""
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frames = writer.deliver(3, "c", 7, False, "ex", "rk", PROPS, body, frame_max)
    data = b"".join(frames)
    events = read_all(data, frame_max)
    assert events[0].method.name == "Basic.Deliver" and events[1].body_size == size
    assert all(isinstance(e, BodyFrame) and len(e.data) <= frame_max - 8 for e in events[2:])
    assert b"".join(e.data for e in events[2:]) == body
    if size > frame_max - 8 >= writer.PIECE_MIN:
        slices = [f for f in frames if type(f) is memoryview]
        assert len(slices) == -(-size // (frame_max - 8))
        assert all(s.obj is body for s in slices)
    for build in (writer.get_ok, writer.return_):
        args = (3, 7, False, "ex", "rk", 5) if build is writer.get_ok else (3, 312, "NO_ROUTE", "ex", "rk")
        parts = build(*args, PROPS, memoryview(body), frame_max)  # type: ignore[operator]
        assert b"".join(e.data for e in read_all(b"".join(parts), frame_max)[2:]) == body
