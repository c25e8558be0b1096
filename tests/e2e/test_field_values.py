"""Field tables and property blocks over the wire: every value type RabbitMQ accepts passes through
byte-identical; tables the broker refuses (too deep, malformed) close only their channel, with 406
and a text naming the problem, and never a 541."""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lavinpy.wire import field_table as ft

from . import uid
from .conftest import ON_LAVINPY
from .rawamqp import PeerClosed, RawAMQP, commands, method_payload, raw_frame

PUBLISH = struct.Struct(">HH")
MAX_DEPTH = ft.MAX_DEPTH


# --- raw frames -----------------------------------------------------------------------------------

def next_raw_frame(conn: RawAMQP) -> tuple[int, int, bytes]:
    """(type, channel, payload) of the next frame, read without decoding (pamqp cannot decode all)."""
    import time
    deadline = time.monotonic() + conn.timeout
    while True:
        if len(conn.buf) >= 7:
            frame_type, channel, size = struct.unpack_from(">BHI", conn.buf)
            if len(conn.buf) >= size + 8:
                payload = conn.buf[7:7 + size]
                conn.buf = conn.buf[size + 8:]
                if frame_type != 8:
                    return frame_type, channel, payload
                continue
        conn._fill(deadline)


def publish_raw(conn: RawAMQP, channel: int, exchange: str, routing_key: str, properties: bytes,
                body: bytes) -> None:
    args = (b"\x00\x00" + bytes((len(exchange),)) + exchange.encode()
            + bytes((len(routing_key.encode()),)) + routing_key.encode() + b"\x00")
    header = struct.pack(">HHQ", 60, 0, len(body)) + properties
    conn.send_raw(raw_frame(1, channel, method_payload(60, 40, args)) + raw_frame(2, channel, header)
                  + (raw_frame(3, channel, body) if body else b""))


def get_raw(conn: RawAMQP, channel: int, queue: str) -> tuple[bytes, bytes]:
    """basic.get (no-ack) of one message: (raw property block, body)."""
    conn.send(channel, commands.Basic.Get(queue=queue, no_ack=True))
    frame_type, ch, payload = next_raw_frame(conn)
    index = struct.unpack_from(">I", payload)[0]
    assert frame_type == 1 and index == 0x003C0047, f"expected get-ok, got frame {frame_type} {payload[:40]!r}"
    frame_type, ch, payload = next_raw_frame(conn)
    assert frame_type == 2 and ch == channel
    body_size = struct.unpack_from(">Q", payload, 4)[0]
    props = payload[12:]
    body = b""
    while len(body) < body_size:
        frame_type, ch, payload = next_raw_frame(conn)
        assert frame_type == 3
        body += payload
    return props, body


def expect_raw_channel_close(conn: RawAMQP, channel: int) -> tuple[int, str]:
    """(reply code, reply text) of the channel.close that must come next on ``channel``."""
    while True:
        frame_type, ch, payload = next_raw_frame(conn)
        index = struct.unpack_from(">I", payload)[0] if frame_type == 1 else None
        if index == 0x000A0032:
            code = struct.unpack_from(">H", payload, 4)[0]
            raise AssertionError(f"connection closed with {code}: {payload[7:7 + payload[6]]!r}")
        if ch == channel and index == 0x00140028:
            code = struct.unpack_from(">H", payload, 4)[0]
            text = payload[7:7 + payload[6]].decode()
            conn.send(channel, commands.Channel.CloseOk())
            return code, text


def shortstr(data: bytes) -> bytes:
    return bytes((len(data),)) + data


def props_with_headers(table_body: bytes) -> bytes:
    return b"\x20\x00" + struct.pack(">I", len(table_body)) + table_body


def nested_arrays(depth: int) -> bytes:
    """A tagged value: ``depth`` arrays, one inside the other, the innermost empty."""
    value = b"A\x00\x00\x00\x00"
    for _ in range(depth - 1):
        value = b"A" + struct.pack(">I", len(value)) + value
    return value


@pytest.fixture
def raw(broker):
    conn = RawAMQP(broker.host, broker.port)
    conn.handshake()
    conn.open_channel(1)
    yield conn
    conn.close()


# --- every value type, byte-identical --------------------------------------------------------------

