"""lavinpyctl's node commands: status, cluster_status, ping, await_startup, close_all_connections,
set_vm_memory_high_watermark, set_disk_free_limit."""

from __future__ import annotations

import argparse
import time
from typing import Any

from .ctl_api import EXIT_TEMPFAIL, EXIT_UNAVAILABLE, EXIT_USAGE, Api, CtlError, q
from .ctl_columns import pick
from .ctl_output import Output

AWAIT_POLL_SECONDS = 0.5


def _local_node(api: Api) -> dict[str, Any]:
    nodes = api.call("GET", "/api/nodes")
    return next((n for n in nodes if n.get("self", True)), nodes[0]) if nodes else {}


def cmd_status(api: Api, args: argparse.Namespace, out: Output) -> None:
    """Version, uptime, memory, disk, alarms, listeners, file descriptors and object totals. The
    command exits 0 whenever the broker answers (alarms included): it is the container health check."""
    overview = api.call("GET", "/api/overview")
    node = _local_node(api)
    alarms = api.call("GET", "/api/health/checks/alarms", accept=(503,))  # an alarm is a status, not a failure
    product = overview.get("product_name", "RabbitMQ")
    version = overview.get("product_version") or overview.get("rabbitmq_version", "")
    out.banner(f"Status of node {overview.get('node')} ...")
    info = {
        "node": overview.get("node"),
        "product": f"{product} {version}".strip(),
        "version": version,
        "management_version": overview.get("management_version"),
        "uptime_seconds": (node.get("uptime") or 0) // 1000,
        "memory_used": node.get("mem_used"),
        "memory_limit": node.get("mem_limit"),
        "memory_alarm": node.get("mem_alarm"),
        "disk_free": node.get("disk_free"),
        "disk_free_limit": node.get("disk_free_limit"),
        "disk_free_alarm": node.get("disk_free_alarm"),
        "file_descriptors_used": node.get("fd_used"),
        "file_descriptors_total": node.get("fd_total"),
        "listeners": [f"{x.get('protocol')} {x.get('ip_address')}:{x.get('port')}"
                      for x in overview.get("listeners", [])],
        "connections": pick(overview, "object_totals.connections"),
        "queues": pick(overview, "object_totals.queues"),
        "messages": pick(overview, "queue_totals.messages"),
        "alarms": alarms.get("status") if isinstance(alarms, dict) else alarms,
        "alarm_list": [a.get("resource") for a in alarms.get("alarms", [])] if isinstance(alarms, dict) else [],
    }
    out.fields(info)


CLUSTER_COLUMNS = ["clustering_id", "role", "amqp_address", "in_sync", "bytes_sent", "bytes_acked", "lag_bytes"]


def cmd_cluster_status(api: Api, args: argparse.Namespace, out: Output) -> None:
    """A replicated cluster: every node with its role and, per follower, the replication bytes sent,
    acknowledged and the lag. A single node: the one node as rabbitmqctl shows a cluster of one."""
    nodes = api.call("GET", "/api/nodes")
    if any("role" in node for node in nodes):
        nodes = sorted(nodes, key=lambda n: (n.get("role") != "leader", str(n.get("clustering_id"))))
        out.banner("Cluster status of this lavinpy cluster ...")
        out.rows([{c: n.get(c) for c in CLUSTER_COLUMNS} for n in nodes], CLUSTER_COLUMNS)
        return
    overview = api.call("GET", "/api/overview")
    alarms = api.call("GET", "/api/health/checks/alarms", accept=(503,))
    names = [n.get("name") for n in nodes]
    running = [n.get("name") for n in nodes if n.get("running", True)]
    version = f"{overview.get('product_name', 'RabbitMQ')} {overview.get('product_version', '')}".strip()
    status = {
        "cluster_name": overview.get("cluster_name"),
        "disk_nodes": [n.get("name") for n in nodes if n.get("type", "disc") == "disc"],
        "running_nodes": running,
        "versions": {name: version for name in names},
        "alarms": [f"{a.get('resource')} on {a.get('node')}" for a in alarms.get("alarms", [])]
        if isinstance(alarms, dict) else [],
        "partitions": {n.get("name"): n.get("partitions", []) for n in nodes if n.get("partitions")},
    }
    if out.fmt == "json":
        out.fields(status)
        return
    out.banner(f"Cluster status of node {overview.get('node')} ...")
    sections = [("Basics", [f"Cluster name: {status['cluster_name']}"]),
                ("Disk Nodes", status["disk_nodes"]), ("Running Nodes", running),
                ("Versions", [f"{name}: {version}" for name in names]),
                ("Alarms", status["alarms"] or ["(none)"]),
                ("Network Partitions", [f"{k}: {v}" for k, v in status["partitions"].items()] or ["(none)"])]
    for title, lines in sections:
        print(title)
        print()
        for line in lines:
            print(line)
        print()


