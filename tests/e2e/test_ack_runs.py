"""Runs of basic.ack frames arriving in one read: settled as a batch, with exactly the outcome of
settling them one by one (RabbitMQ's semantics).

Every test writes its acks with one sendall, so the broker reads them together; the checks hold
however the bytes are split, which is the point: batching must not change what a client sees.
"""

from __future__ import annotations

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from lavinpy.wire import writer

from . import uid
from .rawamqp import RawAMQP


def _connect(broker, *channels: int) -> RawAMQP:
    c = RawAMQP(broker.host, broker.port)
    c.handshake()
    for channel in channels:
        c.open_channel(channel)
    return c


def _fill(c: RawAMQP, channel: int, queue: str, count: int) -> None:
    """Declare ``queue`` (durable, not exclusive: it outlives the connection) with ``count`` messages."""
    c.call(channel, commands.Queue.Declare(queue=queue, durable=True), commands.Queue.DeclareOk)
    for i in range(count):
        c.publish(channel, "", queue, f"m{i}".encode())
    ok = c.call(channel, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    assert ok.message_count == count


def _deliveries(c: RawAMQP, count: int) -> list[tuple[int, int, bytes, bool]]:
    """The next ``count`` deliveries as (channel, delivery tag, body, redelivered)."""
    out = []
    while len(out) < count:
        deliver = c.expect(commands.Basic.Deliver)
        header = c.expect(ContentHeader)
        channel, body = c.recv()
        assert isinstance(body, ContentBody) and len(body.value) == header.body_size
        out.append((channel, deliver.delivery_tag, body.value, deliver.redelivered))
    return out


def _consume(c: RawAMQP, channel: int, queue: str, count: int, prefetch: int = 0) -> list[int]:
    if prefetch:
        c.call(channel, commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
    c.call(channel, commands.Basic.Consume(queue=queue), commands.Basic.ConsumeOk)
    got = _deliveries(c, count)
    assert [body for _, _, body, _ in got] == [f"m{i}".encode() for i in range(count)]
    return [tag for _, tag, _, _ in got]


def _acks(channel: int, *tags: int | tuple[int, bool]) -> bytes:
    """basic.ack frames; a (tag, True) item is a multiple=true ack."""
    return b"".join(writer.basic_ack(channel, *(t if isinstance(t, tuple) else (t, False))) for t in tags)


def _left(broker, queue: str) -> list[tuple[bytes, bool]]:
    """What the queue holds now, from a new connection: (body, redelivered) in order; deletes it."""
    with _connect(broker, 1) as c:
        out = []
        while (got := c.get_message(1, queue)) is not None:
            out.append((got[2], got[0].redelivered))
        c.call(1, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    return out


def _expect_unknown_tag(c: RawAMQP, channel: int, tag: int) -> None:
    close = c.expect_channel_close(channel)
    assert (close.reply_code, close.reply_text) == (406, f"PRECONDITION_FAILED - unknown delivery tag {tag}")
    assert (close.class_id, close.method_id) == (60, 80)


def test_a_run_of_acks_settles_all_and_releases_prefetch(broker):
    q = uid("ackrun")
    with _connect(broker, 1) as c:
        _fill(c, 1, q, 12)
        tags = _consume(c, 1, q, 5, prefetch=5)
        assert tags == [1, 2, 3, 4, 5]
        c.send_raw(_acks(1, *tags))  # the credit comes back: the next five are delivered
        nxt = _deliveries(c, 5)
        assert [(tag, body) for _, tag, body, _ in nxt] == [(6 + i, f"m{5 + i}".encode()) for i in range(5)]
        c.send_raw(_acks(1, 6, 7, 8, 9, 10))
        last = _deliveries(c, 2)
        assert [body for _, _, body, _ in last] == [b"m10", b"m11"]
        c.call(1, commands.Channel.Close(200, "bye", 0, 0), commands.Channel.CloseOk)  # m10 and m11 go back
    assert _left(broker, q) == [(b"m10", True), (b"m11", True)]


def test_unknown_tag_in_a_run_applies_the_acks_before_it_only(broker):
    q = uid("ackrun")
    with _connect(broker, 1, 2) as c:
        _fill(c, 1, q, 6)
        assert _consume(c, 1, q, 6) == [1, 2, 3, 4, 5, 6]
        c.send_raw(_acks(1, 1, 2, 99, 3, 4))
        _expect_unknown_tag(c, 1, 99)
        # the connection and its other channel go on
        c.call(2, commands.Queue.Declare(queue=q, passive=True), commands.Queue.DeclareOk)
    assert _left(broker, q) == [(f"m{i}".encode(), True) for i in (2, 3, 4, 5)]


def test_a_tag_acked_twice_in_one_run_is_unknown_the_second_time(broker):
    q = uid("ackrun")
    with _connect(broker, 1) as c:
        _fill(c, 1, q, 4)
        assert _consume(c, 1, q, 4) == [1, 2, 3, 4]
        c.send_raw(_acks(1, 2, 1, 2, 3))
        _expect_unknown_tag(c, 1, 2)
    assert _left(broker, q) == [(b"m2", True), (b"m3", True)]


def test_multiple_true_inside_a_run_keeps_its_place(broker):
    q = uid("ackrun")
    with _connect(broker, 1) as c:
        _fill(c, 1, q, 8)
        assert _consume(c, 1, q, 8) == list(range(1, 9))
        # 1, 2; then 3..5 by multiple=true; 6; then 4 again: already settled by the multiple ack.
        # Taken out of order (4 before the multiple ack) there would be no error at all.
        c.send_raw(_acks(1, 1, 2, (5, True), 6, 4, 7))
        _expect_unknown_tag(c, 1, 4)
    assert _left(broker, q) == [(b"m6", True), (b"m7", True)]


def test_acks_of_two_channels_interleaved_in_one_read(broker):
    q1, q2 = uid("ackrun1"), uid("ackrun2")
    with _connect(broker, 1, 2) as c:
        _fill(c, 1, q1, 4)
        _fill(c, 2, q2, 4)
        assert _consume(c, 1, q1, 4) == [1, 2, 3, 4]
        assert _consume(c, 2, q2, 4) == [1, 2, 3, 4]
        c.send_raw(_acks(1, 1) + _acks(2, 1) + _acks(1, 2) + _acks(2, 2) + _acks(1, 3) + _acks(2, 9)
                   + _acks(2, 3) + _acks(1, 4))
        _expect_unknown_tag(c, 2, 9)
        # channel 1 is unaffected, its acks after channel 2's error included
        ok = c.call(1, commands.Queue.Declare(queue=q1, passive=True), commands.Queue.DeclareOk)
        assert ok.message_count == 0
        c.call(1, commands.Channel.Close(200, "bye", 0, 0), commands.Channel.CloseOk)
    assert _left(broker, q1) == []
    assert _left(broker, q2) == [(b"m2", True), (b"m3", True)]


def test_acks_in_a_transaction_wait_for_commit(broker):
    q = uid("ackrun")
    with _connect(broker, 1) as c:
        _fill(c, 1, q, 6)
        c.call(1, commands.Tx.Select(), commands.Tx.SelectOk)
        assert _consume(c, 1, q, 6) == list(range(1, 7))
        c.send_raw(_acks(1, 1, 2) + writer.method_frame(1, commands.Tx.Commit()))
        c.expect(commands.Tx.CommitOk, 1)
        c.send_raw(_acks(1, 3, 4) + writer.method_frame(1, commands.Tx.Rollback()))
        c.expect(commands.Tx.RollbackOk, 1)  # 3 and 4 stay unacked
        c.send_raw(_acks(1, 5, 77, 3))  # validated at once: 77 closes the channel, 5 was never committed
        _expect_unknown_tag(c, 1, 77)
    assert _left(broker, q) == [(f"m{i}".encode(), True) for i in (2, 3, 4, 5)]
