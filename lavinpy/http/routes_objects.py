"""Exchanges, queues and bindings: RabbitMQ's /api/exchanges, /api/queues and /api/bindings.

Handlers read the request, call one broker operation with the request's actor, and shape the answer;
the operations check permissions and arguments. "amq.default" in a path names the default exchange.
"""

from __future__ import annotations

from typing import Any, overload
from urllib.parse import quote

from aiohttp import web

from ..broker.ops import ConnectionRegistry, Exchange, VHost, messages, scope
from ..broker.ops import objects as ops
from ..broker.ops.object_info import exchange_info, properties_key, queue_info, vhost_bindings
from ..wire.field_table import FieldTableError, check_nesting
from . import cooperative
from .context import actor_of, broker_of, json_reply
from .errors import bad_request, not_found, read_json_object
from .listing import apply_list_query, object_reply
from .samples import SampleQuery

DEFAULT_EXCHANGE_PATH_NAME = "amq.default"


# --- request translation -----------------------------------------------------------------------------

def _vhost(request: web.Request) -> VHost:
    return scope.open_vhost(broker_of(request), actor_of(request), request.match_info["vhost"])


def _exchange_name(name: str) -> str:
    return "" if name == DEFAULT_EXCHANGE_PATH_NAME else name


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false, not {value!r}")
    return value


def _query_flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


def _arguments(body: dict[str, Any]) -> dict[str, Any]:
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be a JSON object")
    try:
        check_nesting(arguments)
    except FieldTableError as e:
        raise bad_request(f"arguments: {e}") from None
    return arguments


@overload
def _int_field(body: dict[str, Any], name: str, default: int) -> int: ...
@overload
def _int_field(body: dict[str, Any], name: str, default: None) -> int | None: ...
def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise bad_request(f"{name} must be an integer, not {value!r}")


def _scope(request: web.Request) -> list[VHost]:
    return scope.vhosts_in_scope(broker_of(request), actor_of(request), request.match_info.get("vhost"))


def _list(request: web.Request, items: list[dict[str, Any]]) -> web.Response:
    return json_reply(apply_list_query(items, request.query))


# --- exchanges ------------------------------------------------------------------------------------------

async def list_exchanges(request: web.Request) -> web.Response:
    return _list(request, [exchange_info(v, x) for v in _scope(request) for x in v.exchanges.values()])


async def get_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    exchange = ops.get_exchange(actor_of(request), vhost, _exchange_name(request.match_info["name"]))
    return object_reply(exchange_info(vhost, exchange))


async def put_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = await read_json_object(request)
    name = _exchange_name(request.match_info["name"])
    type_name = body.get("type")
    if not isinstance(type_name, str) or not type_name:
        raise bad_request("type must name an exchange type (direct, fanout, topic, headers, ...)")
    existed = name in vhost.exchanges
    ops.declare_exchange(actor_of(request), vhost, name, type_name, durable=_flag(body, "durable", True),
                         auto_delete=_flag(body, "auto_delete", False), internal=_flag(body, "internal", False),
                         arguments=_arguments(body))
    return web.Response(status=204 if existed else 201)


async def delete_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    ops.delete_exchange(actor_of(request), vhost, _exchange_name(request.match_info["name"]),
                        if_unused=_query_flag(request, "if-unused"), missing_ok=False)
    return web.Response(status=204)


