"""The read-only views and health checks: overview, nodes, connections, channels, consumers,
/api/health/checks/*, /api/aliveness-test. Handlers translate; node_info and session_views decide
what the acting user may see."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..amqp import session_views as views
from ..broker import node_info
from ..broker.alarms import disk_limit, memory_watermark
from ..broker.operations import open_vhost, visible_vhosts
from ..config import total_memory
from ..mqtt import views as mqtt_views
from ..wire.constants import ACCESS_REFUSED
from ..wire.errors import AMQPChannelError
from .context import CLUSTER_NODES, MQTT_SESSIONS, actor_of, broker_of, json_reply, sessions_of
from .errors import bad_request, not_found, read_json_object
from .listing import apply_list_query, object_reply
from .samples import SampleQuery


def _status(ok: bool, reason: str = "", **extra: Any) -> web.Response:
    """RabbitMQ's health-check reply: 200 ok, or 503 failed with a reason."""
    if ok:
        return json_reply({"status": "ok", **extra})
    return json_reply({"status": "failed", "reason": reason, **extra}, status=503)


async def overview(request: web.Request) -> web.Response:
    sessions, actor = sessions_of(request), actor_of(request)
    connections = views.open_connections(sessions, actor)
    channels = sum(len(c.channels) for c in connections)
    consumers = len(views.consumer_infos(sessions, actor))
    mqtt = request.app.get(MQTT_SESSIONS)
    mqtt_connections = len(mqtt_views.open_connections(mqtt, actor)) if mqtt is not None else 0
    broker = broker_of(request)
    reply = node_info.overview(broker, actor, connections=len(connections) + mqtt_connections, channels=channels,
                               consumers=consumers)
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
        raise AMQPChannelError(ACCESS_REFUSED, "Not administrator user")
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
    conns = views.open_connections(sessions_of(request), actor_of(request), vhost)
    rows = [views.connection_info(c, _node()) for c in conns]
    mqtt = request.app.get(MQTT_SESSIONS)
    if mqtt is not None:  # MQTT clients are connections too (protocol "MQTT 3.1.1")
        rows += [mqtt_views.connection_info(c, _node()) for c in mqtt_views.open_connections(mqtt, actor_of(request),
                                                                                              vhost)]
    return json_reply(apply_list_query(rows, request.query))


def _mqtt_connection(request: web.Request) -> Any:
    """The MQTT connection the path names, or None (then it is an AMQP one, or none: 404)."""
    mqtt = request.app.get(MQTT_SESSIONS)
    name = request.match_info["name"]
    if mqtt is None or " -> " not in name:
        return None
    return next((c for c in mqtt_views.open_connections(mqtt, actor_of(request))
                 if mqtt_views.connection_name(c) == name), None)


async def get_connection(request: web.Request) -> web.Response:
    mqtt_conn = _mqtt_connection(request)
    if mqtt_conn is not None:  # with its MQTT session: subscriptions, deliveries awaiting PUBACK
        return object_reply({**mqtt_views.connection_info(mqtt_conn, _node()),
                           "mqtt_session": mqtt_views.session_info(mqtt_conn)})
    conn = views.find_connection(sessions_of(request), actor_of(request), request.match_info["name"])
    return object_reply(views.connection_info(conn, _node()))


async def delete_connection(request: web.Request) -> web.Response:
    mqtt = request.app.get(MQTT_SESSIONS)
    if mqtt is not None and _mqtt_connection(request) is not None:
        mqtt_views.close_connection(mqtt, actor_of(request), request.match_info["name"],
                                    request.headers.get("X-Reason"))
        return web.Response(status=204)
    views.close_connection(sessions_of(request), actor_of(request), request.match_info["name"],
                           request.headers.get("X-Reason"))
    return web.Response(status=204)


async def list_channels(request: web.Request) -> web.Response:
    if "name" in request.match_info and _mqtt_connection(request) is not None:
        return json_reply(apply_list_query([], request.query))  # an MQTT connection has no channels
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        open_vhost(broker_of(request), actor_of(request), vhost)
    items = views.channel_infos(sessions_of(request), actor_of(request), _node(), vhost=vhost,
                                connection=request.match_info.get("name"))
    return json_reply(apply_list_query(items, request.query))


async def list_consumers(request: web.Request) -> web.Response:
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        open_vhost(broker_of(request), actor_of(request), vhost)
    items = views.consumer_infos(sessions_of(request), actor_of(request), vhost)
    mqtt = request.app.get(MQTT_SESSIONS)
    if mqtt is not None:  # MQTT subscriptions consume too
        items += mqtt_views.consumer_infos(mqtt, actor_of(request), _node(), vhost)
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
