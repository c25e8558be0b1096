"""The compiled codec (lavinpy.wire._cwire) and the pure-Python one agree: the same input gives the same
events, the same bytes and the same errors (reply code, text, frames decoded before the error).

Hypothesis builds arbitrary frame streams (valid frames, mutated ones, random bytes), cut at arbitrary
points, and feeds them to a compiled and a pure FrameReader side by side. Skipped when the pure path is
selected (LAVINPY_PURE_PYTHON=1 or no extension): there is nothing compiled to compare.
"""

from __future__ import annotations

import struct
from itertools import accumulate

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from lavinpy.store.record import StoredMessage
from lavinpy.wire import accel, client, writer
from lavinpy.wire.constants import PROTOCOL_HEADER
from lavinpy.wire.errors import AMQPError
from lavinpy.wire.properties import valid_props
from lavinpy.wire.reader import BadProtocolHeader, FrameReader, RefusedFrame
from tests.wire.frames import mutate

pytestmark = pytest.mark.skipif(not accel.COMPILED, reason="the pure-Python codec is selected")

FRAME_MAX = 4096
AGREE = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text(max_size=12)
channels = st.integers(0, 3)
# Property blocks: fixed-size ones (no walk), ones with strings or headers (walked, then remembered),
# a malformed headers table (the channel is refused) and a block longer or shorter than its frame.
properties = st.sampled_from([
    b"\x00\x00", b"\x10\x00\x02", b"\x18\x00\x02\x05", b"\x18\x40\x02\x05" + bytes(8),
    b"\x90\x00\x0atext/plain\x01",
    b"\x20\x00" + struct.pack(">I", 8) + b"\x01kS\x00\x00\x00\x01v",
    b"\x20\x00" + struct.pack(">I", 3) + b"\x01kZ",  # unknown field type
    b"\x10\x00\x02\x00", b"\x80\x00\x09abc",
])


def content(channel: int, props: bytes, body: bytes) -> bytes:
    size = len(body)
    out = writer._HEADER_HEAD.pack(2, channel, 12 + len(props), 60, 0, size) + props + b"\xce"
    if size:
        out += client.frame(3, channel, body)
    return out


def message(channel: int, routing_key: str, props: bytes, body: bytes) -> bytes:
    """basic.publish with its content: what a publisher sends most."""
    return writer.method_frame(channel, commands.Basic.Publish(0, "", routing_key)) + content(channel, props, body)


def publish_run(channel: int, items: list[tuple[str, bytes, bytes]]) -> bytes:
    """Publishes that mostly repeat the one before: the compiled reader reuses the last method and
    property block when their bytes repeat, and must tell apart keys and blocks of equal length."""
    return b"".join(message(channel, routing_key, props, body) for routing_key, props, body in items)