async def publish(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = await read_json_object(request)
    routing_key = body.get("routing_key", "")
    if not isinstance(routing_key, str):
        raise bad_request("routing_key must be a string")
    properties = messages.properties_from_json(body.get("properties") or {})
    payload = messages.payload_bytes(body.get("payload", ""), body.get("payload_encoding", "string"))
    routed = messages.publish_message(actor_of(request), vhost, _exchange_name(request.match_info["name"]),
                                      routing_key, properties, payload)
    return json_reply({"routed": routed})


def _exchange_bindings(vhost: VHost, exchange: Exchange, as_source: bool) -> list[dict[str, Any]]:
    out = []
    for b in vhost_bindings(vhost):
        if (b["source"] if as_source else b["destination"]) != exchange.name:
            continue
        if not as_source and b["destination_type"] != "exchange":
            continue
        out.append(b)
    return out


async def exchange_bindings_source(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    exchange = ops.get_exchange(actor_of(request), vhost, _exchange_name(request.match_info["name"]))
    return _list(request, _exchange_bindings(vhost, exchange, True))


async def exchange_bindings_destination(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    exchange = ops.get_exchange(actor_of(request), vhost, _exchange_name(request.match_info["name"]))
    return _list(request, _exchange_bindings(vhost, exchange, False))


# --- queues ---------------------------------------------------------------------------------------------

def _queue_info(queue: Any, connections: ConnectionRegistry) -> dict[str, Any]:
    """A queue as the API shows it; an exclusive one names its owning connection, as RabbitMQ's do."""
    info = queue_info(queue)
    if queue.exclusive_owner is not None:
        details = connections.owner_details(queue.exclusive_owner)
        if details is not None:
            info["owner_pid_details"] = details
    return info


async def list_queues(request: web.Request) -> web.Response:
    queues = [q for v in _scope(request) for q in v.queues.values()]
    connections = broker_of(request).connections
    return await cooperative.list_reply(queues, lambda queue: _queue_info(queue, connections), request.query)


async def get_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = ops.get_queue(actor_of(request), vhost, request.match_info["name"])
    info = _queue_info(queue, broker_of(request).connections)
    samples = SampleQuery(request.query)
    if samples:
        samples.apply(broker_of(request).stats, queue.stats.history, info, info["message_stats"])
    return object_reply(info)


async def put_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = await read_json_object(request)
    name = request.match_info["name"]
    existed = name in vhost.queues
    ops.declare_queue(actor_of(request), vhost, name, owner=None, durable=_flag(body, "durable", True),
                      auto_delete=_flag(body, "auto_delete", False), arguments=_arguments(body))
    return web.Response(status=204 if existed else 201)


async def delete_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    ops.delete_queue(actor_of(request), vhost, request.match_info["name"], owner=None,
                     if_unused=_query_flag(request, "if-unused"), if_empty=_query_flag(request, "if-empty"),
                     missing_ok=False)
    return web.Response(status=204)


async def purge_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    ops.purge_queue(actor_of(request), vhost, request.match_info["name"], None)
    return web.Response(status=204)


async def get_messages(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = await read_json_object(request)
    ackmode = body.get("ackmode")
    if ackmode is None and "requeue" in body:  # older clients send requeue instead of ackmode
        ackmode = "ack_requeue_true" if _flag(body, "requeue", True) else "ack_requeue_false"
    got = messages.get_messages(actor_of(request), vhost, request.match_info["name"],
                                count=_int_field(body, "count", 1), ackmode=ackmode or "ack_requeue_true",
                                encoding=body.get("encoding", "auto"), truncate=_int_field(body, "truncate", None))
    return json_reply(got)


async def peek(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    count = _int_field(dict(request.query), "count", 1)
    return json_reply(messages.peek_messages(actor_of(request), vhost, request.match_info["name"], count))


async def replay(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = await read_json_object(request)
    count = _int_field(body, "count", None)
    if count is None:
        raise bad_request("count is required: how many messages to replay at most")
    return json_reply(messages.replay_messages(actor_of(request), vhost, request.match_info["name"], count))


async def stream_offsets(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    return json_reply(messages.stream_consumer_offsets(actor_of(request), vhost, request.match_info["name"]))


async def delete_stream_offset(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    messages.delete_stream_consumer_offset(actor_of(request), vhost, request.match_info["name"],
                                           request.match_info["tag"])
    return web.Response(status=204)


async def queue_bindings(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = ops.get_queue(actor_of(request), vhost, request.match_info["name"])
    return _list(request, [b for b in vhost_bindings(vhost)
                           if b["destination_type"] == "queue" and b["destination"] == queue.name])


# --- bindings -------------------------------------------------------------------------------------------

async def list_bindings(request: web.Request) -> web.Response:
    return _list(request, [b for v in _scope(request) for b in vhost_bindings(v)])


def _binding_ends(request: web.Request, vhost: VHost) -> tuple[str, str, str]:
    """(source, destination, destination type) of a /api/bindings/{vhost}/e/{source}/{q|e}/{dest} path;
    both ends must exist (404)."""
    source = _exchange_name(request.match_info["source"])
    destination = request.match_info["destination"]
    kind = "queue" if request.match_info["kind"] == "q" else "exchange"
    actor = actor_of(request)
    ops.get_exchange(actor, vhost, source)
    if kind == "queue":
        ops.get_queue(actor, vhost, destination)
    else:
        ops.get_exchange(actor, vhost, _exchange_name(destination))
        destination = _exchange_name(destination)
    return source, destination, kind


def _bindings_between(vhost: VHost, source: str, destination: str, kind: str) -> list[dict[str, Any]]:
    return [b for b in vhost_bindings(vhost)
            if b["source"] == source and b["destination"] == destination and b["destination_type"] == kind]


async def bindings_between(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    return _list(request, _bindings_between(vhost, *_binding_ends(request, vhost)))


async def create_binding(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    source, destination, kind = _binding_ends(request, vhost)
    body = await read_json_object(request)
    routing_key = body.get("routing_key", "")
    if not isinstance(routing_key, str):
        raise bad_request("routing_key must be a string")
    arguments = _arguments(body)
    actor = actor_of(request)
    if kind == "queue":
        ops.bind_queue(actor, vhost, destination, source, routing_key, arguments, None)
    else:
        ops.bind_exchange(actor, vhost, destination, source, routing_key, arguments)
    location = "/".join(("/api/bindings", quote(vhost.name, safe=""), "e",
                         quote(source or DEFAULT_EXCHANGE_PATH_NAME, safe=""), request.match_info["kind"],
                         quote(destination, safe=""), quote(properties_key(routing_key, arguments), safe="")))
    return web.Response(status=201, headers={"Location": location})


def _binding_by_key(request: web.Request, vhost: VHost) -> tuple[str, str, str, dict[str, Any]]:
    source, destination, kind = _binding_ends(request, vhost)
    key = request.match_info["props"]
    for b in _bindings_between(vhost, source, destination, kind):
        if b["properties_key"] == key:
            return source, destination, kind, b
    raise not_found()


async def get_binding(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    return json_reply(_binding_by_key(request, vhost)[3])


async def delete_binding(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    source, destination, kind, found = _binding_by_key(request, vhost)
    actor = actor_of(request)
    arguments = _stored_arguments(vhost, source, destination, found)
    if kind == "queue":
        ops.unbind_queue(actor, vhost, destination, source, found["routing_key"], arguments, None)
    else:
        ops.unbind_exchange(actor, vhost, destination, source, found["routing_key"], arguments)
    return web.Response(status=204)


def _stored_arguments(vhost: VHost, source: str, destination: str, found: dict[str, Any]) -> dict[str, Any]:
    """The binding's own arguments (typed as stored), not their JSON rendering."""
    for b in vhost.exchanges[source].bindings():
        if getattr(b.destination, "name", None) == destination and b.routing_key == found["routing_key"] \
                and properties_key(b.routing_key, b.arguments) == found["properties_key"]:
            return b.arguments
    return {}


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/exchanges", list_exchanges)
    r.add_get("/api/exchanges/{vhost}", list_exchanges)
    r.add_get("/api/exchanges/{vhost}/{name}", get_exchange)
    r.add_put("/api/exchanges/{vhost}/{name}", put_exchange)
    r.add_delete("/api/exchanges/{vhost}/{name}", delete_exchange)
    r.add_post("/api/exchanges/{vhost}/{name}/publish", publish)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/source", exchange_bindings_source)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/destination", exchange_bindings_destination)
    r.add_get("/api/queues", list_queues)
    r.add_get("/api/queues/{vhost}", list_queues)
    r.add_get("/api/queues/{vhost}/{name}", get_queue)
    r.add_put("/api/queues/{vhost}/{name}", put_queue)
    r.add_delete("/api/queues/{vhost}/{name}", delete_queue)
    r.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    r.add_post("/api/queues/{vhost}/{name}/get", get_messages)
    r.add_get("/api/queues/{vhost}/{name}/peek", peek)
    r.add_post("/api/queues/{vhost}/{name}/replay", replay)
    r.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    r.add_get("/api/queues/{vhost}/{name}/consumer_offsets", stream_offsets)
    r.add_delete("/api/queues/{vhost}/{name}/consumer_offsets/{tag}", delete_stream_offset)
    r.add_get("/api/bindings", list_bindings)
    r.add_get("/api/bindings/{vhost}", list_bindings)
    between = "/api/bindings/{vhost}/e/{source}/{kind:[eq]}/{destination}"
    r.add_get(between, bindings_between)
    r.add_post(between, create_binding)
    r.add_get(between + "/{props}", get_binding)
    r.add_delete(between + "/{props}", delete_binding)
