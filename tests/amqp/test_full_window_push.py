"""A message pushed while the queue's lone consumer has its prefetch window full asks for no delivery
step (``ConsumerSet.step_wanted``): whatever gives the window back (an ack, ack multiple, a nack that
requeues, a reject, basic.recover) asks for it, and the consumer gets the backlog in order."""

from __future__ import annotations

from pathlib import Path

from pamqp import body, commands
from session_client import Harness
from test_delivery_round import _publishes


def test_a_full_window_s_backlog_goes_out_at_each_settle(tmp_path: Path) -> None:
    harness = Harness(tmp_path, fsync="never")
    try:
        publisher, consumer = harness.open_client(), harness.open_client()
        publisher.send((1, commands.Queue.Declare(queue="work")))
        publisher.read()
        consumer.send((1, commands.Basic.Qos(prefetch_count=2)), (1, commands.Basic.Consume(queue="work",
                                                                                            consumer_tag="c")))
        consumer.read()
        scheduler = harness.broker.scheduler
        queue = harness.broker.vhosts["/"].queues["work"]
        publisher.send(_publishes(publisher, 2, 0))  # in hand to the consumer: its window full
        steps: list[bool] = []
        own_step = queue.deliver
        queue.deliver = lambda: steps.append(True) or own_step()  # type: ignore[method-assign]
        publisher.send(_publishes(publisher, 8, 2))
        publisher.read()
        assert not steps and queue not in scheduler.queues and queue.message_count == 8

        def got() -> list[tuple[int | None, bool, bytes]]:
            frames = consumer.read()
            replies = [value for _, value in frames if isinstance(value, commands.Basic.RecoverOk)]
            delivers = [value for _, value in frames if isinstance(value, commands.Basic.Deliver)]
            bodies = [value.value for _, value in frames if isinstance(value, body.ContentBody)]
            deliveries = [(d.delivery_tag, bool(d.redelivered), bytes(b))
                          for d, b in zip(delivers, bodies, strict=True)]
            return deliveries + [(0, False, b"RecoverOk")] * len(replies)

        assert got() == [(1, False, b"m0"), (2, False, b"m1")]
        consumer.send((1, commands.Basic.Ack(delivery_tag=1)))
        assert got() == [(3, False, b"m2")]
        consumer.send((1, commands.Basic.Ack(delivery_tag=3, multiple=True)))
        assert got() == [(4, False, b"m3"), (5, False, b"m4")]
        consumer.send((1, commands.Basic.Nack(delivery_tag=4, requeue=True)))
        assert got() == [(6, True, b"m3")]
        consumer.send((1, commands.Basic.Reject(delivery_tag=5, requeue=False)))
        assert got() == [(7, False, b"m5")]
        consumer.send((1, commands.Basic.Recover(requeue=True)))
        assert got() == [(8, True, b"m3"), (9, True, b"m5"), (0, False, b"RecoverOk")]
        consumer.send((1, commands.Basic.Ack(delivery_tag=9, multiple=True)))
        assert got() == [(10, False, b"m6"), (11, False, b"m7")]
        consumer.send((1, commands.Basic.Ack(delivery_tag=11, multiple=True)))
        assert got() == [(12, False, b"m8"), (13, False, b"m9")] and queue.message_count == 0
        assert steps  # the settles asked for them
    finally:
        harness.close()
