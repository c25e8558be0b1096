"""Node-level metric families of ``/metrics`` beyond the message counters: churn, publishers and
consumers, empty gets, confirm-mode publishes, message sizes, fsync time, event-loop lag and the
process (CPU, memory, descriptors, start time).

Names, types and labels are RabbitMQ's where it has the family (rabbitmq_prometheus's core, global
and message-size collectors); lavinpy's own (fsync histogram, event-loop lag) follow the same scheme.
Everything is read at scrape time from counters the model keeps (broker/metrics/stats.py ``NodeCounters``,
broker/ops/store_figures.py), so a scrape costs one pass over the open channels and nothing is kept here
except the event-loop probe's last readings.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..broker.ops import AMQP_091, FIELDS, MESSAGE_SIZE_BOUNDS, read_counts
from ..broker.ops.store_figures import FSYNC_BOUNDS, fsync_times

if TYPE_CHECKING:
    from ..amqp.sessions import Sessions
    from ..broker.ops import Broker, ConnectionCounts, NodeCounters

# RabbitMQ labels its global families by protocol. The message counters are the node's, of every
# face, and go under AMQP 0-9-1's label; publishers and consumers are split by protocol.
PROTOCOL = AMQP_091.label

# (family after the prefix, NodeCounters attribute, HELP): RabbitMQ's connection_churn_metrics.
_CHURN = (
    ("connections_opened_total", "connections_opened", "Total number of connections opened"),
    ("connections_closed_total", "connections_closed", "Total number of connections closed or terminated"),
    ("channels_opened_total", "channels_opened", "Total number of channels opened"),
    ("channels_closed_total", "channels_closed", "Total number of channels closed"),
    ("queues_declared_total", "queues_declared", "Total number of queues declared"),
    ("queues_created_total", "queues_created", "Total number of queues created"),
    ("queues_deleted_total", "queues_deleted", "Total number of queues deleted"),
)


def churn_families(p: str, counters: NodeCounters) -> Iterator[Metric]:
    """Connections, channels and queues opened/declared/created and closed/deleted."""
    for name, attribute, doc in _CHURN:
        yield CounterMetricFamily(f"{p}_{name}", doc, value=getattr(counters, attribute))


def login_family(p: str, counts: dict[tuple[str, str], int]) -> Metric:
    """Logins of every face by the auth backend that decided ("none": no backend knew the user) and
    their outcome (ok, refused)."""
    family = CounterMetricFamily(f"{p}_auth_logins", "Logins by auth backend and outcome",
                                 labels=["backend", "outcome"])
    for (backend, outcome), value in sorted(counts.items()):
        family.add_metric([backend, outcome], value)
    return family


def received_confirm(sessions: Sessions, counters: NodeCounters) -> int:
    """Messages received on AMQP confirm-mode channels so far: each open channel's sequence plus what
    closed channels left to the node."""
    received = counters.received_confirm_closed
    for conn in list(sessions.connections):
        for channel in list(conn.channels.values()):
            received += channel.publish_seq
    return received


# RabbitMQ's queue_type label values for lavinpy's queue kinds.
QUEUE_TYPES = {"classic": "rabbit_classic_queue", "quorum": "rabbit_quorum_queue", "stream": "rabbit_stream_queue"}


def counts_by_kind(broker: Broker) -> dict[str, dict[str, int]]:
    """The queue counters (deliver, ack, ...) of every queue kind but classic: live queues' plus
    deleted ones'. Classic's are the node total minus these (the total also holds what no queue
    kind owns)."""
    sums: dict[str, list[int]] = {}
    for vhost in list(broker.vhosts.values()):
        for kind, counters in list(vhost.deleted_stats_by_kind.items()):
            row = read_counts(counters)
            sums[kind] = [a + b for a, b in zip(sums.get(kind, [0] * len(row)), row, strict=True)]
        for queue in list(vhost.queues.values()):
            if queue.kind != "classic":
                row = read_counts(queue.stats)
                sums[queue.kind] = [a + b for a, b in zip(sums.get(queue.kind, [0] * len(row)), row, strict=True)]
    return {kind: dict(zip(FIELDS, row, strict=True)) for kind, row in sums.items()}


def global_families(p: str, sessions: Sessions, counters: NodeCounters,
                    by_protocol: dict[str, ConnectionCounts]) -> Iterator[Metric]:
    """RabbitMQ's per-protocol global families that the message counters do not give.

    Publishers and consumers come from every face by protocol (``by_protocol``, the model's connection
    registry: each face says what counts as a publisher, as RabbitMQ counts them for its protocol)."""
    labels = ["protocol"]
    protocols = sorted({PROTOCOL, *by_protocol})
    for name, doc in (("publishers", "Current number of publishers"), ("consumers", "Current number of consumers")):
        gauge = GaugeMetricFamily(f"{p}_global_{name}", doc, labels=labels)
        for protocol in protocols:
            counts = by_protocol.get(protocol)
            gauge.add_metric([protocol], getattr(counts, name) if counts is not None else 0)
        yield gauge
    counter = CounterMetricFamily(f"{p}_global_messages_received_confirm_total",
                                  "Total number of messages received from publishers expecting confirmations",
                                  labels=labels)
    for protocol, protocol_counters in sorted(counters.by_protocol.items()):
        value = protocol_counters.received_confirm
        if protocol == PROTOCOL:  # AMQP channels number their confirm-mode publishes themselves
            value += received_confirm(sessions, counters)
        counter.add_metric([protocol], value)
    yield counter
    # Per queue type, as RabbitMQ's; only classic queues answer basic.get (a stream refuses it).
    empty = CounterMetricFamily(f"{p}_global_messages_get_empty_total",
                                "Total number of times basic.get operations fetched no message",
                                labels=["protocol", "queue_type"])
    for kind, queue_type in QUEUE_TYPES.items():
        empty.add_metric([PROTOCOL, queue_type], counters.get_empty if kind == "classic" else 0)
    yield empty
    # The aggregated channel family RabbitMQ gives beside the global one (no labels, as its siblings).
    yield CounterMetricFamily(f"{p}_channel_get_empty_total",
                              "Total number of times basic.get operations fetched no message", value=counters.get_empty)


def _histogram(name: str, doc: str, bounds: tuple[float, ...], buckets: list[int], total: float,
               labels: list[str] | None = None, label_values: list[str] | None = None) -> HistogramMetricFamily:
    """A histogram family from per-bucket counts (the last bucket is +Inf); ``le`` is written as the
    Go client writes it (``100.0``, ``1e+06``), which dashboards match as strings."""
    cumulative: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*bounds, float("inf")), buckets, strict=True):
        running += count
        cumulative.append((floatToGoString(bound), running))
    family = HistogramMetricFamily(name, doc, labels=labels)
    family.add_metric(label_values or [], cumulative, total)
    return family


def message_size_family(p: str, counters: NodeCounters) -> Metric:
    return _histogram(f"{p}_message_size_bytes", "Size of messages received from publishers",
                      tuple(float(b) for b in MESSAGE_SIZE_BOUNDS), list(counters.size_buckets),
                      counters.size_sum, ["protocol"], [PROTOCOL])


def fsync_families(p: str) -> Iterator[Metric]:
    """The store's flush time: lavinpy's histogram, and RabbitMQ's io_sync counters from the same data."""
    buckets, total = fsync_times()
    yield _histogram(f"{p}_store_fsync_duration_seconds",
                     "Time a store flush spent in fdatasync/fsync of message segments and queue indexes",
                     FSYNC_BOUNDS, buckets, total)
    yield CounterMetricFamily(f"{p}_io_sync_ops_total", "Total number of I/O sync operations", value=sum(buckets))
    yield CounterMetricFamily(f"{p}_io_sync_time_seconds_total", "Total I/O sync time", value=total)


