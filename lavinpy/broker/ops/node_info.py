"""The node as RabbitMQ's management API and health checks describe it: overview, node facts, alarms.

Every function takes the acting user (an ``Actor``; None = trusted internal caller) where RabbitMQ
restricts what a user sees: totals cover only the vhosts the actor may see.
"""

from __future__ import annotations

import os
import resource
import socket
from typing import TYPE_CHECKING, Any

from ... import __version__
from ...config import parse_watermark
from ..alarms import disk_free, process_rss
from ..connections import all_protocols
from ..errors import ACCESS_REFUSED, BrokerChannelError
from .scope import open_vhost, visible_vhosts

if TYPE_CHECKING:
    from ..access.actor import Actor
    from ..broker import Broker

# The RabbitMQ version whose management API this one follows (clients check it for features).
API_COMPATIBLE_VERSION = "3.12.0"
PRODUCT_NAME = "lavinpy"
ALIVENESS_QUEUE = "aliveness-test"
ALIVENESS_BODY = b"test_message"
_NO_PROPERTIES = b"\x00\x00"


def require_monitor(actor: Actor | None) -> None:
    """Node details are for ``monitoring`` and ``administrator`` users, as in RabbitMQ."""
    if actor is not None and not actor.can_monitor():
        raise BrokerChannelError(ACCESS_REFUSED, "Not monitor user")


def node_name() -> str:
    return f"lavinpy@{socket.gethostname()}"


def uptime_ms() -> int:
    """Milliseconds since this process started (from /proc; 0 where it is missing)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            start_ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as f:
            system_uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, int((system_uptime - start_ticks / os.sysconf("SC_CLK_TCK")) * 1000))


def fd_used() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def resource_state(broker: Broker) -> dict[str, Any]:
    """Memory and disk against their limits, and whether each alarm is raised."""
    mem_used = process_rss()
    mem_limit = parse_watermark(broker.config.memory_high_watermark)
    free = disk_free(broker.datadir.path)
    disk_limit = broker.config.disk_free_limit
    return {
        "mem_used": mem_used,
        "mem_limit": mem_limit,
        "mem_alarm": bool(mem_limit) and mem_used > mem_limit,
        "disk_free": free if free is not None else 0,
        "disk_free_limit": disk_limit,
        "disk_free_alarm": free is not None and free < disk_limit,
    }


def node_info(broker: Broker) -> dict[str, Any]:
    """RabbitMQ's /api/nodes entry for this node (its sockets: the client connections of every face)."""
    info = {
        "name": node_name(),
        "type": "disc",
        "running": True,
        "uptime": uptime_ms(),
        "fd_used": fd_used(),
        "fd_total": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "sockets_used": all_protocols(broker.connections.counts()).sockets,
        "proc_used": 1,
        "processors": os.cpu_count() or 1,
        "partitions": [],
        "applications": [{"name": PRODUCT_NAME, "description": "AMQP 0-9-1 broker", "version": __version__}],
    }
    info.update(resource_state(broker))
    return info


def cluster_node_infos(local: dict[str, Any], members: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """/api/nodes of a cluster: this node's entry and one per other member, each with its ``role`` (and,
    for followers, the replication figures the leader has: bytes sent, acknowledged, lag)."""
    nodes = []
    for member in members:
        if member.get("self"):
            nodes.append({**local, **{k: v for k, v in member.items() if k != "self"}})
        else:
            nodes.append({"name": f"{PRODUCT_NAME}@{member['clustering_id']}", "type": "disc", "running": True,
                          **{k: v for k, v in member.items() if k != "self"}})
    return nodes


def listeners(broker: Broker) -> list[dict[str, Any]]:
    config = broker.config
    ports = [("amqp", config.amqp_port)]
    if config.amqps_enabled:
        ports.append(("amqp/ssl", config.amqps_port))
    if config.http_port:
        ports.append(("http", config.http_port))
    if config.prometheus_port:
        ports.append(("http/prometheus", config.prometheus_port))
    if config.mqtt_port:
        ports.append(("mqtt", config.mqtt_port))
    if config.mqtts_enabled:
        ports.append(("mqtt/ssl", config.mqtts_port))
    return [{"node": node_name(), "protocol": protocol, "ip_address": address, "port": port}
            for protocol, port in ports for address in config.bind]


def overview(broker: Broker, actor: Actor | None, *, connections: int, channels: int,
             consumers: int) -> dict[str, Any]:
    """/api/overview: versions, node, totals of the vhosts the actor may see, message statistics."""
    vhosts = visible_vhosts(broker, actor)
    ready = unacked = exchanges = queues = 0
    for vhost in vhosts:
        exchanges += len(vhost.exchanges)
        queues += len(vhost.queues)
        for queue in vhost.queues.values():
            ready += queue.message_count
            unacked += queue.unacked_count
    if len(vhosts) == len(broker.vhosts):
        stats = broker.stats.node_stats()
    else:
        stats = _sum_stats([broker.stats.vhost_stats(v) for v in vhosts])
    return {
        "management_version": API_COMPATIBLE_VERSION,
        "rabbitmq_version": API_COMPATIBLE_VERSION,
        "product_name": PRODUCT_NAME,
        "product_version": __version__,
        "erlang_version": "none",
        "rates_mode": "basic",
        "cluster_name": broker.parameters.get_global("cluster_name") or node_name(),
        "node": node_name(),
        "object_totals": {"connections": connections, "channels": channels, "consumers": consumers,
                          "exchanges": exchanges, "queues": queues},
        "queue_totals": {"messages": ready + unacked, "messages_ready": ready,
                         "messages_unacknowledged": unacked},
        "message_stats": stats,
        "listeners": listeners(broker),
        "contexts": [{"node": node_name(), "description": "lavinpy management", "path": "/",
                      "port": str(broker.config.http_port)}],
    }


def _sum_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                rate = total.setdefault(key, {"rate": 0.0})
                rate["rate"] = round(rate["rate"] + value["rate"], 1)
            else:
                total[key] = total.get(key, 0) + value
    return total


# --- health checks ----------------------------------------------------------------------------
def alarms(broker: Broker) -> list[str]:
    """The resource alarms in effect (RabbitMQ: ``memory`` / ``disk``)."""
    state = resource_state(broker)
    raised = []
    if state["mem_alarm"]:
        raised.append("memory")
    if state["disk_free_alarm"]:
        raised.append("disk")
    return raised


def vhosts_down(broker: Broker) -> list[str]:
    return [name for name, vhost in broker.vhosts.items() if vhost.closed]


def aliveness_test(broker: Broker, actor: Actor | None, vhost_name: str) -> str | None:
    """RabbitMQ's aliveness test: declare ``aliveness-test``, publish a message to it and get it back.

    Returns None when it worked, else why not.
    """
    vhost = open_vhost(broker, actor, vhost_name)
    if actor is not None and not actor.can_access_vhost(vhost_name):
        raise BrokerChannelError(ACCESS_REFUSED, f"access to vhost '{vhost_name}' refused for user '{actor.name}'")
    queue = vhost.declare_queue(ALIVENESS_QUEUE, owner=None)
    vhost.publish(vhost.default_exchange, ALIVENESS_QUEUE, _NO_PROPERTIES, ALIVENESS_BODY)
    while (got := queue.get()) is not None:  # an older test's leftover may come first
        pos, message, _ = got
        queue.ack(pos)
        if message.body == ALIVENESS_BODY:
            return None
    return f"the test message published to queue '{ALIVENESS_QUEUE}' in vhost '{vhost_name}' did not arrive"