_LEAVES = st.one_of(
    st.booleans(),
    st.integers(-128, 127).map(ft.Int8), st.integers(0, 255).map(ft.UInt8),
    st.integers(-(1 << 15), (1 << 15) - 1).map(ft.Int16), st.integers(0, (1 << 16) - 1).map(ft.UInt16),
    st.integers(-(1 << 31), (1 << 31) - 1).map(ft.Int32), st.integers(0, (1 << 32) - 1).map(ft.UInt32),
    st.integers(-(1 << 63), (1 << 63) - 1).map(ft.Int64), st.integers(0, (1 << 64) - 1).map(ft.UInt64),
    st.floats(width=32, allow_nan=False).map(ft.Float32), st.floats(),
    st.builds(lambda v, s: Decimal(v).scaleb(-s), st.integers(-(1 << 31), (1 << 31) - 1), st.integers(0, 255)),
    st.text(max_size=20), st.binary(max_size=20).map(ft.RawLongStr), st.binary(max_size=20),
    st.integers(0, (1 << 64) - 1).map(ft.Timestamp), st.none(),
)
_KEYS = st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape"))
_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=12)
_HEADERS = st.dictionaries(_KEYS, _VALUES, max_size=6)
_SHORT = st.binary(max_size=40)


@st.composite
def property_blocks(draw: st.DrawFn) -> bytes:
    """A property block with any subset of the 14 basic properties, every value type in headers."""
    fields = [
        (1 << 15, lambda: shortstr(draw(_SHORT))),                      # content_type
        (1 << 14, lambda: shortstr(draw(_SHORT))),                      # content_encoding
        (1 << 13, lambda: ft.encode_table(draw(_HEADERS))),             # headers
        (1 << 12, lambda: bytes((draw(st.integers(0, 255)),))),         # delivery_mode
        (1 << 11, lambda: bytes((draw(st.integers(0, 255)),))),         # priority
        (1 << 10, lambda: shortstr(draw(_SHORT))),                      # correlation_id
        (1 << 9, lambda: shortstr(draw(_SHORT.filter(lambda b: not b.startswith(b"amq."))))),  # reply_to
        (1 << 8, lambda: shortstr(str(draw(st.integers(60_000, 10**9))).encode())),  # expiration
        (1 << 7, lambda: shortstr(draw(_SHORT))),                       # message_id
        (1 << 6, lambda: struct.pack(">Q", draw(st.integers(0, (1 << 64) - 1)))),  # timestamp
        (1 << 5, lambda: shortstr(draw(_SHORT))),                       # type
        (1 << 4, lambda: shortstr(b"guest")),                           # user_id (must be the user's)
        (1 << 3, lambda: shortstr(draw(_SHORT))),                       # app_id
        (1 << 2, lambda: shortstr(draw(_SHORT))),                       # cluster_id
    ]
    present = draw(st.lists(st.booleans(), min_size=14, max_size=14))
    present[2] = present[2] or draw(st.booleans())  # headers more often than not
    flags, body = 0, b""
    for (bit, make), on in zip(fields, present, strict=True):
        if on:
            flags |= bit
            body += make()
    return struct.pack(">H", flags) + body


def test_every_field_value_type_passes_through_byte_identical(broker, raw):
    """Published through a headers exchange (which decodes the headers) and a direct queue; read
    back with basic.get: the property block is the publisher's, byte for byte."""
    exchange, queue = uid("fv.x"), uid("fv.q")
    raw.call(1, commands.Exchange.Declare(exchange=exchange, exchange_type="headers"),
             commands.Exchange.DeclareOk)
    raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    raw.call(1, commands.Queue.Bind(queue=queue, exchange=exchange, arguments={"x-match": "all"}),
             commands.Queue.BindOk)

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(props=property_blocks(), body=st.binary(max_size=64))
    def round_trip(props: bytes, body: bytes) -> None:
        publish_raw(raw, 1, exchange, "", props, body)
        got_props, got_body = get_raw(raw, 1, queue)
        assert got_props == props
        assert got_body == body

    round_trip()
    assert "Traceback" not in broker.log


