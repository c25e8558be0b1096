"""Regressions found by running the client libraries' own test suites (aiormq, aio-pika, py-amqp,
kombu) against lavinpy.

Each test names the client test that found it and pins the RabbitMQ behaviour it expects.
"""

from __future__ import annotations

import pytest

from . import uid
from .rawamqp import RawAMQP, commands


def test_any_channel_number_may_be_opened(broker):
    """aiormq tests/test_connection.py::test_bad_channel opens channel 65535 on a connection tuned
    to RabbitMQ's channel_max 2047: RabbitMQ limits the number of open channels, not their numbers."""
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        assert c.tune.channel_max < 65535
        c.open_channel(65535)
        c.open_channel(c.tune.channel_max + 1)
        c.call(65535, commands.Queue.Declare(queue=uid("q"), exclusive=True), commands.Queue.DeclareOk)


def test_channel_max_counts_open_channels_only(broker):
    """A closed channel no longer counts: with channel_max 2, channels 7 and 9 then 9 and 11."""
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake(channel_max=2)
        c.open_channel(7)
        c.open_channel(9)
        c.call(7, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
               commands.Channel.CloseOk)
        c.open_channel(11)
        c.send(13, commands.Channel.Open())
        close = c.expect_connection_close()
        assert close.reply_code == 530
        assert "channel_max" in close.reply_text


@pytest.mark.parametrize("passive", [True, False])
def test_declare_default_exchange_is_access_refused(broker, passive):
    """aiormq tests/test_connection.py::test_channel_closed_reuse: RabbitMQ's check_not_default_exchange
    runs for passive and active exchange.declare of "" alike."""
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send(1, commands.Exchange.Declare(exchange="", exchange_type="direct", passive=passive))
        close = c.expect(commands.Channel.Close, 1)
        assert close.reply_code == 403


def test_redeclare_exclusive_queue_as_non_exclusive_is_resource_locked(broker):
    """aiormq tests/test_channel.py::test_exclusive_queue_locked: RabbitMQ checks exclusive ownership
    (strict) before the other properties, so a non-exclusive redeclare from the owning connection gets
    405 RESOURCE_LOCKED, never 406 "inequivalent arg 'exclusive'"."""
    q = uid("q")
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.open_channel(2)
        c.call(1, commands.Queue.Declare(queue=q, exclusive=True), commands.Queue.DeclareOk)
        c.send(2, commands.Queue.Declare(queue=q, exclusive=False))
        close = c.expect_channel_close(2)
        assert close.reply_code == 405


def test_recover_async_requeues_without_reply(broker):
    """aiormq tests/test_nowait.py::test_basic_recover_nowait[True]: basic.recover-async with
    requeue=true requeues the unacked messages and has no reply; the connection stays open."""
    q = uid("q")
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Queue.Declare(queue=q, exclusive=True), commands.Queue.DeclareOk)
        c.publish(1, "", q, b"m1")
        got = c.get_message(1, q, no_ack=False)
        assert got is not None
        c.send(1, commands.Basic.RecoverAsync(requeue=True))
        c.call(1, commands.Basic.Qos(prefetch_count=1), commands.Basic.QosOk)
        again = c.get_message(1, q, no_ack=True)
        assert again is not None and again[0].redelivered and again[2] == b"m1"


@pytest.mark.parametrize("missing", ["queue", "exchange"])
def test_queue_unbind_of_missing_resource_is_ok(broker, missing):
    """aio-pika tests/test_rpc.py (RPC.close unbinds its auto-delete reply queue after cancelling its
    consumer) and tests/test_amqp.py::test_big_message (cleanup deletes the queue, then unbinds it):
    RabbitMQ's binding removal reports only 'absent' (down node) resources, so unbinding from a queue or
    exchange that does not exist answers queue.unbind-ok."""
    q, x = uid("q"), uid("x")
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        if missing == "exchange":
            c.call(1, commands.Queue.Declare(queue=q, exclusive=True), commands.Queue.DeclareOk)
        else:
            c.call(1, commands.Exchange.Declare(exchange=x, exchange_type="direct", auto_delete=True),
                   commands.Exchange.DeclareOk)
        c.call(1, commands.Queue.Unbind(queue=q, exchange=x, routing_key="k"), commands.Queue.UnbindOk)


def test_queue_delete_ok_comes_before_own_consumer_cancel(broker):
    """kombu t/integration/test_py_amqp.py::test_PyAMQPEventLoop::test_ack_from_another_thread deletes a
    queue from the channel that consumes from it. In RabbitMQ the channel gets delete-ok from the queue
    process first and the consumer's basic.cancel only later (from the queue's 'DOWN'), so py-amqp's
    queue_delete returns before it sees the cancel; lavinpy sends the cancel first and py-amqp raises
    ConsumerCancelled from queue_delete."""
    q = uid("q")
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Queue.Declare(queue=q), commands.Queue.DeclareOk)
        c.call(1, commands.Basic.Consume(queue=q, consumer_tag="ctag"), commands.Basic.ConsumeOk)
        c.send(1, commands.Queue.Delete(queue=q))
        c.expect(commands.Queue.DeleteOk, 1)
        cancel = c.expect(commands.Basic.Cancel, 1)
        assert cancel.consumer_tag == "ctag"
