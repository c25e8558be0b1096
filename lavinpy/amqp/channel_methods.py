"""Two parts of a channel: the exchange and queue methods (``Declarations``) and direct reply-to
(``DirectReplyTo``)."""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import commands

from ..broker import operations_objects as ops
from ..wire.constants import NOT_FOUND, PRECONDITION_FAILED
from ..wire.errors import AMQPChannelError
from ..wire.frames import build_method

if TYPE_CHECKING:
    import asyncio

    from ..broker.vhost import VHost
    from .channel_host import ChannelHost, ReplyRegistry, ReplyTarget

REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."


def random_tag(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class MethodOutput(Protocol):
    """Where a part's replies go: its channel, while it is open."""

    closing: bool

    def send_method(self, method: Any) -> None: ...


class Declarations:
    """exchange.* and queue.* on one channel; remembers the channel's last declared queue."""

    __slots__ = ("_host", "_vhost", "_out", "last_queue")

    def __init__(self, host: ChannelHost, vhost: VHost, out: MethodOutput) -> None:
        self._host = host
        self._vhost = vhost
        self._out = out
        self.last_queue = ""

    def send_when_replicated(self, method: Any) -> None:
        """A declare/bind/delete/purge-ok: its change is on the local disk already; in a cluster it
        goes out once every in-sync follower has it too (a done-callback, no task)."""
        replicated = self._vhost.replicated()
        if replicated is None:
            self._out.send_method(method)
            return

        def send(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None and not self._out.closing:
                self._out.send_method(method)
        replicated.add_done_callback(send)

    def queue_name(self, name: str) -> str:
        """A queue name as a method gives it: empty means the channel's last declared queue."""
        if name == "":
            if not self.last_queue:
                raise AMQPChannelError(NOT_FOUND, "no previously declared queue")
            return self.last_queue
        return name

    def on_exchange_declare(self, m: commands.Exchange.Declare) -> None:
        ops.declare_exchange(self._host.actor, self._vhost, m.exchange, m.exchange_type, passive=m.passive,
                             durable=m.durable, auto_delete=m.auto_delete, internal=m.internal,
                             arguments=m.arguments)
        if not m.nowait:
            self.send_when_replicated(commands.Exchange.DeclareOk())

    def on_exchange_delete(self, m: commands.Exchange.Delete) -> None:
        ops.delete_exchange(self._host.actor, self._vhost, m.exchange, if_unused=m.if_unused)
        if not m.nowait:
            self.send_when_replicated(commands.Exchange.DeleteOk())

    def on_exchange_bind(self, m: commands.Exchange.Bind) -> None:
        ops.bind_exchange(self._host.actor, self._vhost, m.destination, m.source, m.routing_key, m.arguments)
        if not m.nowait:
            self.send_when_replicated(commands.Exchange.BindOk())

    def on_exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        ops.unbind_exchange(self._host.actor, self._vhost, m.destination, m.source, m.routing_key, m.arguments)
        if not m.nowait:
            self.send_when_replicated(commands.Exchange.UnbindOk())

    def on_queue_declare(self, m: commands.Queue.Declare) -> None:
        name = m.queue
        if name == "" and not m.passive:
            name = self._vhost.generate_queue_name()
        elif name == "":
            name = self.queue_name(name)
        if name == REPLY_TO and m.passive:
            if not m.nowait:
                self._out.send_method(build_method(commands.Queue.DeclareOk, queue=name, message_count=0,
                                                  consumer_count=0))
            return
        queue = ops.declare_queue(self._host.actor, self._vhost, name, owner=self._host, passive=m.passive,
                                  durable=m.durable, exclusive=m.exclusive, auto_delete=m.auto_delete,
                                  arguments=m.arguments, server_named=m.queue == "")
        self.last_queue = name
        if not m.nowait:
            self.send_when_replicated(build_method(
                commands.Queue.DeclareOk, queue=name, message_count=queue.message_count,
                consumer_count=queue.consumer_count))

    def on_queue_bind(self, m: commands.Queue.Bind) -> None:
        name = self.queue_name(m.queue)
        ops.bind_queue(self._host.actor, self._vhost, name, m.exchange, m.routing_key, m.arguments, self._host)
        if not m.nowait:
            self.send_when_replicated(commands.Queue.BindOk())

    def on_queue_unbind(self, m: commands.Queue.Unbind) -> None:
        name = self.queue_name(m.queue)
        ops.unbind_queue(self._host.actor, self._vhost, name, m.exchange, m.routing_key, m.arguments, self._host)
        self.send_when_replicated(commands.Queue.UnbindOk())

    def on_queue_purge(self, m: commands.Queue.Purge) -> None:
        name = self.queue_name(m.queue)
        count = ops.purge_queue(self._host.actor, self._vhost, name, self._host)
        if not m.nowait:
            self.send_when_replicated(commands.Queue.PurgeOk(message_count=count))

    def on_queue_delete(self, m: commands.Queue.Delete) -> None:
        name = self.queue_name(m.queue)
        count = ops.delete_queue(self._host.actor, self._vhost, name, owner=self._host, if_unused=m.if_unused,
                                 if_empty=m.if_empty)
        if not m.nowait:
            self.send_when_replicated(commands.Queue.DeleteOk(message_count=count))


class DirectReplyTo:
    """A channel's direct reply-to consumer: its tag and the key requesters' replies come back to."""

    __slots__ = ("_registry", "key", "consumer_tag")

    def __init__(self, registry: ReplyRegistry) -> None:
        self._registry = registry
        self.key: str | None = None
        self.consumer_tag: str | None = None

    def consume(self, target: ReplyTarget, m: commands.Basic.Consume, tag: str) -> None:
        """basic.consume from amq.rabbitmq.reply-to (no-ack only, one per channel)."""
        if not m.no_ack:
            raise AMQPChannelError(PRECONDITION_FAILED, "reply consumer cannot acknowledge", 60, 20)
        if self.consumer_tag is not None:
            raise AMQPChannelError(PRECONDITION_FAILED, "reply consumer already set", 60, 20)
        self.consumer_tag = tag
        self.key = REPLY_TO_PREFIX + random_tag("")
        self._registry.reply_to[self.key] = target

    def target(self, routing_key: str) -> ReplyTarget | None:
        """The open channel a reply with this routing key goes to, if any."""
        target = self._registry.reply_to.get(routing_key)
        return None if target is None or target.closing else target

    def drop(self) -> None:
        if self.key is not None:
            self._registry.reply_to.pop(self.key, None)
        self.key = self.consumer_tag = None
