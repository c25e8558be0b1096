"""RabbitMQ's /api/definitions[/{vhost}]: GET exports, POST imports (``?dry_run=true`` only reports)."""

from __future__ import annotations

from aiohttp import web

from ..broker.ops.definitions.documents import export_definitions, import_definitions_cooperatively
from .context import actor_of, broker_of, json_reply
from .errors import read_json


async def get_definitions(request: web.Request) -> web.Response:
    doc = export_definitions(broker_of(request), actor_of(request), request.match_info.get("vhost"))
    headers = {}
    if request.query.get("download"):  # the UI's "download" link, as RabbitMQ's
        headers["Content-Disposition"] = f'attachment; filename="{request.query["download"]}"'
    return web.json_response(doc, headers=headers)


async def post_definitions(request: web.Request) -> web.Response:
    doc = await read_json(request)
    dry_run = request.query.get("dry_run", "false").lower() == "true"
    plan = await import_definitions_cooperatively(broker_of(request), actor_of(request), doc,
                                                  vhost=request.match_info.get("vhost"), dry_run=dry_run)
    if dry_run:
        return json_reply({"dry_run": True, "changes": plan.changes, "ignored": plan.ignored})
    if plan.ignored:  # accepted and not needed by lavinpy: said, never silently dropped
        return json_reply({"ignored": plan.ignored})
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/definitions", get_definitions)
    app.router.add_post("/api/definitions", post_definitions)
    app.router.add_get("/api/definitions/{vhost}", get_definitions)
    app.router.add_post("/api/definitions/{vhost}", post_definitions)
