"""An MQTT 5 session's subscriptions: the 3.1.1 ones (``subscriptions``) plus what MQTT 5 adds on the
same queues. The session lives as long as its Session Expiry Interval (its queues are durable with
that ``x-expires``, as RabbitMQ maps it; 0: they go with the connection); deliveries carry their
properties (``message5``), the subscription identifiers and Retain As Published of the filters
matching their topic, a topic alias once one is assigned, and are dropped when larger than the
client's Maximum Packet Size or, under No Local, when the client published them. Shared subscriptions
(``$share/<group>/<filter>``) are one queue per group and filter, every member a consumer on it: the
queue hands its messages round robin to the members with room, and a member's unacknowledged
deliveries go back to it when the member goes, for another to get (with DUP). At QoS 2 a message
belongs to the member that answered PUBREC: it leaves the group's queue then and its PUBREL is owed to
that member's session alone; one whose member went before PUBREC goes to another member."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..broker.errors import BrokerError
from ..broker.ops import Consumer
from ..broker.ops import objects as ops
from . import codec, codec5, topics
from .message5 import Outbound
from .properties import encode_properties
from .state5 import FilterOptions, vhost_state
from .subscriptions import Subscriptions, queue_name

log = logging.getLogger("lavinpy.mqtt")

if TYPE_CHECKING:
    from ..broker.ops import Actor, QueueKind, VHost
    from ..broker.ops.deliveries import StoredMessage
    from .exactly_once import QoS2Store
    from .subscriber_host import RetainedMessage, SubscriberHost

SHARE_PREFIX = "$share/"


@dataclass(slots=True)
class ClientLimits:
    """What the client's CONNECT asked of the server's sending, and the session's life."""

    clean_start: bool
    session_expiry: int  # seconds the session outlives its connection
    maximum_packet_size: int | None = None
    topic_alias_maximum: int = 0


def split_shared(topic_filter: str) -> tuple[str, str] | None:
    """(share name, filter) of ``$share/<name>/<filter>``; TopicError when it is not a valid one."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, _, rest = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not group or not rest or any(c in group for c in "+#"):
        raise topics.TopicError(f"shared subscription {topic_filter!r} is not $share/<name>/<filter>")
    return group, rest


def shared_queue_name(group: str, topic_filter: str) -> str:
    """The group's queue for the filter: a share name has no ``/``, so the name stands for one pair."""
    return f"mqtt-shared-{group}/{topics.binding_key(topic_filter)}"


