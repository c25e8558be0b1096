"""Message statistics: plain integer counters bumped on the hot paths, sampled for rates.

Each queue, exchange and vhost holds one ``MessageCounters``; the publish/deliver/ack paths add 1 to
an attribute where the event already happens (no locks, no per-message objects). Vhost and overall
totals of the queue-side counters are summed at read time; a deleted queue's counts are folded into
its vhost first, so totals never go back. A ``StatsSampler`` snapshots every object every 5 s and
keeps the rate since the previous sample, which the HTTP API and the metrics report as RabbitMQ's
``message_stats`` with ``*_details: {"rate": ...}``. One set of counters feeds every reader. The
sampler also keeps a bounded history of each queue, vhost and the node (see ``history``), so the API
can answer RabbitMQ's ``lengths_age``/``msg_rates_age`` samples without the browser having watched.
"""

from __future__ import annotations

import asyncio
import operator
import time
import typing
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Any, NamedTuple

from .history import Entry, Ring, append, new_ring, summed

SAMPLE_INTERVAL = 5.0


class Counted(typing.Protocol):
    """An object with its own counters (a queue or an exchange)."""

    @property
    def stats(self) -> MessageCounters: ...


class CountedQueue(Counted, typing.Protocol):
    @property
    def message_count(self) -> int: ...

    @property
    def unacked_count(self) -> int: ...


class CountedVHost(Counted, typing.Protocol):
    """The members of a vhost its totals are summed from (``vhost.VHost`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def queues(self) -> Mapping[str, CountedQueue]: ...

    @property
    def exchanges(self) -> Mapping[str, Counted]: ...


class CountedNode(typing.Protocol):
    """The broker as the sampler reads it: its vhosts."""

    @property
    def vhosts(self) -> Mapping[str, CountedVHost]: ...

# Counted by each queue (messages into it, out of it, settled).
QUEUE_FIELDS = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "ack", "redeliver", "reject")
# Counted by the vhost itself: what publishing channels did.
VHOST_FIELDS = ("publish", "confirm", "return_unroutable", "drop_unroutable")
# Counted by each exchange.
EXCHANGE_FIELDS = ("publish_in", "publish_out")
FIELDS = ("publish", "publish_in", "publish_out", "confirm", "deliver", "deliver_no_ack", "get", "get_no_ack",
          "ack", "redeliver", "reject", "return_unroutable", "drop_unroutable")
# Dead-lettering reasons, as in RabbitMQ's x-death (plus ``corrupt`` for damaged records).
DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit", "corrupt")


class MessageCounters:
    """One object's counters. Attributes only: the hot paths do ``obj.stats.deliver += 1``."""

    __slots__ = FIELDS + ("dead_lettered", "retried", "duplicates", "_previous", "_sampled_at", "rates", "history")
    # The counters (set from FIELDS in __init__), named here for the type checker.
    publish: int
    publish_in: int
    publish_out: int
    confirm: int
    deliver: int
    deliver_no_ack: int
    get: int
    get_no_ack: int
    ack: int
    redeliver: int
    reject: int
    return_unroutable: int
    drop_unroutable: int

    def __init__(self) -> None:
        for name in FIELDS:
            setattr(self, name, 0)
        self.dead_lettered: dict[str, int] = {}
        self.retried = 0  # returns held for a delayed retry (x-delayed-retry-*)
        self.duplicates = 0  # messages dropped as duplicates (x-message-deduplication)
        self._previous: tuple[int, ...] = (0,) * len(FIELDS)
        self._sampled_at = 0.0
        self.rates: dict[str, float] = {}
        self.history: Ring | None = None  # a queue's samples, made on its first tick

    def values(self) -> dict[str, int]:
        return dict(zip(FIELDS, read_counts(self), strict=True))

    def add_dead_lettered(self, reason: str) -> None:
        self.dead_lettered[reason] = self.dead_lettered.get(reason, 0) + 1

    def fold_into(self, other: MessageCounters, fields: Iterable[str] = QUEUE_FIELDS) -> None:
        """Add this object's counts to ``other`` (a deleted queue's counts stay in its vhost)."""
        for name in fields:
            if name != "publish":
                setattr(other, name, getattr(other, name) + getattr(self, name))
        for reason, count in self.dead_lettered.items():
            other.dead_lettered[reason] = other.dead_lettered.get(reason, 0) + count
        other.retried += self.retried
        other.duplicates += self.duplicates

    def sample(self, now: float) -> None:
        current = read_counts(self)
        if current == self._previous:  # idle since the last sample (most objects): rates are 0
            self._sampled_at = now
            self.rates = NO_RATES
            return
        self.rates = sample_rates(self, current, now)


