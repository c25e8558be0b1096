"""A channel's AMQP methods other than publish and acks (mixin for Channel): exchanges, queues,
consumers, basic.get/qos/recover, direct reply-to."""

from __future__ import annotations

import asyncio
import base64
import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pamqp import commands

from ..broker import operations_objects as ops
from ..broker.arguments import ArgumentError, validate_consumer_arguments
from ..broker.consumer import Consumer
from ..wire import writer
from ..wire.constants import ACCESS_REFUSED, NOT_ALLOWED, NOT_FOUND, NOT_IMPLEMENTED, PRECONDITION_FAILED
from ..wire.errors import AMQPChannelError, AMQPConnectionError
from .unacked import Unacked

if TYPE_CHECKING:
    from ..broker.vhost import VHost
    from .connection import AMQPConnection

REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."


def _random_tag(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class ChannelMethods:
    conn: AMQPConnection
    id: int
    vhost: VHost
    last_queue: str
    consumers: dict[str, Consumer]
    prefetch_count: int
    global_prefetch: int
    delivery_tag: int
    unacked: OrderedDict[int, Unacked]
    reply_to_key: str | None
    reply_to_consumer: str | None
    closing: bool

    def _send_when_replicated(self, method: Any) -> None:
        """A declare/bind/delete/purge-ok: its change is on the local disk already; in a cluster it
        goes out once every in-sync follower has it too."""
        if self.vhost.store.barrier is None:
            self.send_method(method)
            return
        async def send() -> None:
            await self.vhost.store.wait_replicated()
            if not self.closing:
                self.send_method(method)
        asyncio.get_running_loop().create_task(send())

    def _queue_name(self, name: str) -> str:
        if name == "":
            if not self.last_queue:
                raise AMQPChannelError(NOT_FOUND, "no previously declared queue")
            return self.last_queue
        return name

    def on_exchange_declare(self, m: commands.Exchange.Declare) -> None:
        ops.declare_exchange(self.conn.actor, self.vhost, m.exchange, m.exchange_type, passive=m.passive,
                             durable=m.durable, auto_delete=m.auto_delete, internal=m.internal,
                             arguments=m.arguments)
        if not m.nowait:
            self._send_when_replicated(commands.Exchange.DeclareOk())

    def on_exchange_delete(self, m: commands.Exchange.Delete) -> None:
        ops.delete_exchange(self.conn.actor, self.vhost, m.exchange, if_unused=m.if_unused)
        if not m.nowait:
            self._send_when_replicated(commands.Exchange.DeleteOk())

    def on_exchange_bind(self, m: commands.Exchange.Bind) -> None:
        ops.bind_exchange(self.conn.actor, self.vhost, m.destination, m.source, m.routing_key, m.arguments)
        if not m.nowait:
            self._send_when_replicated(commands.Exchange.BindOk())

    def on_exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        ops.unbind_exchange(self.conn.actor, self.vhost, m.destination, m.source, m.routing_key, m.arguments)
        if not m.nowait:
            self._send_when_replicated(commands.Exchange.UnbindOk())

    def on_queue_declare(self, m: commands.Queue.Declare) -> None:
        name = m.queue
        if name == "" and not m.passive:
            name = self.vhost.generate_queue_name()
        elif name == "":
            name = self._queue_name(name)
        if name == REPLY_TO and m.passive:
            if not m.nowait:
                self.send_method(commands.Queue.DeclareOk(queue=name, message_count=0, consumer_count=0))
            return
        queue = ops.declare_queue(self.conn.actor, self.vhost, name, owner=self.conn, passive=m.passive,
                                  durable=m.durable, exclusive=m.exclusive, auto_delete=m.auto_delete,
                                  arguments=m.arguments, server_named=m.queue == "")
        self.last_queue = name
        if not m.nowait:
            self._send_when_replicated(commands.Queue.DeclareOk(
                queue=name, message_count=queue.message_count, consumer_count=queue.consumer_count))

    def on_queue_bind(self, m: commands.Queue.Bind) -> None:
        name = self._queue_name(m.queue)
        ops.bind_queue(self.conn.actor, self.vhost, name, m.exchange, m.routing_key, m.arguments, self.conn)
        if not m.nowait:
            self._send_when_replicated(commands.Queue.BindOk())

    def on_queue_unbind(self, m: commands.Queue.Unbind) -> None:
        name = self._queue_name(m.queue)
        ops.unbind_queue(self.conn.actor, self.vhost, name, m.exchange, m.routing_key, m.arguments, self.conn)
        self._send_when_replicated(commands.Queue.UnbindOk())

    def on_queue_purge(self, m: commands.Queue.Purge) -> None:
        name = self._queue_name(m.queue)
        count = ops.purge_queue(self.conn.actor, self.vhost, name, self.conn)
        if not m.nowait:
            self._send_when_replicated(commands.Queue.PurgeOk(message_count=count))

    def on_queue_delete(self, m: commands.Queue.Delete) -> None:
        name = self._queue_name(m.queue)
        count = ops.delete_queue(self.conn.actor, self.vhost, name, owner=self.conn, if_unused=m.if_unused,
                                 if_empty=m.if_empty)
        if not m.nowait:
            self._send_when_replicated(commands.Queue.DeleteOk(message_count=count))

    def on_basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise AMQPConnectionError(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})", 60, 10)
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:
            self.prefetch_count = m.prefetch_count
        self.send_method(commands.Basic.QosOk())
        self.conn.schedule_channel_deliveries(self)

    def on_basic_consume(self, m: commands.Basic.Consume) -> None:
        tag = m.consumer_tag or _random_tag("amq.ctag-")
        if tag in self.consumers or tag == self.reply_to_consumer:
            raise AMQPConnectionError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20)
        if m.queue == REPLY_TO:
            self._consume_reply_to(m, tag)
            return
        limit = self.conn.config.max_consumers_per_channel
        if limit and len(self.consumers) >= limit:
            raise AMQPChannelError(NOT_ALLOWED, f"reached maximum ({limit}) of consumers per channel")
        name = self._queue_name(m.queue)
        queue = ops.readable_queue(self.conn.actor, self.vhost, name, self.conn)
        if queue.has_exclusive_consumer() or (m.exclusive and queue.consumers):
            raise AMQPChannelError(ACCESS_REFUSED, f"queue '{name}' in vhost '{self.vhost.name}' in exclusive use")
        args = dict(m.arguments or {})
        try:
            # x-stream-offset is checked by the stream itself (its own reply texts).
            validate_consumer_arguments(args, queue=name, vhost=self.vhost.name)
        except ArgumentError as e:
            raise AMQPChannelError(PRECONDITION_FAILED, e.text)
        priority = args.get("x-priority", 0)
        queue.validate_consumer(m.no_ack, self.prefetch_count, args, self.global_prefetch)
        consumer = Consumer(tag, queue, self, no_ack=m.no_ack, exclusive=m.exclusive, priority=priority,
                            prefetch=self.prefetch_count, arguments=args)
        self.consumers[tag] = consumer
        if not m.nowait:
            self.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))
        queue.add_consumer(consumer)

    def _consume_reply_to(self, m: commands.Basic.Consume, tag: str) -> None:
        if not m.no_ack:
            raise AMQPChannelError(PRECONDITION_FAILED, "reply consumer cannot acknowledge", 60, 20)
        if self.reply_to_consumer is not None:
            raise AMQPChannelError(PRECONDITION_FAILED, "reply consumer already set", 60, 20)
        self.reply_to_consumer = tag
        self.reply_to_key = REPLY_TO_PREFIX + _random_tag("")
        self.conn.sessions.reply_to[self.reply_to_key] = self
        if not m.nowait:
            self.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))

    def on_basic_cancel(self, m: commands.Basic.Cancel) -> None:
        consumer = self.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)
        elif m.consumer_tag == self.reply_to_consumer:
            self._drop_reply_to()
        if not m.nowait:
            self.send_method(commands.Basic.CancelOk(consumer_tag=m.consumer_tag))

    def _drop_reply_to(self) -> None:
        if self.reply_to_key is not None:
            self.conn.sessions.reply_to.pop(self.reply_to_key, None)
        self.reply_to_key = self.reply_to_consumer = None

    def on_basic_get(self, m: commands.Basic.Get) -> None:
        name = self._queue_name(m.queue)
        queue = ops.readable_queue(self.conn.actor, self.vhost, name, self.conn)
        got = queue.get()
        if got is None:
            self.send_method(commands.Basic.GetEmpty())
            return
        pos, msg, redelivered = got
        self.delivery_tag += 1
        tag = self.delivery_tag
        if m.no_ack:
            queue.ack(pos)
            queue.stats.get_no_ack += 1
        else:
            self.unacked[tag] = Unacked(queue, pos, None)
            queue.stats.get += 1
        if redelivered:
            queue.stats.redeliver += 1
        self.conn.send_many(writer.get_ok(self.id, tag, redelivered, msg.exchange, msg.routing_key,
                                          queue.message_count, msg.properties, msg.body, self.conn.frame_max))

    def on_basic_recover(self, m: commands.Basic.Recover) -> None:
        if not m.requeue:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "requeue=false", 60, 110)
        items = list(self.unacked.items())
        self.unacked.clear()
        self._settle(items, True)
        self.send_method(commands.Basic.RecoverOk())

    def on_basic_recover_async(self, m: Any) -> None:
        """Deprecated, but RabbitMQ still serves it: basic.recover without a reply."""
        if not m.requeue:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "requeue=false", 60, 100)
        items = list(self.unacked.items())
        self.unacked.clear()
        self._settle(items, True)
