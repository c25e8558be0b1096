"""The connector's AMQP clients without Spark: wire codec, options, confirms, failures."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
from pamqp import commands

from lavinpy.spark.client import AMQPParams, BrokerClosed, Connection, ConnectionLost
from lavinpy.spark.options import FIRST, LAST, NEXT, OptionError, ReadOptions, WriteOptions, parse_start
from lavinpy.spark.publisher import ConfirmPublisher, PublishError
from lavinpy.wire import field_table, properties
from lavinpy.wire import writer as frames_mod
from tests.helpers import free_port, wait_until

from .conftest import EXTERNAL_URL, REPO_ROOT, _port_open, drain, unique

pytestmark = [pytest.mark.spark, pytest.mark.timeout(60)]


def test_field_table_round_trip() -> None:
    table = {"s": "text", "i": -5, "big": 1 << 40, "t": True, "f": 1.5, "b": b"\x00raw",
             "ts": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "d": Decimal("12.34"),
             "nested": {"a": [1, "two", None]}, "none": None}
    encoded = field_table.encode_table(table)
    assert field_table.decode_table(encoded, 4, len(encoded), typed=False) == table


def test_properties_round_trip() -> None:
    raw = properties.encode_property_values(
        content_type="application/json", headers={"k": "v"}, delivery_mode=2, priority=7, correlation_id="c",
        reply_to="r", expiration="1000", message_id="m",
        timestamp=1700000000, type="t", user_id="guest", app_id="a", content_encoding="gzip")
    props = properties.property_values(raw, typed=False)
    assert dict(zip(properties.PROPERTY_NAMES, props, strict=True)) == {
        "content_type": "application/json", "content_encoding": "gzip", "headers": {"k": "v"}, "delivery_mode": 2,
        "priority": 7, "correlation_id": "c", "reply_to": "r", "expiration": "1000", "message_id": "m",
        "timestamp": 1700000000, "type": "t", "user_id": "guest", "app_id": "a", "cluster_id": None}


def test_url_and_options() -> None:
    p = AMQPParams.from_url("amqp://u%40x:p%3Aw@example.test:5673/my%2Fvhost")
    assert (p.username, p.password, p.host, p.port, p.vhost) == ("u@x", "p:w", "example.test", 5673, "my/vhost")
    assert AMQPParams.from_url("amqp://h").vhost == "/"
    assert AMQPParams.from_url("amqp://h/%2f").vhost == "/"
    with pytest.raises(ValueError, match="use amqp:// or amqps://"):
        AMQPParams.from_url("http://h/")
    tls = AMQPParams.from_url("amqps://h/?cacertfile=/ca.pem&verify=verify_none&server_name_indication=n")
    assert (tls.port, tls.tls.cacertfile, tls.tls.verify, tls.tls.server_name) == (5671, "/ca.pem", False, "n")
    assert AMQPParams.from_url("amqp://h").tls is None and AMQPParams.from_url("amqp://h").port == 5672
    w = WriteOptions.parse({"QUEUE": "jobs", "Confirm": "false", "maxInFlight": "100"})
    assert (w.exchange, w.routing_key, w.confirm, w.persistent, w.mandatory, w.max_in_flight) == \
        ("", "jobs", False, True, True, 100)
    with pytest.raises(OptionError, match="maxInFlight"):
        WriteOptions.parse({"queue": "q", "maxInFlight": "0"})
    with pytest.raises(OptionError, match="exchange"):
        WriteOptions.parse({})
    r = ReadOptions.parse({"queue": "s", "startingOffset": "42", "endingOffset": "100"})
    assert (r.starting_offset, r.ending_offset) == (42, 100)
    # Each kind's own default prefetch (a stream's credit, a queue's unacked messages); one given
    # applies to both.
    assert (r.stream_prefetch, r.queue_prefetch) == (16384, 2000)
    given = ReadOptions.parse({"queue": "s", "prefetch": "300"})
    assert (given.stream_prefetch, given.queue_prefetch) == (300, 300)
    with pytest.raises(OptionError, match="prefetch"):
        ReadOptions.parse({"queue": "s", "prefetch": "0"})
    assert parse_start(None) == FIRST and parse_start("earliest") == FIRST
    assert parse_start("last") == LAST and parse_start("latest") == NEXT and parse_start("next") == NEXT
    assert parse_start("2024-05-01T12:00:00Z") == dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)
    with pytest.raises(OptionError, match="startingOffset"):
        parse_start("yesterday")
    with pytest.raises(OptionError, match="queue"):
        ReadOptions.parse({})
    assert ReadOptions.parse({"queue": "q"}).queue_type == "auto"
    assert ReadOptions.parse({"queue": "q", "QueueType": "Classic"}).queue_type == "classic"
    with pytest.raises(OptionError, match="queueType='fifo': expected auto, stream, classic or quorum"):
        ReadOptions.parse({"queue": "q", "queueType": "fifo"})


@pytest.mark.parametrize(("given", "meant"), [
    ({"queue": "q", "prefech": "5"}, "prefetch"),
    ({"queue": "q", "startingOffsets": "earliest"}, "startingOffset"),  # Kafka's names
    ({"queue": "q", "maxOffsetsPerTrigger": "100"}, "maxMessagesPerTrigger"),
    ({"queue": "q", "routing_key": "k"}, "routingKey"),
    ({"queue": "q", "consumer": "4"}, "consumers"),
])
def test_an_option_near_one_of_ours_is_refused_naming_ours(given: dict, meant: str) -> None:
    """A typo or another source's name would leave our default in force without a word."""
    typo = next(key for key in given if key != "queue")
    for parse in (ReadOptions.parse, WriteOptions.parse):
        with pytest.raises(OptionError, match=f"option '{typo}' is not an option of the lavinpy source: "
                                              f"did you mean {meant}\\?"):
            parse(given)


