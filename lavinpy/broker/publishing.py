"""Publishing in a vhost: routed (see ``routing``), then the message stored once for all its queues."""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from time import time_ns
from typing import TYPE_CHECKING, Any

from ..store.record import StoredMessage
from ..wire.properties import PropertiesError, fast_varied_run_kind, peek_delivery_mode, peek_headers, varied_run_kind
from .exchanges.direct import DirectExchange
from .exchanges.fanout import FanoutExchange
from .exchanges.topic import TopicExchange
from .metrics.stats import MESSAGE_SIZE_BOUNDS
from .queues.publish_run import PublishRun

if TYPE_CHECKING:
    from ..store.reserved_record import ReservedRecord
    from ..store.vhost_store import VhostStore
    from .exchanges.base import Exchange
    from .metrics.stats import NodeCounters
    from .queues.base import QueueKind
    from .routing import Routing

log = logging.getLogger("lavinpy.vhost")

_HEADERS_FLAG_HIGH = (1 << 13) >> 8  # the headers bit within the first property-flags byte
_EXPIRATION_FLAG_HIGH = (1 << 8) >> 8  # the expiration bit within the first property-flags byte
_FIRST_SIZE_BOUND = MESSAGE_SIZE_BOUNDS[0]
# vhost.publish's second value when a reject-publish queue refused the message: confirm with a nack.
REJECTED = object()


# The last headers table ``publish`` decoded, with its property block: a publisher sends the same block
# again and again (an MQTT client's QoS, an AMQP client's fixed headers). Only a table of scalar values
# is kept, and each caller gets its own copy: the same dict as decoding again, for a C-level copy.
_last_headers: tuple[bytes, dict] = (b"", {})


def _peeked_headers(properties: bytes) -> dict | None:
    global _last_headers
    last = _last_headers
    if properties == last[0]:
        return dict(last[1])
    headers = peek_headers(properties)
    if headers and type(properties) is bytes and all(
            isinstance(value, (int, str, bytes, float)) for value in headers.values()):
        _last_headers = (properties, dict(headers))
    return headers


def append_and_push(store: VhostStore, exchange_name: str, routing_key: str, properties: bytes, body: bytes,
                    timestamp: int, queues: Iterable[QueueKind], stored: int = -1) -> tuple[int, bool]:
    """Store a message once and push its position to every queue that is not closed.

    ``stored``: the position of the message's record when it is already written (a large body
    written in place as it arrived, see store.reserved_record). Returns (queues it was pushed to,
    whether a persistent copy reached a durable queue: its publisher confirm then waits for an fsync).
    """
    pos = stored if stored >= 0 else store.messages.append(exchange_name, routing_key, properties, body, timestamp)
    message = StoredMessage(timestamp, exchange_name, routing_key, properties, body)
    persistent = peek_delivery_mode(properties) == 2
    needs_sync = False
    pushed = 0
    for queue in queues:
        queue.push(pos, persistent, message)
        queue.stats.publish += 1
        pushed += 1
        if persistent and queue.durable:
            needs_sync = True
    return pushed, needs_sync


def append_and_push_many(store: VhostStore, run: PublishRun, queues: Sequence[QueueKind],
                         counters: NodeCounters) -> bool:
    """``append_and_push`` for a run: the records are written by one call per segment, and each
    queue takes the positions of that call at once. The queues are open. The messages are counted
    in the size histogram from the sizes each write reports. Returns whether a persistent copy
    reached a durable queue (the confirms then wait for an fsync)."""
    properties = run.properties
    # (a run with per-message properties has one delivery mode: publish_run checked)
    persistent = peek_delivery_mode(properties[0] if isinstance(properties, list) else properties) == 2
    bodies = run.bodies
    append_run = store.messages.append_run
    observe_run = counters.observe_run
    start = 0
    while start < len(bodies):
        done, positions, body_bytes, smallest, largest = append_run(run.exchange, run.routing_key, run.properties,
                                                                    bodies, start, run.timestamp)
        observe_run(bodies, start, done, body_bytes, smallest, largest)
        for queue in queues:
            queue.push_many(positions, persistent, run, start)
            queue.stats.publish += len(positions)
        start = done
    return persistent and any(queue.durable for queue in queues)