def cmd_ping(api: Api, args: argparse.Namespace, out: Output) -> None:
    """Succeeds when the broker answers at all: a refused login still shows the node is up."""
    out.banner(f"Will ping {api.base}. This only checks that the broker answers on its management port.")
    try:
        api.call("GET", "/api/whoami")
    except CtlError as e:
        if e.status is None:  # no HTTP answer at all
            raise
    print("Ping succeeded")


def cmd_await_startup(api: Api, args: argparse.Namespace, out: Output) -> None:
    """Wait until the broker answers (at most --timeout seconds, rabbitmqctl's 300 by default)."""
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            api.call("GET", "/api/overview")
            return
        except CtlError as e:
            # Unreachable, or up but not serving yet (503: a cluster node with no leader); any other
            # answer is a refusal that waiting will not change.
            if e.code != EXIT_UNAVAILABLE and e.status != 503:
                raise
            if time.monotonic() >= deadline:
                raise CtlError(f"Error: the broker at {api.base} did not start within {args.timeout:g} s",
                               EXIT_TEMPFAIL) from None
        time.sleep(min(AWAIT_POLL_SECONDS, max(0.0, deadline - time.monotonic())))


def cmd_close_all_connections(api: Api, args: argparse.Namespace, out: Output) -> None:
    """rabbitmqctl's close_all_connections: the vhost's connections (-p), or every one (--global),
    at most --limit of them, --per-connection-delay milliseconds apart."""
    if args.global_:
        out.banner(f"Closing all connections to this node (across all vhosts), reason: {args.explanation}...")
        connections = api.call("GET", "/api/connections")
    else:
        out.banner(f"Closing all connections in vhost {args.vhost}, reason: {args.explanation}...")
        connections = api.call("GET", f"/api/vhosts/{q(args.vhost)}/connections")
    if args.limit is not None:
        connections = connections[:args.limit]
    closed = 0
    for n, conn in enumerate(connections):
        if n and args.per_connection_delay:
            time.sleep(args.per_connection_delay / 1000)
        # one that went away meanwhile is not a failure: it is closed as asked
        api.call("DELETE", f"/api/connections/{q(conn['name'])}", headers={"X-Reason": args.explanation},
                 accept=(404,))
        closed += 1
    print(f"Closed {closed} connections")


def _threshold_args(values: list[str], keyword: str) -> tuple[str | None, str]:
    """rabbitmqctl's ``<value>`` or ``<keyword> <value>`` argument forms."""
    if len(values) == 1 and values[0] != keyword:
        return None, values[0]
    if len(values) == 2 and values[0] == keyword:
        return keyword, values[1]
    raise CtlError(f"Error: expected <value> or {keyword} <value>, not {' '.join(values)!r}", EXIT_USAGE)


def cmd_set_vm_memory_high_watermark(api: Api, args: argparse.Namespace, out: Output) -> None:
    """rabbitmqctl set_vm_memory_high_watermark <fraction> | absolute <bytes or size>: the memory alarm's
    threshold, at run time (until the broker restarts with its configuration file)."""
    form, value = _threshold_args(args.threshold, "absolute")
    node = _local_node(api).get("name", "")
    out.banner(f"Setting memory threshold on {node} to {'absolute ' if form else ''}{value} ...")
    if form is None:
        try:
            body: dict[str, Any] = {"fraction": float(value)}
        except ValueError:
            raise CtlError(f"Error: the fraction of RAM must be a number between 0 and 1, not {value!r}",
                           EXIT_USAGE) from None
    else:
        body = {"absolute": value}
    api.call("PUT", f"/api/nodes/{q(node)}/memory_high_watermark", body)


def cmd_set_disk_free_limit(api: Api, args: argparse.Namespace, out: Output) -> None:
    """rabbitmqctl set_disk_free_limit <bytes or size> | mem_relative <multiple of RAM>: the disk alarm's
    threshold, at run time (until the broker restarts with its configuration file)."""
    form, value = _threshold_args(args.limit, "mem_relative")
    node = _local_node(api).get("name", "")
    out.banner(f"Setting disk free limit on {node} to {'mem_relative ' if form else ''}{value} ...")
    if form is None:
        body: dict[str, Any] = {"bytes": value}
    else:
        try:
            body = {"mem_relative": float(value)}
        except ValueError:
            raise CtlError(f"Error: mem_relative takes a number, not {value!r}", EXIT_USAGE) from None
    api.call("PUT", f"/api/nodes/{q(node)}/disk_free_limit", body)