def test_options_far_from_ours_pass_as_spark_hands_them() -> None:
    """Spark gives a source options of its own (a path, a streaming query's checkpoint location)."""
    spark_own = {"path": "/data", "checkpointLocation": "/cp", "queryName": "jobs"}
    assert ReadOptions.parse({"queue": "q", **spark_own}).queue == "q"
    assert WriteOptions.parse({"queue": "q", **spark_own}).routing_key == "q"


def test_split_range() -> None:
    pytest.importorskip("pyspark")
    from lavinpy.spark.datasource import split_range

    parts = split_range(10, 1_010, 300)
    assert [(p.start, p.end) for p in parts] == [(10, 260), (260, 510), (510, 760), (760, 1010)]
    assert split_range(5, 5, 10) == []
    assert [(p.start, p.end) for p in split_range(0, 3, 10)] == [(0, 3)]


def test_bad_credentials_and_vhost_fail_clearly(broker) -> None:
    base = AMQPParams.from_url(broker.url)
    with pytest.raises(BrokerClosed) as info:
        Connection(dataclasses.replace(base, password="wrong")).open()
    assert info.value.reply_code == 403
    with pytest.raises(BrokerClosed) as info:
        Connection(dataclasses.replace(base, vhost="no-such-vhost")).open()
    assert info.value.reply_code in (402, 530)


def test_publisher_confirms_everything(broker, admin) -> None:
    queue = unique("spark-q")
    admin.queue_declare(queue, durable=True)
    with Connection(AMQPParams.from_url(broker.url)).open() as conn:
        pub = ConfirmPublisher(conn, max_in_flight=500)
        for i in range(5000):
            pub.publish("", queue, b"m%d" % i, properties.encode_property_values(delivery_mode=2))
        pub.wait_for_confirms()
        assert pub.unconfirmed == 0 and pub.published == 5000
        pub.close()
    assert sorted(int(b[1:]) for _, _, b in drain(broker.url, queue, 5000)) == list(range(5000))


def test_publisher_reports_nacks(broker, admin) -> None:
    queue = unique("spark-q")
    admin.queue_declare(queue, durable=True, arguments={"x-max-length": 5, "x-overflow": "reject-publish"})
    with Connection(AMQPParams.from_url(broker.url)).open() as conn:
        pub = ConfirmPublisher(conn)
        try:
            for _ in range(20):
                pub.publish("", queue, b"x")
            pub.wait_for_confirms()
        except PublishError as exc:
            assert "nacked" in str(exc)
            return
    pytest.skip("the broker accepted messages past x-max-length with x-overflow=reject-publish, so nothing was "
                "nacked (see test_confirm_tracking_with_nacks for the client side)")


