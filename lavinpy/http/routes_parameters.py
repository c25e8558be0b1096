"""RabbitMQ's /api/parameters, /api/global-parameters, /api/vhost-limits, /api/user-limits and
/api/operator-policies. The rules are in ``broker.ops.limits``; handlers only translate."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..broker.ops.limits import LimitsOperations
from .context import actor_of, broker_of, created_or_updated, json_reply
from .errors import bad_request, read_json_object
from .listing import listed

NO_CONTENT = 204


def _ops(request: web.Request) -> LimitsOperations:
    return LimitsOperations(broker_of(request))


def _value(body: dict[str, Any]) -> Any:
    if "value" not in body:
        raise bad_request("value is missing")
    return body["value"]


# -- parameters -------------------------------------------------------------------------------

async def list_parameters(request: web.Request) -> web.Response:
    m = request.match_info
    return listed(request, _ops(request).list_parameters(actor_of(request), m.get("component"), m.get("vhost")))


async def get_parameter(request: web.Request) -> web.Response:
    m = request.match_info
    return json_reply(_ops(request).get_parameter(actor_of(request), m["component"], m["vhost"], m["name"]))


async def put_parameter(request: web.Request) -> web.Response:
    m = request.match_info
    value = _value(await read_json_object(request))
    created = _ops(request).set_parameter(actor_of(request), m["component"], m["vhost"], m["name"], value)
    return created_or_updated(created)


async def delete_parameter(request: web.Request) -> web.Response:
    m = request.match_info
    _ops(request).clear_parameter(actor_of(request), m["component"], m["vhost"], m["name"])
    return web.Response(status=NO_CONTENT)


# -- global parameters --------------------------------------------------------------------------

async def list_global_parameters(request: web.Request) -> web.Response:
    return listed(request, _ops(request).list_global_parameters(actor_of(request)))


async def get_global_parameter(request: web.Request) -> web.Response:
    return json_reply(_ops(request).get_global_parameter(actor_of(request), request.match_info["name"]))


async def put_global_parameter(request: web.Request) -> web.Response:
    value = _value(await read_json_object(request))
    created = _ops(request).set_global_parameter(actor_of(request), request.match_info["name"], value)
    return created_or_updated(created)


async def delete_global_parameter(request: web.Request) -> web.Response:
    _ops(request).clear_global_parameter(actor_of(request), request.match_info["name"])
    return web.Response(status=NO_CONTENT)


# -- vhost and user limits ----------------------------------------------------------------------

async def list_vhost_limits(request: web.Request) -> web.Response:
    return listed(request, _ops(request).list_vhost_limits(actor_of(request), request.match_info.get("vhost")))


async def put_vhost_limit(request: web.Request) -> web.Response:
    m = request.match_info
    _ops(request).set_vhost_limit(actor_of(request), m["vhost"], m["name"], _value(await read_json_object(request)))
    return web.Response(status=NO_CONTENT)


async def delete_vhost_limit(request: web.Request) -> web.Response:
    m = request.match_info
    _ops(request).clear_vhost_limit(actor_of(request), m["vhost"], m["name"])
    return web.Response(status=NO_CONTENT)


async def list_user_limits(request: web.Request) -> web.Response:
    return listed(request, _ops(request).list_user_limits(actor_of(request), request.match_info.get("user")))


async def put_user_limit(request: web.Request) -> web.Response:
    m = request.match_info
    _ops(request).set_user_limit(actor_of(request), m["user"], m["name"], _value(await read_json_object(request)))
    return web.Response(status=NO_CONTENT)


async def delete_user_limit(request: web.Request) -> web.Response:
    m = request.match_info
    _ops(request).clear_user_limit(actor_of(request), m["user"], m["name"])
    return web.Response(status=NO_CONTENT)


# -- operator policies --------------------------------------------------------------------------

async def list_operator_policies(request: web.Request) -> web.Response:
    return listed(request, _ops(request).list_operator_policies(actor_of(request), request.match_info.get("vhost")))


async def get_operator_policy(request: web.Request) -> web.Response:
    m = request.match_info
    return json_reply(_ops(request).get_operator_policy(actor_of(request), m["vhost"], m["name"]))


async def put_operator_policy(request: web.Request) -> web.Response:
    m = request.match_info
    body = await read_json_object(request)
    return created_or_updated(_ops(request).set_operator_policy(actor_of(request), m["vhost"], m["name"], body))


async def delete_operator_policy(request: web.Request) -> web.Response:
    m = request.match_info
    _ops(request).clear_operator_policy(actor_of(request), m["vhost"], m["name"])
    return web.Response(status=NO_CONTENT)


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/parameters", list_parameters)
    r.add_get("/api/parameters/{component}", list_parameters)
    r.add_get("/api/parameters/{component}/{vhost}", list_parameters)
    r.add_get("/api/parameters/{component}/{vhost}/{name}", get_parameter)
    r.add_put("/api/parameters/{component}/{vhost}/{name}", put_parameter)
    r.add_delete("/api/parameters/{component}/{vhost}/{name}", delete_parameter)
    r.add_get("/api/global-parameters", list_global_parameters)
    r.add_get("/api/global-parameters/{name}", get_global_parameter)
    r.add_put("/api/global-parameters/{name}", put_global_parameter)
    r.add_delete("/api/global-parameters/{name}", delete_global_parameter)
    r.add_get("/api/vhost-limits", list_vhost_limits)
    r.add_get("/api/vhost-limits/{vhost}", list_vhost_limits)
    r.add_put("/api/vhost-limits/{vhost}/{name}", put_vhost_limit)
    r.add_delete("/api/vhost-limits/{vhost}/{name}", delete_vhost_limit)
    r.add_get("/api/user-limits", list_user_limits)
    r.add_get("/api/user-limits/{user}", list_user_limits)
    r.add_put("/api/user-limits/{user}/{name}", put_user_limit)
    r.add_delete("/api/user-limits/{user}/{name}", delete_user_limit)
    r.add_get("/api/operator-policies", list_operator_policies)
    r.add_get("/api/operator-policies/{vhost}", list_operator_policies)
    r.add_get("/api/operator-policies/{vhost}/{name}", get_operator_policy)
    r.add_put("/api/operator-policies/{vhost}/{name}", put_operator_policy)
    r.add_delete("/api/operator-policies/{vhost}/{name}", delete_operator_policy)
