"""One AMQP channel: frames in, translated to the model's operations, and their results to frames out.

The channel owns its parts: content assembly (content.py), confirms and the transaction (confirms.py),
exchange/queue methods and direct reply-to (channel_methods.py), the model's ledger of its unacked deliveries
(broker/ops/deliveries.py), its replies after the disk in method order (broker/ops/replies.py; the channel is
their ``ReplySink``). It needs its connection's ``ChannelHost`` Protocol; it creates no tasks, opens no files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from ..broker.errors import BrokerChannelError
from ..broker.ops import AMQP_091, ArgumentError, Consumer, validate_consumer_arguments
from ..broker.ops import publish as publish_ops
from ..broker.ops.deliveries import Deliveries
from ..broker.ops.messages import publish_exchange, publish_topic_check
from ..broker.ops.objects import readable_queue
from ..broker.ops.replies import ReplyQueue
from ..wire import writer
from ..wire.constants import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_ERROR,
    UNEXPECTED_FRAME,
)
from ..wire.errors import AMQPChannelError, AMQPConnectionError, AMQPError
from ..wire.reader import Ack, BodyFrame, HeaderFrame, Nack, Publish, Reject
from . import delivery_round as rounds
from .channel_methods import (
    REPLY_TO,
    REPLY_TO_PREFIX,
    Declarations,
    DirectReplyTo,
    check_special_properties,
    random_tag,
)
from .confirms import Confirms, Transaction
from .content import Content, ContentAssembly, in_place, release_bodies
from .log import channel_close_log
from .refusals import CHANNEL_ERRORS, reply_code

if TYPE_CHECKING:
    from ..broker.ops import Exchange, TopicCheck
    from ..broker.ops.deliveries import StoredMessage  # the model's record type; amqp names no store module
    from .channel_host import ChannelHost

log = logging.getLogger("lavinpy.channel")


def _method_ids(method: Any) -> tuple[int, int]:
    index: int | None = getattr(method, "index", None)
    if index is None:
        index = int(getattr(type(method), "INDEX", 0))
    return (index >> 16) & 0xFFFF, index & 0xFFFF


class Channel:
    def __init__(self, host: ChannelHost, channel_id: int) -> None:
        self.conn = host
        self.id = channel_id
        vhost = host.vhost
        assert vhost is not None  # channels open after the vhost
        self.vhost = vhost
        self.closing = self.closed = False
        self.flow_active = True
        # parts
        self.content = ContentAssembly(channel_id, host.config, host.body_spool, in_place(vhost, self))
        self.in_content = False  # after basic.publish, until its body is complete (the host reads it)
        self.counters = vhost.node_counters.of(AMQP_091)  # what the model counts this channel's traffic in
        self.deliveries = Deliveries(vhost, self._room_freed, self.counters)
        # what goes out after the disk, in the order of its methods; deliveries wait while a reply does
        self.replies = ReplyQueue(self, self, self._replies_released)
        self.confirms: Confirms | None = None  # after confirm.select
        self.tx: Transaction | None = None  # after tx.select
        self.declarations = Declarations(host, vhost, self)
        self.reply_to = DirectReplyTo(host.sessions)
        self.consumers: dict[str, Consumer] = {}
        self.prefetch_count = 0  # for consumers created after basic.qos(global=false)
        # the exchange the last basic.publish resolved (kept while its name and the vhost's generation
        # hold); set once the channel has published (the metrics count publishers by it)
        self._publish_exchange: Exchange | None = None
        self._publish_exchange_name: str | None = None
        self._publish_generation = -1
        self._publish_topic_check: TopicCheck | None = None  # set only when a topic permission applies
        # consumer timeout: (oldest unacked delivery tag, when the sweep first saw it)
        self.oldest_unacked_seen: tuple[int, float] | None = None

    # --- read by the connection, monitoring and the consumer timeout ---------------------------
    @property
    def publish_seq(self) -> int:  # publishes received in confirm mode
        return self.confirms.seq if self.confirms is not None else 0

    # --- output (in the order of the methods that caused it: behind a reply that waits) ---------
    def send_method(self, method: Any) -> None:
        self.send_frames([writer.method_frame(self.id, method)])

    def send_frames(self, frames: list[bytes | memoryview]) -> None:
        if self.replies.waiting:
            self.replies.follow(frames)
        else:
            self.conn.send_many(frames)

    def reply_after(self, wait: Any, method: Any, cause: Any) -> None:
        """``method``, the reply to ``cause``, once ``wait`` (VHost.durable/replicated, or None) is done."""
        self.replies.commit(wait, (method, cause))

    # --- the reply queue's sink (broker.ops.replies.ReplySink, ConfirmSink) -------------------------
    def send_reply(self, reply: Any) -> None:
        """A method's reply, (method, cause), or frames that followed one."""
        if type(reply) is tuple:
            self.conn.send(writer.method_frame(self.id, reply[0]))
        else:
            self.conn.send_many(reply)

    def send_confirm(self, upto: int) -> None:
        if self.confirms is not None:
            self.confirms.send_ack(upto)

    def refuse_confirm(self, upto: int, reason: str) -> None:
        if self.confirms is not None:
            self.confirms.refuse(upto, reason)

    def durability_failed(self, reply: Any, reason: str) -> None:
        """A reply's change could not be made durable: the channel closes (506), the client retries."""
        log.error("channel %d on %s: %s", self.id, self.conn.name, reason)
        error = AMQPChannelError(RESOURCE_ERROR, reason, *_method_ids(reply[1]))  # its text fits a short string
        self.conn.send(writer.method_frame(self.id, commands.Channel.Close(
            reply_code=RESOURCE_ERROR, reply_text=error.text, class_id=error.class_id, method_id=error.method_id)))
        self.closing = True
        self.release()

    def _replies_released(self) -> None:
        self.conn.schedule_channel_deliveries(self)  # deliveries waited behind the replies

    def send_confirms(self) -> None:
        """End of an input batch: the confirms of what this channel published in it."""
        if self.confirms is not None:
            self.confirms.send()

    # --- errors -------------------------------------------------------------------------------
    def close_with_error(self, error: AMQPChannelError | BrokerChannelError, method: Any | None) -> None:
        class_id, method_id = (error.class_id, error.method_id)
        if method is not None and not class_id:
            class_id, method_id = _method_ids(method)
        channel_close_log.log(logging.INFO, "channel %d on %s closed: %s", self.id, self.conn.name, error.text)
        # After the replies before it; the last frame of the channel.
        self.replies.follow([writer.method_frame(self.id, commands.Channel.Close(
            reply_code=reply_code(error), reply_text=error.text, class_id=class_id, method_id=method_id))],
            last=True)
        self.closing = True
        self.release(replies_end=False)

    # --- frames in ----------------------------------------------------------------------------
    def handle_frame(self, frame: Any) -> None:
        """Process one frame for this channel; errors close the channel or the connection."""
        if self.closing:
            # After channel.close only close/close-ok matter (AMQP 0-9-1 section 2.2.6).
            method = getattr(frame, "method", None)
            if isinstance(method, commands.Channel.CloseOk):
                self.conn.remove_channel(self.id)
            elif isinstance(method, commands.Channel.Close):
                unsent = self.replies.waiting  # our channel.close still waits: the client's wins
                self.replies.stop()
                self.conn.send(writer.method_frame(self.id, commands.Channel.CloseOk()))
                if unsent:
                    self.conn.remove_channel(self.id)
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
            except CHANNEL_ERRORS as e:
                self.close_with_error(e, method)

    def on_header(self, frame: HeaderFrame) -> None:
        self._assemble(self.content.on_header, frame)

    def on_body(self, data: bytes | memoryview) -> None:
        self._assemble(self.content.on_body, data)

    def _assemble(self, step: Callable[[Any], Content | None], frame: Any) -> None:
        """One content frame into the assembly: a bad one closes the channel, the last one publishes."""
        try:
            content = step(frame)
        except CHANNEL_ERRORS as e:
            self.in_content = False
            self.close_with_error(e, None)
            return
        if content is not None:
            self._content_complete(content)

    def _content_complete(self, content: Content) -> None:
        self.in_content = False
        stored = content.stored  # a large body written in place: published at its record's position
        try:
            self._publish_message(content.method, content.exchange, content.properties, content.body,
                                  -1 if stored is None else stored.position)
        finally:
            (stored or content.spooled or content).release()

    # --- publishing ---------------------------------------------------------------------------
    def publish_target(self, method: Publish) -> Exchange | None:
        """basic.publish: the exchange, resolved now (404/403 before the content, as RabbitMQ); None: refused."""
        try:
            name = method.exchange
            if name != self._publish_exchange_name or self.vhost.generation != self._publish_generation:
                if method.immediate:
                    raise AMQPConnectionError(NOT_IMPLEMENTED, "immediate=true", 60, 40)
                self._publish_exchange = publish_exchange(self.conn.actor, self.vhost, name)
                self._publish_topic_check = publish_topic_check(self.conn.actor, self.vhost, self._publish_exchange)
                self._publish_exchange_name = name
                self._publish_generation = self.vhost.generation
            elif method.immediate:
                raise AMQPConnectionError(NOT_IMPLEMENTED, "immediate=true", 60, 40)
            if self._publish_topic_check is not None:  # once per publish, once per run of publishes
                self._publish_topic_check(method.routing_key)
        except CHANNEL_ERRORS as e:
            self.close_with_error(e, method)
            return None
        conn = self.conn
        if not conn.published:
            conn.published = True
            if conn.blocked:
                conn.update_reading()  # resource alarm: this connection now publishes
        return self._publish_exchange

    @property
    def is_publisher(self) -> bool:
        """The channel has resolved an exchange to publish to (RabbitMQ counts a publisher from then)."""
        return self._publish_exchange is not None

    def on_publish(self, method: Publish) -> None:
        exchange = self.publish_target(method)
        if exchange is not None:
            self.content.begin(method, exchange)
            self.in_content = True

    def on_message(self, method: Publish, properties: bytes, body: bytes) -> None:
        """basic.publish, its header and its one body frame, all from one read (the common case)."""
        exchange = self.publish_target(method)
        if exchange is None:
            return  # the publish was refused and the channel closed
        if len(body) > self.conn.config.max_message_size:
            self.content.begin(method, exchange)
            self.in_content = True
            self.on_header(HeaderFrame(self.id, 60, len(body), properties))  # refuses it, as usual
            return
        self._publish_message(method, exchange, properties, body)

    def _publish_message(self, method: Publish, exchange: Exchange, properties: bytes,
                         body: bytes | memoryview, stored: int = -1) -> None:
        """Route (or hold, in a transaction) one complete message and count its confirm."""
        try:
            if properties[0] & 0x03 or properties[1] & 0x10:  # reply_to, expiration or user_id present
                properties = check_special_properties(properties, self.conn.username, self.reply_to.key)
            if self.tx is not None:
                self.tx.hold_publish(self.content.hold(method, properties, body))
                return
            routing_key = method.routing_key
            if routing_key.startswith(REPLY_TO_PREFIX) and exchange.name == "":
                confirm = self._route(exchange, routing_key, method.mandatory, properties, body)
            else:  # the common case, one call less than through _route
                routed, confirm = publish_ops.publish(self.vhost, exchange, routing_key, method.mandatory,
                                                      properties, body, self.counters, stored=stored)
                if not routed and method.mandatory:
                    self._return(exchange, routing_key, properties, body)
        except CHANNEL_ERRORS as e:
            self.close_with_error(e, method)
            return
        if self.confirms is not None:
            self.confirms.published(confirm)
            self.conn.confirms_pending.add(self)

    def _route(self, exchange: Exchange, routing_key: str, mandatory: bool, properties: bytes,
               body: bytes | memoryview) -> Any:
        """Publish one message through the model; its confirm as the model's publish returns it."""
        if routing_key.startswith(REPLY_TO_PREFIX) and exchange.name == "":
            target = self.reply_to.target(routing_key)
            if target is not None:
                target.deliver_reply(routing_key, properties, bytes(body))
                return False
            publish_ops.unroutable_reply(self.vhost, exchange, mandatory, self.counters)
            routed, confirm = False, False
        else:
            routed, confirm = publish_ops.publish(self.vhost, exchange, routing_key, mandatory, properties, body,
                                                  self.counters)
        if not routed and mandatory:
            self._return(exchange, routing_key, properties, body)
        return confirm

    def _return(self, exchange: Exchange, routing_key: str, properties: bytes, body: bytes | memoryview) -> None:
        """basic.return of a mandatory message no queue took."""
        self.send_frames(writer.return_(self.id, NO_ROUTE, "NO_ROUTE", exchange.name, routing_key,
                                           properties, body, self.conn.frame_max))

    def published_run(self, count: int, needs_sync: bool) -> None:
        """A run of publishes was routed and stored (publish_batch): their confirms."""
        if self.confirms is not None:
            self.confirms.published_run(count, needs_sync)
            self.conn.confirms_pending.add(self)

    # --- deliveries (the queue's side: broker.queues.queue_consumer.DeliveryChannel) -------------------------
    def can_deliver(self) -> bool:
        if not self.flow_active or self.closing or not self.conn.writable or self.replies.waiting:
            return False
        deliveries = self.deliveries
        return not deliveries.prefetch or len(deliveries.unacked) < deliveries.prefetch

    def deliver(self, consumer: Consumer, pos: int, msg: StoredMessage, redelivered: bool) -> None:
        tag = self.deliveries.deliver(consumer, pos, redelivered)
        conn = self.conn
        conn.send_many(writer.deliver(self.id, consumer.tag, tag, redelivered, msg.exchange,
                                      msg.routing_key, msg.properties, msg.body, conn.frame_max))

    def delivery_room(self) -> int:
        """How many more deliveries the channel-wide prefetch (basic.qos global) allows now."""
        return self.deliveries.room()

    deliver_round = staticmethod(rounds.deliver_round)  # one message to each of many consumers: one call
    deliver_stamped_run = rounds.deliver_stamped_run  # a stream's run: its offsets stamped as it is framed
    deliver_segment_run = rounds.deliver_segment_run  # a stream's run framed straight from its store segment
    deliver_stored_run = rounds.deliver_stored_run  # a classic queue's run framed straight from its segments
    def deliver_run(self, consumer: Consumer, positions: list[int], messages: list[StoredMessage],
                    redelivered: list[bool] | None) -> None:
        """``deliver`` for messages of the consumer's queue: booked once, framed in one list (compiled if it can)."""
        if consumer.no_ack or not rounds.deliver_run_compiled(self, consumer, positions, messages, redelivered):
            first, conn = self.deliveries.deliver_run(consumer, positions, redelivered), self.conn
            conn.send_many(writer.deliver_run(self.id, consumer.tag, first, redelivered, messages, conn.frame_max))

    def deliver_reply(self, routing_key: str, properties: bytes, body: bytes) -> None:
        """Direct reply-to: a reply goes straight to the requester, never through a queue."""
        self.send_frames(writer.deliver(self.id, self.reply_to.consumer_tag or "", self.deliveries.next_tag(),
                                           False, "", routing_key, properties, body, self.conn.frame_max))

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The server cancels a consumer (its queue was deleted)."""
        if self.consumers.get(consumer.tag) is consumer:
            del self.consumers[consumer.tag]
            if self.conn.capability("consumer_cancel_notify") and not self.closing:
                self.send_method(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    def _room_freed(self) -> None:
        """Settled deliveries freed room under the channel-wide prefetch: its consumers may take more."""
        self.conn.schedule_channel_deliveries(self)

    # --- acknowledgements ---------------------------------------------------------------------
    def on_ack_run(self, tags: list[int]) -> None:
        """Consecutive basic.ack frames (multiple=false) of one read, settled as one batch with the
        outcome of acking them one by one: an unknown tag closes the channel with 406 after the acks
        before it were applied; the ones after it are not."""
        if self.tx is not None:
            for tag in tags:  # held until commit, each validated now
                try:
                    self._settle(tag, False, None)
                except CHANNEL_ERRORS as e:
                    self.close_with_error(e, Ack(tag, False))
                    return
            return
        bad = self.deliveries.ack_run(tags)
        if bad is not None:
            self.close_with_error(AMQPChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tags[bad]}"),
                                  Ack(tags[bad], False))

    def _settle(self, delivery_tag: int, multiple: bool, requeue: bool | None, failed: bool = False) -> None:
        """basic.ack (requeue None), nack or reject (``failed``): validated now; in a transaction
        applied on commit and given back on rollback. Counted toward the input turn's work."""
        if multiple and requeue is None and self.tx is None:  # the common multiple ack: a run slice at a time
            self.conn.settled_in_turn += self.deliveries.ack_multiple(delivery_tag)
            return
        items = self.deliveries.take(delivery_tag, multiple)
        self.conn.settled_in_turn += len(items)
        if self.tx is not None:
            self.tx.hold_settle(items, requeue, failed)
            return
        self.deliveries.settle(items, requeue, failed)

    # --- methods ------------------------------------------------------------------------------
    def _handle_method(self, method: Any) -> None:
        if isinstance(method, Publish):
            self.on_publish(method)
            return
        if isinstance(method, Ack):
            if method.multiple or self.tx is not None or self.deliveries.ack_run([method.delivery_tag]) is not None:
                self._settle(method.delivery_tag, method.multiple, None)
            return
        if isinstance(method, Nack):
            self._settle(method.delivery_tag, method.multiple, method.requeue)
            return
        if isinstance(method, Reject):
            self._settle(method.delivery_tag, False, method.requeue, True)
            return
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise AMQPConnectionError(COMMAND_INVALID, f"method {getattr(method, 'name', method)!s} is not "
                                                       "valid on an open channel",
                                      *_method_ids(method))
        handler(self, method)

    def on_channel_close(self, method: commands.Channel.Close) -> None:
        self.release()  # replies still waiting are dropped: after channel.close a client reads only close-ok
        self.conn.send(writer.method_frame(self.id, commands.Channel.CloseOk()))
        self.conn.remove_channel(self.id)

    def on_channel_flow(self, method: commands.Channel.Flow) -> None:
        if not method.active:
            # As RabbitMQ: consumers are throttled with basic.qos, not by stopping the channel.
            raise AMQPConnectionError(NOT_IMPLEMENTED, "active=false", 20, 20)
        self.flow_active = bool(method.active)
        self.send_method(commands.Channel.FlowOk(active=self.flow_active))
        if self.flow_active:
            self.conn.schedule_channel_deliveries(self)

    def on_basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise AMQPConnectionError(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})", 60, 10)
        if m.global_:
            self.deliveries.set_prefetch(m.prefetch_count)
        else:
            self.prefetch_count = m.prefetch_count
        self.send_method(commands.Basic.QosOk())
        self.conn.schedule_channel_deliveries(self)

    def on_basic_consume(self, m: commands.Basic.Consume) -> None:
        tag = m.consumer_tag or random_tag("amq.ctag-")
        if tag in self.consumers or tag == self.reply_to.consumer_tag:
            raise AMQPConnectionError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20)
        if m.queue == REPLY_TO:
            self.reply_to.consume(self, m, tag)
            if not m.nowait:
                self.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))
            return
        limit = self.conn.config.max_consumers_per_channel
        if limit and len(self.consumers) >= limit:
            raise AMQPChannelError(NOT_ALLOWED, f"reached maximum ({limit}) of consumers per channel")
        name = self.declarations.queue_name(m.queue)
        queue = readable_queue(self.conn.actor, self.vhost, name, self.conn)
        if queue.has_exclusive_consumer() or (m.exclusive and queue.consumers):
            raise AMQPChannelError(ACCESS_REFUSED, f"queue '{name}' in vhost '{self.vhost.name}' in exclusive use")
        args = dict(m.arguments or {})
        try:
            # x-stream-offset is checked by the stream itself (its own reply texts).
            validate_consumer_arguments(args, queue=name, vhost=self.vhost.name)
        except ArgumentError as e:
            raise AMQPChannelError(PRECONDITION_FAILED, e.text)
        priority = int(args.get("x-priority", 0))  # type: ignore[arg-type]  # validated above
        queue.validate_consumer(m.no_ack, self.prefetch_count, args, self.deliveries.prefetch)
        consumer = Consumer(tag, queue, self, no_ack=m.no_ack, exclusive=m.exclusive, priority=priority,
                            prefetch=self.prefetch_count, arguments=args)
        self.consumers[tag] = consumer
        if not m.nowait:
            self.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))
        queue.add_consumer(consumer)

    def on_basic_cancel(self, m: commands.Basic.Cancel) -> None:
        consumer = self.consumers.pop(m.consumer_tag or "", None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)
        elif m.consumer_tag == self.reply_to.consumer_tag:
            self.reply_to.drop()
        if not m.nowait:
            self.send_method(commands.Basic.CancelOk(consumer_tag=m.consumer_tag))

    def on_basic_get(self, m: commands.Basic.Get) -> None:
        name = self.declarations.queue_name(m.queue)
        queue = readable_queue(self.conn.actor, self.vhost, name, self.conn)
        got = self.deliveries.get(queue, m.no_ack)
        if got is None:
            self.send_method(commands.Basic.GetEmpty())
            return
        tag, msg, redelivered = got
        self.send_frames(writer.get_ok(self.id, tag, redelivered, msg.exchange, msg.routing_key,
                                          queue.message_count, msg.properties, msg.body, self.conn.frame_max))

    def on_basic_recover(self, m: commands.Basic.Recover) -> None:
        if not m.requeue:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "requeue=false", 60, 110)
        self.deliveries.requeue_all()
        self.send_method(commands.Basic.RecoverOk())

    def on_basic_recover_async(self, m: Any) -> None:
        """Deprecated, but RabbitMQ still serves it: basic.recover without a reply."""
        if not m.requeue:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "requeue=false", 60, 100)
        self.deliveries.requeue_all()

    def on_confirm_select(self, m: commands.Confirm.Select) -> None:
        if self.tx is not None:
            raise AMQPChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10)
        if self.confirms is None:
            self.confirms = Confirms(self.id, self.conn, self.vhost, self.replies, self.counters)
        if not m.nowait:
            self.send_method(commands.Confirm.SelectOk())

    def on_tx_select(self, m: commands.Tx.Select) -> None:
        if self.confirms is not None:
            raise AMQPChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10)
        if self.tx is None:
            self.tx = Transaction()
        self.send_method(commands.Tx.SelectOk())

    def on_tx_commit(self, m: commands.Tx.Commit) -> None:
        if self.tx is None:
            raise AMQPChannelError(PRECONDITION_FAILED, "channel is not transactional", 90, 20)
        publishes, settles = self.tx.take()
        needs_sync = False
        try:
            for p in publishes:
                needs_sync |= bool(self._route(self.vhost.get_exchange(p.exchange), p.routing_key,
                                               p.mandatory, p.properties, p.body.read()))
                p.body.release()
        finally:
            release_bodies(publishes)
        for items, requeue, failed in settles:
            self.deliveries.settle(items, requeue, failed)
        self.reply_after(self.vhost.durable() if needs_sync else None, commands.Tx.CommitOk(), m)

    def on_tx_rollback(self, m: commands.Tx.Rollback) -> None:
        if self.tx is None:
            raise AMQPChannelError(PRECONDITION_FAILED, "channel is not transactional", 90, 30)
        self.deliveries.restore(self.tx.rollback())
        self.send_method(commands.Tx.RollbackOk())

    # --- teardown -----------------------------------------------------------------------------
    def release(self, replies_end: bool = True) -> None:
        """Channel closed: consumers go, unacked messages return to their queues in order; replies
        still waiting are dropped unless ``replies_end`` is False (the channel.close behind them)."""
        if replies_end:
            self.replies.stop()
        if self.closed:
            return
        self.closed = True
        self.closing = True
        if self.confirms is not None:
            self.confirms.stopped = True
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        self.reply_to.drop()
        self.content.reset()
        self.in_content = False
        if self.tx is not None:
            self.deliveries.restore(self.tx.rollback())
        self.deliveries.close(self.publish_seq)


def _part(name: str, method: Any) -> Any:
    """A handler of the part ``name`` of the channel, called as ``handler(channel, method)``."""
    return lambda channel, m: method(getattr(channel, name), m)


_HANDLERS = {
    commands.Channel.Close: Channel.on_channel_close,
    commands.Channel.Flow: Channel.on_channel_flow,
    commands.Exchange.Declare: _part("declarations", Declarations.on_exchange_declare),
    commands.Exchange.Delete: _part("declarations", Declarations.on_exchange_delete),
    commands.Exchange.Bind: _part("declarations", Declarations.on_exchange_bind),
    commands.Exchange.Unbind: _part("declarations", Declarations.on_exchange_unbind),
    commands.Queue.Declare: _part("declarations", Declarations.on_queue_declare),
    commands.Queue.Bind: _part("declarations", Declarations.on_queue_bind),
    commands.Queue.Unbind: _part("declarations", Declarations.on_queue_unbind),
    commands.Queue.Purge: _part("declarations", Declarations.on_queue_purge),
    commands.Queue.Delete: _part("declarations", Declarations.on_queue_delete),
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
