"""Reading classic and quorum queues: batch drains, typed headers, acks tied to Spark's commit
(a failed query's messages come back redelivered to the restarted one), one clear error per bad option."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pamqp import commands

from lavinpy.spark import queues as queues_module
from lavinpy.spark.client import AMQPParams, Connection
from lavinpy.spark.publisher import ConfirmPublisher
from lavinpy.spark.queues import MAX_PREFETCH, QUEUE, STREAM, drain_partition, queue_kind
from lavinpy.spark.streams import ColumnsSink, StreamReadError
from lavinpy.wire import properties
from tests.e2e.conftest import LocalBroker
from tests.e2e.tls_certs import CA
from tests.helpers import free_ports, wait_until

from .conftest import error_text, unique

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

HEADERS_SCHEMA = ("body BINARY, redelivered BOOLEAN, offset LONG, headers STRUCT<i: LONG, f: DOUBLE, ok: BOOLEAN, "
                  "at: TIMESTAMP, price: DECIMAL(10,2), meta: STRING, tags: MAP<STRING, STRING>, missing: INT>")


def declare(admin, kind: str) -> str:
    queue = unique(f"spark-{kind}")
    admin.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
    return queue


def publish(url: str, queue: str, start: int, count: int) -> None:
    """Confirmed messages with headers of every type (pika cannot encode floats: lavinpy's own client)."""
    with Connection(AMQPParams.from_url(url)).open() as conn:
        pub = ConfirmPublisher(conn)
        for i in range(start, start + count):
            at = dt.datetime(2024, 5, 1, 12, 0, i % 60, tzinfo=dt.UTC)
            headers = {"i": i, "f": i / 4, "ok": i % 2 == 0, "at": at,
                       "price": decimal.Decimal(f"{i}.25"), "meta": {"n": i, "tags": ["a", "b"]},
                       "tags": {"color": "red", "size": i}}
            pub.publish("", queue, b"m%d" % i, properties.encode_property_values(headers=headers, delivery_mode=2))
        pub.wait_for_confirms()
        pub.close()


def counts(admin, queue: str) -> tuple[int, int]:
    ok = admin.queue_declare(queue, passive=True).method
    return ok.message_count, ok.consumer_count


def settled_counts(admin, queue: str, want: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """The counts once they are ``want`` (or after 10 s): a task ends without waiting for the broker to
    apply its acks and close its connection (finish_consumers), so the consumers go a moment later."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: counts(admin, queue) == want, timeout=10, what=f"{queue} to hold {want}")
    return counts(admin, queue)


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_batch_read_drains_the_queue_with_typed_headers(spark, broker, admin, kind: str) -> None:
    queue = declare(admin, kind)
    publish(broker.url, queue, 0, 400)
    df = (spark.read.format("lavinpy").schema(HEADERS_SCHEMA).option("url", broker.url).option("queue", queue)
          .option("consumers", "3").load())
    assert df.rdd.getNumPartitions() == 3  # one consumer each
    rows = df.collect()
    assert sorted(r.body for r in rows) == sorted(b"m%d" % i for i in range(400))
    assert not any(r.redelivered for r in rows) and all(r.offset is None for r in rows)
    row = next(r for r in rows if r.body == b"m7")
    h = row.headers
    assert (h.i, h.f, h.ok, h.price, h.missing) == (7, 1.75, False, decimal.Decimal("7.25"), None)
    assert h.at.astimezone(dt.UTC) == dt.datetime(2024, 5, 1, 12, 0, 7, tzinfo=dt.UTC)
    assert json.loads(h.meta) == {"n": 7, "tags": ["a", "b"]} and h.tags == {"color": "red", "size": "7"}
    assert settled_counts(admin, queue) == (0, 0), "everything read is acked, no consumer left"
    assert spark.read.format("lavinpy").option("url", broker.url).option("queue", queue).load().count() == 0


def test_read_tasks_freeze_their_workers_heap_and_never_the_drivers(spark, broker, admin) -> None:
    """A lavinpy task freezes its Python worker's heap (once a process), so that the full collection
    Spark's daemon runs after every task walks only what later tasks made; the driver, which runs the
    streaming queue reader's consumers, never freezes its own (the application's)."""
    import gc

    queue = declare(admin, "classic")
    publish(broker.url, queue, 0, 200)
    rows = spark.read.format("lavinpy").option("url", broker.url).option("queue", queue).load().collect()
    assert len(rows) == 200
    # A data source's tasks run in the same reused workers (an RDD's in others): how many objects the
    # workers of two tasks have frozen (the read's two tasks may have shared one worker).
    from tests.spark.freeze_probe import FreezeProbe

    spark.dataSource.register(FreezeProbe)
    frozen = [row.frozen for row in spark.read.format("freeze_probe").load().collect()]
    assert len(frozen) == 2 and max(frozen) > 1000, frozen
    from lavinpy.spark.client import gc_paused

    with gc_paused():  # in the driver (no task context)
        pass
    assert gc.get_freeze_count() == 0


def pids_connected_to(port: int) -> set[int]:
    """Processes with a TCP connection to 127.0.0.1:port (from /proc: no psutil needed)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # ESTABLISHED
                    inodes.add(fields[9])
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if any(os.readlink(fd).removeprefix("socket:[").rstrip("]") in inodes
                       for fd in (proc / "fd").iterdir()):
                    pids.add(int(proc.name))
    return pids


@pytest.mark.parametrize("how", ["raises", "killed"])
def test_streaming_read_acks_after_commit_and_redelivers_after_a_failure(spark, broker, admin, tmp_path: Path,
                                                                         how: str) -> None:
    """The job dies in the middle of batch 1, after writing part of its output: its foreachBatch
    raises, or the process holding the source's consumers is killed (SIGKILL). The query restarted
    from its checkpoint outputs every message at least once and leaves none unacked."""
    queue = declare(admin, "classic")
    publish(broker.url, queue, 0, 300)
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    out.mkdir()
    state = {"fail_at": 1}

    def record(batch_df, batch_id: int) -> None:
        rows = batch_df.select("body", "redelivered").collect()
        with open(out / f"{batch_id}-{len(list(out.iterdir()))}.json", "w") as f:
            json.dump([[r.body.decode(), r.redelivered] for r in rows], f)
        if batch_id == state["fail_at"] and how == "killed":
            readers = pids_connected_to(urlsplit(broker.url).port or 5672) - {os.getpid()}
            assert readers, "the stream reader's consumers are connected"
            for pid in readers:
                os.kill(pid, signal.SIGKILL)
        if batch_id == state["fail_at"]:
            raise RuntimeError("the job dies in the middle of batch 1, after writing part of its output")

    def run(**trigger: object):
        stream = (spark.readStream.format("lavinpy").option("url", broker.url).option("queue", queue)
                  .option("maxMessagesPerTrigger", "100").load())
        return (stream.writeStream.foreachBatch(record).option("checkpointLocation", str(checkpoint))
                .trigger(**trigger).start())

    query = run(availableNow=True)
    with pytest.raises(Exception) as info:
        query.awaitTermination(120)
    assert "dies in the middle of batch 1" in error_text(info.value) or how == "killed"
    # batch 0 was committed and acked; batch 1's messages went back to the queue with the connections
    wait_until(lambda: counts(admin, queue)[1] == 0, timeout=30, what="the failed query's consumers closed")
    assert counts(admin, queue) == (200, 0)

    state["fail_at"] = -1
    query = run(availableNow=True)
    query.awaitTermination(120)
    # Spark stops the reader (closing its consumers) just after the query ends
    wait_until(lambda: counts(admin, queue)[1] == 0, timeout=30, what="the stream reader's consumers closed")
    assert query.exception() is None
    seen: dict[str, bool] = {}
    for path in out.iterdir():
        for body, redelivered in json.loads(path.read_text()):
            seen[body] = seen.get(body, False) or redelivered
    assert set(seen) == {f"m{i}" for i in range(300)}, "every message in the output at least once"
    assert sum(seen.values()) >= 100, "batch 1's messages came again, marked redelivered"
    assert settled_counts(admin, queue) == (0, 0), "none left unacked or unread"


def test_bad_options_fail_once_with_a_clear_error(spark, broker, admin, stream_queue) -> None:
    classic = declare(admin, "classic")

    def failure(url: str, queue: str, **options: str) -> str:
        reader = spark.read.format("lavinpy").option("url", url).option("queue", queue)
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(Exception) as info:
            reader.load().collect()
        return error_text(info.value)

    missing = unique("spark-missing")
    assert f"queue '{missing}' not found" in failure(broker.url, missing)
    bad_login = broker.url.replace("guest:guest@", "guest:wrong@")
    text = failure(bad_login, classic)
    assert "403" in text and "check the user, password and vhost" in text, text
    text = failure(broker.url, classic, startingOffset="first")
    assert "option startingOffset does not apply" in text and "classic or quorum queue" in text, text
    stream = stream_queue()
    text = failure(broker.url, stream, consumers="4")
    assert "option consumers does not apply" in text and "a stream queue" in text, text
    text = failure(broker.url, classic, queueType="fifo")
    assert "option queueType='fifo': expected auto, stream, classic or quorum" in text, text
    # A named kind is taken as said: a classic queue read as a stream is refused by its first delivery.
    publish_plain(broker.url, classic, 1, 16)
    text = failure(broker.url, classic, queueType="stream")
    assert "is not a stream queue" in text, text
    rows = (spark.read.format("lavinpy").option("url", broker.url).option("queue", classic)
            .option("queueType", "classic").load().collect())
    assert [row.body[:8] for row in rows] == [b"00000000"] and counts(admin, classic) == (0, 0)


def test_amqps_write_and_read(spark, tmp_path: Path) -> None:
    """amqps:// URLs (with RabbitMQ's cacertfile key) work for writes and reads."""
    ca = CA(tmp_path / "pki")
    cert, key, _serial = ca.issue("server", server=True)
    (amqps_port,) = free_ports(1)
    conf = tmp_path / "tls.yaml"
    conf.write_text(f"tls_cert: {cert}\ntls_key: {key}\namqps_port: {amqps_port}\nhttps_port: 0\n"
                    "prometheus_tls_port: 0\nmqtt_port: 0\n")
    broker = LocalBroker(tmp_path / "broker")
    broker.extra_args = ["--config", str(conf)]
    broker.start()
    try:
        url = f"amqps://guest:guest@localhost:{amqps_port}/?cacertfile={ca.cert_path}"
        queue = unique("spark-tls")
        with Connection(AMQPParams.from_url(url)).open() as conn:
            conn.call(conn.open_channel(), commands.Queue.Declare(queue=queue, durable=True), commands.Queue.DeclareOk)
        spark.range(50).selectExpr("cast(id AS string) AS body").write.format("lavinpy").mode("append") \
            .option("url", url).option("queue", queue).save()
        rows = spark.read.format("lavinpy").option("url", url).option("queue", queue).load().collect()
        assert sorted(int(r.body) for r in rows) == list(range(50))
        # Heartbeats over TLS: the heartbeat thread writes while the owner reads (OpenSSL is not
        # thread-safe: the client's one lock keeps them apart).
        with Connection(AMQPParams.from_url(url + "&heartbeat=1")).open() as conn:
            ch = conn.open_channel()
            deadline = time.monotonic() + 3.5  # past two heartbeats, reading all along
            while time.monotonic() < deadline:
                assert conn.read_frames(0.05) == []
            conn.call(ch, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    finally:
        broker.stop()


def publish_plain(url: str, queue: str, count: int, body_bytes: int) -> None:
    with Connection(AMQPParams.from_url(url)).open() as conn:
        pub = ConfirmPublisher(conn)
        props = properties.encode_property_values(delivery_mode=2)
        for i in range(count):
            pub.publish("", queue, b"%08d" % i + b"x" * (body_bytes - 8), props)
        pub.wait_for_confirms()
        pub.close()


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_batch_read_task_outwaits_a_delivery_pause_while_the_queue_holds_its_share(broker, admin,
                                                                                     kind: str) -> None:
    """The broker stops (SIGSTOP) for longer than idleTimeout in the middle of a task's share: the task
    asks the queue's ready count instead of ending with part of its share."""
    if broker.proc is None:
        pytest.skip("needs the broker process this suite starts (it is paused with SIGSTOP)")
    queue = declare(admin, kind)
    total = 20_000  # 20 MB: more than the socket buffers hold, so the pause comes mid-share
    publish_plain(broker.url, queue, total, 1000)
    pid = broker.proc.pid
    bodies: list[bytes] = []
    paused = False
    try:
        for taken, _redelivered in drained(AMQPParams.from_url(broker.url), queue, total, idle_wait=0.2):
            bodies.extend(taken)
            if not paused:
                os.kill(pid, signal.SIGSTOP)
                paused = True
                threading.Timer(1.5, os.kill, (pid, signal.SIGCONT)).start()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert paused
    assert len(bodies) == total and len(set(bodies)) == total
    assert settled_counts(admin, queue) == (0, 0), "all of it acked, no consumer left"


def drained(params: AMQPParams, queue: str, total: int, idle_wait: float,
            batch_rows: int = 1000) -> Iterator[tuple[list[bytes], int]]:
    """A batch-read task's drain (drain_partition), its columns taken at each of its yields (every
    batch_rows messages and at the end): the bodies and how many were redelivered, each time."""
    sink = ColumnsSink(batch_rows)
    with contextlib.closing(drain_partition(params, queue, total, idle_wait, sink)) as task:
        for _ in task:
            cols = sink.take()
            yield [cols.body(row) for row in range(cols.rows)], len(cols.redelivered)


def count_connections(monkeypatch) -> list[Connection]:
    """The connections lavinpy.spark.queues opens from now on (real ones), in a list."""
    opened: list[Connection] = []

    class CountedConnection(Connection):
        def open(self) -> CountedConnection:
            opened.append(self)
            return super().open()

    monkeypatch.setattr(queues_module, "Connection", CountedConnection)
    return opened


def test_a_task_whose_parts_outnumber_the_channels_a_broker_allows_opens_another_connection(
        tmp_path: Path, monkeypatch) -> None:
    """A broker with channel_max 1: the task's second part goes on a connection of its own; both parts
    are read and acked."""
    broker = LocalBroker(tmp_path / "broker")
    broker.settings["channel_max"] = "1"
    broker.start()
    try:
        url = broker.url
        queue = unique("spark-channels")
        with Connection(AMQPParams.from_url(url)).open() as conn:
            conn.call(conn.open_channel(), commands.Queue.Declare(queue=queue, durable=True), commands.Queue.DeclareOk)
        total = MAX_PREFETCH + 5
        publish_plain(url, queue, total, 16)
        opened = count_connections(monkeypatch)
        bodies = [body for taken, _ in drained(AMQPParams.from_url(url), queue, total, idle_wait=0.5)
                  for body in taken]
        assert len(opened) == 2
        assert len(bodies) == total and len(set(bodies)) == total
        with Connection(AMQPParams.from_url(url)).open() as conn:
            channel = conn.open_channel()

            def left() -> tuple[int, int]:
                ok = conn.call(channel, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
                return ok.message_count, ok.consumer_count

            with contextlib.suppress(AssertionError):
                wait_until(lambda: left() == (0, 0), timeout=10)
            assert left() == (0, 0), "all of it acked, no consumer left"
    finally:
        broker.stop()


def test_a_share_larger_than_a_prefetch_is_read_by_one_task(broker, admin, monkeypatch) -> None:
    """70,000 messages for one task: more than one consumer's prefetch holds (65,535), taken by
    consumers the task opens one after the other on channels of one connection, all acked at the
    end; abandoned past the first part, the task acks nothing and every part goes back to the queue."""
    opened = count_connections(monkeypatch)
    queue = declare(admin, "classic")
    total = 70_000
    publish_plain(broker.url, queue, total, 16)
    params = AMQPParams.from_url(broker.url)
    abandoned = drained(params, queue, total, idle_wait=0.5)
    taken = 0
    for got, _redelivered in abandoned:
        taken += len(got)
        if taken > MAX_PREFETCH:
            break
    abandoned.close()
    assert len(opened) == 1, "the second part on the first part's connection"
    deadline = time.monotonic() + 10
    while counts(admin, queue) != (total, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counts(admin, queue) == (total, 0), "an abandoned task acks nothing"
    bodies: list[bytes] = []
    redelivered = 0
    for got, flagged in drained(params, queue, total, idle_wait=0.5):
        bodies.extend(got)
        redelivered += flagged
        if len(bodies) > MAX_PREFETCH:
            ready, consumers = counts(admin, queue)
            assert consumers == 2 and ready + len(bodies) <= total  # the first one still holds its part
    assert len(opened) == 2, "one connection a task"
    assert len(bodies) == total and len(set(bodies)) == total
    assert redelivered >= taken, "what the abandoned task had taken comes again, marked redelivered"
    assert not any(b for b in bodies if len(b) != 16)
    assert settled_counts(admin, queue) == (0, 0), "all of it acked, no consumer left"


def test_a_named_queue_type_is_taken_without_the_redeclare_probe(broker, admin) -> None:
    """queueType names the kind (and skips the checks that find it out); auto finds it out, and
    the count and a missing queue's error are the same either way."""
    classic = declare(admin, "classic")
    publish_plain(broker.url, classic, 3, 16)
    params = AMQPParams.from_url(broker.url)
    assert queue_kind(params, classic) == (QUEUE, 3)
    assert queue_kind(params, classic, "classic") == (QUEUE, 3)
    assert queue_kind(params, classic, "stream") == (STREAM, 3)  # the user's word, not checked
    missing = unique("spark-missing")
    for named in ("auto", "quorum"):
        with pytest.raises(StreamReadError, match=f"queue '{missing}' not found"):
            queue_kind(params, missing, named)


def test_names_beyond_ascii_are_read_and_written(spark, broker, admin, stream_queue) -> None:
    """RabbitMQ takes any UTF-8 name up to 255 bytes; the driver's checks (pamqp's constructors would
    refuse a non-ASCII name) and the tasks send them as given."""
    classic = unique("spark-очередь ✓")
    admin.queue_declare(classic, durable=True)
    stream = stream_queue(unique("spark-поток ✓"))
    publish_plain(broker.url, classic, 3, 16)
    params = AMQPParams.from_url(broker.url)
    assert queue_kind(params, classic) == (QUEUE, 3)
    assert queue_kind(params, stream)[0] == STREAM
    (spark.range(5).selectExpr("cast(id AS string) AS body").write.format("lavinpy").mode("append")
     .option("url", broker.url).option("queue", stream).save())
    rows = spark.read.format("lavinpy").option("url", broker.url).option("queue", stream).load().collect()
    assert sorted(r.body for r in rows) == [b"%d" % i for i in range(5)]
    rows = spark.read.format("lavinpy").option("url", broker.url).option("queue", classic).load().collect()
    assert sorted(r.body[:8] for r in rows) == [b"%08d" % i for i in range(3)]
    assert rows[0].routing_key == classic


@pytest.mark.parametrize("kind", ["classic", "stream"])
def test_a_streaming_read_goes_on_across_a_broker_restart(spark, tmp_path: Path, kind: str) -> None:
    """The driver's connections reach the broker again when they are lost (a broker restart): the query
    goes on, and every message reaches the sink at least once (a queue's messages not yet acked come
    again, redelivered; a stream's ranges are read by offset)."""
    broker = LocalBroker(tmp_path / "broker")
    broker.start()
    query = None
    try:
        queue = unique(f"spark-restart-{kind}")
        with Connection(AMQPParams.from_url(broker.url)).open() as conn:
            conn.call(conn.open_channel(), commands.Queue.Declare(queue=queue, durable=True,
                                                                  arguments={"x-queue-type": kind}),
                      commands.Queue.DeclareOk)
        publish(broker.url, queue, 0, 100)
        out = tmp_path / "out"

        def bodies() -> set[bytes]:
            if not (out / "_spark_metadata").exists():
                return set()
            rows = spark.read.schema("body BINARY, redelivered BOOLEAN").parquet(str(out)).collect()
            return {row.body for row in rows}

        query = (spark.readStream.format("lavinpy").option("url", broker.url).option("queue", queue).load()
                 .select("body", "redelivered").writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="500 milliseconds")
                 .start())
        wait_until(lambda: len(bodies()) == 100, timeout=60, what="the first 100 messages in the sink")
        broker.stop()
        broker.start()
        publish(broker.url, queue, 100, 100)
        wait_until(lambda: len(bodies()) == 200 or not query.isActive, timeout=90, what="all 200 in the sink")
        assert query.isActive, query.exception()
        assert bodies() == {b"m%d" % i for i in range(200)}
    finally:
        if query is not None:
            query.stop()
        broker.stop()


def test_a_finished_task_leaves_its_acks_and_close_to_the_broker_without_waiting(broker, admin,
                                                                                  monkeypatch) -> None:
    """A task's end sends its cancels, acks and connection.close in one write and does not wait for the
    broker: with the broker stopped (SIGSTOP), the task still ends at once. Resumed, the broker applies
    the acks before the close (which would otherwise requeue the messages): nothing comes back, no
    consumer is left; the task's socket is closed once the close-ok has been read."""
    if broker.proc is None:
        pytest.skip("needs the broker process this suite starts (it is paused with SIGSTOP)")
    from lavinpy.wire import client_blocking

    queue = declare(admin, "classic")
    total = MAX_PREFETCH + 100  # two parts: two consumers to cancel and ack
    publish_plain(broker.url, queue, total, 16)
    opened = count_connections(monkeypatch)
    pid = broker.proc.pid
    sink = ColumnsSink(1 << 20)
    task = drain_partition(AMQPParams.from_url(broker.url), queue, total, 0.5, sink)
    for _ in task:
        if sink.columns.rows == total:
            break  # every message taken: the task's last yield, before its acks
    assert sink.columns.rows == total
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(6.0, os.kill, (pid, signal.SIGCONT))  # a task that waits is let go after 6 s
    resume.start()
    try:
        started = time.monotonic()
        with pytest.raises(StopIteration):
            next(task)  # the task's end: acks and close
        ended = time.monotonic() - started
        (conn,) = opened
        assert conn.sock is not None, "the socket waits for the close-ok, which the stopped broker has not sent"
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)
    assert ended < 3.0, f"the task's end waited {ended:.2f} s for a stopped broker"
    wait_until(lambda: (client_blocking._closing.reap(), conn.sock is None)[1], what="the close-ok to be read")
    assert settled_counts(admin, queue) == (0, 0), "acked before the close: nothing requeued, no consumer left"
