"""Reading classic and quorum queues (and telling them from streams) over plain AMQP 0-9-1.

A queue hands each message to one consumer and forgets it on the consumer's ack, so the data
source consumes with manual acks and acknowledges only when Spark is done with the messages:
- batch reads: one consumer per Spark task; its messages are acked when the task has handed all
  of them to Spark (a failed or killed task's connection closes, and the broker requeues them);
- streaming reads: the consumers live in the driver's stream reader (one connection each), whose
  micro-batch is what they hold unacked; `commit` after Spark committed the batch acks it.
A message the broker hands out again after such a failure comes with `redelivered` set.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from pamqp import commands

from lavinpy.wire.client import encode_shortstr
from lavinpy.wire.field_table import encode_table
from lavinpy.wire.frames import build_method
from lavinpy.wire.writer import basic_ack, method_frame

from .client import AMQPClientError, AMQPParams, BrokerClosed, Connection, server_product
from .streams import _U16, ColumnsSink, NotAStreamError, Receiver, StreamClient, StreamReadError

STREAM, QUEUE = "stream", "queue"
UNKNOWN = "unknown"  # an empty queue whose kind the user may not check (see queue_kind)
# One letter, as the stream reader's: tags are per channel, and each consumer has its channel. Every
# delivery carries the tag, and "lavinpy.spark" cost two read tasks 2 % more CPU a row than "q".
_CONSUMER_TAG = "q"


def login_error(params: AMQPParams, exc: BrokerClosed) -> AMQPClientError:
    return AMQPClientError(
        f"cannot open a connection to {params.safe_url()} as {params.username!r}: {exc.reply_code} "
        f"{exc.reply_text}: check the user, password and vhost in the url option")


def open_connection(params: AMQPParams) -> Connection:
    """A connection for the driver's checks; a refused login raises an error naming the url option."""
    try:
        return Connection(params).open()
    except BrokerClosed as exc:
        raise login_error(params, exc) from None


def queue_kind(params: AMQPParams, queue: str, queue_type: str = "auto",
               conn: Connection | None = None) -> tuple[str, int]:
    """(STREAM, QUEUE or UNKNOWN, ready message count) of an existing queue; a clear error if it is missing.

    queue_type other than "auto" is the user's word for it (the queueType option): only the count
    is asked then.

    Redeclaring with x-queue-type=stream (durable) has no side effect: it succeeds on a stream
    without other arguments, and a 406 naming x-queue-type, durable or auto_delete proves the queue
    is not one (brokers compare the type before the other arguments). A 406 naming another
    argument means the type matched: a stream with retention settings. A redeclare proves nothing
    where it is refused (a user without configure permission), where the refusal names no argument
    (LavinMQ 1.0) or where the broker is not known to compare them: the first delivery decides then
    (kind_by_delivery).
    conn: a connection of the caller's to ask on (left open), else one of its own.
    """
    if conn is None:
        with open_connection(params) as own:
            return queue_kind(params, queue, queue_type, own)
    # One channel for both declares, left open when they succeed: the connection's close ends it.
    ch = conn.open_channel()
    try:
        ok = conn.call(ch, build_method(commands.Queue.Declare, queue=queue, passive=True), commands.Queue.DeclareOk)
    except BrokerClosed as exc:
        if exc.reply_code == 404:
            raise StreamReadError(f"queue {queue!r} not found in vhost {params.vhost!r} at "
                                  f"{params.safe_url()}: declare it first (the lavinpy source reads "
                                  f"classic, quorum and stream queues)") from None
        raise StreamReadError(f"cannot inspect queue {queue!r}: {exc.reply_code} {exc.reply_text}") from None
    count = int(ok.message_count)
    if queue_type != "auto":
        return (STREAM if queue_type == "stream" else QUEUE), count
    try:
        conn.call(ch, build_method(commands.Queue.Declare, queue=queue, durable=True,
                                   arguments={"x-queue-type": "stream"}),
                  commands.Queue.DeclareOk)
    except BrokerClosed as exc:
        if exc.scope == "connection":
            raise
        text = exc.reply_text
        if exc.reply_code == 406 and any(f"'{arg}'" in text for arg in
                                         ("x-queue-type", "durable", "exclusive", "auto_delete")):
            return QUEUE, count
        if (exc.reply_code == 406 and "queue type" in text) or exc.reply_code == 405:
            return QUEUE, count  # 405: another connection's exclusive queue, never a stream
        if exc.reply_code == 406 and "inequivalent arg '" in text:
            return STREAM, count  # the type matched, another argument did not
        return kind_by_delivery(params, queue), count
    if _compares_arguments(conn):
        return STREAM, count
    return kind_by_delivery(params, queue), count