def test_timestamp_past_year_9999_in_headers_and_property(broker, raw):
    """A uint64 timestamp is valid AMQP whatever its value (RabbitMQ keeps it as an integer)."""
    queue = uid("fv.ts")
    raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    headers = b"\x01tT" + struct.pack(">Q", (1 << 64) - 1)
    props = (b"\x22\x40" + struct.pack(">I", len(headers)) + headers + shortstr(b"reply")
             + struct.pack(">Q", 1 << 63))  # headers, reply_to, timestamp
    publish_raw(raw, 1, "", queue, props, b"late")
    assert get_raw(raw, 1, queue) == (props, b"late")


# --- refused tables --------------------------------------------------------------------------------

@pytest.mark.parametrize("case, table_body, expected", [
    ("too deep", b"\x04deep" + nested_arrays(MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH} levels at 'deep'"),
    ("490 levels", b"\x01k" + nested_arrays(490), f"nested deeper than {MAX_DEPTH} levels at 'k'"),
    ("inner table past its end", b"\x05outerF\x00\x00\x00\x10\x01iS\x00\x00\x00\x01x",
     "'F' length 16 runs past the end of its container at 'outer'"),
    ("string past its table", b"\x05outerF\x00\x00\x00\x07\x01iS\x00\x00\x00\x01x",
     "'S' length 1 runs past the end of its container at 'outer''i'"),
    ("unknown type", b"\x03keyZ", "unknown field type 0x5a at 'key'"),
    ("truncated value", b"\x01kl\x00\x00", "'l' value truncated at 'k'"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else "")
def test_bad_headers_close_only_the_channel(broker, raw, case, table_body, expected):
    queue = uid("fv.bad")
    raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    raw.open_channel(2)
    publish_raw(raw, 2, "", queue, props_with_headers(table_body), b"bad")
    code, text = expect_raw_channel_close(raw, 2)
    assert code == 406, text
    assert text.startswith("PRECONDITION_FAILED - invalid headers property: ")
    assert expected in text
    # The connection, its other channel and the queue go on; nothing was enqueued.
    good = props_with_headers(b"\x01kI\x00\x00\x00\x07")
    publish_raw(raw, 1, "", queue, good, b"good")
    assert get_raw(raw, 1, queue) == (good, b"good")
    raw.send(1, commands.Basic.Get(queue=queue, no_ack=True))
    raw.expect(commands.Basic.GetEmpty, 1)
    assert "Traceback" not in broker.log and "internal error" not in broker.log


def test_bad_headers_are_logged_one_rate_limited_line_each(broker, raw):
    queue = uid("fv.log")
    raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    before = len(broker.log)
    for _ in range(60):
        raw.open_channel(2)
        publish_raw(raw, 2, "", queue, props_with_headers(b"\x01k" + nested_arrays(200)), b"x")
        assert expect_raw_channel_close(raw, 2)[0] == 406
    raw.send(2, commands.Channel.Open())
    raw.expect(commands.Channel.OpenOk, 2)
    added = broker.log[before:]
    assert "Traceback" not in added
    assert added.count("invalid headers property") <= 25, added[-2000:]
    assert len(added) < 20_000


# --- method arguments: the nesting limit, and what is accepted survives a restart --------------------

def nested_tables(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


def test_queue_declare_with_too_deep_arguments_is_refused_on_its_channel(broker, raw):
    queue = uid("fv.deepq")
    raw.open_channel(2)
    raw.send(2, commands.Queue.Declare(queue=queue, durable=True,
                                       arguments={"x-custom": nested_tables(MAX_DEPTH)}))
    code, text = expect_raw_channel_close(raw, 2)
    assert code == 406
    assert text.startswith("PRECONDITION_FAILED - invalid queue.declare: tables and arrays nested deeper "
                           f"than {MAX_DEPTH} levels at 'arguments''x-custom''n'")
    raw.send(1, commands.Queue.Declare(queue=queue, passive=True))
    code, text = expect_raw_channel_close(raw, 1)
    assert code == 404, text


def test_exchange_declare_and_bind_arguments_are_limited_too(broker, raw):
    exchange = uid("fv.deepx")
    raw.send(1, commands.Exchange.Declare(exchange=exchange, exchange_type="headers",
                                          arguments={"a": [nested_tables(MAX_DEPTH)]}))
    code, text = expect_raw_channel_close(raw, 1)
    assert (code, "invalid exchange.declare" in text, "'arguments''a'[0]" in text) == (406, True, True), text
    raw.open_channel(2)
    raw.call(2, commands.Exchange.Declare(exchange=exchange, exchange_type="headers"),
             commands.Exchange.DeclareOk)
    raw.send(2, commands.Queue.Bind(queue="nope", exchange=exchange, arguments={"k": nested_tables(200)}))
    code, text = expect_raw_channel_close(raw, 2)
    assert code == 406 and "invalid queue.bind" in text, text


@pytest.mark.skipif(not ON_LAVINPY, reason="restarts the broker")
def test_nothing_accepted_live_fails_at_boot(fresh_broker):
    """A durable queue whose argument nests to the limit is kept across a restart; one nesting
    490 levels (accepted by earlier versions, then undecodable at boot) is refused up front."""
    arguments = {"x-custom": nested_tables(MAX_DEPTH - 1), "when": datetime.datetime(2030, 1, 1,
                                                                                     tzinfo=datetime.UTC)}
    conn = RawAMQP(fresh_broker.host, fresh_broker.port)
    conn.handshake()
    conn.open_channel(1)
    conn.call(1, commands.Queue.Declare(queue="deep", durable=True, arguments=arguments),
              commands.Queue.DeclareOk)
    deepest = b"\x01k" + nested_arrays(490)
    declare = (b"\x00\x00" + shortstr(b"too-deep") + b"\x02" + struct.pack(">I", len(deepest)) + deepest)
    conn.open_channel(2)
    conn.send_raw(raw_frame(1, 2, method_payload(50, 10, declare)))
    code, text = expect_raw_channel_close(conn, 2)
    assert code == 406 and "'arguments''k'" in text, text
    conn.close()
    fresh_broker.restart()
    conn = RawAMQP(fresh_broker.host, fresh_broker.port)
    conn.handshake()
    conn.open_channel(1)
    # Redeclaring with the same arguments succeeds only if the stored ones came back equal.
    conn.call(1, commands.Queue.Declare(queue="deep", durable=True, arguments=arguments),
              commands.Queue.DeclareOk)
    conn.send(1, commands.Queue.Declare(queue="too-deep", passive=True))
    assert expect_raw_channel_close(conn, 1)[0] == 404
    conn.close()
    assert "undecodable" not in fresh_broker.log and "Traceback" not in fresh_broker.log


def test_client_properties_too_deep_close_the_connection(broker):
    conn = RawAMQP(broker.host, broker.port)
    conn.send_raw(b"AMQP\x00\x00\x09\x01")
    conn.expect(commands.Connection.Start, 0)
    conn.send(0, commands.Connection.StartOk(client_properties={"p": nested_tables(MAX_DEPTH + 5)},
                                             mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
    try:
        close = conn.expect_connection_close()
    except PeerClosed:
        pytest.fail("the broker dropped the socket without connection.close")
    assert close.reply_code == 406 and "client_properties" in close.reply_text, close
    conn.close()


# --- found by the fuzzer --------------------------------------------------------------------------

def test_user_id_that_is_not_utf8_is_refused_with_406(broker, raw):
    queue = uid("fv.uid")
    raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    publish_raw(raw, 1, "", queue, b"\x00\x10" + shortstr(b"gu\xffst"), b"x")  # user_id only
    code, text = expect_raw_channel_close(raw, 1)
    assert code == 406, text
    assert text == "PRECONDITION_FAILED - user_id property set to 'gu\\udcffst' but authenticated user was 'guest'"


def test_bind_with_a_bad_x_match_is_refused_with_406(broker, raw):
    exchange, queue = uid("fv.hx"), uid("fv.hq")
    raw.call(1, commands.Exchange.Declare(exchange=exchange, exchange_type="headers"),
             commands.Exchange.DeclareOk)
    raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    raw.send(1, commands.Queue.Bind(queue=queue, exchange=exchange, arguments={"x-match": "anyy"}))
    code, text = expect_raw_channel_close(raw, 1)
    assert code == 406
    assert text == ("PRECONDITION_FAILED - Invalid x-match field value 'anyy'; expected all, any, "
                    "all-with-x, or any-with-x")
    raw.open_channel(2)
    raw.send(2, commands.Exchange.Bind(destination=exchange, source="amq.headers",
                                       arguments={"x-match": "some"}))
    assert expect_raw_channel_close(raw, 2)[0] == 406
    assert "Traceback" not in broker.log
