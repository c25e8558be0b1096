"""Two parts of a channel: the exchange and queue methods (``Declarations``) and direct reply-to
(``DirectReplyTo``); and the checks of a publish's special properties."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import commands

from ..broker.ops import ArgumentError, parse_expiration
from ..broker.ops import objects as ops
from ..wire.constants import NOT_FOUND, PRECONDITION_FAILED
from ..wire.errors import AMQPChannelError
from ..wire.frames import build_method
from ..wire.properties import PropertiesError, decode_properties, peek_expiration, replace_field

if TYPE_CHECKING:
    import asyncio

    from ..broker.ops import VHost
    from ..broker.ops.replies import ReplyQueue
    from .channel_host import ChannelHost, ReplyRegistry, ReplyTarget

REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."

_REPLY_TO_FLAG = 1 << 9
_EXPIRATION_FLAG = 1 << 8
_USER_ID_FLAG = 1 << 4


def random_tag(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


def check_special_properties(properties: bytes, username: str, reply_key: str | None) -> bytes:
    """A publish's expiration, user_id and reply-to checked (and reply-to set to the channel's direct
    reply-to key, ``reply_key``); the properties to store."""
    flags = (properties[0] << 8) | properties[1]
    if flags & _EXPIRATION_FLAG:
        try:
            expiration = peek_expiration(properties)
            if expiration is not None:
                parse_expiration(expiration)
        except ArgumentError as e:
            raise AMQPChannelError(PRECONDITION_FAILED, e.text, 60, 40)
        except PropertiesError as e:
            raise AMQPChannelError(PRECONDITION_FAILED, f"invalid expiration: {e}", 60, 40)
    if not flags & (_REPLY_TO_FLAG | _USER_ID_FLAG):
        return properties
    props = decode_properties(properties)
    if flags & _USER_ID_FLAG and props.user_id != username:
        raise AMQPChannelError(PRECONDITION_FAILED,
                               f"user_id property set to '{props.user_id}' but authenticated user was "
                               f"'{username}'", 60, 40)
    if flags & _REPLY_TO_FLAG and props.reply_to == REPLY_TO:
        if reply_key is None:
            raise AMQPChannelError(PRECONDITION_FAILED, "fast reply consumer does not exist", 60, 40)
        properties = replace_field(properties, "reply_to", reply_key)
    return properties


class MethodOutput(Protocol):
    """Where a part's replies go: its channel, in the order of their methods."""

    replies: ReplyQueue

    def send_method(self, method: Any) -> None: ...

    def reply_after(self, wait: asyncio.Future[None] | None, method: Any, cause: Any) -> None: ...


class Declarations:
    """exchange.* and queue.* on one channel; remembers the channel's last declared queue."""

    __slots__ = ("_host", "_vhost", "_out", "last_queue")

    def __init__(self, host: ChannelHost, vhost: VHost, out: MethodOutput) -> None:
        self._host = host
        self._vhost = vhost
        self._out = out
        self.last_queue = ""

    def _run(self, m: Any, operation: Callable[[], Any]) -> None:
        """Run ``operation`` for the method ``m``; its reply (the value returned, None for none or
        nowait) goes out once the change is with every in-sync follower and the definitions appended
        are on disk (``VHost.replicated``), in order; what the operation sends this channel meanwhile
        (basic.cancel of a deleted queue's consumers) goes behind the reply. A failed flush or
        replication closes the channel (broker.ops.replies)."""
        replies = self._out.replies
        place = replies.hold()
        reply = None
        try:
            reply = operation()
        finally:
            if reply is None or getattr(m, "nowait", False):
                replies.fill(place, None, None)
            else:
                replies.fill(place, self._vhost.replicated(), (reply, m))

    def queue_name(self, name: str) -> str:
        """A queue name as a method gives it: empty means the channel's last declared queue."""
        if name == "":
            if not self.last_queue:
                raise AMQPChannelError(NOT_FOUND, "no previously declared queue")
            return self.last_queue
        return name

    def on_exchange_declare(self, m: commands.Exchange.Declare) -> None:
        def declare() -> Any:
            ops.declare_exchange(self._host.actor, self._vhost, m.exchange, m.exchange_type, passive=m.passive,
                                 durable=m.durable, auto_delete=m.auto_delete, internal=m.internal,
                                 arguments=m.arguments)
            return commands.Exchange.DeclareOk()
        self._run(m, declare)

    def on_exchange_delete(self, m: commands.Exchange.Delete) -> None:
        def delete() -> Any:
            ops.delete_exchange(self._host.actor, self._vhost, m.exchange, if_unused=m.if_unused)
            return commands.Exchange.DeleteOk()
        self._run(m, delete)

    def on_exchange_bind(self, m: commands.Exchange.Bind) -> None:
        def bind() -> Any:
            ops.bind_exchange(self._host.actor, self._vhost, m.destination, m.source, m.routing_key, m.arguments)
            return commands.Exchange.BindOk()
        self._run(m, bind)

    def on_exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        def unbind() -> Any:
            ops.unbind_exchange(self._host.actor, self._vhost, m.destination, m.source, m.routing_key,
                                m.arguments)
            return commands.Exchange.UnbindOk()
        self._run(m, unbind)

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

        def declare() -> Any:
            queue = ops.declare_queue(self._host.actor, self._vhost, name, owner=self._host, passive=m.passive,
                                      durable=m.durable, exclusive=m.exclusive, auto_delete=m.auto_delete,
                                      arguments=m.arguments, server_named=m.queue == "")
            self.last_queue = name
            return build_method(commands.Queue.DeclareOk, queue=name, message_count=queue.message_count,
                                consumer_count=queue.consumer_count)
        self._run(m, declare)

    def on_queue_bind(self, m: commands.Queue.Bind) -> None:
        def bind() -> Any:
            ops.bind_queue(self._host.actor, self._vhost, self.queue_name(m.queue), m.exchange, m.routing_key,
                           m.arguments, self._host)
            return commands.Queue.BindOk()
        self._run(m, bind)

    def on_queue_unbind(self, m: commands.Queue.Unbind) -> None:
        def unbind() -> Any:
            ops.unbind_queue(self._host.actor, self._vhost, self.queue_name(m.queue), m.exchange, m.routing_key,
                             m.arguments, self._host)
            return commands.Queue.UnbindOk()
        self._run(m, unbind)

    def on_queue_purge(self, m: commands.Queue.Purge) -> None:
        def purge() -> Any:
            count = ops.purge_queue(self._host.actor, self._vhost, self.queue_name(m.queue), self._host)
            return commands.Queue.PurgeOk(message_count=count)
        self._run(m, purge)

    def on_queue_delete(self, m: commands.Queue.Delete) -> None:
        def delete() -> Any:
            count = ops.delete_queue(self._host.actor, self._vhost, self.queue_name(m.queue), owner=self._host,
                                     if_unused=m.if_unused, if_empty=m.if_empty)
            return commands.Queue.DeleteOk(message_count=count)
        self._run(m, delete)


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
