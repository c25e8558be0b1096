"""One MQTT client's subscriptions on the model: its queues (named as RabbitMQ names them, one for
QoS 0 and one for QoS 1 and 2 subscriptions), their bindings on the MQTT exchange, the consumers on
them, and the deliveries awaiting PUBACK or PUBREC (one in-flight window). A message of the QoS 1 queue
goes out at QoS 2 when a filter granted QoS 2 matches its topic (those filters are part of the
session's QoS 2 state, ``exactly_once``) and it was published at QoS 2 or over AMQP; it is acked to its
queue at PUBREC. Queues deliver here as to any ``DeliveryChannel``; the books and the settling are the
model's (``broker.ops.deliveries``)."""

from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING

from ..broker.errors import BrokerError
from ..broker.ops import Consumer
from ..broker.ops import objects as ops
from ..broker.ops.deliveries import Deliveries
from ..wire.properties import peek_headers
from . import codec, topics
from .exactly_once import ClientState
from .subscriber_host import RetainedMessage, RetainedSource, RunSource, SubscriberHost

if TYPE_CHECKING:
    from ..broker.ops import Actor, QueueKind, VHost
    from ..broker.ops.deliveries import StoredMessage  # the model's record type; mqtt names no store module
    from .exactly_once import QoS2Store

PUBLISH_QOS_HEADER = "x-mqtt-publish-qos"
# Retained messages owed to SUBSCRIBEs go out at most this many bytes per call (once per flush of the
# connection's output), and only while the socket takes them: one or two such batches beyond the
# socket's high-water mark at most, however many are owed.
RETAINED_BATCH_BYTES = 1 << 20
_PACKET_IDS = 65535


def queue_name(client_id: str, qos: int) -> str:
    return f"mqtt-subscription-{client_id}qos{qos}"


