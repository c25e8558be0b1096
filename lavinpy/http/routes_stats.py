"""The read-only views and health checks: overview, nodes, connections, channels, consumers,
/api/health/checks/*, /api/aliveness-test. Handlers translate; node_info and the model's connection
registry (broker.connections, read through broker.ops.scope) decide what the acting user may see,
of every face alike."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..broker.errors import ACCESS_REFUSED, BrokerChannelError
from ..broker.ops import disk_limit, memory_watermark, node_info
from ..broker.ops.scope import (
    close_connection,
    find_connection,
    open_vhost,
    visible_connections,
    visible_consumers,
    visible_vhosts,
)
from ..config import total_memory
from .context import CLUSTER_NODES, actor_of, broker_of, json_reply
from .errors import bad_request, not_found, read_json_object
from .listing import apply_list_query, object_reply
from .samples import SampleQuery


def _status(ok: bool, reason: str = "", **extra: Any) -> web.Response:
    """RabbitMQ's health-check reply: 200 ok, or 503 failed with a reason."""
    if ok:
        return json_reply({"status": "ok", **extra})
    return json_reply({"status": "failed", "reason": reason, **extra}, status=503)


async def overview(request: web.Request) -> web.Response:
    broker, actor = broker_of(request), actor_of(request)
    connections = visible_connections(broker, actor)
    channels = sum(c.channel_count for c in connections)
    consumers = len(visible_consumers(broker, actor, _node()))
    reply = node_info.overview(broker, actor, connections=len(connections), channels=channels, consumers=consumers)
    samples = SampleQuery(request.query)
    if samples:
        history = broker.stats.history_of(visible_vhosts(broker, actor))
        samples.apply(broker.stats, history, reply["queue_totals"], reply["message_stats"])
    return json_reply(reply)


async def list_nodes(request: web.Request) -> web.Response:
    node_info.require_monitor(actor_of(request))
    info = node_info.node_info(broker_of(request))
    cluster_nodes = request.app[CLUSTER_NODES]
    nodes = [info] if cluster_nodes is None else node_info.cluster_node_infos(info, cluster_nodes())
    return json_reply(apply_list_query(nodes, request.query))


async def get_node(request: web.Request) -> web.Response:
    node_info.require_monitor(actor_of(request))
    if request.match_info["name"] != node_info.node_name():
        raise not_found()
    return json_reply(node_info.node_info(broker_of(request)))


async def _threshold_body(request: web.Request) -> dict[str, Any]:
    """The body of a threshold change, after the checks: this node, an administrator."""
    actor = actor_of(request)
    if actor is not None and not actor.is_admin():
        raise BrokerChannelError(ACCESS_REFUSED, "Not administrator user")
    if request.match_info["name"] != node_info.node_name():
        raise not_found()
    return await read_json_object(request)


def _thresholds(broker: Any) -> dict[str, Any]:
    state = node_info.resource_state(broker)
    return {"memory_high_watermark": broker.config.memory_high_watermark, "mem_limit": state["mem_limit"],
            "mem_alarm": state["mem_alarm"], "disk_free_limit": state["disk_free_limit"],
            "disk_free_alarm": state["disk_free_alarm"]}


async def put_memory_high_watermark(request: web.Request) -> web.Response:
    """lavinpy's run-time form of rabbitmqctl set_vm_memory_high_watermark (RabbitMQ's API has none):
    ``{"fraction": 0.4}`` or ``{"absolute": "512MiB"}``; the alarm is re-evaluated at once."""
    body = await _threshold_body(request)
    try:
        setting = memory_watermark(fraction=body.get("fraction"), absolute=body.get("absolute"))
    except (ValueError, TypeError) as e:
        raise bad_request(str(e)) from None
    broker = broker_of(request)
    broker.set_resource_limits(memory_high_watermark=setting)
    return json_reply(_thresholds(broker))


async def put_disk_free_limit(request: web.Request) -> web.Response:
    """rabbitmqctl set_disk_free_limit at run time: ``{"bytes": 50000000}`` (or a size, "2GB") or
    ``{"mem_relative": 1.5}``; the alarm is re-evaluated at once."""
    body = await _threshold_body(request)
    try:
        limit = disk_limit(size=body.get("bytes"), mem_relative=body.get("mem_relative"),
                           total_memory=total_memory())
    except (ValueError, TypeError) as e:
        raise bad_request(str(e)) from None
    broker = broker_of(request)
    broker.set_resource_limits(disk_free_limit=limit)
    return json_reply(_thresholds(broker))