class EventLoopLag:
    """Measures how late the event loop wakes a sleeper: the time clients wait behind other work.

    A probe sleeps ``interval`` and records how much longer than that it took. The family reports
    the worst of the last few probes (a rolling window: several scrapers do not reset each other).
    """

    def __init__(self, interval: float = 0.5, window: int = 6) -> None:
        self.interval = interval
        self.recent: deque[float] = deque([0.0], maxlen=window)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.interval)
            self.recent.append(max(0.0, loop.time() - before - self.interval))

    def family(self, p: str) -> Metric:
        return GaugeMetricFamily(f"{p}_event_loop_lag_seconds",
                                 "Worst delay of the event loop in waking a timer over the last few seconds",
                                 value=round(max(self.recent), 6))

    async def context(self, _app: object) -> AsyncIterator[None]:
        """An aiohttp cleanup context: the probe runs while the metrics server does."""
        task = asyncio.get_running_loop().create_task(self.run())
        yield
        task.cancel()


# prometheus_client's reader of /proc/self: CPU seconds, resident and virtual memory, open and
# maximum descriptors, start time, under the standard unprefixed ``process_*`` names every process
# dashboard uses (RabbitMQ also gives ``process_start_time_seconds`` unprefixed).
_PROCESS = ProcessCollector(registry=None)


def process_families() -> Iterator[Metric]:
    yield from _PROCESS.collect()