def _duplicate(queue: QueueKind, headers: dict, now_ms: int) -> bool:
    """Whether a deduplicating queue has seen this message's identifier (then counted there)."""
    assert queue.dedup is not None
    if queue.dedup.seen(headers, now_ms):
        queue.stats.duplicates += 1
        return True
    return False


def _durable_cache(queues: Iterable[QueueKind]) -> bool:
    """Whether one of these queues keeps its deduplication cache on disk."""
    return any(queue.dedup is not None and queue.dedup.durable for queue in queues)


def _without_duplicates(exchange: Exchange, queue: QueueKind | None, properties: list[bytes],
                        now_ms: int) -> list[int] | None:
    """The indexes of a run's messages that are not duplicates at the exchange or then at ``queue``
    (each identifier read from the raw block and remembered, in order; a duplicate is counted where
    it was found); None when every message is kept."""
    exchange_cache = exchange.dedup
    queue_cache = queue.dedup if queue is not None else None
    if exchange_cache is None or queue_cache is None:  # one cache: the run in one loop there
        if queue_cache is not None:
            kept_new = queue_cache.new_in(properties, now_ms)
            if kept_new is not None:
                queue.stats.duplicates += len(properties) - len(kept_new)  # type: ignore[union-attr]
            return kept_new
        if exchange_cache is not None:
            kept_new = exchange_cache.new_in(properties, now_ms)
            if kept_new is not None:
                exchange.stats.duplicates += len(properties) - len(kept_new)
            return kept_new
        return None
    kept: list[int] = []
    dropped = False
    for i, block in enumerate(properties):
        if exchange_cache is not None and exchange_cache.seen_in(block, now_ms):
            exchange.stats.duplicates += 1
            dropped = True
        elif queue_cache is not None and queue_cache.seen_in(block, now_ms):
            queue.stats.duplicates += 1  # type: ignore[union-attr]  # (a cache is a queue's)
            dropped = True
        else:
            kept.append(i)
    return kept if dropped else None


# Exchanges whose routing depends on the routing key alone: a run is routed once.
_RUN_EXCHANGES = (DirectExchange, FanoutExchange, TopicExchange)