def _node() -> str:
    return node_info.node_name()


async def list_connections(request: web.Request) -> web.Response:
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        open_vhost(broker_of(request), actor_of(request), vhost)
    rows = [c.info(_node()) for c in visible_connections(broker_of(request), actor_of(request), vhost)]
    return json_reply(apply_list_query(rows, request.query))


async def get_connection(request: web.Request) -> web.Response:
    connection = find_connection(broker_of(request), actor_of(request), request.match_info["name"])
    return object_reply(connection.details(_node()))


async def delete_connection(request: web.Request) -> web.Response:
    close_connection(broker_of(request), actor_of(request), request.match_info["name"],
                     request.headers.get("X-Reason"))
    return web.Response(status=204)


async def list_channels(request: web.Request) -> web.Response:
    broker, actor = broker_of(request), actor_of(request)
    name = request.match_info.get("name")
    if name is not None:
        connections = [find_connection(broker, actor, name)]
    else:
        vhost = request.match_info.get("vhost")
        if vhost is not None:
            open_vhost(broker, actor, vhost)
        connections = visible_connections(broker, actor, vhost)
    items = [row for connection in connections for row in connection.channel_infos(_node())]
    return json_reply(apply_list_query(items, request.query))


async def list_consumers(request: web.Request) -> web.Response:
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        open_vhost(broker_of(request), actor_of(request), vhost)
    items = visible_consumers(broker_of(request), actor_of(request), _node(), vhost)
    return json_reply(apply_list_query(items, request.query))


def _alarms_status(request: web.Request, where: str) -> web.Response:
    # One node: the cluster-wide and the local check see the same alarms; only RabbitMQ's text differs.
    alarms = node_info.alarms(broker_of(request))
    if not alarms:
        return _status(True)
    return _status(False, f"There are alarms in effect {where}",
                   alarms=[{"node": _node(), "resource": a} for a in alarms])


async def check_alarms(request: web.Request) -> web.Response:
    return _alarms_status(request, "in the cluster")


async def check_local_alarms(request: web.Request) -> web.Response:
    return _alarms_status(request, "on the node")


async def check_virtual_hosts(request: web.Request) -> web.Response:
    down = node_info.vhosts_down(broker_of(request))
    if not down:
        return _status(True)
    return _status(False, "Some virtual hosts are down", **{"virtual-hosts": down})


async def check_port_listener(request: web.Request) -> web.Response:
    raw = request.match_info["port"]
    try:
        port = int(raw)
    except ValueError:
        return _status(False, f"port must be a number, not {raw!r}")
    ports = sorted({listener["port"] for listener in node_info.listeners(broker_of(request))})
    if port in ports:
        return _status(True, port=port)
    return _status(False, "No active listener", missing=port, ports=ports)


async def aliveness_test(request: web.Request) -> web.Response:
    failure = node_info.aliveness_test(broker_of(request), actor_of(request), request.match_info["vhost"])
    return _status(failure is None, failure or "")


def add_routes(app: web.Application) -> None:
    router = app.router
    router.add_get("/api/overview", overview)
    router.add_get("/api/nodes", list_nodes)
    router.add_get("/api/nodes/{name}", get_node)
    router.add_put("/api/nodes/{name}/memory_high_watermark", put_memory_high_watermark)
    router.add_put("/api/nodes/{name}/disk_free_limit", put_disk_free_limit)
    router.add_get("/api/connections", list_connections)
    router.add_get("/api/connections/{name}", get_connection)
    router.add_delete("/api/connections/{name}", delete_connection)
    router.add_get("/api/connections/{name}/channels", list_channels)
    router.add_get("/api/vhosts/{vhost}/connections", list_connections)
    router.add_get("/api/channels", list_channels)
    router.add_get("/api/vhosts/{vhost}/channels", list_channels)
    router.add_get("/api/consumers", list_consumers)
    router.add_get("/api/consumers/{vhost}", list_consumers)
    router.add_get("/api/health/checks/alarms", check_alarms)
    router.add_get("/api/health/checks/local-alarms", check_local_alarms)
    router.add_get("/api/health/checks/virtual-hosts", check_virtual_hosts)
    router.add_get("/api/health/checks/port-listener/{port}", check_port_listener)
    router.add_get("/api/aliveness-test/{vhost}", aliveness_test)