# Every counter of an object as one tuple, in FIELDS order (one C call: sampling 10,000 queues is cheap).
read_counts = operator.attrgetter(*FIELDS)
NO_RATES: dict[str, float] = {}


def sample_rates(holder: Any, current: tuple[int, ...], now: float) -> dict[str, float]:
    """Rates per second since ``holder``'s previous sample; stores this sample on the holder."""
    previous, sampled_at = holder._previous, holder._sampled_at
    holder._previous, holder._sampled_at = current, now
    if not sampled_at or now <= sampled_at:
        return {}
    elapsed = now - sampled_at
    return {name: round((cur - prev) / elapsed, 1) for name, cur, prev in zip(FIELDS, current, previous, strict=True)}


# Upper bounds (bytes) of the message-size histogram's buckets, as RabbitMQ's; the last is +Inf.
MESSAGE_SIZE_BOUNDS = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 50_000_000, 100_000_000)


class ProtocolId(NamedTuple):
    """A protocol the model counts traffic by: each face names its own and hands the model the
    ``ProtocolCounters`` the node keeps for it."""

    label: str  # the ``protocol`` label of RabbitMQ's metrics ("amqp091", "mqtt311")
    name: str  # as the management API's connection rows name it ("AMQP 0-9-1")


# RabbitMQ's management plugin publishes and gets over an internal AMQP 0-9-1 connection, so the
# HTTP API's message operations count as this protocol's too.
AMQP_091 = ProtocolId("amqp091", "AMQP 0-9-1")


# What a protocol's traffic is counted by: FIELDS but an exchange's publish_in (a protocol's publishes
# are its ``publish``), and the publishes received expecting a confirm.
PROTOCOL_FIELDS = tuple(name for name in FIELDS if name != "publish_in") + ("received_confirm",)


class ProtocolCounters:
    """The message counters (FIELDS) of one protocol's traffic, node-wide, plus the publishes received
    expecting a confirm. A face asks the node for them once per session and passes them to the model's
    operations (publish, deliver, get, ack, confirm), which count them where they count the queue and
    vhost counters, a run at a time; a face never writes one."""

    __slots__ = PROTOCOL_FIELDS + ("protocol",)
    publish: int
    publish_out: int
    confirm: int
    deliver: int
    deliver_no_ack: int
    get: int
    get_no_ack: int
    ack: int
    redeliver: int
    reject: int
    return_unroutable: int
    drop_unroutable: int
    received_confirm: int

    def __init__(self, protocol: ProtocolId) -> None:
        for name in PROTOCOL_FIELDS:
            setattr(self, name, 0)
        self.protocol = protocol

    def count(self, name: str) -> int:
        """One counter by name (a PROTOCOL_FIELDS name)."""
        return int(getattr(self, name))