class VHostPublishing:
    """The routing and publishing methods of ``VHost``, over the vhost members declared here."""

    store: VhostStore
    exchanges: dict[str, Exchange]
    queues: dict[str, QueueKind]
    default_exchange: Exchange
    node_counters: NodeCounters
    routing: Routing
    dead_letter: Callable[[QueueKind, StoredMessage, str], int]

    def route(self, exchange: Exchange, routing_key: str, headers: dict | None,
              properties: bytes | None = None) -> set:
        """The queues a message reaches from ``exchange`` (see ``routing``)."""
        return self.routing.route(exchange, routing_key, headers, properties)

    def publish(self, exchange: Exchange, routing_key: str, properties: bytes,
                body: bytes, stored: int = -1) -> tuple[int, Any]:
        """Route and store a message once; returns (queues reached, needs an fsync for its confirm).

        ``stored``: the position of its record when the body was written in place as it arrived
        (``reserve``), with these exchange, routing key and properties; else it is written here. The
        second value is ``REJECTED`` when a reject-publish queue refused the message (the
        publisher's confirm is then a basic.nack).
        """
        # Every message received counts in the size histogram, routable or not (as RabbitMQ's).
        # Inlined: a method call would cost more than the two additions.
        # Most messages are small: the first bucket without a search.
        counters = self.node_counters
        size = len(body)
        counters.size_buckets[0 if size <= _FIRST_SIZE_BOUND else bisect_left(MESSAGE_SIZE_BOUNDS, size)] += 1
        counters.size_sum += size
        if exchange is self.default_exchange and not properties[0] & _HEADERS_FLAG_HIGH:
            # Hot path: the default exchange without headers (no CC/BCC) reaches at most one queue.
            queue = self.queues.get(routing_key)
            if queue is None:
                return 0, False
            if queue.may_refuse or properties[0] & _EXPIRATION_FLAG_HIGH:
                return self._publish_to(exchange.name, routing_key, properties, body, (queue,), stored=stored)
            queues: Iterable[QueueKind] = (queue,)
        else:
            headers = _peeked_headers(properties) if properties[0] & _HEADERS_FLAG_HIGH else None
            if exchange.dedup is not None and exchange.dedup.seen(headers, time_ns() // 1_000_000):
                exchange.stats.duplicates += 1
                # a duplicate: routed nowhere, and confirmed as accepted once its original is durable
                return 1, exchange.dedup.durable
            if exchange.holds_messages and exchange.hold(routing_key, properties, body, headers):
                return 1, exchange.durable  # held until due; counted as routed
            routed_properties = properties
            queues, properties = self.routing.route_message(exchange, routing_key, properties, headers)
            if not queues:
                return 0, False
            if properties is not routed_properties:
                stored = -1  # the BCC header left the properties: the record written as it came is not it
            if properties[0] & _EXPIRATION_FLAG_HIGH:
                return self._publish_to(exchange.name, routing_key, properties, body, queues, stored=stored)
            deduplicating = False
            for queue in queues:
                if queue.may_refuse:
                    return self._publish_to(exchange.name, routing_key, properties, body, queues, headers,
                                            stored)
                if queue.dedup is not None:  # (a message without headers has none to ask: the branch above)
                    deduplicating = True
            if deduplicating and headers:
                now = time_ns() // 1_000_000
                kept = [queue for queue in queues if queue.dedup is None or not _duplicate(queue, headers, now)]
                if not kept:  # a duplicate everywhere: confirmed once its original is durable
                    return len(queues), _durable_cache(queues)  # type: ignore[arg-type]  # (routed: a set)
                queues = kept
        reached, needs_sync = append_and_push(self.store, exchange.name, routing_key, properties, body,
                                              time_ns() // 1_000_000, queues, stored)
        if not reached:
            # Every target is closed: nothing holds the record (the next roll-over reclaims it), so
            # the publisher must not get an ack. Routed all the same: no basic.return.
            return len(queues), REJECTED  # type: ignore[arg-type]
        return reached, needs_sync

    def publish_run(self, exchange: Exchange, routing_key: str, properties: bytes | list[bytes],
                    bodies: list[bytes]) -> tuple[int, bool] | None:
        """``publish`` for a run of messages with the same exchange and routing key, routed once:
        (queues reached by each, needs an fsync for the confirms). ``properties``: the block all
        share, or a list with each message's own (see ``_varied_run``).

        Only the common case takes this path: no CC/BCC headers and no expiration, the default, a
        direct, fanout or topic exchange, routable, and every target an open queue that may refuse none.
        Otherwise it returns None having done nothing, and the caller publishes the messages one by one.
        """
        if isinstance(properties, list):
            return self._varied_run(exchange, routing_key, properties, bodies)
        if properties[0] & _EXPIRATION_FLAG_HIGH:
            return None
        headers = None
        if properties[0] & _HEADERS_FLAG_HIGH:  # read once for the run (exchange-to-exchange bindings)
            headers = peek_headers(properties)
            if headers and ("CC" in headers or "BCC" in headers):
                return None
        if headers and exchange.dedup is not None and exchange.dedup.header in headers:
            return None  # (the same identifier on every message: one by one)
        queues = self._run_targets(exchange, routing_key, headers, False)
        if queues is None:
            return None
        if headers:
            for queue in queues:
                if queue.dedup is not None and queue.dedup.header in headers:
                    return None
        run = PublishRun(exchange.name, routing_key, properties, bodies, time_ns() // 1_000_000)
        # Counted in the write only: a None above means one by one, counted by publish().
        return len(queues), append_and_push_many(self.store, run, queues, self.node_counters)

    def _run_targets(self, exchange: Exchange, routing_key: str, headers: dict | None,
                     own_bindings_only: bool) -> Sequence[QueueKind] | None:
        """The queues a run reaches, when it can be taken whole: the default exchange's queue, or
        what a direct, fanout or topic exchange routes the key to (``own_bindings_only``: only an
        exchange that routes by its own bindings, for messages whose headers differ), every one
        open and none that may refuse one. None (unroutable included: returns are one by one) otherwise."""
        if exchange is self.default_exchange:
            queue = self.queues.get(routing_key)
            if queue is None:
                return None
            queues: Sequence[QueueKind] = (queue,)
        elif type(exchange) in _RUN_EXCHANGES and (not own_bindings_only or exchange.routes_by_own_bindings()):
            queues = tuple(self.routing.route(exchange, routing_key, headers))
            if not queues:
                return None
        else:
            return None
        for queue in queues:
            if queue.may_refuse:
                return None
        return queues

    def _varied_run(self, exchange: Exchange, routing_key: str, properties: list[bytes],
                    bodies: list[bytes]) -> tuple[int, bool] | None:
        """``publish_run`` for messages whose properties differ (ids, timestamps, headers): taken
        whole only where no property routes or is checked per message. Each block is looked at
        once: no expiration, no CC/BCC (a byte test: a false alarm only means one by one), one
        delivery mode; the exchange routes by its own bindings (no exchange-to-exchange binding or
        alternate that might read a property). Deduplication (the exchange's, or its one target
        queue's) asks each message's identifier here and leaves the duplicates out of the run."""
        kind = fast_varied_run_kind(properties)
        if kind == -2:  # (the compiled check leaves an unusual block to the pure-Python one)
            kind = varied_run_kind(properties)
        if kind < 0:
            return None
        with_headers = kind == 1
        queues = self._run_targets(exchange, routing_key, None, True)
        if queues is None:
            return None
        deduplicating = with_headers and exchange.dedup is not None
        if with_headers:
            for queue in queues:
                if queue.dedup is not None:
                    if len(queues) > 1:  # the queues would keep different messages: one by one
                        return None
                    deduplicating = True
        timestamp = time_ns() // 1_000_000
        duplicates_wait = False
        if deduplicating:
            kept = _without_duplicates(exchange, queues[0] if len(queues) == 1 else None, properties, timestamp)
            if kept is not None:
                # the duplicates are stored nowhere; confirmed once their originals are durable
                duplicates_wait = exchange.dedup is not None and exchange.dedup.durable or _durable_cache(queues)
                if not kept:
                    return len(queues), duplicates_wait
                properties = [properties[i] for i in kept]
                bodies = [bodies[i] for i in kept]
        run = PublishRun(exchange.name, routing_key, properties, bodies, timestamp)
        return len(queues), append_and_push_many(self.store, run, queues, self.node_counters) or duplicates_wait

    def _publish_to(self, exchange_name: str, routing_key: str, properties: bytes, body: bytes,
                    queues: Iterable[QueueKind], headers: Any = False, stored: int = -1) -> tuple[int, Any]:
        """publish() for targets that use queue features: limits may refuse, TTLs must be tracked."""
        timestamp = time_ns() // 1_000_000
        expiring = bool(properties[0] & _EXPIRATION_FLAG_HIGH)
        rejected = False
        duplicate = False
        reached = 0
        targets = []
        # ``headers`` False: not read yet (read once, when a queue deduplicates)
        for queue in queues:
            reached += 1
            if expiring:
                queue.enable_message_ttl()
            if queue.may_refuse and queue.refuses(len(body)):
                rejected = True
                if queue.settings.overflow == "reject-publish-dlx":
                    message = StoredMessage(timestamp, exchange_name, routing_key, properties, body)
                    self.dead_letter(queue, message, "maxlen")
                continue
            if queue.dedup is not None:
                if headers is False:
                    headers = peek_headers(properties) if properties[0] & _HEADERS_FLAG_HIGH else None
                if headers and _duplicate(queue, headers, timestamp):
                    # not stored here; its publisher is confirmed all the same, once the original is durable
                    duplicate = duplicate or queue.dedup.durable
                    continue
            targets.append(queue)
        needs_sync = duplicate
        if targets:
            needs_sync = append_and_push(self.store, exchange_name, routing_key, properties, body, timestamp,
                                         targets, stored)[1] or needs_sync
        return reached, REJECTED if rejected else needs_sync

    def reserve(self, exchange: Exchange, routing_key: str, properties: bytes, body_size: int) -> ReservedRecord:
        """A record for a large body written in place as its pieces arrive; published with
        ``publish(..., stored=record.seal())``, released by its publisher after that (or abandoned)."""
        return self.store.messages.reserve(exchange.name, routing_key, properties, body_size)

    def _route_due(self, exchange: Exchange, msg: StoredMessage) -> None:
        """A held message is due: route it now, as a new record (its wait does not count as age)."""
        if exchange.name not in self.exchanges:
            return
        try:
            headers = peek_headers(msg.properties)
        except PropertiesError as e:
            log.warning("delayed exchange %r: dropping a message with malformed headers: %s", exchange.name, e)
            return
        queues, properties = self.routing.route_message(exchange, msg.routing_key, msg.properties, headers)
        if queues:
            self._publish_to(exchange.name, msg.routing_key, properties, msg.body, queues)