def frames() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.builds(message, channels, names, properties, st.binary(max_size=300)),
        st.builds(publish_run, channels, st.lists(st.tuples(
            st.sampled_from(["ab", "ab", "ba", "a"]),
            st.sampled_from([b"\x10\x00\x02", b"\x10\x00\x02", b"\x10\x00\x01", b"\x80\x00\x01a",
                             b"\x80\x00\x01b", b"\x20\x00" + struct.pack(">I", 3) + b"\x01kZ"]),
            st.binary(max_size=20)), min_size=2, max_size=6)),
        st.builds(message, channels, names, properties, st.binary(max_size=300)),
        st.builds(lambda ch, ex, rk, m: writer.method_frame(ch, commands.Basic.Publish(0, ex, rk, m)),
                  channels, st.sampled_from(["", "amq.direct", "x"]), names, st.booleans()),
        st.builds(content, channels, properties, st.binary(max_size=300)),
        # a content header whose body frame is on another channel or of another size
        st.builds(lambda ch, p, n: content(ch, p, b"x" * n)[:-(n + 8)] + client.frame(3, ch + 1, b"y" * n)
                  if n else content(ch, p, b""), channels, properties, st.integers(0, 5)),
        st.builds(lambda ch: client.frame(2, ch, b"\x00\x3c\x00\x00" + bytes(6)), channels),  # short header
        st.builds(writer.basic_ack, channels, st.integers(0, 2**64 - 1), st.booleans()),
        st.builds(writer.basic_nack, channels, st.integers(0, 2**64 - 1), st.booleans(), st.booleans()),
        st.builds(lambda ch, tag: client.frame(1, ch, struct.pack(">HHQ", 60, 80, tag)), channels,
                  st.integers(0, 2**64 - 1)),  # basic.ack without its bits octet
        st.builds(lambda ch, tag, bits: client.frame(1, ch, struct.pack(">HHQB", 60, 80, tag, bits)), channels,
                  st.integers(0, 2**64 - 1), st.integers(0, 255)),  # basic.ack with any bits set
        st.builds(lambda ch, q: writer.method_frame(ch, commands.Queue.Declare(0, q, False, True)),
                  channels, st.sampled_from(["q", ""])),
        st.builds(lambda ch, p: client.frame(1, ch, b"\x00\x3c\x00\x28" + p), channels,
                  st.binary(max_size=12)),  # basic.publish with arbitrary arguments
        st.builds(lambda t, ch, p: client.frame(t, ch, p), st.sampled_from([1, 2, 3, 4, 8]), channels,
                  st.binary(max_size=20)),
        st.just(writer.HEARTBEAT),
        st.just(client.frame(8, 1, b"")),
        st.binary(min_size=1, max_size=10),  # noise
    )


streams = st.builds(mutate, st.lists(frames(), min_size=1, max_size=8).map(b"".join),
                    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=2))