class _FakeConnection:
    """Just enough of Connection for ConfirmPublisher: scripted incoming frames."""

    frame_max = 131072
    params = AMQPParams()

    def __init__(self) -> None:
        self.incoming: list[tuple[int, int, bytes]] = []

    def open_channel(self) -> int:
        return 1

    def call(self, *args: object) -> None:
        return None

    def send(self, data: bytes) -> None:
        pass

    def read_frames(self, timeout: float | None) -> list[tuple[int, int, bytes]]:
        frames, self.incoming = self.incoming, []
        return frames


def _ack(tag: int, multiple: bool, nack: bool = False) -> tuple[int, int, bytes]:
    method_id = 120 if nack else 80
    payload = (60).to_bytes(2, "big") + method_id.to_bytes(2, "big") + tag.to_bytes(8, "big")
    return (1, 1, payload + (b"\x01" if multiple else b"\x00"))


def test_confirm_tracking_with_nacks() -> None:
    conn = _FakeConnection()
    pub = ConfirmPublisher(conn, max_in_flight=100)  # type: ignore[arg-type]
    for _ in range(10):
        pub.publish("", "q", b"x")
    conn.incoming = [_ack(3, False), _ack(2, True), _ack(5, False), _ack(4, False)]
    pub._pump(0)
    assert pub.unconfirmed == 5 and pub._acked_upto == 5
    conn.incoming = [_ack(10, True)]
    pub.wait_for_confirms()
    assert pub.unconfirmed == 0
    pub.publish("", "q", b"x")
    pub.publish("", "q", b"x")
    conn.incoming = [_ack(11, False), _ack(12, False, nack=True)]
    with pytest.raises(PublishError, match="nacked 1 of 12 messages \\(first delivery tag 12\\)"):
        pub.wait_for_confirms()


