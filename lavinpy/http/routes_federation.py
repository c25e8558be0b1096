"""RabbitMQ's federation status API: /api/federation-links, /api/federation-links/{vhost} and the
restart path /api/federation-links/vhost/{vhost}/{id}/{node}/restart.

Upstreams and sets are defined through /api/parameters/federation-upstream(-set)/{vhost}/{name} (the
parameters registry, which calls lavinpy.federation's components) and applied by policies; these
routes list the links that run on this node and restart one by its id.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..broker.ops import ADMINISTRATOR, POLICYMAKER
from ..federation.component import Federation, LinkNotFound
from .context import actor_of, json_reply
from .errors import ApiError
from .link_rows import route_vhost, rows_shown

FEDERATION: web.AppKey[Federation] = web.AppKey("federation")


def _federation(request: web.Request) -> Federation:
    federation = request.app.get(FEDERATION)
    if federation is None:
        raise ApiError(404, "Object Not Found", "federation is not running on this node")
    return federation


def _shown(request: web.Request, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows_shown(request, rows, "error")


async def list_all(request: web.Request) -> web.Response:
    actor = actor_of(request)
    rows = [row for row in _federation(request).status()
            if actor.can_monitor() or actor.can_access_vhost(row["vhost"])]
    return json_reply(_shown(request, rows))


async def list_vhost(request: web.Request) -> web.Response:
    return json_reply(_shown(request, _federation(request).status(route_vhost(request))))


async def restart(request: web.Request) -> web.Response:
    vhost, link_id = route_vhost(request), request.match_info["id"]
    actor = actor_of(request)
    if not actor.tags & {ADMINISTRATOR, POLICYMAKER}:
        raise ApiError(401, "not_authorised", f"user '{actor.name}' needs the policymaker or administrator tag")
    try:
        _federation(request).restart(vhost, link_id)
    except LinkNotFound as e:
        raise ApiError(404, "Object Not Found", str(e)) from None
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/federation-links", list_all)
    app.router.add_get("/api/federation-links/{vhost}", list_vhost)
    app.router.add_delete("/api/federation-links/vhost/{vhost}/{id}/{node}/restart", restart)
