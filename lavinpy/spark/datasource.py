"""The PySpark Python data source "lavinpy": batch and streaming reads and writes.

Everything here is pickled between the driver and the executors, so objects only hold options
and plain values; connections are opened inside write()/read() (and, on the driver, lazily by the
stream reader, which lives in one long-running Python process for the whole query, and by a batch
read's planning, from reader() to partitions()), and left out of what is pickled.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import pyarrow as pa
from pamqp import commands
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from lavinpy.wire.frames import build_method

from .client import AMQPClientError, BrokerClosed, Connection, gc_paused
from .options import FIRST, LAST, LATEST, NEXT, OptionError, ReadOptions, StartSpec, WriteOptions
from .publisher import ConfirmPublisher
from .queue_source import QueueBatchReader, QueueStreamReader
from .queues import QUEUE, STREAM, UNKNOWN, open_connection, queue_kind
from .read_rows import BatchBuilder, read_schema
from .read_rows import check_schema as check_read_schema
from .streams import ColumnsSink, StreamClient
from .write_rows import RowEncoder, RowError
from .write_rows import check_schema as check_write_schema


class LavinpyDataSource(DataSource):
    """`spark.dataSource.register(LavinpyDataSource)`, then format("lavinpy")."""

    @classmethod
    def name(cls) -> str:
        return "lavinpy"

    def schema(self) -> Any:
        return read_schema()

    def reader(self, schema: Any) -> DataSourceReader:
        check_read_schema(schema)
        opts = ReadOptions.parse(self.options)
        conn = open_connection(opts.params)
        try:
            kind, count = queue_kind(opts.params, opts.queue, opts.queue_type, conn)
            kind = decided_kind(opts, kind, streaming=False)
            opts.check_kind(kind == STREAM)
        except BaseException:
            conn.close()
            raise
        if kind == STREAM:
            # Spark plans on the reader it gets (partitions()), in this process: the stream's end is
            # asked on this connection, and the type only once (queue_kind checked it unless named).
            client = StreamClient(opts.params, opts.queue, prefetch=opts.stream_prefetch, conn=conn)
            return LavinpyBatchReader(opts, schema, client, type_checked=opts.queue_type == "auto")
        conn.close()
        return QueueBatchReader(opts, schema, count)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        check_read_schema(schema)
        opts = ReadOptions.parse(self.options)
        kind, _count = queue_kind(opts.params, opts.queue, opts.queue_type)
        kind = decided_kind(opts, kind, streaming=True)
        opts.check_kind(kind == STREAM)
        if kind == STREAM:
            return LavinpyStreamReader(opts, schema, type_checked=opts.queue_type == "auto")
        return QueueStreamReader(opts, schema)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        opts = _write_options(self.options, schema)
        return LavinpyWriter(opts)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        opts = _write_options(self.options, schema)
        return LavinpyStreamWriter(opts)


def decided_kind(opts: ReadOptions, kind: str, streaming: bool) -> str:
    """STREAM or QUEUE for queue_kind's answer. An empty queue whose kind no redeclare proved (UNKNOWN)
    is what the options given say (a stream option: a stream; a queue option: a classic or quorum
    queue). Without either, a batch read takes it as a queue, which reads nothing as an empty stream
    would, and a streaming read, whose offsets mean something else for each kind, asks for queueType."""
    if kind != UNKNOWN:
        return kind
    if any(name.lower() in opts.given for name in opts.STREAM_ONLY):
        return STREAM
    if not streaming or any(name.lower() in opts.given for name in opts.QUEUE_ONLY):
        return QUEUE
    raise OptionError(
        f"cannot tell whether queue {opts.queue!r} is a stream or a classic or quorum queue: it holds no "
        f"message, and the broker did not prove its kind by a redeclare (user {opts.params.username!r} may "
        f"not configure it, or the broker's refusal did not name the argument); set the option queueType to stream, "
        f"classic or quorum")


# --- writing --------------------------------------------------------------------------------------

@dataclass
class PublishedMessages(WriterCommitMessage):
    """What one write task confirmed."""

    messages: int


def _write_options(options: Any, schema: Any) -> WriteOptions:
    """Parse and check on the driver, so that mistakes fail the job once, before any task runs."""
    opts = WriteOptions.parse(options)
    check_write_schema(schema, opts)
    if opts.exchange:
        _check_exchange(opts)
    return opts


def _check_exchange(opts: WriteOptions) -> None:
    with Connection(opts.params).open() as conn:
        ch = conn.open_channel()
        try:
            conn.call(ch, build_method(commands.Exchange.Declare, exchange=opts.exchange, passive=True),
                      commands.Exchange.DeclareOk)
        except BrokerClosed as exc:
            if exc.reply_code == 404:
                raise RowError(
                    f"exchange {opts.exchange!r} not found in vhost {opts.params.vhost!r} at "
                    f"{opts.params.safe_url()}: declare it first (the lavinpy writer does not create "
                    f"exchanges)") from None
            raise


def publish_batches(opts: WriteOptions, batches: Iterator[pa.RecordBatch]) -> PublishedMessages:
    """One task: one connection, one confirm channel; returns only when all is confirmed."""
    with gc_paused(), Connection(opts.params).open() as conn:
        publisher = ConfirmPublisher(conn, confirm=opts.confirm, mandatory=opts.mandatory,
                                     max_in_flight=opts.max_in_flight)
        rows = RowEncoder(opts, publisher.encoder)
        for batch in batches:
            for data, count in rows.chunks(batch):
                publisher.send_encoded(data, count)
        publisher.wait_for_confirms()
        if not opts.confirm:
            publisher.close()  # unconfirmed: returns may still be coming, and come before the close-ok
        # Confirmed, every return came too (a broker returns a message before it confirms it): the
        # task need not wait for the broker to close the channel and the connection.
        conn.close_soon()
    return PublishedMessages(rows.rows)


class LavinpyWriter(DataSourceArrowWriter):
    """Batch writes. Published messages cannot be taken back, so abort() has nothing to undo:
    a failed task is retried by Spark and its messages may be published twice (at-least-once)."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedMessages:
        return publish_batches(self.opts, iterator)


class LavinpyStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: every micro-batch partition publishes and waits for its confirms."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedMessages:
        return publish_batches(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass


# --- reading --------------------------------------------------------------------------------------

@dataclass
class OffsetRange(InputPartition):
    """One Spark task's share of a stream: offsets start <= offset < end."""

    start: int
    end: int


def split_range(start: int, end: int, max_size: int) -> list[OffsetRange]:
    """Split [start, end) into as few near-equal ranges of at most max_size offsets as possible."""
    if end <= start:
        return []
    parts = -(-(end - start) // max_size)
    step = -(-(end - start) // parts)
    return [OffsetRange(lo, min(lo + step, end)) for lo in range(start, end, step)]


def resolve_start(client: StreamClient, spec: StartSpec, end: int | None) -> int:
    """An offset for startingOffset, given the stream's current end (None when empty).

    An empty stream starts at 0: a consumer asked for an offset below the oldest one starts at
    the oldest, so nothing published later can be missed whatever the broker's first offset is.
    """
    if isinstance(spec, int):
        return spec
    if end is None:
        return 0
    if spec == FIRST:
        first = client.first_offset()
        return 0 if first is None else first
    if spec == LAST:
        return end - 1
    if spec == NEXT:
        return end
    if not isinstance(spec, datetime):
        raise ValueError(f"startingOffset {spec!r} is not first, last, next, an offset or a time")
    found = client.offset_at(spec)
    return end if found is None else found


def read_partition(opts: ReadOptions, schema: Any, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Executor side: read exactly the partition's range as record batches, then stop."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    builder = BatchBuilder(arrow_schema)
    sink = ColumnsSink(builder.batch_rows)
    with gc_paused(), StreamClient(opts.params, opts.queue, prefetch=opts.stream_prefetch) as client:
        for lo, hi in client.read_range_into(sink, partition.start, partition.end, then_close=True):
            columns = sink.take()
            if hi > lo:
                yield builder.build(columns, lo, hi)


class LavinpyBatchReader(DataSourceReader):
    """spark.read: the range [startingOffset, endingOffset) as it is when the query is planned."""

    def __init__(self, opts: ReadOptions, schema: Any, client: StreamClient | None = None,
                 type_checked: bool = False) -> None:
        self.opts = opts
        self.schema = schema
        self._client = client  # the driver's, open since reader(): used by partitions(), never pickled
        self._type_checked = type_checked

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a socket is not picklable; executors open their own
        return state

    def partitions(self) -> list[OffsetRange]:
        opts = self.opts
        client, self._client = self._client, None
        with client or StreamClient(opts.params, opts.queue, prefetch=opts.stream_prefetch) as client:
            if not self._type_checked:
                client.check_is_stream()
            end = client.end_offset()
            if opts.ending_offset != LATEST:
                # never past what exists: readers would wait for messages not yet published
                end = min(int(opts.ending_offset), end if end is not None else 0)
            start = resolve_start(client, opts.starting_offset, end)
        end = start if end is None else max(end, start)
        return split_range(start, end, opts.max_messages_per_partition) or [OffsetRange(start, start)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark hands back the partitions this reader made: OffsetRanges.
        return read_partition(self.opts, self.schema, cast(OffsetRange, partition))


class LavinpyStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """spark.readStream: offsets are {queue: next offset to read}, checkpointed by Spark.

    Each micro-batch is the range [previous end, new end) read by offset, so a query restarted
    from its checkpoint re-reads exactly the ranges it had not committed: no gap, no duplicate.
    """

    def __init__(self, opts: ReadOptions, schema: Any, type_checked: bool = False) -> None:
        self.opts = opts
        self.schema = schema
        self._client: StreamClient | None = None
        self._target: int | None = None
        self._type_checked = type_checked  # queue_kind proved it a stream when the query was planned

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a socket is not picklable; executors open their own
        return state

    def _stream(self) -> StreamClient:
        if self._client is None:
            client = StreamClient(self.opts.params, self.opts.queue, prefetch=self.opts.stream_prefetch)
            if not self._type_checked:
                client.check_is_stream()
            self._client = client
        return self._client

    def _offset(self, offset: dict[str, Any] | None) -> int:
        queue = self.opts.queue
        if not offset or queue not in offset:
            raise ValueError(f"offset {offset!r} does not belong to stream {queue!r}: the checkpoint is from a "
                             f"query on another queue; use a new checkpointLocation")
        return int(offset[queue])

    def initialOffset(self) -> dict[str, int]:
        client = self._stream()
        return {self.opts.queue: resolve_start(client, self.opts.starting_offset, client.end_offset())}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.opts.max_messages_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        end = self._stream().end_offset()
        self._target = 0 if end is None else end

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, int]:
        client = self._stream()
        begin = self._offset(start) if start is not None else 0
        end = client.end_offset()
        end = begin if end is None else max(end, begin)
        if self._target is not None:
            end = max(begin, min(end, self._target))
        if isinstance(limit, ReadMaxRows) and end - begin > limit.max_rows:
            first = client.first_offset()
            base = begin if first is None else max(begin, first)  # skip offsets retention removed
            end = min(end, base + limit.max_rows)
        return {self.opts.queue: end}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[OffsetRange]:
        lo, hi = self._offset(start), self._offset(end)
        size = self.opts.max_messages_per_partition
        if hi - lo > size:
            try:
                first = self._stream().first_offset()
            except AMQPClientError:
                first = None
            if first is not None and lo < first < hi:
                lo = first  # balance the split over offsets that still exist
        return split_range(lo, hi, size)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark hands back the partitions this reader made: OffsetRanges.
        return read_partition(self.opts, self.schema, cast(OffsetRange, partition))

    def commit(self, end: dict[str, Any]) -> None:
        pass  # streams keep messages; there is nothing to acknowledge on the broker

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