def view(value: object) -> object:
    """A comparable view of an event, a method or an error (their classes define no equality)."""
    if isinstance(value, (bytes, int, str, bool, float, type(None))):
        return value
    if isinstance(value, dict):
        return {k: view(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [view(v) for v in value]
    if isinstance(value, AMQPError):
        return (type(value).__name__, value.reply_code, value.text, value.class_id, value.method_id)
    if isinstance(value, BaseException):
        return (type(value).__name__, str(value))
    slots = [s for cls in type(value).__mro__ for s in getattr(cls, "__slots__", ())]
    fields = {s: view(getattr(value, s)) for s in slots if hasattr(value, s)}
    if not fields and hasattr(value, "__dict__"):
        fields = {k: view(v) for k, v in vars(value).items()}
    return (type(value).__name__, fields)


def run(compiled: bool, data: bytes, cuts: list[int]) -> list:
    """Feed ``data`` in pieces; the outcome of every feed call (events or error) and the bytes held."""
    valid_props.clear()  # both runs start with the same cache of validated property blocks
    frame_reader = FrameReader(FRAME_MAX, compiled=compiled)
    outcome: list = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        piece, start = data[start:cut], max(start, cut)
        try:
            events = frame_reader.feed(piece)
        except AMQPError as err:
            outcome.append(("error", view(err), view(getattr(err, "frames", []))))
            break
        except BadProtocolHeader as err:
            outcome.append(("bad header", err.received))
            break
        outcome.append((view(events), frame_reader.buffered))
    return outcome


@AGREE
@given(streams, st.lists(st.integers(0, 3000), max_size=5))
def test_reader_compiled_and_pure_agree(stream: bytes, cuts: list[int]) -> None:
    data = PROTOCOL_HEADER + stream
    assert run(True, data, cuts) == run(False, data, cuts)


@AGREE
@given(streams, st.integers(1, 200))
def test_reader_agrees_with_small_frame_max(stream: bytes, frame_max: int) -> None:
    # A small frame_max makes "frame too large" errors frequent.
    def go(compiled: bool) -> object:
        valid_props.clear()
        frame_reader = FrameReader(frame_max, compiled=compiled)
        try:
            return view(frame_reader.feed(PROTOCOL_HEADER + stream))
        except AMQPError as err:
            return view(err), view(err.frames)
    assert go(True) == go(False)


def test_reader_differential_check_sees_a_difference() -> None:
    # The comparison can fail: a refused frame and a content header are told apart.
    refused = FrameReader(FRAME_MAX, compiled=True).feed(
        PROTOCOL_HEADER + content(1, b"\x20\x00" + struct.pack(">I", 3) + b"\x01kZ", b""))
    good = FrameReader(FRAME_MAX, compiled=True).feed(PROTOCOL_HEADER + content(1, b"\x00\x00", b""))
    assert isinstance(refused[0], RefusedFrame)
    assert view(refused) != view(good)


def test_reader_compiled_fuses_publish_header_body() -> None:
    data = (PROTOCOL_HEADER + writer.method_frame(1, commands.Basic.Publish(0, "ex", "rk"))
            + content(1, b"\x10\x00\x02", b"hello"))
    events = FrameReader(FRAME_MAX, compiled=True).feed(data)
    assert [type(e).__name__ for e in events] == ["ContentMessage"]
    assert (events[0].method.exchange, events[0].method.routing_key, events[0].properties, events[0].body) == (
        "ex", "rk", b"\x10\x00\x02", b"hello")


def split_outcome(split, data: bytes, frame_max: int) -> object:
    try:
        return split(data, frame_max)
    except client.WireError as err:
        return ("WireError", str(err))


@AGREE
@given(streams, st.sampled_from([0, 20, 300, FRAME_MAX]), st.booleans())
def test_client_split_frames_agree(stream: bytes, frame_max: int, as_bytearray: bool) -> None:
    data = bytearray(stream) if as_bytearray else stream
    assert split_outcome(client.split_frames, data, frame_max) == split_outcome(client._split_frames, data,
                                                                                 frame_max)


@AGREE
@given(channels, names, st.integers(0, 2**64 - 1), st.booleans(), names, names, properties,
       st.binary(min_size=1, max_size=500), st.booleans())
def test_deliver_frames_agree(channel: int, tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                              routing_key: str, props: bytes, body: bytes, as_view: bool) -> None:
    head, names_part = writer._deliver_parts(channel, tag, exchange, routing_key)
    payload = memoryview(body) if as_view else body
    compiled = accel.cwire.deliver_frames(head, names_part, channel, delivery_tag, redelivered, props, payload)
    assert compiled == writer.deliver_frames_py(head, names_part, channel, delivery_tag, redelivered, props,
                                                payload)
    assert writer.deliver(channel, tag, delivery_tag, redelivered, exchange, routing_key, props, payload,
                          FRAME_MAX) == [compiled]


@AGREE
@given(st.sampled_from([writer._IDX_ACK, writer._IDX_NACK]), st.integers(0, 65535), st.integers(0, 2**64 - 1),
       st.integers(0, 3))
def test_ack_frames_agree(index: int, channel: int, delivery_tag: int, bits: int) -> None:
    assert accel.cwire.ack_frame(index, channel, delivery_tag, bits) == writer.ack_frame_py(
        index, channel, delivery_tag, bits)


@AGREE
@given(channels, names, st.integers(0, 2**64 - 1), st.booleans(), names, names, properties,
       st.binary(max_size=700), st.sampled_from([0, 64, 300, FRAME_MAX]), st.booleans())
def test_writer_deliver_agrees(channel: int, tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                               routing_key: str, props: bytes, body: bytes, frame_max: int, clear: bool) -> None:
    # Every case: cached parts or not, empty bodies, bodies split over several frames (small frame_max).
    if clear:
        writer._deliver_parts_cache.clear()
    args = (channel, tag, delivery_tag, redelivered, exchange, routing_key, props, body, frame_max)
    assert writer.deliver is accel.cwire.deliver
    assert writer.deliver(*args) == writer.deliver_py(*args)
    assert writer.deliver(*args[:7], memoryview(body), frame_max) == writer.deliver_py(*args)


# --- the blocking clients' runs (lavinpy.wire._cclient) ----------------------------------------------

def outcome(fn: object, *args: object) -> object:
    """A call's result, or its error's type and text."""
    try:
        return fn(*args)  # type: ignore[operator]
    except Exception as err:  # noqa: BLE001 - compared, not handled
        return type(err), str(err)


bodies = st.lists(st.one_of(st.binary(max_size=90), st.binary(min_size=1, max_size=4).map(bytearray)), max_size=30)


@AGREE
@given(bodies, st.integers(0, 32), st.integers(0, 40), st.integers(0, 3000), st.sampled_from([1, 8, 60, 4096]),
       channels, properties, st.binary(max_size=20))
def test_client_pack_publishes_agree(items: list, start: int, max_count: int, max_bytes: int, max_inline: int,
                                     channel: int, props: bytes, prefix: bytes) -> None:
    method = client.publish_method_frame(channel, "ex", "rk", True)
    args = (method, channel, props, items, start, max_count, max_bytes, max_inline)
    out_c, out_py = bytearray(prefix), bytearray(prefix)
    assert outcome(accel.cclient.pack_publishes, out_c, *args) == outcome(client._pack_publishes, out_py, *args)
    assert out_c == out_py


@AGREE
@given(st.lists(st.binary(max_size=90), max_size=30), st.integers(0, 32), st.integers(0, 32), st.integers(0, 40),
       st.integers(0, 3000), st.sampled_from([1, 8, 60, 4096]), channels, properties, st.binary(max_size=20),
       st.one_of(st.none(), st.tuples(st.integers(0, 31), st.integers(-5, 3000))))
def test_client_pack_publishes_arrow_agree(items: list, start: int, end: int, max_count: int, max_bytes: int,
                                           max_inline: int, channel: int, props: bytes, prefix: bytes,
                                           bad: tuple[int, int] | None) -> None:
    """Publishes packed from an Arrow binary array's buffers: both twins give the same frames and
    stop at the same body (also on offsets that are out of order or out of the data), and on good
    buffers the frames are pack_publishes' of the same bodies."""
    ends = list(accumulate(map(len, items), initial=0))  # an Arrow binary array's offsets, and its data
    data = b"".join(items)
    if bad is not None and bad[0] < len(ends):
        ends[bad[0]] = bad[1]
    offsets = struct.pack(f"<{len(ends)}i", *ends)
    method = client.publish_method_frame(channel, "ex", "rk", True)
    args = (method, channel, props, offsets, data, start, end, max_count, max_bytes, max_inline)
    out_c, out_py = bytearray(prefix), bytearray(prefix)
    compiled = outcome(accel.cclient.pack_publishes_arrow, out_c, *args)
    assert compiled == outcome(client._pack_publishes_arrow, out_py, *args)
    assert out_c == out_py
    if bad is None and start <= end < len(ends):
        out_list = bytearray(prefix)
        stop = client._pack_publishes(out_list, method, channel, props, items[:end], start, max_count, max_bytes,
                                      max_inline)
        assert (compiled, out_c) == (stop, out_list)


run_messages = st.lists(
    st.tuples(st.sampled_from(["", "amq.direct", "x"]), st.sampled_from(["q", "rk", ""]), properties,
              st.one_of(st.binary(max_size=400), st.binary(max_size=20).map(memoryview))),
    max_size=12)


@AGREE
@given(channels, names, st.integers(1, 2**62), run_messages, st.booleans(), st.data(),
       st.sampled_from([64, 300, FRAME_MAX]), st.booleans())
def test_deliver_runs_agree(channel: int, tag: str, first_tag: int, messages: list, flagged: bool,
                            data: st.DataObject, frame_max: int, clear: bool) -> None:
    # Runs mixing common deliveries with the fallback's (cache misses, empty, memoryview and
    # multi-frame bodies): the same bytes in the same order, tags counted from first_tag.
    if clear:
        writer._deliver_parts_cache.clear()
    stored = [StoredMessage(0, exchange, key, props, body) for exchange, key, props, body in messages]
    flags = data.draw(st.lists(st.booleans(), min_size=len(stored), max_size=len(stored))) if flagged else None
    assert writer.deliver_run is accel.cwire.deliver_run
    compiled = writer.deliver_run(channel, tag, first_tag, flags, stored, frame_max)
    pure = writer.deliver_run_py(channel, tag, first_tag, flags, stored, frame_max)
    assert b"".join(compiled) == b"".join(pure)
    assert b"".join(pure) == b"".join(
        b"".join(writer.deliver_py(channel, tag, first_tag + i, bool(flags and flags[i]), m.exchange,
                                   m.routing_key, m.properties, m.body, frame_max))
        for i, m in enumerate(stored))


def headers_block(table: bytes, flags: int = 0x2000, before: bytes = b"", after: bytes = b"") -> bytes:
    """A property block with a headers table of these entry bytes (``before``/``after``: the fields
    the other ``flags`` ask for, in wire order)."""
    return flags.to_bytes(2, "big") + before + struct.pack(">I", len(table)) + table + after


def nested_tables(depth: int, array: bool = False) -> bytes:
    """Table entries nesting ``depth`` tables (or, below the headers table, arrays) in all."""
    value = b""
    for _ in range(depth - 2):
        value = (b"A" if array else b"\x01kF") + struct.pack(">I", len(value)) + value
    return b"\x01k" + (b"A" if array else b"F") + struct.pack(">I", len(value)) + value if depth > 1 else b""


_VALUES = [b"t\x01", b"b\x02", b"B\x03", b"s\x00\x04", b"u\x00\x05", b"I" + bytes(4), b"i" + bytes(4),
           b"l" + bytes(8), b"L" + bytes(8), b"f" + bytes(4), b"d" + bytes(8), b"D" + bytes(5),
           b"T" + bytes(8), b"V", b"S\x00\x00\x00\x02id", b"x\x00\x00\x00\x01\xff",
           b"F\x00\x00\x00\x04\x01aV\x00"[:-1], b"A\x00\x00\x00\x02t\x00", b"Z", b"S\x00\x00\x00\x09ab"]
entries = st.lists(st.tuples(st.binary(max_size=3), st.sampled_from(_VALUES)), max_size=4).map(
    lambda items: b"".join(bytes((len(k),)) + k + v for k, v in items))
# Blocks not seen before, as a publisher with per-message headers sends them: well formed tables of
# every value type, arbitrary table bytes, nesting at and past the limit, other fields around them.
new_blocks = st.one_of(
    st.builds(headers_block, entries),
    st.builds(headers_block, st.binary(max_size=24)),
    st.builds(lambda d, a: headers_block(nested_tables(d, a)), st.integers(62, 66), st.booleans()),
    st.builds(lambda t, mid: headers_block(t, 0x3080, after=b"\x02" + bytes((len(mid),)) + mid),
              entries, st.binary(max_size=20)),
    st.builds(lambda t, ct: headers_block(t, 0xA040, before=bytes((len(ct),)) + ct, after=bytes(8)),
              entries, st.binary(max_size=5)),
    st.builds(lambda b: b, st.binary(min_size=2, max_size=30)),
    st.builds(lambda t: headers_block(t, 0x2001) + b"\x00\x00", entries),  # a continuation word
)


@AGREE
@given(st.lists(st.tuples(channels, new_blocks, st.binary(max_size=20), st.booleans()), min_size=1, max_size=6),
       st.lists(st.integers(0, 3000), max_size=3))
def test_reader_checks_new_property_blocks_as_python(items: list, cuts: list[int]) -> None:
    # The compiled scan checks a block it has not seen itself; it must take exactly what Python takes.
    stream = b"".join(message(ch, "rk", props, body) if fused else content(ch, props, body)
                      for ch, props, body, fused in items)
    data = PROTOCOL_HEADER + stream
    assert run(True, data, cuts) == run(False, data, cuts)


def test_reader_compiled_takes_per_message_headers_without_python() -> None:
    # A header on every message (an identifier) keeps the compiled path: Python's cache of checked
    # blocks (which only its own checks fill) stays empty.
    valid_props.clear()
    data = PROTOCOL_HEADER + b"".join(
        message(1, "q", headers_block(b"\x16x-deduplication-headerS\x00\x00\x00\x04" + b"%04d" % i, 0x3000)
                + b"\x02", b"body") for i in range(50))
    events = FrameReader(FRAME_MAX, compiled=True).feed(data)
    assert [type(e).__name__ for e in events] == ["ContentMessage"] * 50
    assert not valid_props
