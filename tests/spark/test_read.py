"""Reading stream queues: batch offset ranges, streaming restarts from a checkpoint, refusals.

The tests that need a stream queue skip themselves (stream_queue fixture) while the broker
refuses x-queue-type: stream.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pytest

from lavinpy.spark.client import AMQPParams, Connection
from lavinpy.spark.publisher import ConfirmPublisher
from lavinpy.spark.streams import StreamClient
from lavinpy.wire import properties

from .conftest import error_text, unique

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


def publish(url: str, queue: str, start: int, count: int) -> None:
    """Messages m<start>..m<start+count-1>, header i=<n>, message_id <n>, all confirmed."""
    with Connection(AMQPParams.from_url(url)).open() as conn:
        pub = ConfirmPublisher(conn)
        for i in range(start, start + count):
            props = properties.encode_property_values(
                headers={"i": i, "kind": "test"}, message_id=str(i), delivery_mode=2, content_type="text/plain",
                timestamp=1700000000 + i)
            pub.publish("", queue, b"m%d" % i, props)
        pub.wait_for_confirms()
        pub.close()


def first_offset(url: str, queue: str) -> int:
    with StreamClient(AMQPParams.from_url(url), queue) as client:
        first = client.first_offset(wait=5.0)
    assert first is not None
    return first


def read(spark, url: str, queue: str, **options: str):
    reader = spark.read.format("lavinpy").option("url", url).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_of_an_offset_range(spark, broker, stream_queue) -> None:
    queue = stream_queue()
    assert read(spark, broker.url, queue).count() == 0  # empty stream: one empty partition
    publish(broker.url, queue, 0, 1000)
    base = first_offset(broker.url, queue)  # lavinpy: 1, RabbitMQ: 0

    rows = read(spark, broker.url, queue).orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(base, base + 1000))
    for i, row in enumerate(rows):
        assert row.body == b"m%d" % i
        assert row.routing_key == queue and row.exchange == ""
        assert row.headers == {"i": str(i), "kind": "test"}  # x-stream-offset is the offset column
        assert (row.message_id, row.content_type, row.delivery_mode) == (str(i), "text/plain", 2)
        assert int(row.timestamp.timestamp()) == 1700000000 + i

    part = read(spark, broker.url, queue, startingOffset=str(base + 100), endingOffset=str(base + 200),
                maxMessagesPerPartition="30")
    assert part.rdd.getNumPartitions() == 4
    got = part.select("offset", "body").orderBy("offset").collect()
    assert [(r.offset, r.body) for r in got] == [(base + i, b"m%d" % i) for i in range(100, 200)]

    last = read(spark, broker.url, queue, startingOffset="last").select("offset").collect()
    assert [r.offset for r in last] == [base + 999]
    assert read(spark, broker.url, queue, startingOffset="next").count() == 0

    narrow = spark.read.format("lavinpy").schema("body BINARY, offset LONG").option("url", broker.url) \
        .option("queue", queue).option("endingOffset", str(base + 3)).load()
    assert [(r.body, r.offset) for r in narrow.collect()] == [(b"m0", base), (b"m1", base + 1), (b"m2", base + 2)]


def test_streaming_read_restarted_from_checkpoint_has_no_gap_and_no_duplicate(spark, broker, stream_queue,
                                                                              tmp_path: Path) -> None:
    queue = stream_queue()
    publish(broker.url, queue, 0, 3000)
    base = first_offset(broker.url, queue)
    checkpoint = tmp_path / "checkpoint"
    out = tmp_path / "out"

    def record(batch_df, batch_id: int) -> None:
        # every execution of a batch, replays included, lands in its own directory
        batch_df.select("offset", "body").write.parquet(str(out / f"batch={batch_id}" / f"run={uuid.uuid4().hex}"))

    def run() -> None:
        stream = (spark.readStream.format("lavinpy").option("url", broker.url).option("queue", queue)
                  .option("maxMessagesPerTrigger", "1000").load())
        query = (stream.writeStream.foreachBatch(record).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None

    run()
    batches = sorted(int(p.name.split("=")[1]) for p in out.iterdir())
    assert batches == [0, 1, 2], batches  # 3000 messages, 1000 per trigger

    # Simulate a crash after batch 2's offsets were logged but before it committed: the restarted
    # query must replay exactly the same range, then go on with what was published meanwhile.
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    publish(broker.url, queue, 3000, 1500)
    run()

    runs = spark.read.parquet(str(out)).select("batch", "run", "offset", "body").collect()
    by_run: dict[tuple[int, str], list[int]] = {}
    for r in runs:
        by_run.setdefault((r.batch, r.run), []).append(r.offset)
        assert r.body == b"m%d" % (r.offset - base)
    batch_two = [sorted(v) for (b, _), v in by_run.items() if b == 2]
    assert len(batch_two) == 2 and batch_two[0] == batch_two[1], "the replayed batch differs from the original"
    once = {}
    for (b, _), offsets in by_run.items():
        once.setdefault(b, sorted(offsets))
    everything = sorted(o for offsets in once.values() for o in offsets)
    assert everything == list(range(base, base + 4500)), "a gap or a duplicate across the restart"


def test_reading_a_missing_queue_fails_clearly(spark, broker) -> None:
    queue = unique("spark-missing")
    with pytest.raises(Exception) as info:
        read(spark, broker.url, queue).collect()
    assert f"queue '{queue}' not found" in error_text(info.value)


def test_end_offset_probe(broker, stream_queue) -> None:
    queue = stream_queue()
    params = AMQPParams.from_url(broker.url)
    with StreamClient(params, queue) as client:
        assert client.end_offset() is None  # empty
        publish(broker.url, queue, 0, 10)
        base = client.first_offset(wait=5.0)
        assert client.end_offset() == base + 10
        assert [d.offset for d in client.read_range(base + 3, base + 6)] == [base + 3, base + 4, base + 5]
        assert client.offset_at(dt.datetime(2000, 1, 1, tzinfo=dt.UTC)) == base
        assert client.offset_at(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)) is None


def test_end_offset_with_a_count_that_lags_far_behind(broker, stream_queue, monkeypatch) -> None:
    """A broker whose count of a stream lags by more than the capped read from the estimate covers
    (RabbitMQ 3.10 counted 485,781 of 999,424 confirmed messages): the end still comes from a
    consumer at "last", never short of a confirmed message."""
    from lavinpy.spark import streams

    queue = stream_queue()
    publish(broker.url, queue, 0, 600)
    params = AMQPParams.from_url(broker.url)
    with StreamClient(params, queue, prefetch=50) as client:
        base = client.first_offset(wait=5.0)
        real_count = client.message_count()
        assert real_count == 600 and client.end_offset() == base + 600
        monkeypatch.setattr(streams, "_END_MAX_S", 0.0)  # the read from the estimate stops at its first buffer
        monkeypatch.setattr(client, "_message_count", lambda: real_count // 3)
        monkeypatch.setitem(client.conn.server_properties, "product", "RabbitMQ")  # its probes, not lavinpy's
        assert client.end_offset() == base + 600


def test_lavinpy_s_end_is_its_newest_message_without_a_pause(broker, stream_queue, monkeypatch) -> None:
    """lavinpy starts a consumer at "last" on the newest message and counts exactly: the end is that
    delivery's offset plus one, with no read waiting for deliveries to pause (50 ms a query)."""
    queue = stream_queue()
    params = AMQPParams.from_url(broker.url)
    with StreamClient(params, queue) as client:
        def no_pause(*_args: object) -> None:
            raise AssertionError("a read to a pause")

        monkeypatch.setattr(client, "_read_to_quiet", no_pause)
        assert client.end_offset() is None  # empty: the count says so
        publish(broker.url, queue, 0, 25)
        assert client.end_offset() == client.first_offset(wait=5.0) + 25