@pytest.mark.skipif(bool(EXTERNAL_URL), reason="kills its own broker process")
def test_connection_drop_leaves_messages_unconfirmed_and_fails(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAVINPY_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "lavinpy", "--data-dir", str(tmp_path / "data"), "--amqp-port",
                             str(port), "--http-port", "0", "--prometheus-port", "0", "--mqtt-port", "0",
                             "--log-level", "error"],
                            cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _port_open(port):
            assert proc.poll() is None and time.monotonic() < deadline, "lavinpy did not start"
            time.sleep(0.05)
        conn = Connection(AMQPParams.from_url(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=10)).open()
        pub = ConfirmPublisher(conn, mandatory=False, max_in_flight=1_000_000)
        killer = threading.Timer(0.3, lambda: proc.send_signal(signal.SIGKILL))
        killer.start()
        with pytest.raises(PublishError, match="left unconfirmed") as info:
            body = b"y" * 1000
            for _ in range(2_000_000):
                pub.publish("", "", body)  # default exchange, empty routing key: dropped, still confirmed
            pub.wait_for_confirms()
        assert "at-least-once" in str(info.value)
        killer.join()
        conn.abort()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_stream_reader_offsets_and_properties_with_shared_blocks(broker, admin) -> None:
    """Deliveries that share a property block (decoded once by the reader) each keep their own offset;
    blocks that differ, carry a publisher's own x-stream-offset or a look-alike value read as published."""
    import pika

    from lavinpy.spark.streams import StreamClient

    queue = unique("spark-s")
    admin.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
    look_alike = "\x0fx-stream-offsetl" + "\x00" * 7 + "\x09"
    kinds = [
        ({"k": "v"}, "text/plain"),
        (None, None),
        ({"x-stream-offset": 999, "other": "keep"}, None),
        ({"s": look_alike}, "a"),
    ]
    for i in range(400):
        headers, content_type = kinds[(i // 3) % len(kinds)]
        admin.basic_publish("", queue, b"m%d" % i,
                            pika.BasicProperties(headers=headers, content_type=content_type, message_id=str(i % 2)))
    with StreamClient(AMQPParams.from_url(broker.url), queue, prefetch=50) as client:
        first = client.first_offset()  # lavinpy's streams start at 1, RabbitMQ's at 0
        assert first is not None
        got = list(client.read_range(first, first + 400))
    assert [d.offset for d in got] == list(range(first, first + 400))
    for i, d in enumerate(got):
        headers, content_type = kinds[(i // 3) % len(kinds)]
        expected = {k: v for k, v in (headers or {}).items() if k != "x-stream-offset"} or None
        assert (d.body, d.properties[0], d.properties[2], d.properties[8]) == \
            (b"m%d" % i, content_type, expected, str(i % 2))


def test_stream_reader_leaves_no_tracked_offset(broker, admin) -> None:
    """The reader names its consumers (a short tag on every delivery) and asks the broker not to track
    them: a consumer that later comes with the same tag and no x-stream-offset starts at the stream's
    next message, as any new consumer does, not where the reader's acks left off."""
    from lavinpy.spark.streams import StreamClient

    queue = unique("spark-s")
    admin.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(100):
        admin.basic_publish("", queue, b"old%d" % i)
    with StreamClient(AMQPParams.from_url(broker.url), queue, prefetch=10) as client:
        first = client.first_offset()
        assert first is not None
        assert [d.body for d in client.read_range(first, first + 60)] == [b"old%d" % i for i in range(60)]
    got: list[bytes] = []
    admin.basic_qos(prefetch_count=10)
    admin.basic_consume(queue, lambda ch, method, props, body: got.append(body), consumer_tag="s")
    admin.connection.process_data_events(time_limit=0.3)
    admin.basic_publish("", queue, b"new")
    wait_until(lambda: (admin.connection.process_data_events(time_limit=0.05), got)[1], timeout=10)
    assert got == [b"new"]


def test_stream_reader_chunks_mix_large_small_and_empty_bodies(broker, admin) -> None:
    """Bodies split over frames (the generic path) between whole ones (the column scan), empty bodies,
    a range starting and ending inside the stream: the same messages by rows (read_range) and as Arrow
    batches of the columns (read_range_into, a batch every 64 rows or so)."""
    import pika
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from lavinpy.spark.read_rows import BatchBuilder, read_schema
    from lavinpy.spark.streams import ColumnsSink, StreamClient

    queue = unique("spark-s")
    admin.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})

    def body(i: int) -> bytes:
        if i % 50 == 3:
            return bytes([i % 256]) * 300_000  # more than frame_max: several body frames
        return b"" if i % 7 == 0 else b"m%d" % i

    def app_id(i: int) -> str | None:
        return None if i % 2 else f"a{i % 4}"

    for i in range(300):
        admin.basic_publish("", queue, body(i), pika.BasicProperties(app_id=app_id(i)))
    params = AMQPParams.from_url(broker.url)
    with StreamClient(params, queue, prefetch=40) as client:
        oldest = client.first_offset()  # lavinpy's streams start at 1, RabbitMQ's at 0
        assert oldest is not None
        rows = list(client.read_range(oldest + 10, oldest + 290))
    assert [d.offset for d in rows] == list(range(oldest + 10, oldest + 290))
    assert [d.body for d in rows] == [body(i) for i in range(10, 290)]
    assert [d.properties[12] for d in rows] == [app_id(i) for i in range(10, 290)]
    assert {d.routing_key for d in rows} == {queue} and {d.exchange for d in rows} == {""}
    schema = to_arrow_schema(read_schema(), timezone="UTC")
    builder = BatchBuilder(schema, batch_rows=64)
    sink = ColumnsSink(builder.batch_rows)
    batches = []
    scanned = generic = 0  # rows of the two paths' runs, in the range or not
    large_generic = True  # every body over several frames came by the generic path
    with StreamClient(params, queue, prefetch=40) as client:
        for lo, hi in client.read_range_into(sink, oldest + 10, oldest + 290):
            cols = sink.take()
            batches.append(builder.build(cols, lo, hi))
            starts = [run[0] for run in cols.runs] + [cols.rows]
            for run, first, stop in zip(cols.runs, starts, starts[1:], strict=False):
                if run[4] is None:
                    generic += stop - first
                else:
                    scanned += stop - first
                    large_generic = large_generic and all(len(cols.body(row)) < 300_000 for row in range(first, stop))
    assert len(batches) > 1 and scanned and generic and large_generic
    by_columns = pa.Table.from_batches(batches, schema)
    assert by_columns.equals(plain_table(schema, rows, [False] * len(rows)))
    assert by_columns.column("offset").to_pylist() == list(range(oldest + 10, oldest + 290))
    assert by_columns.column("body").to_pylist() == [body(i) for i in range(10, 290)]
    assert by_columns.column("app_id").to_pylist() == [app_id(i) for i in range(10, 290)]


def test_stream_range_read_is_sent_nothing_past_its_end(broker, admin, monkeypatch) -> None:
    """A range inside a longer stream: the reader's acks never give the broker credit past the range's
    end, so no delivery arrives that the channel's close would only drop (up to a prefetch of them,
    each through the generic frame path), nor the first credit of a range shorter than the prefetch.
    The range still comes whole, for prefetches that divide it or not; read to close its connection
    without a wait at the end (a Spark task's), the same, the socket closed once the close-ok came."""
    import pika

    from lavinpy.spark.streams import ColumnsSink, StreamClient
    from lavinpy.wire import client_blocking
    from lavinpy.wire.client import method_id, split_frames

    queue = unique("spark-s")
    admin.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(1200):
        admin.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    dropped = []
    parse = client_blocking.BlockingConnection._parse

    def counting_parse(self):  # noqa: ANN001, ANN202 - a test wrapper
        if self._closing_channels:
            frames, _used = split_frames(self._rbuf)
            dropped.extend(ch for ftype, ch, payload in frames
                           if ch in self._closing_channels and ftype == 1 and method_id(payload) == (60 << 16 | 60))
        return parse(self)

    monkeypatch.setattr(client_blocking.BlockingConnection, "_parse", counting_parse)
    ranges = ((40, 100, 500), (64, 1, 1001), (7, 333, 1111), (50, 1101, 1201), (2, 10, 50), (1, 5, 9),
              (64, 1101, 1121), (8192, 7, 8))
    for i, (prefetch, start, end) in enumerate(ranges):
        then_close = i % 2 == 1
        sink = ColumnsSink(batch_rows=50)
        offsets: list[int] = []
        received: list[int] = []  # every delivery the columns took, in the range or not
        with StreamClient(AMQPParams.from_url(broker.url), queue, prefetch=prefetch) as client:
            conn = client.conn
            for lo, hi in client.read_range_into(sink, start, end, then_close=then_close):
                columns = sink.take()
                offsets.extend(columns.offset_values[lo:hi])
                received.extend(columns.offset_values)
            assert (client._conn is None) == then_close
        assert offsets == list(range(start, end)), prefetch
        assert received == offsets and dropped == [], (prefetch, len(received) - len(offsets), len(dropped))
        wait_until(lambda: (client_blocking._closing.reap(), conn.sock is None)[1], what="the close-ok")  # noqa: B023


def plain_table(schema, rows, redelivered):  # noqa: ANN001, ANN201 - a test helper
    """Arrow's conversion of plain lists of the rows' values (Delivery-like: offset, exchange, routing
    key, properties, body)."""
    import pyarrow as pa

    index = {"content_type": 0, "content_encoding": 1, "headers": 2, "delivery_mode": 3, "priority": 4,
             "correlation_id": 5, "reply_to": 6, "expiration": 7, "message_id": 8, "timestamp": 9, "type": 10,
             "user_id": 11, "app_id": 12}
    columns = {"offset": [d[0] for d in rows], "exchange": [d[1] for d in rows], "routing_key": [d[2] for d in rows],
               "body": [d[4] for d in rows], "redelivered": list(redelivered)}
    for name, i in index.items():
        columns[name] = [d[3][i] for d in rows]
    columns["timestamp"] = [None if t is None else t * 1_000_000 for t in columns["timestamp"]]
    return pa.table([pa.array(columns[name], schema.field(name).type) for name in schema.names], schema=schema)


def delivery_columns(blocks, bodies, redelivered=None, generic=()):  # noqa: ANN001, ANN201 - a test helper
    """DeliveryColumns of deliveries (exchange "", routing key "rk") with these property blocks and bodies:
    scanned from one receive buffer, but the rows in ``generic``, appended as the generic path hands
    them over (decoded, the offset out of the headers); decoded."""
    from lavinpy.wire.delivery_columns import DeliveryColumns, split_offset

    cols = DeliveryColumns()
    flags = redelivered or [False] * len(blocks)
    for i, (block, body, flag) in enumerate(zip(blocks, bodies, flags, strict=True)):
        if i in generic:
            props = properties.property_values(block, typed=False)
            cols.append(i + 1, split_offset(props), "", "rk", props, body, flag)
        else:
            buf = b"".join(frames_mod.deliver(1, "ctag", i + 1, flag, "", "rk", block, body, 131072))
            assert cols.scan(buf, 1)[:2] == (1, len(buf))
        if i % 2:
            cols.decode()  # as a reader decodes after each receive
    cols.decode()
    return cols


def test_offsets_found_by_the_decode_fill_only_their_own_rows() -> None:
    """A block whose x-stream-offset is not the stamped trailing entry (another broker's order, or a type
    other than long) gets its offset from the decode; rows whose offset the scan read keep theirs; the
    offset column is the int64s as they are when every row has one, all null when none has, and
    null exactly where a row has none otherwise."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from lavinpy.spark.read_rows import BatchBuilder, read_schema
    from lavinpy.wire.delivery_columns import NO_OFFSET, STREAM_OFFSET_ENTRY

    def stamped(block: bytes, offset: int) -> bytes:
        return properties.append_header_entry(block, STREAM_OFFSET_ENTRY + offset.to_bytes(8, "big", signed=True))

    trailing = properties.encode_property_values(headers={"a": 1})
    elsewhere = properties.encode_property_values(headers={"x-stream-offset": 5, "z": 1})
    last_int = properties.encode_property_values(headers={"z": "y", "x-stream-offset": 6})  # type 'I'
    plain = properties.encode_property_values(app_id="p")
    schema = to_arrow_schema(read_schema(), timezone="UTC")
    builder = BatchBuilder(schema)
    cases = [
        ([stamped(trailing, 7), elsewhere, elsewhere, plain, last_int, stamped(plain, 8)], [7, 5, 5, None, 6, 8]),
        ([stamped(trailing, 1), stamped(trailing, 1 << 40), stamped(trailing, -3)], [1, 1 << 40, -3]),
        ([plain, trailing, plain], [None] * 3),
    ]
    for blocks, offsets in cases:
        for generic in ((), (1,), (0, 2)):
            cols = delivery_columns(blocks, [b"b%d" % i for i in range(len(blocks))], generic=generic)
            assert list(cols.offset_values) == [NO_OFFSET if o is None else o for o in offsets]
            assert cols.missing == offsets.count(None)
            batch = builder.build(cols)
            assert batch.column("offset").equals(pa.array(offsets, pa.int64())), (offsets, generic)
            headers = [None if h is None else {k: str(v) for k, v in h.items()}
                       for h in (properties.property_values(block, typed=False)[2] for block in blocks)]
            for h in headers:
                if h is not None:
                    h.pop("x-stream-offset", None)
            assert batch.column("headers").to_pylist() == [None if not h else list(h.items()) for h in headers]


def test_queue_read_columns_against_plain_conversion() -> None:
    """Queue reads' columns (no offsets, one property block or several, some or no redelivered messages,
    repeated integer properties, null columns, rows scanned or appended by the generic path, a batch
    whole or a slice of it) equal Arrow's conversion of plain lists."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from lavinpy.spark.read_rows import BatchBuilder, read_schema

    schema = to_arrow_schema(read_schema(), timezone="UTC")
    shared = properties.encode_property_values(delivery_mode=2, content_type="text/plain")
    other = properties.encode_property_values(delivery_mode=1, priority=3, app_id="app", timestamp=1_700_000_000)
    for blocks, flags in (([shared] * 9, [False] * 9), ([shared] * 4 + [other] * 5, [False, True] + [False] * 7),
                          ([other, shared] * 3, [True] * 6)):
        n = len(blocks)
        bodies = [b"m%d" % i if i % 4 else b"" for i in range(n)]  # empty bodies too
        rows = [(None, "", "rk", properties.property_values(block, typed=False), body)
                for block, body in zip(blocks, bodies, strict=True)]
        for generic in ((), (0, 1), tuple(range(2, n))):
            cols = delivery_columns(blocks, bodies, flags, generic)
            assert cols.missing == n and cols.redelivered == [i for i, flag in enumerate(flags) if flag]
            builder = BatchBuilder(schema)
            got = builder.build(cols)
            assert pa.Table.from_batches([got], schema).equals(plain_table(schema, rows, flags)), (blocks, flags)
            part = builder.build(cols, 1, n - 1)
            assert pa.Table.from_batches([part], schema).equals(plain_table(schema, rows[1:n - 1], flags[1:n - 1]))


def _socket_connection() -> tuple[Connection, socket.socket]:
    """A Connection on one end of a socket pair (no handshake: its receive side alone) and the other end."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    conn = Connection(AMQPParams(timeout=5))
    conn.sock = ours
    return conn, theirs


def test_received_bytes_are_appended_to_the_receive_buffer_and_a_close_is_told() -> None:
    """Reads land after what rbuf holds (straight into it on the compiled path); nothing there is no
    read; the peer's close is ConnectionLost."""
    conn, peer = _socket_connection()
    conn.rbuf.extend(b"kept")
    del conn.rbuf[:2]  # a parser consumed from the front
    assert not conn.wait_readable(0.05)
    data = bytes(range(256)) * 5000  # more than one read takes
    sender = threading.Thread(target=peer.sendall, args=(data,))
    sender.start()
    while len(conn.rbuf) < 2 + len(data):
        assert conn.wait_readable(2)
    sender.join()
    assert bytes(conn.rbuf) == b"pt" + data
    peer.close()
    with pytest.raises(ConnectionLost, match="closed by the broker"):
        conn.wait_readable(2)


def test_a_consume_ok_at_the_front_is_taken_alone_and_the_deliveries_after_it_stay_raw() -> None:
    """wait_method_id_first parses only the reply (heartbeats before it dropped); the deliveries that
    came in the same read stay bytes in rbuf. Anything else at the front goes the general way: kept in
    the backlog, or a channel.close raised as BrokerClosed."""
    consume_ok = frames_mod.method_frame(1, commands.Basic.ConsumeOk(consumer_tag="t"))
    deliver = frames_mod.method_frame(1, commands.Basic.Deliver(consumer_tag="t", delivery_tag=1, exchange="",
                                                               routing_key="q"))
    heartbeat = bytes([8, 0, 0, 0, 0, 0, 0, 0xCE])
    mid = commands.Basic.ConsumeOk.index
    conn, peer = _socket_connection()
    peer.sendall(heartbeat + consume_ok[:5])  # the reply split over two reads
    threading.Timer(0.1, peer.sendall, (consume_ok[5:] + deliver,)).start()
    assert conn.wait_method_id_first(1, mid)[:4] == consume_ok[7:11]
    deadline = time.monotonic() + 2
    while len(conn.rbuf) < len(deliver) and time.monotonic() < deadline:
        conn.wait_readable(0.1)
    assert bytes(conn.rbuf) == deliver and not conn.has_backlog

    conn, peer = _socket_connection()
    peer.sendall(deliver + consume_ok)  # a frame before the reply: the general way keeps it
    assert conn.wait_method_id_first(1, mid)[:4] == consume_ok[7:11]
    assert conn.has_backlog
    conn.unread_backlog()
    assert bytes(conn.rbuf) == deliver

    conn, peer = _socket_connection()
    peer.sendall(frames_mod.method_frame(1, commands.Channel.Close(reply_code=404, reply_text="NOT_FOUND - no queue",
                                                                   class_id=60, method_id=20)))
    with pytest.raises(BrokerClosed) as info:
        conn.wait_method_id_first(1, mid)
    assert info.value.reply_code == 404


def test_a_connection_closed_soon_is_closed_once_and_its_socket_once_the_close_ok_came(broker) -> None:
    """close_soon sends connection.close without waiting; a later close() (a with block's end) sends
    nothing more; the closing list closes the socket once the broker's close-ok has been read."""
    from lavinpy.wire import client_blocking

    conn = Connection(AMQPParams.from_url(broker.url)).open()
    conn.close_soon()
    assert any(each is conn for each, _since in client_blocking._closing.connections)
    sent: list[bytes] = []
    conn.send = sent.append  # type: ignore[method-assign]
    conn.close()
    conn.close_soon()
    assert sent == []
    wait_until(lambda: (client_blocking._closing.reap(), conn.sock is None)[1], what="the close-ok")
    assert not any(each is conn for each, _since in client_blocking._closing.connections)


def test_a_task_connection_has_a_fixed_receive_buffer_where_the_system_allows_it(broker) -> None:
    """A read task's connection takes a fixed 4 MiB receive buffer (the kernel doubles it for its own
    bookkeeping) when net.core.rmem_max allows one that large; otherwise the kernel's autotuning stays,
    since a buffer it caps lower would read slower."""
    from lavinpy.spark import client

    with Connection(AMQPParams.from_url(broker.url)).open() as conn:
        assert conn.sock is not None
        size = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    if client._rmem_max() >= client.RECEIVE_BUFFER:
        assert size == 2 * client.RECEIVE_BUFFER
    else:
        assert size < 2 * client.RECEIVE_BUFFER  # not locked: the kernel's default, autotuned
