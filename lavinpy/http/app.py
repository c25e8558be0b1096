"""The aiohttp application: authentication and error middleware, then the routes of each route module.

Handlers only translate: they read the path, query and JSON body, call one broker operation with the
request's ``Actor``, and shape its result as RabbitMQ's API does. Every permission and tag check is in
the operations; their ``BrokerError`` becomes RabbitMQ's error JSON here (see errors.py for the table).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..broker.errors import BrokerError
from ..logs import RateLimitedLog
from . import (
    definitions,
    routes_admin,
    routes_dashboard,
    routes_federation,
    routes_health,
    routes_mqtt,
    routes_objects,
    routes_parameters,
    routes_shovels,
    routes_stats,
)
from .auth import REALM, authenticate
from .context import ACTOR_KEY, BROKER, CLUSTER_NODES, SESSIONS
from .csrf import same_origin_json
from .errors import ApiError, error_response, from_broker_error
from .proxied import ForwardedProtocol, proxied_remote

if TYPE_CHECKING:
    from ..amqp.sessions import Sessions
    from ..broker.ops import Broker
    from ..wire.proxy_header import ProxyHeader

log = logging.getLogger("lavinpy.http")
_refused_log = RateLimitedLog(log)

# Each route module's routes, registered in this order (aiohttp matches the first route that fits).
ROUTE_TABLES: tuple[Callable[[web.Application], None], ...] = (
    routes_objects.add_routes,
    routes_admin.add_routes,
    routes_parameters.add_routes,  # parameters, limits, operator policies
    definitions.add_routes,
    routes_stats.add_routes,
    routes_health.add_routes,  # RabbitMQ 4's further health checks
    routes_dashboard.add_routes,
    routes_federation.add_routes,
    routes_shovels.add_routes,
    routes_mqtt.add_routes,  # MQTT over WebSocket (/ws)
)
API_PREFIX = "/api/"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        headers = {"WWW-Authenticate": REALM} if e.status == 401 else None
        return error_response(e.status, e.error, e.reason, headers)
    except BrokerError as e:
        return from_broker_error(e)
    except web.HTTPNotFound:
        return error_response(404, "Object Not Found", "Not Found")
    except web.HTTPMethodNotAllowed:
        return error_response(405, "Method Not Allowed", f"{request.method} is not allowed on {request.path}")
    except web.HTTPException:
        raise
    except ConnectionResetError as e:  # the client went before its body was read: nothing to answer
        return _ended_early(request, e)
    except Exception as e:
        if isinstance(e, RuntimeError) and request.transport is None:
            # aiohttp's "Connection closed.": a read of the body begun after the client went (a handler
            # that reached it late, such as the first request, which waits for the HTTP stack to load)
            return _ended_early(request, e)
        log.exception("HTTP %s %s failed", request.method, request.path)
        return error_response(500, "internal_error", "internal error, see the broker log")


def _ended_early(request: web.Request, e: Exception) -> web.Response:
    _refused_log.log(logging.INFO, "HTTP %s %s from %s: %s", request.method, request.path, request.remote, e)
    # aiohttp keeps the exception on the request's stream, a cycle freed only by a full collection
    # (rare at the server's GC thresholds); its traceback holds the body read so far (up to
    # client_max_size). Without it that goes now.
    e.__traceback__ = None
    return error_response(400, "bad_request", "the request body ended early")


@web.middleware
async def _authentication(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith(API_PREFIX) and request.path != routes_dashboard.AUTH_SETTINGS_PATH:
        request[ACTOR_KEY] = await authenticate(request.app[BROKER], request)
    return await handler(request)


# Requests that change something: their reply waits until every in-sync follower has the change.
CHANGING_METHODS = frozenset({"PUT", "POST", "DELETE"})


@web.middleware
async def _replicated(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    if request.method in CHANGING_METHODS and response.status < 400:
        await request.app[BROKER].wait_replicated()
    return response


# A route's {name}: aiohttp's default pattern ([^{}/]+) leaves out names with braces, which RabbitMQ
# allows ("{tenant}.orders" answered 404); any text but "/" (a "/" in a name arrives as %2F).
_SEGMENT = re.compile(r"\{(?P<var>[_a-zA-Z][_a-zA-Z0-9]*)\}")


def add_routes(app: web.Application) -> None:
    """Every route of the management API and the dashboard."""
    router = app.router
    add_resource = router.add_resource

    def any_segment(path: str, *, name: str | None = None) -> web.Resource:
        return add_resource(_SEGMENT.sub(r"{\g<var>:[^/]+}", path), name=name)

    setattr(router, "add_resource", any_segment)  # noqa: B010 - the routes registered below use it
    try:
        for add in ROUTE_TABLES:
            add(app)
    finally:
        delattr(router, "add_resource")


def make_app(broker: Broker, sessions: Sessions,
             cluster_nodes: Callable[[], list[dict[str, Any]]] | None = None) -> web.Application:
    """The management application for one broker (its route modules registered); ``cluster_nodes``:
    the cluster's nodes with their roles, when the broker leads a cluster."""
    app = web.Application(middlewares=[proxied_remote, _errors, same_origin_json, _authentication, _replicated],
                          client_max_size=broker.config.management_max_body_size)
    app[BROKER] = broker
    app[SESSIONS] = sessions
    app[CLUSTER_NODES] = cluster_nodes
    add_routes(app)
    return app


class _MalformedRequestLine(logging.Filter):
    """aiohttp logs a request it cannot parse (a line over 8190 bytes, a bad chunk size: the client's
    fault, answered 400) at ERROR with a traceback: any client could fill the log with them. Such a
    record becomes one rate-limited INFO line of lavinpy.http."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        text = " ".join(str(error.message).split())[:200]  # aiohttp's text spans lines, with a caret
        _refused_log.log(logging.INFO, "HTTP request from %s refused: %s %s", peer, error.code, text)
        return False


_MALFORMED_REQUEST_FILTER = _MalformedRequestLine()


class HttpServer:
    """An app's aiohttp server; its connections come from listeners of the ports that serve it (the server
    binds them at start, lavinpy.http.gate), each behind ForwardedProtocol."""

    def __init__(self, app: web.Application) -> None:
        logging.getLogger("aiohttp.server").addFilter(_MALFORMED_REQUEST_FILTER)  # a second add is a no-op
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)

    async def setup(self) -> None:
        await self.runner.setup()

    def protocol(self, client: ProxyHeader | None, what: str) -> asyncio.Protocol:
        """aiohttp's protocol for one connection of a port named ``what``, from ``client`` if a PROXY
        header named one."""
        server = self.runner.server
        assert server is not None
        return ForwardedProtocol(server(), client, what)

    async def stop(self) -> None:
        await self.runner.cleanup()
