"""The Spark readers of classic and quorum queues (streams: datasource.py).

Batch: one partition per consumer, each taking its share of the messages the queue held when the
query was planned, acked when the task has handed them all to Spark.
Streaming: the consumers live in the driver's stream reader (a long-running Python process for the
whole query); a micro-batch is what they received since the last one, shipped to the tasks as Arrow
IPC, and acked in `commit`, which Spark calls once the batch's output is committed. A query that
fails or is killed before that closes its connections, and the broker redelivers the messages to
the restarted query (`redelivered` true): at-least-once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from .client import BrokerClosed, ConnectionLost, connection_gone, gc_paused, reconnecting
from .options import ReadOptions
from .queues import MAX_PREFETCH, QueueConsumer, drain_partition, ready_count
from .read_rows import BatchBuilder
from .streams import ColumnsSink

log = logging.getLogger(__name__)

_POLL_FIRST_S = 0.05   # how long latestOffset waits for a first delivery when the queue is quiet
_POLL_IDLE_S = 0.01    # the pause that ends a micro-batch's collection
_AVAILABLE_NOW_WAIT_S = 2.0


def arrow_schema_of(schema: Any) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


@dataclass
class QueueShare(InputPartition):
    """A batch-read task: one consumer taking up to `quota` messages."""

    index: int
    quota: int


class QueueBatchReader(DataSourceReader):
    """spark.read of a classic or quorum queue: drains what it held when the query was planned."""

    def __init__(self, opts: ReadOptions, schema: Any, ready: int) -> None:
        self.opts = opts
        self.schema = schema
        self.ready = ready

    def partitions(self) -> list[QueueShare]:
        # One task per consumer asked for (local[N] runs N at once: one wave); a task whose share is
        # more than one prefetch holds opens further consumers itself (drain_partition).
        consumers = max(1, min(self.opts.consumers, self.ready))
        quota = -(-self.ready // consumers)
        return [QueueShare(i, quota) for i in range(consumers)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        share = cast(QueueShare, partition)
        builder = BatchBuilder(arrow_schema_of(self.schema))
        sink = ColumnsSink(builder.batch_rows)
        with gc_paused():
            for _full in drain_partition(self.opts.params, self.opts.queue, share.quota, self.opts.idle_timeout, sink):
                yield builder.build(sink.take())


@dataclass
class QueueBatch(InputPartition):
    """One consumer's share of a micro-batch, as Arrow IPC (empty: nothing to read)."""

    ipc: bytes