class NodeCounters:
    """Node-wide counters of events that belong to no queue or exchange: churn (RabbitMQ's
    ``connection_churn_metrics``), empty basic.gets, confirm-mode publishes of closed channels and
    the sizes of messages received. Plain attributes bumped where the event happens; one object per
    broker, so counts never go back when a vhost or queue goes away.
    """

    __slots__ = ("connections_opened", "connections_closed", "channels_opened", "channels_closed",
                 "queues_declared", "queues_created", "queues_deleted", "get_empty", "received_confirm_closed",
                 "size_buckets", "size_sum", "by_protocol")

    def __init__(self) -> None:
        self.connections_opened = self.connections_closed = 0
        self.channels_opened = self.channels_closed = 0
        self.queues_declared = self.queues_created = self.queues_deleted = 0
        self.get_empty = 0
        # Confirm-mode publishes of channels already closed; open channels' are read at scrape time
        # from their own sequence numbers, so the publish path counts nothing more for this.
        self.received_confirm_closed = 0
        self.size_buckets = [0] * (len(MESSAGE_SIZE_BOUNDS) + 1)  # per bucket, not cumulative
        self.size_sum = 0
        # The message counts of every protocol, by the label RabbitMQ's metrics give it; the model's
        # operations count into them (ProtocolCounters), each face's sessions hand them over.
        self.by_protocol: dict[str, ProtocolCounters] = {}
        self.of(AMQP_091)  # the HTTP API's message operations count as it from the start

    def of(self, protocol: ProtocolId) -> ProtocolCounters:
        """The counters of ``protocol``'s traffic (created on first use: a face asks when it starts,
        so its figures are in the metrics from then on, zero or not)."""
        counters = self.by_protocol.get(protocol.label)
        if counters is None:
            counters = self.by_protocol[protocol.label] = ProtocolCounters(protocol)
        return counters

    def connection_opened(self) -> None:
        self.connections_opened += 1

    def connection_closed(self) -> None:
        self.connections_closed += 1

    def observe_size(self, size: int) -> None:
        """One message received from a publisher (RabbitMQ's message_size_bytes histogram)."""
        self.size_buckets[bisect_left(MESSAGE_SIZE_BOUNDS, size)] += 1
        self.size_sum += size

    def observe_run(self, bodies: Sequence[Sized], start: int, end: int, total: int, smallest: int,
                    largest: int) -> None:
        """``observe_size`` for ``bodies[start:end]``, given their total, smallest and largest size
        (the store's run write reports them). When the smallest and the largest share a bucket (the
        common case: a publisher sends messages of one size) that is one addition for the whole
        run, and no body is looked at; only a run whose sizes straddle a bound is counted body by
        body. The largest is looked at first: in the first bucket, so is every other."""
        high = bisect_left(MESSAGE_SIZE_BOUNDS, largest)
        if not high or high == bisect_left(MESSAGE_SIZE_BOUNDS, smallest):
            self.size_buckets[high] += end - start
        else:
            buckets = self.size_buckets
            for i in range(start, end):
                buckets[bisect_left(MESSAGE_SIZE_BOUNDS, len(bodies[i]))] += 1
        self.size_sum += total


class Totals:
    """Summed counters of a vhost or the whole node, with the rates of the last sample."""

    __slots__ = ("counts", "dead_lettered", "retried", "duplicates", "_previous", "_sampled_at", "rates")

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(FIELDS, 0)
        self.dead_lettered: dict[str, int] = {}
        self.retried = 0  # returns held for a delayed retry (x-delayed-retry-*)
        self.duplicates = 0  # messages dropped as duplicates
        self._previous: tuple[int, ...] = (0,) * len(FIELDS)
        self._sampled_at = 0.0
        self.rates: dict[str, float] = {}

    def add(self, counters: MessageCounters | Totals, fields: Iterable[str]) -> None:
        counts = self.counts
        source = counters.counts if isinstance(counters, Totals) else None
        for name in fields:
            counts[name] += source[name] if source is not None else getattr(counters, name)
        for reason, count in counters.dead_lettered.items():
            self.dead_lettered[reason] = self.dead_lettered.get(reason, 0) + count
        self.retried += counters.retried
        self.duplicates += counters.duplicates


_PUBLISH = FIELDS.index("publish")


def vhost_totals(vhost: CountedVHost) -> Totals:
    """A vhost's counters: its own (publishing channels, deleted queues) plus its queues' and exchanges'.

    Each kind of object counts only its own fields (queues never count publish_in, exchanges never
    deliver), so whole tuples are summed; a queue's ``publish`` (messages into it) is not the vhost's
    (messages from publishers) and is taken out again.
    """
    totals = Totals()
    queues = list(vhost.queues.values())
    queue_rows = [read_counts(q.stats) for q in queues]
    rows = [read_counts(vhost.stats), *queue_rows, *(read_counts(x.stats) for x in list(vhost.exchanges.values()))]
    sums = [sum(column) for column in zip(*rows, strict=True)]
    sums[_PUBLISH] -= sum(row[_PUBLISH] for row in queue_rows)
    totals.counts = dict(zip(FIELDS, sums, strict=True))
    totals.dead_lettered = dict(vhost.stats.dead_lettered)
    totals.retried = vhost.stats.retried + sum(queue.stats.retried for queue in queues)
    exchanges = list(vhost.exchanges.values())
    totals.duplicates = (vhost.stats.duplicates + sum(queue.stats.duplicates for queue in queues)
                         + sum(exchange.stats.duplicates for exchange in exchanges))
    for queue in queues:
        if queue.stats.dead_lettered:
            for reason, count in queue.stats.dead_lettered.items():
                totals.dead_lettered[reason] = totals.dead_lettered.get(reason, 0) + count
    return totals


