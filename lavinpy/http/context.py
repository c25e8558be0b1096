"""What a handler reads from its request: the broker, the session layer, the cluster's node list and
the authenticated actor. A leaf: the route modules import it, the application (app.py) fills it in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..broker.ops import Actor

if TYPE_CHECKING:
    from ..amqp.sessions import Sessions
    from ..broker.ops import Broker

BROKER: web.AppKey[Broker] = web.AppKey("broker")
SESSIONS: web.AppKey[Sessions] = web.AppKey("sessions")
CLUSTER_NODES: web.AppKey[Callable[[], list[dict[str, Any]]] | None] = web.AppKey("cluster_nodes")
ACTOR_KEY = "actor"


def broker_of(request: web.Request) -> Broker:
    return request.app[BROKER]


def sessions_of(request: web.Request) -> Sessions:
    return request.app[SESSIONS]


def actor_of(request: web.Request) -> Actor:
    actor: Actor = request[ACTOR_KEY]
    return actor


def json_reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def created_or_updated(created: bool) -> web.Response:
    """A PUT's reply as RabbitMQ's: 201 when it made the object, 204 when it changed one."""
    return web.Response(status=201 if created else 204)
