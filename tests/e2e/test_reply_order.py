"""Replies in the order of the methods that caused them, seen by a real client over TCP: a consumer
of a durable queue deleted on the same channel gets queue.delete-ok before basic.cancel (RabbitMQ's
order; the delete-ok waits for the group commit, the cancel must not overtake it)."""

from __future__ import annotations

import pika

from . import uid


def test_delete_ok_before_the_consumers_basic_cancel(broker):
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        seen: list[str] = []
        # The blocking channel runs its own callbacks later, at dispatch; the asynchronous channel
        # under it calls back as each frame arrives, which is the order to see.
        channel = ch._impl
        channel.add_on_cancel_callback(lambda frame: seen.append("basic.cancel " + frame.method.consumer_tag))
        queue = uid("reply-order")
        ch.queue_declare(queue, durable=True)
        tag = ch.basic_consume(queue, lambda *_: None)
        channel.add_callback(lambda _frame: seen.append("queue.delete-ok"), [pika.spec.Queue.DeleteOk])
        ch.queue_delete(queue)
        conn.process_data_events(time_limit=0.5)
        assert seen == ["queue.delete-ok", "basic.cancel " + tag]
        assert ch.is_open
    finally:
        conn.close()