def node_totals(broker: CountedNode) -> Totals:
    totals = Totals()
    for vhost in list(broker.vhosts.values()):
        totals.add(vhost_totals(vhost), FIELDS)
    return totals


def message_stats(counts: dict[str, int], rates: dict[str, float],
                  fields: Iterable[str] = FIELDS) -> dict[str, Any]:
    """RabbitMQ's ``message_stats`` object: each count and its ``<name>_details: {"rate": r}``."""
    stats: dict[str, Any] = {}
    for name in fields:
        stats[name] = counts[name]
        stats[name + "_details"] = {"rate": rates.get(name, 0.0)}
    deliver_get = counts["deliver"] + counts["deliver_no_ack"] + counts["get"] + counts["get_no_ack"]
    if "deliver" in fields:
        stats["deliver_get"] = deliver_get
        stats["deliver_get_details"] = {"rate": round(sum(rates.get(n, 0.0) for n in (
            "deliver", "deliver_no_ack", "get", "get_no_ack")), 1)}
    return stats


def counters_stats(counters: MessageCounters, fields: Iterable[str]) -> dict[str, Any]:
    """An object's ``message_stats``; empty for an object without traffic, as RabbitMQ shows it."""
    counts = read_counts(counters)
    if not any(counts) and not counters.rates:
        return {}
    return message_stats(dict(zip(FIELDS, counts, strict=True)), counters.rates, fields)


class StatsSampler:
    """Samples every queue, exchange, vhost and the node every ``interval`` seconds."""

    def __init__(self, broker: CountedNode, interval: float = SAMPLE_INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        self.vhosts: dict[str, Totals] = {}
        self.node = Totals()
        self._task: asyncio.Task | None = None
        # Wall-clock milliseconds of the kept ticks; the rings below and each queue's line up with it.
        self.times: Ring = new_ring()
        self.vhost_history: dict[str, Ring] = {}
        self.node_history: Ring = new_ring()

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sample()

    def sample(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        node = Totals()
        node._previous, node._sampled_at = self.node._previous, self.node._sampled_at
        vhosts: dict[str, Totals] = {}
        histories: dict[str, Ring] = {}
        node_ready = node_unacked = 0
        for name, vhost in list(self.broker.vhosts.items()):
            ready = unacked = 0
            for queue in vhost.queues.values():
                stats = queue.stats
                stats.sample(now)
                lengths = (queue.message_count, queue.unacked_count)
                ready += lengths[0]
                unacked += lengths[1]
                if stats.history is None:
                    stats.history = new_ring(self.times.maxlen or 1)
                append(stats.history, stats._previous, lengths)
            for exchange in vhost.exchanges.values():
                exchange.stats.sample(now)
            totals = vhost_totals(vhost)
            old = self.vhosts.get(name)
            if old is not None:
                totals._previous, totals._sampled_at = old._previous, old._sampled_at
            totals.rates = sample_rates(totals, tuple(totals.counts[f] for f in FIELDS), now)
            vhosts[name] = totals
            node.add(totals, FIELDS)
            ring = histories[name] = self.vhost_history.get(name) or new_ring(self.times.maxlen or 1)
            append(ring, totals._previous, (ready, unacked))
            node_ready += ready
            node_unacked += unacked
        node.rates = sample_rates(node, tuple(node.counts[f] for f in FIELDS), now)
        append(self.node_history, node._previous, (node_ready, node_unacked))
        self.times.append(int(time.time() * 1000))
        self.vhosts = vhosts
        self.vhost_history = histories  # a deleted vhost's history goes with it
        self.node = node

    def history_of(self, vhosts: Sequence[CountedVHost] | None = None) -> list[Entry] | Ring:
        """The node's samples, or the sum of some vhosts' (a user who sees only those)."""
        if vhosts is None or len(vhosts) == len(self.broker.vhosts):
            return self.node_history
        return summed([self.vhost_history[v.name] for v in vhosts if v.name in self.vhost_history])

    def vhost_stats(self, vhost: CountedVHost) -> dict[str, Any]:
        """The vhost's current counts with the rates of the last sample."""
        sampled = self.vhosts.get(vhost.name)
        return message_stats(vhost_totals(vhost).counts, sampled.rates if sampled else {})

    def node_stats(self) -> dict[str, Any]:
        return message_stats(node_totals(self.broker).counts, self.node.rates)

