"""One AMQP channel: frames in, publishing, deliveries, acks, teardown.

The rest of a channel is in mixins: content assembly (content.py), confirms and transactions
(confirms.py), and the methods for exchanges, queues and consumers (channel_methods.py).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from itertools import repeat
from typing import TYPE_CHECKING, Any

from pamqp import commands

from ..broker.arguments import ArgumentError, parse_expiration
from ..broker.operations_messages import publish_exchange
from ..broker.vhost import REJECTED
from ..store.record import StoredMessage
from ..wire import writer
from ..wire.constants import (
    COMMAND_INVALID,
    NO_ROUTE,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
)
from ..wire.errors import AMQPChannelError, AMQPConnectionError, AMQPError
from ..wire.properties import PropertiesError, decode_properties, peek_expiration, replace_field
from ..wire.reader import Ack, BodyFrame, HeaderFrame, Nack, Publish, Reject
from .channel_methods import REPLY_TO, REPLY_TO_PREFIX, ChannelMethods
from .confirms import ConfirmsAndTx
from .content import ContentAssembly, release_bodies
from .log import channel_close_log
from .unacked import Unacked, unacked_run

if TYPE_CHECKING:
    from ..broker.consumer import Consumer
    from ..broker.exchanges.base import Exchange
    from ..broker.vhost import VHost
    from .connection import AMQPConnection

log = logging.getLogger("lavinpy.channel")

_REPLY_TO_FLAG = 1 << 9
_EXPIRATION_FLAG = 1 << 8
_USER_ID_FLAG = 1 << 4


def _method_ids(method: Any) -> tuple[int, int]:
    index = getattr(method, "index", None)
    if index is None:
        index = getattr(type(method), "INDEX", 0)
    return (index >> 16) & 0xFFFF, index & 0xFFFF


class Channel(ContentAssembly, ConfirmsAndTx, ChannelMethods):
    def __init__(self, connection: AMQPConnection, channel_id: int) -> None:
        self.conn = connection
        self.id = channel_id
        self.vhost: VHost = connection.vhost
        self.closing = False
        self.closed = False
        # content assembly
        self.in_content = False  # after basic.publish, until the body is complete
        self._header_seen = False
        self._publish: Publish | None = None
        self._publish_exchange: Exchange | None = None  # resolved and permission-checked
        self._publish_exchange_name: str | None = None
        self._publish_generation = -1
        self._properties = b""
        self._body_size = 0
        self._body_parts: list[bytes] = []
        self._body_received = 0
        self._spooled = None  # a large body being written to the connection's spool
        # deliveries
        self.delivery_tag = 0
        self.unacked: OrderedDict[int, Unacked] = OrderedDict()
        self.consumers: dict[str, Consumer] = {}
        self.prefetch_count = 0  # for consumers created after basic.qos(global=false)
        self.global_prefetch = 0  # basic.qos(global=true): the whole channel
        self.flow_active = True
        self.last_queue = ""
        self.init_confirms()  # confirms and transactions
        # consumer timeout: (oldest unacked delivery tag, when the sweep first saw it)
        self.oldest_unacked_seen: tuple[int, float] | None = None
        # direct reply-to
        self.reply_to_key: str | None = None
        self.reply_to_consumer: str | None = None

    # --- output -------------------------------------------------------------------------------
    def send_method(self, method: Any) -> None:
        self.conn.send(writer.method_frame(self.id, method))

    # --- errors -------------------------------------------------------------------------------
    def close_with_error(self, error: AMQPChannelError, method: Any | None) -> None:
        class_id, method_id = (error.class_id, error.method_id)
        if method is not None and not class_id:
            class_id, method_id = _method_ids(method)
        channel_close_log.log(logging.INFO, "channel %d on %s closed: %s", self.id, self.conn.name, error.text)
        self.send_method(commands.Channel.Close(reply_code=error.reply_code, reply_text=error.text[:255],
                                                class_id=class_id, method_id=method_id))
        self.closing = True
        self.release()

    # --- frames in ----------------------------------------------------------------------------
    def handle_frame(self, frame: Any) -> None:
        """Process one frame for this channel; errors close the channel or the connection."""
        if self.closing:
            # After channel.close only close/close-ok matter (AMQP 0-9-1 section 2.2.6).
            method = getattr(frame, "method", None)
            if isinstance(method, commands.Channel.CloseOk):
                self.conn.remove_channel(self.id)
            elif isinstance(method, commands.Channel.Close):
                self.send_method(commands.Channel.CloseOk())
            return
        if isinstance(frame, BodyFrame):
            if not self.in_content:
                raise AMQPConnectionError(UNEXPECTED_FRAME, f"expected a method frame on channel {self.id}, "
                                                            "got a content body frame")
            self.on_body(frame.data)
        elif isinstance(frame, HeaderFrame):
            if not self.in_content:
                raise AMQPConnectionError(UNEXPECTED_FRAME, f"expected a method frame on channel {self.id}, "
                                                            "got a content header frame")
            self.on_header(frame)
        elif self.in_content:
            raise AMQPConnectionError(
                UNEXPECTED_FRAME,
                f"expected content header for class 60 on channel {self.id}, got a "
                f"{'method' if getattr(frame, 'method', None) is not None else 'heartbeat'} frame")
        else:
            method = frame.method
            try:
                self._handle_method(method)
            except AMQPChannelError as e:
                self.close_with_error(e, method)

    # --- publishing ---------------------------------------------------------------------------
    def on_publish(self, method: Publish) -> None:
        """basic.publish: resolve the exchange now (404/403 before the content, as RabbitMQ)."""
        try:
            name = method.exchange
            if name != self._publish_exchange_name or self.vhost.generation != self._publish_generation:
                if method.immediate:
                    raise AMQPConnectionError(NOT_IMPLEMENTED, "immediate=true", 60, 40)
                self._publish_exchange = publish_exchange(self.conn.actor, self.vhost, name)
                self._publish_exchange_name = name
                self._publish_generation = self.vhost.generation
            elif method.immediate:
                raise AMQPConnectionError(NOT_IMPLEMENTED, "immediate=true", 60, 40)
        except AMQPChannelError as e:
            self.close_with_error(e, method)
            return
        self._publish = method
        self.in_content = True
        conn = self.conn
        if not conn.published:
            conn.published = True
            if conn.blocked:
                conn.update_reading()  # resource alarm: this connection now publishes

    def on_message(self, method: Publish, properties: bytes, body: bytes) -> None:
        """basic.publish, its header and its one body frame, all from one read (the common case)."""
        self.on_publish(method)
        if not self.in_content:
            return  # the publish was refused and the channel closed
        if len(body) > self.conn.config.max_message_size:
            self.on_header(HeaderFrame(self.id, 60, len(body), properties))  # refuses it, as usual
            return
        # Nothing of the content assembly was used: only what on_publish set is undone.
        self.in_content = False
        self._publish = None
        self._publish_message(method, properties, body)

    def _complete_publish(self, body: bytes | memoryview) -> None:
        method = self._publish
        properties = self._properties
        self._reset_content()
        assert method is not None
        self._publish_message(method, properties, body)

    def _publish_message(self, method: Publish, properties: bytes, body: bytes | memoryview) -> None:
        """Route (or hold, in a transaction) one complete message and count its confirm."""
        try:
            if properties[0] & 0x03 or properties[1] & 0x10:  # reply_to, expiration or user_id present
                properties = self._check_special_properties(properties)
            if self.tx:
                self._tx_publish(method, properties, body)
                return
            needs_sync = self._route(self._publish_exchange, method.routing_key, method.mandatory,
                                     properties, body)
        except AMQPChannelError as e:
            self.close_with_error(e, method)
            return
        if self.confirm:
            self.publish_seq += 1
            self._confirm_upto = self.publish_seq
            if needs_sync:
                if needs_sync is REJECTED:
                    self._nacks.append(self.publish_seq)
                else:
                    self._confirm_needs_sync = True
            self.conn.confirms_pending.add(self)

    def _check_special_properties(self, properties: bytes) -> bytes:
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
        if flags & _USER_ID_FLAG and props.user_id != self.conn.username:
            raise AMQPChannelError(PRECONDITION_FAILED,
                                   f"user_id property set to '{props.user_id}' but authenticated user was "
                                   f"'{self.conn.username}'", 60, 40)
        if flags & _REPLY_TO_FLAG and props.reply_to == REPLY_TO:
            if self.reply_to_key is None:
                raise AMQPChannelError(PRECONDITION_FAILED, "fast reply consumer does not exist", 60, 40)
            properties = replace_field(properties, "reply_to", self.reply_to_key)
        return properties

    def _route(self, exchange: Exchange, routing_key: str, mandatory: bool, properties: bytes,
               body: bytes) -> bool:
        """Route one message; returns True when its confirm must wait for an fsync."""
        if routing_key.startswith(REPLY_TO_PREFIX) and exchange.name == "":
            target = self.conn.sessions.reply_to.get(routing_key)
            if target is not None and not target.closing:
                target.deliver_reply(routing_key, properties, body)
                return False
            queued, needs_sync = 0, False
        else:
            queued, needs_sync = self.vhost.publish(exchange, routing_key, properties, body)
        vhost_stats = self.vhost.stats
        vhost_stats.publish += 1
        exchange.stats.publish_in += 1
        if queued:
            exchange.stats.publish_out += 1
        elif mandatory:
            vhost_stats.return_unroutable += 1
            self.conn.send_many(writer.return_(self.id, NO_ROUTE, "NO_ROUTE", exchange.name, routing_key,
                                               properties, body, self.conn.frame_max))
        else:
            vhost_stats.drop_unroutable += 1
        return needs_sync

    # --- deliveries ---------------------------------------------------------------------------
    def can_deliver(self) -> bool:
        if not self.flow_active or self.closing or not self.conn.writable:
            return False
        return not self.global_prefetch or len(self.unacked) < self.global_prefetch

    def deliver(self, consumer: Consumer, pos: int, msg: StoredMessage, redelivered: bool) -> None:
        self.delivery_tag += 1
        tag = self.delivery_tag
        stats = consumer.queue.stats
        if not consumer.no_ack:
            self.unacked[tag] = Unacked(consumer.queue, pos, consumer)
            stats.deliver += 1
        else:
            stats.deliver_no_ack += 1
        if redelivered:
            stats.redeliver += 1
        self.conn.send_many(writer.deliver(self.id, consumer.tag, tag, redelivered, msg.exchange,
                                           msg.routing_key, msg.properties, msg.body, self.conn.frame_max))

    def delivery_room(self) -> int:
        """How many more deliveries the channel-wide prefetch (basic.qos global) allows now."""
        if not self.global_prefetch:
            return 1 << 30
        return self.global_prefetch - len(self.unacked)

    def deliver_run(self, consumer: Consumer, positions: list[int], messages: list[StoredMessage],
                    redelivered: list[bool] | None) -> None:
        """``deliver`` for several messages of the consumer's queue: the bookkeeping once per run,
        the frames in one list. ``redelivered`` None means none is a redelivery."""
        count = len(positions)
        first = self.delivery_tag + 1
        self.delivery_tag += count
        queue = consumer.queue
        stats = queue.stats
        if not consumer.no_ack:
            self.unacked.update(zip(range(first, first + count), unacked_run(queue, positions, consumer), strict=True))
            stats.deliver += count
        else:
            stats.deliver_no_ack += count
        if redelivered is not None:
            stats.redeliver += sum(redelivered)
        conn = self.conn
        conn.send_many(writer.deliver_run(self.id, consumer.tag, first, redelivered, messages, conn.frame_max))

    def deliver_reply(self, routing_key: str, properties: bytes, body: bytes) -> None:
        """Direct reply-to: a reply goes straight to the requester, never through a queue."""
        self.delivery_tag += 1
        self.conn.send_many(writer.deliver(self.id, self.reply_to_consumer or "", self.delivery_tag, False,
                                           "", routing_key, properties, body, self.conn.frame_max))

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The server cancels a consumer (its queue was deleted)."""
        if self.consumers.get(consumer.tag) is consumer:
            del self.consumers[consumer.tag]
            if self.conn.capability("consumer_cancel_notify") and not self.closing:
                self.send_method(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    # --- acknowledgements ---------------------------------------------------------------------
    def _take_unacked(self, delivery_tag: int, multiple: bool) -> list[tuple[int, Unacked]]:
        unacked = self.unacked
        if multiple:
            if delivery_tag == 0:
                taken = list(unacked.items())
                unacked.clear()
                return taken
            taken = []
            while unacked:
                tag = next(iter(unacked))
                if tag > delivery_tag:
                    break
                taken.append(unacked.popitem(last=False))
            if taken:
                return taken
        else:
            item = unacked.pop(delivery_tag, None)
            if item is not None:
                return [(delivery_tag, item)]
        raise AMQPChannelError(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")

    def _settle(self, items: list[tuple[int, Unacked]], requeue: bool | None) -> None:
        """requeue None = ack; True = back to the queue; False = drop (dead-lettered later)."""
        if requeue is None:
            self._settle_acks([item for _tag, item in items])
            return
        touched = set()
        for _tag, item in items:
            if item.consumer is not None:
                item.consumer.unacked -= 1
            if requeue:
                item.queue.requeue(item.pos)
            else:
                item.queue.reject(item.pos)
                item.queue.stats.reject += 1  # dead-lettered (reason rejected) when the queue has a DLX
            touched.add(item.queue)
        for queue in touched:
            if queue.consumers:
                self.vhost.schedule_delivery(queue)
        if self.global_prefetch:
            self.conn.schedule_channel_deliveries(self)

    def on_ack_run(self, tags: list[int]) -> None:
        """Consecutive basic.ack frames (multiple=false) of one read, settled as one batch with the
        outcome of acking them one by one: an unknown tag closes the channel with 406 after the acks
        before it were applied; the ones after it are not."""
        if self.tx:
            for tag in tags:  # held until commit, each validated now
                try:
                    self._ack("ack", tag, False, False)
                except AMQPChannelError as e:
                    self.close_with_error(e, Ack(tag, False))
                    return
            return
        unacked = self.unacked
        if len(tags) == 1:
            if not self._ack_one(tags[0]):
                self._unknown_ack(tags[0])
            return
        items = list(map(unacked.pop, tags, repeat(None)))  # one C loop; None for an unknown tag
        if None in items:
            bad = items.index(None)
            # Those after the unknown tag stay unacked (returned to their queues as the channel closes).
            for tag, item in zip(tags[bad + 1:], items[bad + 1:], strict=True):
                if item is not None:
                    unacked[tag] = item
            ordered = sorted(unacked.items())  # delivery order again
            unacked.clear()
            unacked.update(ordered)
            if bad:
                self._settle_acks(items[:bad])
            self._unknown_ack(tags[bad])
            return
        self._settle_acks(items)

    def _unknown_ack(self, delivery_tag: int) -> None:
        self.close_with_error(AMQPChannelError(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}"),
                              Ack(delivery_tag, False))

    def _settle_acks(self, items: list[Unacked]) -> None:
        """Acks, a run of deliveries of one queue at a time (one ack_many per run). A queue with
        consumers is asked to deliver again only when it holds ready messages (the freed prefetch
        credit is then used): an empty one delivers on its next publish anyway."""
        count = len(items)
        queues, positions, consumers = zip(*items, strict=True)
        queue, consumer = queues[0], consumers[0]
        if queues.count(queue) == count and consumers.count(consumer) == count:
            # The common case: every delivery from one consumer (or all from basic.get) of one queue.
            if consumer is not None:
                consumer.unacked -= count
            queue.ack_many(list(positions))
            queue.stats.ack += count
            if queue.consumers and queue.message_count:
                self.vhost.schedule_delivery(queue)
            if self.global_prefetch:
                self.conn.schedule_channel_deliveries(self)
            return
        touched = []
        run_queue = None
        run: list[int] = []
        for queue, pos, consumer in items:
            if consumer is not None:
                consumer.unacked -= 1
            if queue is not run_queue:
                if run:
                    run_queue.ack_many(run)  # type: ignore[union-attr]
                    run_queue.stats.ack += len(run)  # type: ignore[union-attr]
                run_queue = queue
                run = []
                if queue not in touched:
                    touched.append(queue)
            run.append(pos)
        if run:
            run_queue.ack_many(run)  # type: ignore[union-attr]
            run_queue.stats.ack += len(run)  # type: ignore[union-attr]
        for queue in touched:
            if queue.consumers and queue.message_count:
                self.vhost.schedule_delivery(queue)
        if self.global_prefetch:
            self.conn.schedule_channel_deliveries(self)

    def _ack_one(self, delivery_tag: int) -> bool:
        """basic.ack of one delivery outside a transaction, without the lists; False if the tag is
        not unacked (the general path then raises the error)."""
        item = self.unacked.pop(delivery_tag, None)
        if item is None:
            return False
        queue, pos, consumer = item
        if consumer is not None:
            consumer.unacked -= 1
        queue.ack(pos)
        queue.stats.ack += 1
        if queue.consumers and queue.message_count:
            self.vhost.schedule_delivery(queue)
        if self.global_prefetch:
            self.conn.schedule_channel_deliveries(self)
        return True

    def _ack(self, kind: str, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        items = self._take_unacked(delivery_tag, multiple)
        settle = None if kind == "ack" else requeue
        if self.tx:
            # Validated now, applied on commit, given back on rollback.
            self._tx_settles.append((items, settle))
            return
        self._settle(items, settle)

    # --- methods ------------------------------------------------------------------------------
    def _handle_method(self, method: Any) -> None:
        if isinstance(method, Publish):
            self.on_publish(method)
            return
        if isinstance(method, Ack):
            if method.multiple or self.tx or not self._ack_one(method.delivery_tag):
                self._ack("ack", method.delivery_tag, method.multiple, False)
            return
        if isinstance(method, Nack):
            self._ack("nack", method.delivery_tag, method.multiple, method.requeue)
            return
        if isinstance(method, Reject):
            self._ack("reject", method.delivery_tag, False, method.requeue)
            return
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise AMQPConnectionError(COMMAND_INVALID, f"method {getattr(method, 'name', method)!s} is not "
                                                       "valid on an open channel",
                                      *_method_ids(method))
        handler(self, method)

    def on_channel_close(self, method: commands.Channel.Close) -> None:
        self.send_method(commands.Channel.CloseOk())
        self.release()
        self.conn.remove_channel(self.id)

    def on_channel_flow(self, method: commands.Channel.Flow) -> None:
        if not method.active:
            # As RabbitMQ: consumers are throttled with basic.qos, not by stopping the channel.
            raise AMQPConnectionError(NOT_IMPLEMENTED, "active=false", 20, 20)
        self.flow_active = bool(method.active)
        self.send_method(commands.Channel.FlowOk(active=self.flow_active))
        if self.flow_active:
            self.conn.schedule_channel_deliveries(self)

    # --- teardown -----------------------------------------------------------------------------
    def release(self) -> None:
        """Channel closed: consumers go, unacked messages return to their queues in order."""
        if self.closed:
            return
        self.closed = True
        self.closing = True
        counters = self.conn.broker.node_counters
        counters.channels_closed += 1
        # Open channels' confirm-mode publishes are read from their sequence at scrape time; a
        # closing channel leaves its total to the node, so the counter never goes back.
        counters.received_confirm_closed += self.publish_seq
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        self._drop_reply_to()
        self._reset_content()
        release_bodies(self._tx_publishes)
        self._tx_publishes = []
        self._restore_tx_settles()
        items = list(self.unacked.values())
        self.unacked.clear()
        touched = set()
        for item in items:
            item.queue.requeue(item.pos)
            touched.add(item.queue)
        for queue in touched:
            if queue.consumers:
                self.vhost.schedule_delivery(queue)


_HANDLERS = {
    commands.Channel.Close: Channel.on_channel_close,
    commands.Channel.Flow: Channel.on_channel_flow,
    commands.Exchange.Declare: Channel.on_exchange_declare,
    commands.Exchange.Delete: Channel.on_exchange_delete,
    commands.Exchange.Bind: Channel.on_exchange_bind,
    commands.Exchange.Unbind: Channel.on_exchange_unbind,
    commands.Queue.Declare: Channel.on_queue_declare,
    commands.Queue.Bind: Channel.on_queue_bind,
    commands.Queue.Unbind: Channel.on_queue_unbind,
    commands.Queue.Purge: Channel.on_queue_purge,
    commands.Queue.Delete: Channel.on_queue_delete,
    commands.Basic.Qos: Channel.on_basic_qos,
    commands.Basic.Consume: Channel.on_basic_consume,
    commands.Basic.Cancel: Channel.on_basic_cancel,
    commands.Basic.Get: Channel.on_basic_get,
    commands.Basic.Recover: Channel.on_basic_recover,
    commands.Basic.RecoverAsync: Channel.on_basic_recover_async,
    commands.Confirm.Select: Channel.on_confirm_select,
    commands.Tx.Select: Channel.on_tx_select,
    commands.Tx.Commit: Channel.on_tx_commit,
    commands.Tx.Rollback: Channel.on_tx_rollback,
}

__all__ = ["Channel", "AMQPError"]