class Subscriptions5(Subscriptions):
    property_block = b"\x00"
    def __init__(self, host: SubscriberHost, actor: Actor, vhost: VHost, exchange: str, client_id: str,
                 limits: ClientLimits, inflight_window: int, qos2_store: QoS2Store) -> None:
        super().__init__(host, actor, vhost, exchange, client_id, limits.clean_start, inflight_window, qos2_store)
        self.limits = limits
        self.state = vhost_state(vhost)
        self.options = self.state.client_options(client_id)  # a persistent session's are in the vhost's file
        self._aliases: dict[str, int] = {}  # topic -> the alias the client was given for it
        self._outbound: dict[bytes, Outbound] = {}
        self._matching: dict[str, list[FilterOptions]] = {}
        self._consumer: Consumer | None = None  # of the delivery being encoded
        self._plain: dict[bytes, bool] = {}  # AMQP properties -> whether a delivery carries no MQTT 5 property
        self._per_message = self._needs_per_message()

    # --- the session's life --------------------------------------------------------------------------
    def start(self) -> bool:
        """Clean Start drops what an earlier session left; the session lives on after the connection
        when its expiry interval is not 0. Shared subscriptions are consumed again."""
        expiry = self.limits.session_expiry
        if self.state.session_expired(self.client_id) and not self.limits.clean_start:
            # The session expired while away: none is present (3.1.2.11.2), as after a Clean Start.
            self.limits.clean_start = self.clean_session = True
        if self.limits.clean_start:
            self.state.drop(self.client_id)
            super().start()
            if expiry:
                self.qos2 = self.qos2_store.session(self.vhost, self.client_id, True)
            present = False
        else:
            self.clean_session = False
            present = super().start()
            if expiry:  # a resumed session's queues expire after this connection's interval
                self._expire_own_queues()
        self.clean_session = expiry == 0
        for topic_filter, options in list(self.options.items()):
            if options.group is not None:  # a session of shared subscriptions alone is present too
                present = True
                self.subscribe_shared(options.group, topic_filter.split("/", 2)[2], options.qos)
        self._per_message = self._needs_per_message()
        return present

    def _queue(self, qos: int) -> QueueKind:
        name = queue_name(self.client_id, qos)
        existing = self.vhost.queues.get(name)
        if existing is not None:
            return existing
        return self._declare(name)

    def _declare(self, name: str) -> QueueKind:
        """A queue of the session (its own or a shared group's it joins): durable with the interval as
        ``x-expires``, or going with the connection when the interval is 0."""
        expiry, expires = self.limits.session_expiry, self._expires_ms()
        return ops.declare_queue(self.actor, self.vhost, name, owner=self, durable=expiry > 0,
                                 auto_delete=expiry == 0, arguments=None if expires is None else {"x-expires": expires})

    def _expires_ms(self) -> int | None:
        """The session's queues' ``x-expires``: its interval; none for 0xFFFFFFFF (never expires) or 0
        (they go with the connection)."""
        expiry = self.limits.session_expiry
        return expiry * 1000 if 0 < expiry < 0xFFFFFFFF else None

    def set_session_expiry(self, seconds: int) -> None:
        """A DISCONNECT changed the interval: a non-zero one is the queues' ``x-expires`` from now on
        (as RabbitMQ rewrites it); 0 ends the session with the connection (``end``)."""
        self.limits.session_expiry = seconds
        if seconds:
            self._expire_own_queues()

    def _expire_own_queues(self) -> None:
        for qos in (0, 1):
            name = queue_name(self.client_id, qos)
            if name in self.vhost.queues:
                try:
                    ops.set_queue_expiry(self.actor, self.vhost, name, self._expires_ms(), owner=self)
                except BrokerError as e:  # may not configure it: it keeps the x-expires it has
                    log.warning("MQTT client %r: session queue %r keeps its expiry: %s", self.client_id, name, e)

    def end(self) -> None:
        """The connection is gone: a session whose expiry interval is 0 ends with it (queues and QoS 2
        state an earlier session made durable too)."""
        self.close()
        if self.limits.session_expiry:
            self.state.session_ended(self.client_id, self.limits.session_expiry)
        if self.limits.session_expiry == 0:
            self.state.drop(self.client_id)
            if self.qos2.file is not None:  # the QoS 2 state a persistent session kept
                self.qos2_store.session(self.vhost, self.client_id, False)
            for qos in (0, 1):
                if queue_name(self.client_id, qos) in self.vhost.queues:
                    try:
                        ops.delete_queue(self.actor, self.vhost, queue_name(self.client_id, qos), owner=self)
                    except BrokerError:
                        pass  # may not configure it: it expires as its arguments say

    # --- SUBSCRIBE -----------------------------------------------------------------------------------
    def subscribe5(self, request: codec5.SubscriptionRequest) -> tuple[int, bool]:
        """The SUBACK code of one request (the granted QoS; 0x8F for a bad filter, 0x87 for one refused)
        and whether the subscription existed before."""
        try:
            shared = split_shared(request.topic_filter)
        except topics.TopicError:
            return 0x8F, False  # topic filter invalid
        try:
            topics.check_filter(shared[1] if shared is not None else request.topic_filter)
        except topics.TopicError:
            return 0x8F, False
        existed = request.topic_filter in self.options
        if shared is not None:
            code = self.subscribe_shared(shared[0], shared[1], request.qos)
        else:
            code = self.subscribe(request.topic_filter, request.qos)
        if code == codec.SUBACK_FAILURE:  # a valid filter refused: a permission (or a name too long)
            return 0x87, existed
        if code < 0x80:
            self.state.set_options(self.client_id, request.topic_filter, FilterOptions(
                code, request.no_local, request.retain_as_published, request.subscription_id,
                shared[0] if shared is not None else None), self.limits.session_expiry > 0)
            self._matching.clear()
            self._per_message = self._needs_per_message()
        return code, existed

    def subscribe_shared(self, group: str, topic_filter: str, qos: int) -> int:
        """A member of the group's queue for the filter, at the QoS asked (QoS 2: deliveries published
        at QoS 2, or over AMQP, go out with the PUBREC/PUBREL/PUBCOMP handshake)."""
        granted = qos
        try:
            topics.check_filter(topic_filter)
            name = shared_queue_name(group, topic_filter)
            if len(name.encode()) > topics.MAX_NAME_BYTES:
                return codec.SUBACK_FAILURE
            if name not in self.vhost.queues:
                # A persistent member's group keeps its messages across a restart and while every
                # member is away, for the member's session expiry; else it goes with its last member.
                self._declare(name)
            ops.bind_queue(self.actor, self.vhost, name, self.exchange, topics.binding_key(topic_filter), None, self)
            mine = self.consumers.get(name)
            if mine is not None and mine.no_ack != (granted == 0):
                mine.queue.remove_consumer(mine)
                del self.consumers[name]
            if name not in self.consumers:
                queue = ops.readable_queue(self.actor, self.vhost, name, self)
                consumer = Consumer(f"mqtt-{self.client_id}-{name}", queue, self, no_ack=granted == 0,
                                    prefetch=self.window if granted else 0)
                self.consumers[name] = consumer
                queue.add_consumer(consumer)
            self._bound_window()
        except (topics.TopicError, BrokerError):
            return codec.SUBACK_FAILURE
        return granted

    def unsubscribe5(self, topic_filter: str) -> int:
        """The UNSUBACK code: success, or no subscription existed."""
        options = self.state.unsubscribed(self.client_id, topic_filter, self.limits.session_expiry > 0)
        self._matching.clear()
        self._per_message = self._needs_per_message()
        if options is not None and options.group is not None:
            name = shared_queue_name(options.group, topic_filter.split("/", 2)[2])
            consumer = self.consumers.pop(name, None)
            if consumer is not None:
                consumer.queue.remove_consumer(consumer)
            self._bound_window()
            return 0
        self.unsubscribe(topic_filter)
        return 0 if options is not None else 0x11

    # --- deliveries ----------------------------------------------------------------------------------
    def _bound_window(self) -> None:
        """With shared subscriptions beside its own queue the client has several consumers: the
        in-flight window (its Receive Maximum) bounds them together. Alone, its queue's consumer
        prefetch does (a channel-wide one would cut QoS 0 runs to the window's size too)."""
        shared = any(isinstance(key, str) for key in self.consumers)
        self.deliveries.set_prefetch(self.window if shared else 0)

    def _needs_per_message(self) -> bool:
        """Whether a delivery may differ from the plain 3.1.1-shaped one plus an empty property block
        (aliases, a size limit, subscription options or identifiers)."""
        limits = self.limits
        return bool(limits.maximum_packet_size is not None or limits.topic_alias_maximum or any(
            o.subscription_id is not None or o.no_local or o.retain_as_published for o in self.options.values()))

    def _is_plain(self, properties: bytes) -> bool:
        found = self._plain.get(properties)
        if found is None:
            if len(self._plain) >= 64:
                self._plain.clear()
            outbound = self._outbound_of(properties)
            found = self._plain[properties] = not outbound.static and outbound.expiration_ms is None
        return found

    def _all_plain(self, messages: list[StoredMessage]) -> bool:
        last = None  # a run's messages mostly share one properties value: each distinct one looked up once
        for msg in messages:
            properties = msg.properties
            if properties is not last:
                if not self._is_plain(properties):
                    return False
                last = properties
        return True

    def _deliver_booked(self, consumer: Consumer, first: int, positions: list[int], messages: list[StoredMessage],
                        redelivered: list[bool] | None) -> None:
        """A run of plain deliveries (no MQTT 5 property to send, none dropped) is written as the 3.1.1
        connection writes runs; any other, one delivery at a time."""
        if not self._per_message and consumer.queue.name[:12] != "mqtt-shared-" and self._all_plain(messages):
            return super()._deliver_booked(consumer, first, positions, messages, redelivered)
        for i, (pos, msg) in enumerate(zip(positions, messages, strict=True)):
            self._send(consumer, first + i, pos, msg, redelivered is not None and redelivered[i])

    def _qos1_run(self, first: int, messages: list[StoredMessage]) -> bool:
        """The 3.1.1 run step for plain runs only (one properties value in a run that step takes)."""
        if self._per_message or not self._is_plain(messages[0].properties):
            return False
        return super()._qos1_run(first, messages)

    def _send(self, consumer: Consumer, tag: int, pos: int, msg: StoredMessage, redelivered: bool) -> None:
        self._consumer = consumer
        if self._skipped(consumer, msg):
            if not consumer.no_ack:
                self.deliveries.ack_run([tag])
            return
        if consumer.queue.name[:12] == "mqtt-shared-":  # a shared subscription: QoS 0 or 1
            self._send_shared(consumer, tag, msg, redelivered)
            return
        super()._send(consumer, tag, pos, msg, redelivered)

    def _send_shared(self, consumer: Consumer, tag: int, msg: StoredMessage, redelivered: bool) -> None:
        if msg.routing_key[:1] == "$" and not self._dollar_subscribed(msg.routing_key, consumer):
            if not consumer.no_ack:
                self.deliveries.ack_run([tag])
            return
        topic, body = topics.topic_name(msg.routing_key), bytes(msg.body)
        if consumer.no_ack or self._published_qos(msg.properties) == 0:
            self.host.send(self._encode(topic, body, 0, False, 0, msg))
            if not consumer.no_ack:
                self.deliveries.ack_run([tag])
            return
        qos = 2 if self._published_qos(msg.properties) != 1 and self._shared_qos2(consumer) else 1
        packet_id = self._packet_id()
        self.inflight[packet_id] = tag
        if qos == 2:  # awaiting PUBREC in memory: a member gone before it has not taken the message
            self.qos2_ids.add(packet_id)
            self.shared_qos2_ids.add(packet_id)
        self.host.send(self._encode(topic, body, qos, redelivered, packet_id, msg))

    def _shared_qos2(self, consumer: Consumer) -> bool:
        """Whether the member's subscription on this group's queue was granted QoS 2."""
        return any(o.qos == 2 for o in self._options_for("", consumer))

    def _outbound_of(self, properties: bytes) -> Outbound:
        cache = self._outbound
        found = cache.get(properties)
        if found is None:
            if len(cache) >= 64:
                cache.clear()
            found = cache[properties] = Outbound(properties)
        return found

    def _options_for(self, topic: str, consumer: Consumer | None) -> list[FilterOptions]:
        """The options of the filters a delivery on this consumer's queue came through."""
        if consumer is not None and consumer.queue.name[:12] == "mqtt-shared-":
            name = consumer.queue.name
            return [o for f, o in self.options.items()
                    if o.group is not None and shared_queue_name(o.group, f.split("/", 2)[2]) == name]
        cache = self._matching
        found = cache.get(topic)
        if found is None:
            if len(cache) >= 1024:
                cache.clear()
            found = cache[topic] = [o for f, o in self.options.items() if o.group is None and topics.matches(f, topic)]
        return found

    def _skipped(self, consumer: Consumer, msg: StoredMessage) -> bool:
        """No Local (every filter the message came through asks it, and the client published it), or
        larger than the client's Maximum Packet Size (dropped as if sent, 3.1.2.11.4)."""
        outbound = self._outbound_of(msg.properties)
        topic = topics.topic_name(msg.routing_key)
        if outbound.publisher() == self.client_id:
            options = self._options_for(topic, consumer)
            if options and all(o.no_local for o in options):
                return True
        limit = self.limits.maximum_packet_size
        if limit is not None:
            length = 2 + len(topic.encode()) + 2 + len(outbound.block(msg.timestamp, msg.timestamp, {})) \
                + len(msg.body) + 8  # the subscription identifiers' room
            if 1 + len(codec.remaining_length(length)) + length > limit:
                return True
        return False

    def _encode(self, topic: str, body: bytes, qos: int, dup: bool, packet_id: int, msg: StoredMessage) -> bytes:
        outbound = self._outbound_of(msg.properties)
        options = self._options_for(topic, self._consumer) if self.options else []
        extra: dict[str, Any] = {}
        ids = [o.subscription_id for o in options if o.subscription_id is not None]
        if ids:
            extra["subscription_identifier"] = ids
        retain = outbound.retained() and any(o.retain_as_published for o in options)
        name = self._alias(topic, extra)
        block = outbound.block(msg.timestamp, time.time_ns() // 1_000_000, extra)
        return codec5.publish(name, body, qos, retain, dup, packet_id, block)

    def _alias(self, topic: str, extra: dict[str, Any]) -> str:
        """The topic to send: empty once the client knows its alias (the alias in ``extra``)."""
        maximum = self.limits.topic_alias_maximum
        if not maximum:
            return topic
        alias = self._aliases.get(topic)
        if alias is not None:
            extra["topic_alias"] = alias
            return ""
        if len(self._aliases) < maximum:
            alias = self._aliases[topic] = len(self._aliases) + 1
            extra["topic_alias"] = alias
        return topic

    def _retained_packet(self, topic: str, message: RetainedMessage, qos: int, packet_id: int) -> bytes:
        """A retained message's PUBLISH, with the properties it was published with (its expiry interval
        what is left of it) and the subscription identifiers of the filters it matches."""
        options = self._options_for(topic, None)
        ids = [o.subscription_id for o in options if o.subscription_id is not None]
        extra = {"subscription_identifier": ids} if ids else {}
        if message.properties is None:
            block = encode_properties(extra)
        else:
            block = self._outbound_of(message.properties).block(message.timestamp_ms, time.time_ns() // 1_000_000,
                                                                extra)
        return codec5.publish(topic, message.payload, qos, True, False, packet_id, block)


def retained_for(request: codec5.SubscriptionRequest, existed: bool) -> bool:
    """Whether a SUBSCRIBE's retained messages are sent: Retain Handling 0 always, 1 for a new
    subscription, 2 never; never for a shared subscription."""
    if request.topic_filter.startswith(SHARE_PREFIX):
        return False
    return request.retain_handling == 0 or (request.retain_handling == 1 and not existed)
