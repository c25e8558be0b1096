"""Exchanges, queues and bindings: RabbitMQ's /api/exchanges, /api/queues and /api/bindings."""

from __future__ import annotations

from aiohttp import web

from ..broker import operations as ops
from ..broker.object_info import exchange_info
from .app import actor_of, broker_of, json_reply
from .listing import apply_list_query


async def list_exchanges(request: web.Request) -> web.Response:
    vhosts = ops.vhosts_in_scope(broker_of(request), actor_of(request), request.match_info.get("vhost"))
    items = [exchange_info(v, x) for v in vhosts for x in v.exchanges.values()]
    return json_reply(apply_list_query(items, request.query))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/exchanges", list_exchanges)
    app.router.add_get("/api/exchanges/{vhost}", list_exchanges)
