"""Users, vhosts, permissions and policies: RabbitMQ's /api/whoami, /api/users, /api/vhosts,
/api/permissions and /api/policies. Tag and permission rules live in ``broker.ops.admin``."""

from __future__ import annotations

import weakref
from typing import Any

from aiohttp import web

from ..broker.ops import WindowRates, node_info
from ..broker.ops.admin import AdminOperations, parse_tags, user_json, vhost_json
from .context import actor_of, broker_of, created_or_updated, json_reply
from .errors import not_found, read_json_object
from .listing import listed
from .samples import SampleQuery


def _ops(request: web.Request) -> AdminOperations:
    return AdminOperations(broker_of(request))


NO_CONTENT = 204


async def whoami(request: web.Request) -> web.Response:
    actor = actor_of(request)
    return json_reply({"name": actor.name, "tags": sorted(actor.tags)})


# -- users ------------------------------------------------------------------------------------

async def list_users(request: web.Request) -> web.Response:
    return listed(request, [user_json(u) for u in _ops(request).list_users(actor_of(request))])


async def get_user(request: web.Request) -> web.Response:
    return json_reply(user_json(_ops(request).get_user(actor_of(request), request.match_info["name"])))


async def put_user(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    return created_or_updated(_ops(request).put_user(actor_of(request), request.match_info["name"], body))


async def delete_user(request: web.Request) -> web.Response:
    _ops(request).delete_user(actor_of(request), request.match_info["name"])
    return web.Response(status=NO_CONTENT)


async def user_permissions(request: web.Request) -> web.Response:
    return listed(request, _ops(request).list_permissions(actor_of(request), user=request.match_info["name"]))


# -- vhosts -----------------------------------------------------------------------------------

# The length rates of each open vhost, read when the vhost is listed (a deleted vhost's go with it).
_LENGTH_RATES: weakref.WeakKeyDictionary[Any, WindowRates] = weakref.WeakKeyDictionary()
_LENGTHS = ("messages", "messages_ready", "messages_unacknowledged")


def _vhost_reply(request: web.Request, record: Any) -> dict[str, Any]:
    """A vhost as RabbitMQ lists it: its settings, the message counts of its queues with their
    rates, and its message statistics."""
    item = vhost_json(record)
    broker = broker_of(request)
    vhost = broker.vhosts.get(record.name)
    if vhost is None:  # not opened (yet): nothing in it to count
        return item
    ready = unacked = 0
    for queue in list(vhost.queues.values()):
        ready += queue.message_count
        unacked += queue.unacked_count
    counts = (ready + unacked, ready, unacked)
    rates = _LENGTH_RATES.setdefault(vhost, WindowRates()).read(counts)
    for name, count, rate in zip(_LENGTHS, counts, rates, strict=True):
        item[name] = count
        item[name + "_details"] = {"rate": rate}
    item["message_stats"] = broker.stats.vhost_stats(vhost)
    samples = SampleQuery(request.query)
    if samples:  # RabbitMQ's lengths_age / msg_rates_age: the vhost's history from the sampler
        samples.apply(broker.stats, broker.stats.vhost_history.get(vhost.name), item, item["message_stats"])
    item["cluster_state"] = {node_info.node_name(): "running"}  # open on this node (the only one serving)
    return item


async def list_vhosts(request: web.Request) -> web.Response:
    return listed(request, [_vhost_reply(request, v) for v in _ops(request).visible_vhosts(actor_of(request))])


async def get_vhost(request: web.Request) -> web.Response:
    record = _ops(request).get_vhost(actor_of(request), request.match_info["vhost"])
    return json_reply(_vhost_reply(request, record))


async def put_vhost(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    description = body.get("description", metadata.get("description"))
    tags = body.get("tags", metadata.get("tags"))
    created = _ops(request).put_vhost(actor_of(request), request.match_info["vhost"], description,
                                      parse_tags(tags) if tags is not None else None,
                                      body.get("default_queue_type", metadata.get("default_queue_type")))
    return created_or_updated(created)


async def delete_vhost(request: web.Request) -> web.Response:
    _ops(request).delete_vhost(actor_of(request), request.match_info["vhost"])
    return web.Response(status=NO_CONTENT)


async def vhost_permissions(request: web.Request) -> web.Response:
    return listed(request, _ops(request).list_permissions(actor_of(request), vhost=request.match_info["vhost"]))


# -- permissions ------------------------------------------------------------------------------

async def list_permissions(request: web.Request) -> web.Response:
    return listed(request, _ops(request).list_permissions(actor_of(request)))


async def get_permission(request: web.Request) -> web.Response:
    m = request.match_info
    return json_reply(_ops(request).get_permissions(actor_of(request), m["vhost"], m["user"]))


async def put_permission(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    m = request.match_info
    return created_or_updated(_ops(request).set_permissions(actor_of(request), m["vhost"], m["user"], body))


async def delete_permission(request: web.Request) -> web.Response:
    m = request.match_info
    _ops(request).clear_permissions(actor_of(request), m["vhost"], m["user"])
    return web.Response(status=NO_CONTENT)


# -- topic permissions ------------------------------------------------------------------------

async def list_topic_permissions(request: web.Request) -> web.Response:
    m = request.match_info
    return listed(request, _ops(request).list_topic_permissions(actor_of(request), vhost=m.get("vhost"),
                                                                 user=m.get("user") or m.get("name")))


async def get_topic_permission(request: web.Request) -> web.Response:
    m = request.match_info
    found = _ops(request).list_topic_permissions(actor_of(request), vhost=m["vhost"], user=m["user"])
    if not found:
        raise not_found(f"no topic permissions for user '{m['user']}' in vhost '{m['vhost']}'")
    return json_reply(found)


async def put_topic_permission(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    m = request.match_info
    return created_or_updated(_ops(request).set_topic_permission(actor_of(request), m["vhost"], m["user"], body))


async def delete_topic_permission(request: web.Request) -> web.Response:
    m = request.match_info
    _ops(request).clear_topic_permissions(actor_of(request), m["vhost"], m["user"], request.query.get("exchange"))
    return web.Response(status=NO_CONTENT)


# -- policies ---------------------------------------------------------------------------------

async def list_policies(request: web.Request) -> web.Response:
    return listed(request, _ops(request).list_policies(actor_of(request), request.match_info.get("vhost")))


async def get_policy(request: web.Request) -> web.Response:
    m = request.match_info
    return json_reply(_ops(request).get_policy(actor_of(request), m["vhost"], m["name"]))


async def put_policy(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    m = request.match_info
    return created_or_updated(_ops(request).set_policy(actor_of(request), m["vhost"], m["name"], body))


async def delete_policy(request: web.Request) -> web.Response:
    m = request.match_info
    _ops(request).clear_policy(actor_of(request), m["vhost"], m["name"])
    return web.Response(status=NO_CONTENT)


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/whoami", whoami)
    r.add_get("/api/users", list_users)
    r.add_get("/api/users/{name}", get_user)
    r.add_put("/api/users/{name}", put_user)
    r.add_delete("/api/users/{name}", delete_user)
    r.add_get("/api/users/{name}/permissions", user_permissions)
    r.add_get("/api/vhosts", list_vhosts)
    r.add_get("/api/vhosts/{vhost}", get_vhost)
    r.add_put("/api/vhosts/{vhost}", put_vhost)
    r.add_delete("/api/vhosts/{vhost}", delete_vhost)
    r.add_get("/api/vhosts/{vhost}/permissions", vhost_permissions)
    r.add_get("/api/permissions", list_permissions)
    r.add_get("/api/permissions/{vhost}/{user}", get_permission)
    r.add_put("/api/permissions/{vhost}/{user}", put_permission)
    r.add_delete("/api/permissions/{vhost}/{user}", delete_permission)
    r.add_get("/api/users/{name}/topic-permissions", list_topic_permissions)
    r.add_get("/api/vhosts/{vhost}/topic-permissions", list_topic_permissions)
    r.add_get("/api/topic-permissions", list_topic_permissions)
    r.add_get("/api/topic-permissions/{vhost}/{user}", get_topic_permission)
    r.add_put("/api/topic-permissions/{vhost}/{user}", put_topic_permission)
    r.add_delete("/api/topic-permissions/{vhost}/{user}", delete_topic_permission)
    r.add_get("/api/policies", list_policies)
    r.add_get("/api/policies/{vhost}", list_policies)
    r.add_get("/api/policies/{vhost}/{name}", get_policy)
    r.add_put("/api/policies/{vhost}/{name}", put_policy)
    r.add_delete("/api/policies/{vhost}/{name}", delete_policy)
