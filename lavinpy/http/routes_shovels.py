"""RabbitMQ's shovel status API: /api/shovels, /api/shovels/{vhost}, the restart and delete paths.

The shovels are defined through /api/parameters/shovel/{vhost}/{name} (the parameters registry,
which calls lavinpy.shovel's component); these routes list what runs on this node and restart or
delete one by name, as RabbitMQ's shovel management plugin does, and pause or resume one (LavinMQ's
PUT /api/shovels/{vhost}/{name}/pause and /resume).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..broker.ops import ADMINISTRATOR, POLICYMAKER
from ..shovel.component import ShovelNotFound, Shovels
from .context import actor_of, json_reply
from .errors import ApiError
from .link_rows import route_vhost, rows_shown

SHOVELS: web.AppKey[Shovels] = web.AppKey("shovels")


def _shovels(request: web.Request) -> Shovels:
    shovels = request.app.get(SHOVELS)
    if shovels is None:
        raise ApiError(404, "Object Not Found", "shovels are not running on this node")
    return shovels


def _shown(request: web.Request, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows_shown(request, rows, "reason")


async def list_all(request: web.Request) -> web.Response:
    actor = actor_of(request)
    rows = [row for row in _shovels(request).status() if actor.can_monitor() or actor.can_access_vhost(row["vhost"])]
    return json_reply(_shown(request, rows))


async def list_vhost(request: web.Request) -> web.Response:
    return json_reply(_shown(request, _shovels(request).status(route_vhost(request))))


async def show(request: web.Request) -> web.Response:
    vhost, name = route_vhost(request), request.match_info["name"]
    for row in _shown(request, _shovels(request).status(vhost)):
        if row["name"] == name:
            return json_reply(row)
    raise ApiError(404, "Object Not Found", f"no shovel '{name}' in vhost '{vhost}'")


def _policymaker(request: web.Request) -> None:
    actor = actor_of(request)
    if not actor.tags & {ADMINISTRATOR, POLICYMAKER}:
        raise ApiError(401, "not_authorised", f"user '{actor.name}' needs the policymaker or administrator tag")


async def restart(request: web.Request) -> web.Response:
    vhost, name = route_vhost(request), request.match_info["name"]
    _policymaker(request)
    try:
        _shovels(request).restart(vhost, name)
    except ShovelNotFound as e:
        raise ApiError(404, "Object Not Found", str(e)) from None
    return web.Response(status=204)


async def _pause_or_resume(request: web.Request, pause: bool) -> web.Response:
    """LavinMQ's pause and resume: 204, 404 for no such shovel, 422 when it is paused already (pause) or
    not paused (resume)."""
    vhost, name = route_vhost(request), request.match_info["name"]
    _policymaker(request)
    shovels = _shovels(request)
    try:
        changed = shovels.pause(vhost, name) if pause else shovels.resume(vhost, name)
    except ShovelNotFound as e:
        raise ApiError(404, "Object Not Found", str(e)) from None
    if not changed:
        raise ApiError(422, "unprocessable_entity",
                       f"shovel '{name}' in vhost '{vhost}' is {'paused already' if pause else 'not paused'}")
    return web.Response(status=204)


async def pause(request: web.Request) -> web.Response:
    return await _pause_or_resume(request, True)


async def resume(request: web.Request) -> web.Response:
    return await _pause_or_resume(request, False)


async def delete(request: web.Request) -> web.Response:
    vhost, name = route_vhost(request), request.match_info["name"]
    _policymaker(request)
    shovels = _shovels(request)
    try:
        shovels.delete(vhost, name)
    except ShovelNotFound as e:
        raise ApiError(404, "Object Not Found", str(e)) from None
    if shovels.on_finished is not None:
        shovels.on_finished(vhost, name)  # the parameter goes too, as RabbitMQ's delete_shovel
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/shovels", list_all)
    app.router.add_get("/api/shovels/{vhost}", list_vhost)
    app.router.add_get("/api/shovels/vhost/{vhost}/{name}", show)
    app.router.add_delete("/api/shovels/vhost/{vhost}/{name}/restart", restart)
    app.router.add_delete("/api/shovels/vhost/{vhost}/{name}", delete)
    app.router.add_put("/api/shovels/{vhost}/{name}/pause", pause)
    app.router.add_put("/api/shovels/{vhost}/{name}/resume", resume)