def _compares_arguments(conn: Connection) -> bool:
    """Whether the broker refuses a redeclare whose arguments differ (lavinpy and RabbitMQ do)."""
    return server_product(conn) in ("lavinpy", "RabbitMQ")


def kind_by_delivery(params: AMQPParams, queue: str) -> str:
    """STREAM or QUEUE by the first delivery of a consumer with a stream's start (x-stream-offset
    "first", prefetch 1): a stream's carries its offset, a classic or quorum queue's does not (they
    ignore the argument). That one message goes back to the queue when the consumer's channel
    closes, marked redelivered, as after any consumer's failure. UNKNOWN: nothing came (the queue
    holds no ready message)."""
    try:
        with StreamClient(params, queue, prefetch=1) as probe:
            first = probe.first_offset()
    except NotAStreamError:
        return QUEUE
    return UNKNOWN if first is None else STREAM


class QueueConsumer:
    """One consumer with manual acks, on a connection of its own (so that deliveries of one channel
    fill the receive buffer and are parsed a buffer at a time), or on a new channel of ``conn`` once
    the consumer before it there has taken all its deliveries (a batch read's next part)."""

    def __init__(self, params: AMQPParams, queue: str, prefetch: int, conn: Connection | None = None) -> None:
        self.params = params
        self.queue = queue
        self.prefetch = prefetch  # 0: unlimited
        own = conn is None
        self.conn = Connection(params).open() if conn is None else conn
        try:
            self.ch = self.conn.open_consumer(prefetch, _consume_payload(queue))
        except BrokerClosed as exc:
            if own:
                self.conn.abort()
            raise StreamReadError(f"cannot consume from queue {queue!r}: {exc.reply_code} {exc.reply_text}") from None
        self.receiver = Receiver(self.conn, self.ch, queue)
        self.cancelled = False

    @property
    def last_tag(self) -> int:
        """The delivery tag of the last delivery read (0: none yet)."""
        return self.receiver.last_tag

    def read(self, sink: ColumnsSink, first_wait: float, idle_wait: float, limit: int | None = None) -> Iterator[int]:
        """Append what arrives to sink.columns until none comes for idle_wait (first_wait for the
        first), at most limit messages (the rest waits for the next read); yields how many came each
        time (see Receiver.receive)."""
        return self.receiver.receive(sink, first_wait, idle_wait, limit)

    def cancel(self) -> None:
        """Cancel the consumer; the deliveries the broker sent before its cancel-ok (a channel keeps
        their order) are then read by read() without waiting."""
        self.conn.call(self.ch, commands.Basic.Cancel(consumer_tag=_CONSUMER_TAG), commands.Basic.CancelOk)
        self.conn.unread_backlog()
        self.cancelled = True

    def ack(self, last_tag: int) -> None:
        """Ack every delivery up to last_tag (multiple)."""
        if last_tag:
            self.conn.send(basic_ack(self.ch, last_tag, True))

    def close(self) -> None:
        """Close politely (acks sent before are processed first); the broker requeues the rest."""
        self.conn.close()


def finish_consumers(consumers: list[QueueConsumer]) -> None:
    """Cancel the consumers of one connection, ack each up to the last delivery it read, and close the
    connection, all in one write, without waiting for the broker (Connection.close_soon): it applies
    them in order. A task that waited would wait for the broker's work on the acks (524,288 of them
    take it ~15 ms), with nothing else for the task's core to do at a query's end. As with any AMQP
    client's acks, none is answered: one lost with the connection only means its message is
    delivered again (at least once).

    Cancelling first: an ack frees prefetch credit, and the broker would fill it with messages that
    the close then hands back, marked redelivered although nobody saw them."""
    conn = consumers[0].conn
    cancel = commands.Basic.Cancel(consumer_tag=_CONSUMER_TAG)
    conn.close_soon(b"".join((b"" if consumer.cancelled else method_frame(consumer.ch, cancel))
                             + (basic_ack(consumer.ch, consumer.last_tag, True) if consumer.last_tag else b"")
                             for consumer in consumers))