class Subscriptions:
    """A connected client's queues, consumers and in-flight QoS 1 deliveries."""

    property_block = b""  # after a PUBLISH's packet id (MQTT 5's empty one in runs of plain messages)

    def __init__(self, host: SubscriberHost, actor: Actor, vhost: VHost, exchange: str, client_id: str,
                 clean_session: bool, inflight_window: int, qos2_store: QoS2Store) -> None:
        self.host = host
        self.actor = actor
        self.vhost = vhost
        self.exchange = exchange
        self.client_id = client_id
        self.clean_session = clean_session
        self.window = inflight_window
        self.deliveries = Deliveries(vhost, self._room_freed, host.counters, channel=False)
        self.consumers: dict[int | str, Consumer] = {}  # by the QoS of their queue (shared ones: by queue name)
        self.inflight: dict[int, int | None] = {}  # packet id -> delivery tag (None: a retained message)
        self.qos2_store = qos2_store
        self.qos2 = ClientState(client_id, None)  # the session's QoS 2 state (``start`` finds a persistent one's)
        self.qos2_ids: set[int] = set()  # the ids of ``inflight`` sent at QoS 2 (awaiting PUBREC)
        self.shared_qos2_ids: set[int] = set()  # those of them from a shared subscription's queue
        self._qos2_topics: dict[str, bool] = {}  # topic -> whether a filter granted QoS 2 matches it
        self._ids_exhausted = False  # deliveries wait for a PUBCOMP to free a packet id
        self._queued_qos2 = 0  # deliveries of ``inflight`` from the queue at QoS 2 (their ids are in qos2.sent_ids)
        self._qos_by_properties: dict[bytes, int | None] = {}
        self._next_id = 0
        self._topic_field: tuple[str | None, bytes] = (None, b"")  # a QoS 1 run's last routing key, its topic
        self.closed = False
        # Retained messages owed: (source, filter, granted QoS) of SUBSCRIBEs not yet served, and the
        # topics left of the one being served.
        self._retained_filters: deque[tuple[RetainedSource, str, int]] = deque()
        self._retained_topics: deque[str] = deque()
        self._retained_from: tuple[RetainedSource, int] | None = None

    # --- the session as the client left it ---------------------------------------------------------
    def start(self) -> bool:
        """At CONNECT: a clean session drops what an earlier one left; a persistent one consumes again."""
        names = [queue_name(self.client_id, qos) for qos in (0, 1)]
        self.qos2 = self.qos2_store.session(self.vhost, self.client_id, not self.clean_session)
        if self.clean_session:
            for name in names:
                if name in self.vhost.queues:  # nothing to check for a queue that is not there
                    ops.delete_queue(self.actor, self.vhost, name, owner=self)
            return False
        present = any(name in self.vhost.queues for name in names)
        for qos, name in enumerate(names):
            if name in self.vhost.queues:
                self._consume(qos, name)
        queue = self.vhost.queues.get(names[1])
        if queue is None:  # QoS 2 grants are bindings of that queue: gone with it (expired, deleted)
            self.qos2.forget_grants()
        if self.qos2.sent and (queue is None or not (queue.message_count or queue.unacked_count)):
            for packet_id in list(self.qos2.sent_ids):  # left the queue meanwhile: ids free
                self.qos2.forget(packet_id)
        return present or not self.qos2.empty

    def _queue(self, qos: int) -> QueueKind:
        name = queue_name(self.client_id, qos)
        existing = self.vhost.queues.get(name)
        if existing is not None:
            return existing
        durable = not self.clean_session
        return ops.declare_queue(self.actor, self.vhost, name, owner=self, durable=durable,
                                 auto_delete=not durable)

    def _consume(self, qos: int, name: str) -> None:
        """Consume from the queue of that QoS (read permission on it, as any consumer)."""
        if qos in self.consumers:
            return
        queue = ops.readable_queue(self.actor, self.vhost, name, self)
        consumer = Consumer(f"mqtt-{self.client_id}-qos{qos}", queue, self, no_ack=qos == 0,
                            prefetch=self.window if qos else 0)
        self.consumers[qos] = consumer
        queue.add_consumer(consumer)

    # --- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------------------------
    def subscribe(self, topic_filter: str, qos: int) -> int:
        """Bind the filter to the queue of its QoS (QoS 2 to the QoS 1 queue, the filter kept in the session's
        QoS 2 state) and unbind it from the other; the granted QoS, or the SUBACK failure code (bad filter,
        permission refused)."""
        queue_qos = min(qos, 1)
        try:
            topics.check_filter(topic_filter)
            key = topics.binding_key(topic_filter)
            queue = self._queue(queue_qos)
            self._consume(queue_qos, queue.name)
            ops.bind_queue(self.actor, self.vhost, queue.name, self.exchange, key, None, self)
            other = self.vhost.queues.get(queue_name(self.client_id, 1 - queue_qos))
            if other is not None:
                ops.unbind_queue(self.actor, self.vhost, other.name, self.exchange, key, None, self)
        except (topics.TopicError, BrokerError):
            return codec.SUBACK_FAILURE
        self.qos2.grant(topic_filter, qos == 2)
        self._qos2_topics.clear()
        return qos

    def unsubscribe(self, topic_filter: str) -> None:
        try:
            topics.check_filter(topic_filter)
        except topics.TopicError:
            return
        key = topics.binding_key(topic_filter)
        self.qos2.grant(topic_filter, False)
        self._qos2_topics.clear()
        for qos in (0, 1):
            name = queue_name(self.client_id, qos)
            if name in self.vhost.queues:
                try:
                    ops.unbind_queue(self.actor, self.vhost, name, self.exchange, key, None, self)
                except BrokerError:
                    pass  # nothing bound, or not allowed: UNSUBACK all the same (the spec's rule)

    # --- deliveries (broker.queues.queue_consumer.DeliveryChannel) ------------------------------------------
    def can_deliver(self) -> bool:
        return not self.closed and self.host.writable

    def delivery_room(self) -> int:
        """The room the books allow, and no more than the packet ids left: QoS 2 exchanges past PUBREC
        hold theirs until PUBCOMP (a client that never sends PUBCOMP stops its deliveries, no more)."""
        qos2 = self.qos2
        if not (qos2.pubrel_owed or qos2.sent_ids):  # the usual case: no id held beyond ``inflight``
            return self.deliveries.room()
        held = self._ids_held()
        if not held:
            return self.deliveries.room()
        left = _PACKET_IDS - held - len(self.inflight)
        if left <= 0:
            self._ids_exhausted = True
            return 0
        return min(self.deliveries.room(), left)

    def _ids_held(self) -> int:
        """Packet ids QoS 2 exchanges hold beyond ``inflight``: PUBRELs owed, and deliveries awaiting
        PUBREC that an earlier connection of the session sent."""
        return len(self.qos2.pubrel_owed) + len(self.qos2.sent_ids) - self._queued_qos2

    def deliver(self, consumer: Consumer, pos: int, msg: StoredMessage, redelivered: bool) -> None:
        tag = self.deliveries.deliver(consumer, pos, redelivered)
        self._send(consumer, tag, pos, msg, redelivered)

    def deliver_run(self, consumer: Consumer, positions: list[int], messages: list[StoredMessage],
                    redelivered: list[bool] | None) -> None:
        """Deliveries of a run, booked once and written as one buffer (the topic encoded once per
        routing key, QoS 0 deliveries of a QoS 1 subscription settled as one run)."""
        self._deliver_booked(consumer, self.deliveries.deliver_run(consumer, positions, redelivered), positions,
                             messages, redelivered)

    def deliver_from_queue(self, queue: RunSource, consumer: Consumer, budget: int) -> int | None:
        """A classic queue's whole step for this client's one QoS 1 consumer (``Queue._deliver_to``):
        runs as large as the in-flight window left (and the ids) allow, taken from the queue, booked
        and written as ``deliver_run`` writes them, with no second pass to find the window full. The
        deliveries made; None leaves QoS 0 and a window shared with other consumers to the queue."""
        if consumer.no_ack or self.deliveries.prefetch:
            return None
        delivered = 0
        window = consumer.prefetch
        host = self.host
        qos2 = self.qos2
        while delivered < budget and host.writable and not self.closed:
            count = min(budget - delivered, window - consumer.unacked) if window else budget - delivered
            if qos2.pubrel_owed or qos2.sent_ids:  # ids held beyond the in-flight map's
                count = min(count, self.delivery_room())
            if count <= 0:
                break
            if count == 1:  # the window freed by one PUBACK (a client's PUBACK a write): no run to take or book
                taken = queue.take_one()
                if taken is None:
                    break
                pos, msg, again = taken
                tag = self.deliveries.deliver(consumer, pos, again)
                if again or not self._qos1_run(tag, [msg]):  # what ``_deliver_booked`` tries first, else it
                    self._deliver_booked(consumer, tag, [pos], [msg], [True] if again else None)
                consumer.unacked += 1
                delivered += 1
                if consumer.unacked >= window:  # full again (the usual case): no pass to find it so
                    break
                continue
            positions, messages, redelivered = queue.take_run(count)
            if not positions:
                break
            self._deliver_booked(consumer, self.deliveries.deliver_run(consumer, positions, redelivered), positions,
                                 messages, redelivered)
            consumer.unacked += len(positions)
            delivered += len(positions)
        return delivered

    def _deliver_booked(self, consumer: Consumer, first: int, positions: list[int], messages: list[StoredMessage],
                        redelivered: list[bool] | None) -> None:
        """``deliver_run``'s output, its books made (tags from ``first``)."""
        parts: list[bytes] = []
        block = self.property_block
        headers_cache: tuple[str, bytes, bytes] | None = None  # (routing key, its encoded topic, + block)
        if consumer.no_ack:
            for msg in messages:
                key = msg.routing_key
                if key[:1] == "$" and not self._dollar_subscribed(key, consumer):
                    continue
                if headers_cache is None or headers_cache[0] != key:
                    topic_field = codec.topic_field(topics.topic_name(key))
                    headers_cache = (key, topic_field, topic_field + block)
                parts.append(codec.publish_packet(headers_cache[2], msg.body, 0x30))
            self.host.send(b"".join(parts))
            return
        if redelivered is None and self._qos1_run(first, messages):
            return
        settled: list[int] = []
        qos2 = self.qos2
        exactly_once: list[int] | None = [] if qos2.filters else None  # indexes going out at QoS 2
        qos2_ids: list[int] = []
        topic_qos2 = False
        inflight = self.inflight
        taken = self.qos2.taken
        reserved = bool(self.qos2.sent_ids or self.qos2.pubrel_owed)  # ids QoS 2 exchanges hold
        qos_cache = self._qos_by_properties
        append = parts.append
        next_id = self._next_id
        heads: dict[int, bytes] = {}  # fixed header + topic by body size << 8 | flags, for the key in hand
        unsent = False  # the key in hand is a $ topic no filter of the client's matches
        for i, msg in enumerate(messages):
            key = msg.routing_key
            if headers_cache is None or headers_cache[0] != key:
                topic = topics.topic_name(key)
                topic_field = codec.topic_field(topic)
                headers_cache = (key, topic_field, topic_field + block)
                topic_qos2 = exactly_once is not None and self._qos2_topic(topic)
                heads = {}
                unsent = key[:1] == "$" and not self._dollar_subscribed(key, consumer)
            if unsent:
                settled.append(first + i)  # settled unsent
                continue
            properties = msg.properties
            published_qos = qos_cache[properties] if properties in qos_cache else self._published_qos(properties)
            if published_qos == 0:
                # QoS 0 publishes go out at QoS 0 even to QoS 1 subscribers (the lower of the two).
                append(codec.publish_packet(headers_cache[2], msg.body, 0x30))
                settled.append(first + i)
                continue
            flags = 0x3A if redelivered is not None and redelivered[i] else 0x32
            earlier = None
            if published_qos != 1 and topic_qos2:  # at QoS 2, with the id an earlier delivery had
                assert exactly_once is not None
                exactly_once.append(i)
                flags += 2
                earlier = qos2.id_of(positions[i])
            if earlier is not None and earlier not in inflight:
                next_id = earlier
            else:
                next_id = next_id % 65535 + 1  # the next packet identifier, unless it is still in flight
                if next_id in inflight or (reserved and taken(next_id)):
                    self._next_id = next_id
                    next_id = self._packet_id()
            inflight[next_id] = first + i
            if flags & 4:
                qos2_ids.append(next_id)
            body = msg.body
            size = len(body) << 8 | flags
            head = heads.get(size)
            if head is None:
                topic_field = headers_cache[1]
                length = len(topic_field) + 2 + len(block) + len(body)
                fixed = bytes((flags, length)) if length < 128 else bytes((flags,)) + codec.remaining_length(length)
                head = heads[size] = fixed + topic_field
            # The PUBLISH in parts (fixed header and topic, packet id, properties, payload), joined once for the run.
            append(head)
            append(next_id.to_bytes(2, "big"))
            if block:
                append(block)
            append(body)
        self._next_id = next_id
        if exactly_once:  # recorded as one write; sent once durable when a persistent session's record waits
            self.qos2_ids.update(qos2_ids)
            self._queued_qos2 += len(qos2_ids)
            waits = qos2.sending_run([positions[i] for i in exactly_once], qos2_ids)
            if qos2.file is not None:
                self.host.send_after(self.vhost.durable(acks=False) if waits else None, b"".join(parts))
            else:
                self.host.send(b"".join(parts))
        else:
            self.host.send(b"".join(parts))
        if settled:
            self.deliveries.ack_run(settled)

    def _qos1_run(self, first: int, messages: list[StoredMessage]) -> bool:
        """``deliver_run``'s common case in a few whole-run steps, else False (the loop): first
        deliveries of one topic (no ``$``) and one properties value published at QoS 1 or 2 (or over
        AMQP), no QoS 2 filter or state, and the next packet ids free and not wrapping past 65535. Their
        PUBLISH packets are encoded as one buffer (compiled when built), the same bytes as the loop's."""
        qos2 = self.qos2
        if qos2.filters or qos2.sent_ids or qos2.pubrel_owed:
            return False
        head = messages[0]
        key, properties = head.routing_key, head.properties
        count = len(messages)
        next_id = self._next_id
        if key[:1] == "$" or next_id + count > _PACKET_IDS:
            return False
        cache = self._qos_by_properties
        if (cache[properties] if properties in cache else self._published_qos(properties)) == 0:
            return False
        topic = self._topic_field
        if topic[0] != key:
            topic = self._topic_field = (key, codec.topic_field(topics.topic_name(key)))
        # Encoded and its ids booked in the in-flight map; None when an id is in flight or the run has other
        # keys or properties (or, compiled, a body read in place): the loop
        packets = codec.publish_booked(0x32, topic[1], self.property_block, next_id + 1, messages, key,
                                       properties, self.inflight, first)
        if packets is None:
            return False
        self._next_id = next_id + count
        self.host.send(packets)
        return True

    def consumer_cancelled(self, consumer: Consumer) -> None:
        for qos, mine in list(self.consumers.items()):
            if mine is consumer:
                del self.consumers[qos]

    def _published_qos(self, properties: bytes) -> int | None:
        """The x-mqtt-publish-qos of a message's properties (None: absent, as for AMQP publishes),
        read once per distinct properties value."""
        cache = self._qos_by_properties
        try:
            return cache[properties]
        except KeyError:
            pass
        headers = peek_headers(properties)
        published_qos = headers.get(PUBLISH_QOS_HEADER) if headers else None
        if len(cache) >= 64:
            cache.clear()
        cache[properties] = published_qos
        return published_qos

    def _dollar_subscribed(self, key: str, consumer: Consumer) -> bool:
        """Whether a routing key starting with ``$`` is a topic a filter of the consumer's queue matches:
        in MQTT a filter starting with a wildcard matches no topic starting with ``$`` (3.1.1, 4.7.2), in
        the topic exchange its binding key does. Keys starting with ``$`` are rare; this reads the
        exchange's bindings each time."""
        exchange = self.vhost.exchanges.get(self.exchange)
        if exchange is None:
            return True  # not routed by a filter of the client's
        queue, topic = consumer.queue, topics.topic_name(key)
        return any(binding.destination is queue and topics.matches(topics.topic_filter(binding.routing_key), topic)
                   for binding in exchange.bindings())

    def _send(self, consumer: Consumer, tag: int, pos: int, msg: StoredMessage, redelivered: bool) -> None:
        if msg.routing_key[:1] == "$" and not self._dollar_subscribed(msg.routing_key, consumer):
            if not consumer.no_ack:
                self.deliveries.ack_run([tag])
            return
        topic = topics.topic_name(msg.routing_key)
        body = bytes(msg.body)
        encode = self._encode
        if consumer.no_ack:
            self.host.send(encode(topic, body, 0, False, 0, msg))
            return
        published_qos = self._published_qos(msg.properties)
        if published_qos == 0:
            # QoS 0 publishes go out at QoS 0 even to QoS 1 subscribers (the lower of the two).
            self.host.send(encode(topic, body, 0, False, 0, msg))
            self.deliveries.ack_run([tag])
            return
        if published_qos != 1 and self.qos2.filters and self._qos2_topic(topic):
            # At QoS 2, with the packet id an earlier delivery of the message had (a redelivery).
            packet_id = self.qos2.id_of(pos)
            if packet_id is None or packet_id in self.inflight:
                packet_id = self._packet_id()
            waits = self.qos2.sending(pos, packet_id)
            self.inflight[packet_id] = tag
            self.qos2_ids.add(packet_id)
            self._queued_qos2 += 1
            packet = encode(topic, body, 2, redelivered, packet_id, msg)
            if self.qos2.file is None:
                self.host.send(packet)
            else:  # once its id is recorded, in order with the session's other QoS 2 PUBLISHes
                self.host.send_after(self.vhost.durable(acks=False) if waits else None, packet)
            return
        packet_id = self._packet_id()
        self.inflight[packet_id] = tag
        self.host.send(encode(topic, body, 1, redelivered, packet_id, msg))

    def _encode(self, topic: str, body: bytes, qos: int, dup: bool, packet_id: int, msg: StoredMessage) -> bytes:
        """The PUBLISH of a queue's message (an MQTT 5 session's carries its properties)."""
        return codec.publish(topic, body, qos, False, dup, packet_id)

    def _qos2_topic(self, topic: str) -> bool:
        """Whether a filter granted QoS 2 matches the topic (cached per topic until a (un)subscribe)."""
        cache = self._qos2_topics
        found = cache.get(topic)
        if found is None:
            if len(cache) >= 1024:
                cache.clear()
            found = cache[topic] = any(topics.matches(f, topic) for f in self.qos2.filters)
        return found

    # --- retained messages on SUBSCRIBE, under the socket's back-pressure -------------------------------
    def queue_retained(self, source: RetainedSource, topic_filter: str, qos: int) -> None:
        """The retained messages the filter matches are owed, at the granted QoS (or the lower one they
        were published at); they go out through ``send_retained_owed``."""
        self._retained_filters.append((source, topic_filter, qos))

    @property
    def retained_owed(self) -> int:
        """Filters whose retained messages are not all sent yet."""
        return len(self._retained_filters) + bool(self._retained_topics)

    def send_retained_owed(self) -> None:
        """Send owed retained messages while the socket is writable, at most RETAINED_BATCH_BYTES (but at least
        one message) per call, each read from the store only now; a QoS 1 one waits for a free packet id."""
        budget = RETAINED_BATCH_BYTES
        while budget > 0 and not self.closed and self.host.writable:
            if not self._retained_topics:
                if not self._retained_filters:
                    self._retained_from = None
                    return
                source, topic_filter, qos = self._retained_filters.popleft()
                self._retained_topics = deque(source.topics(topic_filter))
                self._retained_from = (source, qos)
                continue
            assert self._retained_from is not None
            source, qos = self._retained_from
            if qos and len(self.inflight) + self._ids_held() >= _PACKET_IDS:
                return  # every identifier awaits its PUBACK
            topic = self._retained_topics.popleft()
            found = source.get(topic)
            if found is not None:
                self.send_retained(topic, found, min(qos, found.qos))
                budget -= len(found.payload) + len(topic) + 8

    def send_retained(self, topic: str, message: RetainedMessage, qos: int) -> None:
        """A retained message on SUBSCRIBE: straight to the client, outside any queue."""
        packet_id = 0
        if qos:
            packet_id = self._packet_id()
            self.inflight[packet_id] = None
            if qos == 2:
                self.qos2_ids.add(packet_id)
        self.host.send(self._retained_packet(topic, message, qos, packet_id))

    def _retained_packet(self, topic: str, message: RetainedMessage, qos: int, packet_id: int) -> bytes:
        return codec.publish(topic, message.payload, qos, True, False, packet_id)

    def _packet_id(self) -> int:
        for _ in range(65535):
            self._next_id = self._next_id % 65535 + 1
            if self._next_id not in self.inflight and not self.qos2.taken(self._next_id):
                return self._next_id
        raise codec.MQTTProtocolError("no packet identifier left")  # pragma: no cover - window is smaller

    def puback_read(self, data: bytes, write_follows: bool = False) -> bool:
        """A read of whole short PUBACKs and nothing else (what a QoS 1 subscriber sends) settled as
        ``puback_run`` settles its ids; False, and nothing done, for any other input. ``write_follows``:
        the caller writes the deliveries this frees, then calls ``settle_deferred``: the queue side of
        the acks waits until then (the client's next window is out one index update sooner)."""
        if self.qos2_ids:
            ids = codec.puback_ids(data)
            if ids is None:
                return False
            self.puback_run(ids)
            return True
        tags = codec.puback_tags(data, self.inflight)  # the ids popped from the in-flight map at once
        if tags is None:
            return False
        if tags:
            if write_follows:  # the freed window's next delivery goes out in this read's write
                self.deliveries.ack_run_before_write(tags)
            else:
                self.deliveries.ack_run(tags)
        return True

    def settle_deferred(self) -> None:
        """The acks ``puback_read`` left for after the write, applied (nothing when none waits)."""
        if self.deliveries.deferred_acks is not None:
            self.deliveries.settle_deferred()

    def puback_run(self, packet_ids: list[int]) -> None:
        """The client's PUBACKs (of one read) settle their deliveries through the model as one run
        (an unknown id is ignored)."""
        if self.qos2_ids:  # a PUBACK of a QoS 2 delivery is ignored
            packet_ids = [packet_id for packet_id in packet_ids if packet_id not in self.qos2_ids]
        pop = self.inflight.pop
        tags = [tag for tag in map(pop, packet_ids, repeat(None)) if tag is not None]
        if tags:
            self.deliveries.ack_run(tags)

    # --- QoS 2 deliveries: PUBREC acks the message to its queue, PUBREL is owed until PUBCOMP ------
    def pubrec(self, packet_id: int) -> bool:
        """The client's PUBREC: the delivery is acked to its queue and its PUBREL owed (recorded first:
        a crash between the two leaves the PUBREL owed, not a message to deliver again). Whether the
        PUBREL waits for the record to be durable. An unknown id gets its PUBREL all the same."""
        if packet_id not in self.qos2_ids:
            return packet_id in self.qos2.pubrel_owed and self.qos2.pubrec(packet_id)
        self.qos2_ids.discard(packet_id)
        waits = self.qos2.pubrec(packet_id)
        tag = self.inflight.pop(packet_id, None)
        if tag is not None:
            if packet_id in self.shared_qos2_ids:
                self.shared_qos2_ids.discard(packet_id)
            else:
                self._queued_qos2 -= 1
            self.deliveries.ack_run([tag])
        return waits

    def pubrec_run(self, packet_ids: list[int]) -> bool:
        """``pubrec`` for the PUBRECs of one read: recorded as one write, their deliveries acked as one run."""
        qos2_ids = self.qos2_ids
        if len(packet_ids) == 1 or not qos2_ids.issuperset(packet_ids) or self.shared_qos2_ids:
            return any([self.pubrec(packet_id) for packet_id in packet_ids])
        qos2_ids.difference_update(packet_ids)
        waits = self.qos2.pubrec_run(packet_ids)
        pop = self.inflight.pop
        tags = [tag for tag in map(pop, packet_ids, repeat(None)) if tag is not None]
        if tags:
            self._queued_qos2 -= len(tags)
            self.deliveries.ack_run(tags)
        return waits

    def pubcomp_run(self, packet_ids: list[int]) -> None:
        """``pubcomp`` for the PUBCOMPs of one read."""
        self.qos2.pubcomp_run(packet_ids)
        if self._ids_exhausted:
            self._ids_exhausted = False
            self.resume()

    def pubcomp(self, packet_id: int) -> None:
        """The client's PUBCOMP: the exchange is over, the id free (an unknown one is ignored)."""
        self.qos2.pubcomp(packet_id)
        if self._ids_exhausted:
            self._ids_exhausted = False
            self.resume()

    def resend_pubrels(self) -> None:
        """A persistent session resumed: the PUBRELs it owes, in the order their PUBRECs came."""
        if self.qos2.pubrel_owed:
            self.host.send(b"".join(codec.qos2_reply(3, packet_id) for packet_id in self.qos2.pubrel_owed))

    def _room_freed(self) -> None:
        self.resume()

    def resume(self) -> None:
        """Room again (PUBACKs, a drained socket): the queues deliver again."""
        for consumer in self.consumers.values():
            queue = consumer.queue
            if queue.message_count:
                self.vhost.schedule_delivery(queue)

    def close(self) -> None:
        """The connection is gone: consumers go, unacknowledged deliveries back to their queues."""
        if self.closed:
            return
        self.closed = True
        self._retained_filters.clear()
        self._retained_topics.clear()
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        self.inflight.clear()
        self.qos2_ids.clear()
        self.shared_qos2_ids.clear()
        self._queued_qos2 = 0
        self.deliveries.close(0)