@dataclass
class _Planned:
    """A micro-batch handed to Spark and not yet committed: the last delivery tag of each consumer."""

    end: int
    last_tags: dict[int, int]
    partitions: list[QueueBatch]


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """spark.readStream of a classic or quorum queue. Offsets are {queue: messages handed to Spark}."""

    def __init__(self, opts: ReadOptions, schema: Any) -> None:
        self.opts = opts
        self.schema = schema
        self._consumers: list[QueueConsumer] | None = None
        self._planned: dict[int, _Planned] = {}  # by the batch's start offset
        self._remaining: int | None = None  # Trigger.AvailableNow: messages still to hand out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumers"] = None  # sockets stay in the driver
        state["_planned"] = {}
        return state

    def _prefetch(self) -> int:
        """Each consumer holds at most this many unacked messages. Spark commits a micro-batch to
        its source only when it plans the next one, so a consumer must have room for two."""
        prefetch = self.opts.queue_prefetch
        limit = self.opts.max_messages_per_trigger
        if limit:
            prefetch = min(prefetch, 2 * -(-limit // max(1, self.opts.consumers)))
        return min(prefetch, MAX_PREFETCH)

    def _open(self) -> list[QueueConsumer]:
        if self._consumers is None:
            opts = self.opts
            self._consumers = [QueueConsumer(opts.params, opts.queue, self._prefetch()) for _ in range(opts.consumers)]
        return self._consumers

    def _offset(self, offset: dict[str, Any] | None) -> int:
        queue = self.opts.queue
        if not offset or queue not in offset:
            raise ValueError(f"offset {offset!r} does not belong to queue {queue!r}: the checkpoint is from a "
                             f"query on another queue; use a new checkpointLocation")
        return int(offset[queue])

    def initialOffset(self) -> dict[str, int]:
        return {self.opts.queue: 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.opts.max_messages_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._remaining = ready_count(self.opts.params, self.opts.queue)

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, int]:
        begin = self._offset(start) if start is not None else 0
        # Spark asks for the next batch's end only once the batch ending at `begin` is committed,
        # and calls commit() only when it plans a next batch: acking here is what acks a query's
        # last batch (Trigger.AvailableNow ends with this call).
        self._ack_through(begin)
        if begin in self._planned:  # asked again before the batch ran: the same batch
            return {self.opts.queue: self._planned[begin].end}
        try:
            return self._collect(begin, limit)
        except (ConnectionLost, BrokerClosed) as exc:
            if not connection_gone(exc):
                raise
            self._lost(exc)  # what was collected goes back to the queue with the connections
        reconnecting(self._open, self.opts.params.timeout)  # consumers again
        return self._collect(begin, limit)

    def _collect(self, begin: int, limit: ReadLimit | None) -> dict[str, int]:
        """The next micro-batch: what the consumers receive now, planned as the batch from begin."""
        if self._remaining is not None and self._remaining <= 0:
            return {self.opts.queue: begin}
        consumers = self._open()
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._remaining is not None:
            cap = self._remaining if cap is None else min(cap, self._remaining)
        first_wait = _AVAILABLE_NOW_WAIT_S if self._remaining else _POLL_FIRST_S
        builder = BatchBuilder(arrow_schema_of(self.schema))
        last_tags: dict[int, int] = {}
        partitions: list[QueueBatch] = []
        total = 0
        share = None if cap is None else -(-cap // len(consumers))
        with gc_paused():
            for i, consumer in enumerate(consumers):
                sink = ColumnsSink(builder.batch_rows)
                batches: list[pa.RecordBatch] = []
                count = 0
                for added in consumer.read(sink, first_wait=first_wait if i == 0 else _POLL_IDLE_S,
                                           idle_wait=_POLL_IDLE_S, limit=share):
                    count += added
                    if sink.full():
                        batches.append(builder.build(sink.take()))
                if sink.columns.rows:
                    batches.append(builder.build(sink.take()))
                if count:
                    last_tags[i] = consumer.last_tag
                    total += count
                    partitions.append(QueueBatch(_ipc(builder.schema, batches)))
        if total == 0:
            return {self.opts.queue: begin}
        if self._remaining is not None:
            self._remaining -= total
        self._planned[begin] = _Planned(begin + total, last_tags, partitions)
        return {self.opts.queue: begin + total}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[QueueBatch]:
        lo = self._offset(start)
        planned = self._planned.get(lo)
        if planned is None or planned.end != self._offset(end):
            # A batch planned by an earlier run of the query (restarted from its checkpoint): its
            # messages went back to the queue with that run's connections and come again, redelivered.
            return [QueueBatch(b"")]
        return planned.partitions or [QueueBatch(b"")]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        ipc = cast(QueueBatch, partition).ipc
        if ipc:
            yield from pa.ipc.open_stream(ipc)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed the batches up to `end`: ack their messages."""
        self._ack_through(self._offset(end))

    def _ack_through(self, done: int) -> None:
        """Ack the planned batches that end at or before `done` (multiple acks, per consumer). Acks
        that cannot be sent (the connection is gone) are not retried: their messages come again,
        redelivered (at-least-once)."""
        consumers = self._consumers or []
        for begin in sorted(self._planned):
            planned = self._planned[begin]
            if planned.end > done:
                break
            try:
                for i, tag in planned.last_tags.items():
                    if i < len(consumers):
                        consumers[i].ack(tag)
            except (ConnectionLost, BrokerClosed) as exc:
                if not connection_gone(exc):
                    raise
                self._lost(exc)
                consumers = []
            del self._planned[begin]

    def _lost(self, exc: Exception) -> None:
        """A consumer's connection is gone: the broker requeues what every consumer held (a consumer
        cannot ack on another's connection, so all of them start again). Planned batches keep their
        rows but have nothing left to ack, and Trigger.AvailableNow counts their messages again."""
        log.warning("queue %r: the consumers' connection was lost (%s); reconnecting, the messages not yet "
                    "acked come again, redelivered", self.opts.queue, exc)
        for consumer in self._consumers or []:
            consumer.conn.abort()
        self._consumers = None
        for begin, planned in self._planned.items():
            if self._remaining is not None and planned.last_tags:
                self._remaining += planned.end - begin
            planned.last_tags.clear()

    def stop(self) -> None:
        """Unacked messages (batches not committed) go back to the queue with the connections."""
        for consumer in self._consumers or []:
            consumer.close()
        self._consumers = None
        self._planned.clear()


def _ipc(schema: pa.Schema, batches: list[pa.RecordBatch]) -> bytes:
    out = pa.BufferOutputStream()
    with pa.ipc.new_stream(out, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return out.getvalue().to_pybytes()