MAX_PREFETCH = 65535  # a prefetch count is 16 bits: one consumer holds at most this many unacked
_STALL_LIMIT_S = 30.0  # ready messages that none of the consumers get for this long end a batch read


def ready_count(params: AMQPParams, queue: str) -> int:
    """The queue's ready messages now (a passive declare's message count), on a connection of its own:
    the consumer's own connection is busy with deliveries."""
    with Connection(params).open() as conn:
        ok = conn.call(conn.open_channel(), build_method(commands.Queue.Declare, queue=queue, passive=True),
                       commands.Queue.DeclareOk)
        return int(ok.message_count)


def drain_partition(params: AMQPParams, queue: str, quota: int, idle_wait: float,
                    sink: ColumnsSink) -> Iterator[None]:
    """One batch-read task: up to quota messages appended to sink.columns, acked only once the caller
    has taken them all; an abandoned iterator acks nothing. Yields when the sink is full and once at
    the end (when it holds any): the caller takes the columns then.

    A pause of idle_wait without a delivery ends the task only if the queue has no ready message
    left (a loaded broker can pause deliveries longer than that while the queue still holds the
    task's share), and then only after the consumer's cancel-ok, with what was sent before it.
    A share larger than one consumer's prefetch (65,535) is taken by consumers opened one after the
    other on channels of one connection, each once the one before has taken its part (so deliveries
    never interleave: a receive buffer holds one channel's), each holding its part unacked until the
    end, so that a big queue is still read in one wave of tasks. A new consumer costs one round trip
    (waited for while the task's core runs Spark); the end none (finish_consumers).
    """
    if quota <= 0:
        return
    wait = max(idle_wait, 0.05)
    done: list[QueueConsumer] = []  # each holds its part unacked until the end
    conn: Connection | None = None
    finished = False
    got = 0
    try:
        while got < quota:
            part = min(quota - got, MAX_PREFETCH)
            if conn is not None and conn.channels_left == 0:
                conn = None  # the broker's channel_max reached: the next part on a new connection
            # The prefetch bounds what this consumer can take from the others' shares.
            consumer = QueueConsumer(params, queue, part, conn)
            conn = consumer.conn
            done.append(consumer)
            part_got = 0
            stalled_since: float | None = None
            while part_got < part:
                before = part_got
                for added in consumer.read(sink, first_wait=wait, idle_wait=wait, limit=part - part_got):
                    part_got += added
                    if sink.full():
                        yield None
                if part_got >= part:
                    break
                now = time.monotonic()
                if part_got > before or stalled_since is None:
                    stalled_since = now
                if ready_count(params, queue) == 0 or now - stalled_since > _STALL_LIMIT_S:
                    # The queue has none ready, but the broker may have sent this consumer messages
                    # that have not arrived yet: all of them come before the cancel-ok.
                    consumer.cancel()
                    for added in consumer.read(sink, first_wait=0, idle_wait=0, limit=part - part_got):
                        part_got += added
                        if sink.full():
                            yield None
                    break
            got += part_got
            if part_got < part:
                break  # the queue ran dry: no further consumer would get anything
        if sink.columns.rows:
            yield None  # the last rows taken before the acks go
        finished = True
    finally:
        connections = list({id(consumer.conn): consumer.conn for consumer in done}.values())
        for each in connections:
            if finished:
                finish_consumers([consumer for consumer in done if consumer.conn is each])
            else:
                each.abort()  # unfinished: nothing acked, the broker requeues every part (redelivered)


def _consume_payload(queue: str) -> bytes:
    """basic.consume with manual acks and a fixed consumer tag."""
    return (_U16.pack(60) + _U16.pack(20) + b"\x00\x00" + encode_shortstr(queue) + encode_shortstr(_CONSUMER_TAG)
            + b"\x00" + encode_table({}))
