"""Prometheus metrics on ``prometheus_port``: ``/metrics`` (node totals) and ``/metrics/detailed``.

A custom prometheus_client collector reads the broker's message counters (broker/metrics/stats.py) and its
objects at scrape time: nothing is kept between scrapes. Family names are those of RabbitMQ's
rabbitmq_prometheus plugin where one exists, with the prefix ``lavinpy`` by default; ``?prefix=
rabbitmq`` gives RabbitMQ's exact names, so its Grafana dashboards work unchanged. Families without a
RabbitMQ counterpart (message ages, exchange counters, fsync time, event-loop lag) keep the same
naming scheme; the process's own families (CPU, memory, descriptors, start time) are the standard
unprefixed ``process_*``. Node-level families other than the message counters are in metrics_node.py.

``/metrics/detailed?family=F&family=G&vhost=V`` gives per-object families (``<prefix>_detailed_*``
with ``vhost``/``queue``/``exchange`` labels); without ``family`` every detailed family is given. An
unknown family is ignored, as RabbitMQ does, so one scrape config serves brokers of several versions.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .. import __version__
from ..amqp import session_views
from ..broker.ops import DEAD_LETTER_REASONS, all_protocols, node_info, node_totals
from ..shovel.registry import LinkRegistry
from . import metrics_node
from .metrics_node import EventLoopLag

if TYPE_CHECKING:
    from ..amqp.sessions import Sessions
    from ..broker.ops import Broker, QueueKind, VHost

DEFAULT_PREFIX = "lavinpy"
_PREFIX = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
DETAILED_FAMILIES = ("queue_coarse_metrics", "queue_consumer_count", "queue_metrics", "queue_delivery_metrics",
                     "queue_publish_metrics", "exchange_metrics", "vhost_status")

# (counter name after the prefix, node-total field(s), HELP) for the aggregated counters.
_CHANNEL_COUNTERS = (
    ("channel_messages_published_total", ("publish",),
     "Total number of messages published into an exchange on a channel"),
    ("channel_messages_confirmed_total", ("confirm",),
     "Total number of messages published into an exchange and confirmed on the channel"),
    ("channel_messages_unroutable_returned_total", ("return_unroutable",),
     "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable"),
    ("channel_messages_unroutable_dropped_total", ("drop_unroutable",),
     "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    ("channel_get_ack_total", ("get",),
     "Total number of messages fetched with basic.get in manual acknowledgement mode"),
    ("channel_get_total", ("get_no_ack",),
     "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
    ("channel_messages_delivered_ack_total", ("deliver",),
     "Total number of messages delivered to consumers in manual acknowledgement mode"),
    ("channel_messages_delivered_total", ("deliver_no_ack",),
     "Total number of messages delivered to consumers in automatic acknowledgement mode"),
    ("channel_messages_redelivered_total", ("redeliver",),
     "Total number of messages redelivered to consumers"),
    ("channel_messages_acked_total", ("ack",), "Total number of messages acknowledged by consumers"),
    ("global_messages_received_total", ("publish",), "Total number of messages received from publishers"),
    ("global_messages_routed_total", ("publish_out",), "Total number of messages routed to queues or streams"),
    ("global_messages_unroutable_dropped_total", ("drop_unroutable",),
     "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    ("global_messages_unroutable_returned_total", ("return_unroutable",),
     "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable"),
    ("global_messages_confirmed_total", ("confirm",), "Total number of messages confirmed to publishers"),
    ("global_messages_delivered_total", ("deliver", "deliver_no_ack", "get", "get_no_ack"),
     "Total number of messages delivered to consumers"),
    ("global_messages_delivered_consume_manual_ack_total", ("deliver",),
     "Total number of messages delivered to consumers using basic.consume with manual acknowledgment"),
    ("global_messages_delivered_consume_auto_ack_total", ("deliver_no_ack",),
     "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment"),
    ("global_messages_delivered_get_manual_ack_total", ("get",),
     "Total number of messages delivered to consumers using basic.get with manual acknowledgment"),
    ("global_messages_delivered_get_auto_ack_total", ("get_no_ack",),
     "Total number of messages delivered to consumers using basic.get with automatic acknowledgment"),
    ("global_messages_redelivered_total", ("redeliver",),
     "Total number of messages redelivered to consumers"),
    ("global_messages_acknowledged_total", ("ack",), "Total number of messages acknowledged by consumers"),
)

# The global counters RabbitMQ labels by queue type as well as protocol (deliveries, gets, acks).
_QUEUE_TYPE_COUNTERS = frozenset(name for name, _, _ in _CHANNEL_COUNTERS
                                 if name.startswith("global_messages_") and
                                 name.endswith(("delivered_total", "_ack_total", "redelivered_total",
                                                "acknowledged_total")))


def _gauge(name: str, doc: str, value: float | None = None, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value, labels=labels)


class BrokerCollector:
    """Reads the broker at scrape time. ``detailed`` selects per-object families instead of totals."""

    def __init__(self, broker: Broker, sessions: Sessions, prefix: str, *, detailed: bool = False,
                 families: tuple[str, ...] | None = None, vhosts: tuple[str, ...] = (),
                 lag: EventLoopLag | None = None,
                 links: LinkRegistry | None = None) -> None:
        self.broker = broker
        self.links = links
        self.lag = lag
        self.sessions = sessions
        self.prefix = prefix
        self.detailed = detailed
        self.families = DETAILED_FAMILIES if families is None else families  # None: all of them
        self.vhosts = vhosts

    def collect(self) -> Iterator[Metric]:
        if self.detailed:
            yield from self._detailed()
        else:
            yield from self._identity("aggregated")
            yield from self._node()
            yield from self._totals()
            yield from self._links()
            yield from metrics_node.process_families()

    # --- aggregated ---------------------------------------------------------------------------
    def _identity(self, endpoint: str) -> Iterator[Metric]:
        # ``rabbitmq_endpoint`` names the endpoint as RabbitMQ does: its dashboards select series by
        # it (``aggregated`` for /metrics, ``detailed`` for /metrics/detailed).
        p = self.prefix
        node = node_info.node_name()
        identity = _gauge(f"{p}_identity_info", "RabbitMQ node & cluster identity info",
                          labels=["rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id",
                                  "rabbitmq_endpoint"])
        identity.add_metric([node, node, f"lavinpy-{socket.gethostname()}", endpoint], 1)
        yield identity
        build = _gauge(f"{p}_build_info", "RabbitMQ & Erlang/OTP version info",
                       labels=["rabbitmq_version", "product_name", "product_version", "prometheus_plugin_version"])
        build.add_metric([node_info.API_COMPATIBLE_VERSION, node_info.PRODUCT_NAME, __version__, __version__], 1)
        yield build

    def _node(self) -> Iterator[Metric]:
        p = self.prefix
        state = node_info.resource_state(self.broker)
        node = node_info.node_info(self.broker)
        yield _gauge(f"{p}_process_resident_memory_bytes", "Memory used in bytes", state["mem_used"])
        yield _gauge(f"{p}_resident_memory_limit_bytes", "Memory high watermark in bytes", state["mem_limit"])
        yield _gauge(f"{p}_disk_space_available_bytes", "Disk space available in bytes", state["disk_free"])
        yield _gauge(f"{p}_disk_space_available_limit_bytes", "Free disk space low watermark in bytes",
                     state["disk_free_limit"])
        yield _gauge(f"{p}_process_open_fds", "Open file descriptors", node["fd_used"])
        yield _gauge(f"{p}_process_max_fds", "Open file descriptors limit", node["fd_total"])
        yield _gauge(f"{p}_alarms_memory_used_watermark",
                     "is 1 if VM memory watermark alarm is in effect", int(state["mem_alarm"]))
        yield _gauge(f"{p}_alarms_free_disk_space_watermark",
                     "is 1 if free disk space watermark alarm is in effect", int(state["disk_free_alarm"]))
        yield _gauge(f"{p}_alarms_file_descriptor_limit", "is 1 if file descriptor limit alarm is in effect", 0)
        yield _gauge(f"{p}_erlang_uptime_seconds", "Node uptime", node["uptime"] / 1000)
        if self.lag is not None:
            yield self.lag.family(p)

    def _links(self) -> Iterator[Metric]:
        """Per federation link and per shovel (the node's link registry): 1 while running, and the
        messages it has moved."""
        if self.links is None:
            return
        yield from self._federation_links(self.links.rows("federation"))
        running = _gauge(f"{self.prefix}_shovel_running", "is 1 while the shovel runs", labels=["vhost", "name"])
        paused = _gauge(f"{self.prefix}_shovel_paused", "is 1 while the shovel is paused", labels=["vhost", "name"])
        forwarded = _gauge(f"{self.prefix}_shovel_messages_forwarded", "Messages the shovel moved",
                           labels=["vhost", "name"])
        for row in self.links.rows("shovel"):
            values = [row["vhost"], row["name"]]
            running.add_metric(values, int(row["state"] == "running"))
            paused.add_metric(values, int(row["state"] == "paused"))
            forwarded.add_metric(values, row.get("forwarded", 0))
        yield running
        yield paused
        yield forwarded

    def _federation_links(self, rows: list[dict[str, Any]]) -> Iterator[Metric]:
        labels = ["vhost", "exchange", "queue", "upstream", "id"]
        running = _gauge(f"{self.prefix}_federation_link_running", "is 1 while the federation link runs",
                         labels=labels)
        forwarded = _gauge(f"{self.prefix}_federation_link_messages_forwarded",
                           "Messages the federation link republished downstream", labels=labels)
        for row in rows:
            queue = row.get("queue", "") if row.get("type") == "queue" else ""
            values = [row["vhost"], row.get("exchange", ""), queue, row["upstream"], row["id"]]
            running.add_metric(values, int(row["status"] == "running"))
            forwarded.add_metric(values, row.get("messages_forwarded", 0))
        yield running
        yield forwarded

    def _totals(self) -> Iterator[Metric]:
        p = self.prefix
        # Every face's connections, from the model's registry (channels: of the faces that have them).
        by_protocol = self.broker.connections.counts()
        yield _gauge(f"{p}_connections", "Connections currently open", all_protocols(by_protocol).open)
        conns = self.broker.connections.listed()
        yield _gauge(f"{p}_channels", "Channels currently open", sum(c.channel_count for c in conns))
        ready = unacked = queues = consumers = 0
        for vhost in list(self.broker.vhosts.values()):
            queues += len(vhost.queues)
            for queue in vhost.queues.values():
                ready += queue.message_count
                unacked += queue.unacked_count
                consumers += queue.consumer_count
        yield _gauge(f"{p}_consumers", "Consumers currently connected", consumers)
        yield _gauge(f"{p}_queues", "Queues available", queues)
        yield _gauge(f"{p}_queue_messages_ready", "Messages ready to be delivered to consumers", ready)
        yield _gauge(f"{p}_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged",
                     unacked)
        yield _gauge(f"{p}_queue_messages", "Sum of ready and unacknowledged messages - total queue depth",
                     ready + unacked)
        yield _gauge(f"{p}_queue_consumers", "Consumers on a queue", consumers)
        totals = node_totals(self.broker)
        counts = totals.counts
        by_kind = metrics_node.counts_by_kind(self.broker)
        # The model counts each protocol's traffic (its operations are handed the face's protocol).
        traffic = sorted(self.broker.node_counters.by_protocol.items())
        amqp = metrics_node.PROTOCOL
        classic = metrics_node.QUEUE_TYPES["classic"]
        for name, fields, doc in _CHANNEL_COUNTERS:
            if name in _QUEUE_TYPE_COUNTERS:
                # RabbitMQ splits the queue-side global counters by queue type as well. Quorum queues
                # and streams are consumed over AMQP 0-9-1 only: the rest of its figure is classic's.
                family = CounterMetricFamily(f"{p}_{name}", doc, labels=["protocol", "queue_type"])
                other_kinds = 0
                for kind, queue_type in metrics_node.QUEUE_TYPES.items():
                    if kind != "classic":
                        kind_counts = by_kind.get(kind)
                        kind_value = sum(kind_counts[f] for f in fields) if kind_counts else 0
                        other_kinds += kind_value
                        family.add_metric([amqp, queue_type], kind_value)
                for protocol, protocol_counters in traffic:
                    protocol_value = sum(protocol_counters.count(f) for f in fields)
                    if protocol == amqp:
                        family.add_metric([amqp, classic], max(0, protocol_value - other_kinds))
                        continue
                    for queue_type in metrics_node.QUEUE_TYPES.values():
                        family.add_metric([protocol, queue_type], protocol_value if queue_type == classic else 0)
                yield family
            elif name.startswith("global_"):
                # RabbitMQ labels its global counters by protocol; dashboard queries that subtract one
                # from another (received_confirm - confirmed) match series on that label.
                family = CounterMetricFamily(f"{p}_{name}", doc, labels=["protocol"])
                for protocol, protocol_counters in traffic:
                    family.add_metric([protocol], sum(protocol_counters.count(f) for f in fields))
                yield family
            else:
                yield CounterMetricFamily(f"{p}_{name}", doc, value=sum(counts[f] for f in fields))
        for reason in DEAD_LETTER_REASONS:
            family = CounterMetricFamily(f"{p}_global_messages_dead_lettered_{reason}_total",
                                         f"Total number of messages dead-lettered due to {reason}",
                                         labels=["queue_type", "dead_letter_strategy"])
            family.add_metric(["rabbit_classic_queue", "at_most_once"], totals.dead_lettered.get(reason, 0))
            yield family
        yield CounterMetricFamily(f"{p}_global_messages_delayed_retries_total",
                                  "Total number of returned messages held for a delayed retry", value=totals.retried)
        yield CounterMetricFamily(f"{p}_global_messages_deduplicated_total",
                                  "Total number of messages dropped as duplicates by exchanges and queues",
                                  value=totals.duplicates)
        counters = self.broker.node_counters
        yield from metrics_node.global_families(p, self.sessions, counters, by_protocol)
        yield from metrics_node.churn_families(p, counters)
        yield metrics_node.login_family(p, self.broker.logins.counts)
        yield metrics_node.message_size_family(p, counters)
        yield from metrics_node.fsync_families(p)

    # --- per object ---------------------------------------------------------------------------
    def _selected_vhosts(self) -> list[VHost]:
        vhosts = list(self.broker.vhosts.values())
        if self.vhosts:
            vhosts = [v for v in vhosts if v.name in self.vhosts]
        return vhosts

    def _detailed(self) -> Iterator[Metric]:
        d = f"{self.prefix}_detailed"
        vhosts = self._selected_vhosts()
        queues: list[tuple[str, QueueKind]] = [(v.name, q) for v in vhosts for q in list(v.queues.values())]
        wanted = set(self.families)
        q_labels = ["vhost", "queue"]
        if "queue_coarse_metrics" in wanted:
            ready = _gauge(f"{d}_queue_messages_ready", "Messages ready to be delivered to consumers", labels=q_labels)
            unacked = _gauge(f"{d}_queue_messages_unacked",
                             "Messages delivered to consumers but not yet acknowledged", labels=q_labels)
            total = _gauge(f"{d}_queue_messages", "Sum of ready and unacknowledged messages - total queue depth",
                           labels=q_labels)
            for vhost_name, queue in queues:
                r, u = queue.message_count, queue.unacked_count
                ready.add_metric([vhost_name, queue.name], r)
                unacked.add_metric([vhost_name, queue.name], u)
                total.add_metric([vhost_name, queue.name], r + u)
            yield from (ready, unacked, total)
        if "queue_consumer_count" in wanted:
            family = _gauge(f"{d}_queue_consumers", "Consumers on a queue", labels=q_labels)
            for vhost_name, queue in queues:
                family.add_metric([vhost_name, queue.name], queue.consumer_count)
            yield family
        if "queue_metrics" in wanted:
            yield from self._ages(d, queues)
        if "queue_delivery_metrics" in wanted:
            yield from self._queue_counters(d, queues)
        if "queue_publish_metrics" in wanted:
            published = CounterMetricFamily(f"{d}_queue_messages_published_total",
                                            "Total number of messages published to queues", labels=q_labels)
            for vhost_name, queue in queues:
                published.add_metric([vhost_name, queue.name], queue.stats.publish)
            yield published
        if "exchange_metrics" in wanted:
            x_labels = ["vhost", "exchange"]
            published_in = CounterMetricFamily(f"{d}_exchange_messages_published_in_total",
                                               "Total number of messages published into an exchange", labels=x_labels)
            published_out = CounterMetricFamily(f"{d}_exchange_messages_published_out_total",
                                                "Total number of messages an exchange routed to a queue",
                                                labels=x_labels)
            for vhost in vhosts:
                for exchange in list(vhost.exchanges.values()):
                    published_in.add_metric([vhost.name, exchange.name], exchange.stats.publish_in)
                    published_out.add_metric([vhost.name, exchange.name], exchange.stats.publish_out)
            yield from (published_in, published_out)
        if "vhost_status" in wanted:
            family = _gauge(f"{d}_vhost_status", "Whether a given vhost is running", labels=["vhost"])
            for vhost in vhosts:
                family.add_metric([vhost.name], 0 if vhost.closed else 1)
            yield family

    def _ages(self, d: str, queues: list[tuple[str, QueueKind]]) -> Iterator[Metric]:
        q_labels = ["vhost", "queue"]
        now_ms = time.time() * 1000
        head_ts = _gauge(f"{d}_queue_head_message_timestamp",
                         "Timestamp of the first message in the queue, if any", labels=q_labels)
        head_age = _gauge(f"{d}_queue_head_message_age_seconds",
                          "Seconds since the queue's head message was published (0 when empty)", labels=q_labels)
        unacked_age = _gauge(f"{d}_queue_oldest_unacked_age_seconds",
                             "Seconds the queue's oldest unacknowledged delivery has waited (0 when none)",
                             labels=q_labels)
        unacked_ages = session_views.oldest_unacked_ages(self.sessions.connections)
        for vhost, queue in queues:
            timestamp = queue.head_timestamp_ms()
            if timestamp is not None:
                head_ts.add_metric([vhost, queue.name], timestamp // 1000)
            head_age.add_metric([vhost, queue.name],
                                max(0.0, (now_ms - timestamp) / 1000) if timestamp is not None else 0.0)
            unacked_age.add_metric([vhost, queue.name], round(unacked_ages.get((vhost, queue.name), 0.0), 3))
        yield from (head_ts, head_age, unacked_age)

    def _queue_counters(self, d: str, queues: list[tuple[str, QueueKind]]) -> Iterator[Metric]:
        q_labels = ["vhost", "queue"]
        spec = (("queue_get_ack_total", "get", "Total number of messages fetched from a queue with basic.get "
                 "in manual acknowledgement mode"),
                ("queue_get_total", "get_no_ack", "Total number of messages fetched from a queue with basic.get "
                 "in automatic acknowledgement mode"),
                ("queue_messages_delivered_ack_total", "deliver", "Total number of messages delivered from a queue to "
                 "consumers in manual acknowledgement mode"),
                ("queue_messages_delivered_total", "deliver_no_ack", "Total number of messages delivered from a "
                 "queue to consumers in automatic acknowledgement mode"),
                ("queue_messages_redelivered_total", "redeliver", "Total number of messages redelivered from a "
                 "queue to consumers"),
                ("queue_messages_acked_total", "ack", "Total number of messages acknowledged by consumers on a queue"))
        for name, field, doc in spec:
            family = CounterMetricFamily(f"{d}_{name}", doc, labels=q_labels)
            for vhost, queue in queues:
                family.add_metric([vhost, queue.name], getattr(queue.stats, field))
            yield family
        # lavinpy's own: dead-lettering per queue and reason (RabbitMQ gives node totals only). Only
        # reasons that happened have a series, so 10,000 quiet queues add nothing to a scrape.
        dead = CounterMetricFamily(f"{d}_queue_messages_dead_lettered_total",
                                   "Total number of messages dead-lettered from a queue, by reason",
                                   labels=[*q_labels, "reason"])
        for vhost, queue in queues:
            for reason, count in queue.stats.dead_lettered.items():
                dead.add_metric([vhost, queue.name, reason], count)
        yield dead
        retried = CounterMetricFamily(f"{d}_queue_messages_delayed_retries_total",
                                      "Total number of returned messages a queue held for a delayed retry",
                                      labels=q_labels)
        for vhost, queue in queues:
            if queue.stats.retried:
                retried.add_metric([vhost, queue.name], queue.stats.retried)
        yield retried
        duplicates = CounterMetricFamily(f"{d}_queue_messages_deduplicated_total",
                                         "Total number of messages a queue did not store as duplicates",
                                         labels=q_labels)
        for vhost, queue in queues:
            if queue.stats.duplicates:
                duplicates.add_metric([vhost, queue.name], queue.stats.duplicates)
        yield duplicates


def _prefix(request: web.Request) -> str:
    prefix = request.query.get("prefix", DEFAULT_PREFIX)
    if not _PREFIX.fullmatch(prefix):
        raise web.HTTPBadRequest(text=f"prefix must match [a-zA-Z_][a-zA-Z0-9_]*, not {prefix!r}\n")
    return prefix


def _render(collector: BrokerCollector) -> web.Response:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_metrics_app(broker: Broker, sessions: Sessions, links: LinkRegistry | None = None) -> web.Application:
    """The Prometheus endpoint application (no authentication, as RabbitMQ's); ``links``: the node's shovels
    and federation links."""

    lag = EventLoopLag()

    async def metrics(request: web.Request) -> web.Response:
        return _render(BrokerCollector(broker, sessions, _prefix(request), lag=lag, links=links))

    async def detailed(request: web.Request) -> web.Response:
        asked = request.query.getall("family", [])
        families = tuple(f for f in asked if f in DETAILED_FAMILIES) if asked else None
        vhosts = tuple(request.query.getall("vhost", []))
        return _render(BrokerCollector(broker, sessions, _prefix(request), detailed=True, families=families,
                                       vhosts=vhosts))

    app = web.Application()
    app.cleanup_ctx.append(lag.context)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/detailed", detailed)
    return app

