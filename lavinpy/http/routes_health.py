"""RabbitMQ 4's health checks beyond alarms and ports (/api/health/checks/...): in service, a listener
per protocol, the node connection limit, ready to serve clients (the readiness probe), certificate
expiry, quorum criticality and the metadata store. Each answers 200 ``{"status": "ok", ...}`` or 503
``{"status": "failed", "reason": ..., ...}`` as RabbitMQ's do."""

from __future__ import annotations

import ssl
import time
from typing import Any

from aiohttp import web

from ..broker.ops import node_info
from .context import CLUSTER_NODES, broker_of, json_reply, sessions_of
from .errors import bad_request

# Protocol names RabbitMQ accepts for a listener besides the listener's own (amqp, amqp/ssl, http, ...).
PROTOCOL_ALIASES = {
    "amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqp0_9_1": "amqp",
    "amqps": "amqp/ssl", "amqp091/ssl": "amqp/ssl",
}
# certificate-expiration's units, in seconds (a month and a year as RabbitMQ counts them: 30 and 365 days)
DAY = 86400
EXPIRY_UNITS = {"days": DAY, "weeks": 7 * DAY, "months": 30 * DAY, "years": 365 * DAY}


def _status(ok: bool, reason: str = "", **extra: Any) -> web.Response:
    if ok:
        return json_reply({"status": "ok", **extra})
    return json_reply({"status": "failed", "reason": reason, **extra}, status=503)


async def is_in_service(request: web.Request) -> web.Response:
    # lavinpy has no maintenance (drain) mode, and this API listens only once the broker has started:
    # a node that answers is in service.
    return _status(True)


async def protocol_listener(request: web.Request) -> web.Response:
    asked = request.match_info["protocol"].lower()
    protocol = PROTOCOL_ALIASES.get(asked, asked)
    protocols = sorted({listener["protocol"] for listener in node_info.listeners(broker_of(request))})
    if protocol in protocols:
        return _status(True, protocol=protocol)
    return _status(False, "No active listener", missing=protocol, protocols=protocols)


def _connection_limit(request: web.Request) -> tuple[bool, dict[str, Any]]:
    # lavinpy has no node-wide connection_max (limits are per vhost and per user): the limit is
    # RabbitMQ's default, infinity.
    connections = len(sessions_of(request).connections)
    return True, {"limit": "infinity", "connections": connections}


async def below_node_connection_limit(request: web.Request) -> web.Response:
    ok, figures = _connection_limit(request)
    return _status(ok, "node connection limit is reached", **figures)


async def ready_to_serve_clients(request: web.Request) -> web.Response:
    """The readiness probe: in service and still accepting connections."""
    ok, figures = _connection_limit(request)
    if not ok:
        return _status(False, "node connection limit is reached", **figures)
    return _status(True)


def _certificate_not_after(path: str) -> float | None:
    try:
        decoded = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]  # the stdlib's only PEM reader
    except (OSError, ssl.SSLError, ValueError):
        return None
    not_after = decoded.get("notAfter")
    return ssl.cert_time_to_seconds(not_after) if not_after else None


async def certificate_expiration(request: web.Request) -> web.Response:
    within, unit = request.match_info["within"], request.match_info["unit"]
    if unit not in EXPIRY_UNITS:
        raise bad_request("Time unit not recognised. Supported units: days, weeks, months, years.")
    if not within.isdigit():
        raise bad_request("Time period must be a positive integer.")
    deadline = time.time() + int(within) * EXPIRY_UNITS[unit]
    config = broker_of(request).config
    expiring = []
    if config.amqps_enabled:
        for path in (config.tls_cert, config.tls_ca_cert):
            not_after = _certificate_not_after(path) if path else None
            if not_after is not None and not_after < deadline:
                expiring.append({"node": node_info.node_name(), "protocol": "amqp/ssl", "port": config.amqps_port,
                                 "certfile": path, "expiry_date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                time.gmtime(not_after))})
    if expiring:
        return _status(False, "Certificates expiring", expired=expiring)
    return _status(True)


async def node_is_quorum_critical(request: web.Request) -> web.Response:
    # A quorum queue here has no Raft group of its own: the cluster's in-sync replicas hold it, and it
    # stays available while one of them survives. So a single node is never critical (as RabbitMQ
    # says of one), and in a cluster only the leader with no other member in sync is: shutting it down
    # leaves its quorum queues with no copy to fail over to.
    cluster_nodes = request.app[CLUSTER_NODES]
    if cluster_nodes is None:
        return json_reply({"status": "ok", "reason": "single node cluster"})
    nodes = cluster_nodes()
    me = next((n for n in nodes if n.get("self")), None)
    if me is None or me.get("role") != "leader" or any(n.get("in_sync") for n in nodes if not n.get("self")):
        return _status(True)
    queues = [{"name": queue.name, "virtual_host": vhost.name, "type": queue.kind}
              for vhost in list(broker_of(request).vhosts.values())
              for queue in list(vhost.queues.values()) if queue.kind == "quorum"]
    if not queues:
        return _status(True)
    return _status(False, "There are quorum queues that would lose their quorum if the target node is shut down",
                   queues=queues)


async def node_is_mirror_sync_critical(request: web.Request) -> web.Response:
    # No classic mirrored queues: never critical.
    if request.app[CLUSTER_NODES] is None:
        return json_reply({"status": "ok", "reason": "single node cluster"})
    return _status(True)


async def metadata_store_initialized(request: web.Request) -> web.Response:
    # Users, vhosts and definitions are loaded before the broker starts listening.
    return _status(True)


def add_routes(app: web.Application) -> None:
    r = app.router
    checks = "/api/health/checks/"
    r.add_get(checks + "is-in-service", is_in_service)
    r.add_get(checks + "protocol-listener/{protocol:.+}", protocol_listener)
    r.add_get(checks + "below-node-connection-limit", below_node_connection_limit)
    r.add_get(checks + "ready-to-serve-clients", ready_to_serve_clients)
    r.add_get(checks + "certificate-expiration/{within}/{unit}", certificate_expiration)
    r.add_get(checks + "node-is-quorum-critical", node_is_quorum_critical)
    r.add_get(checks + "node-is-mirror-sync-critical", node_is_mirror_sync_critical)
    r.add_get(checks + "metadata-store/initialized", metadata_store_initialized)
    r.add_get(checks + "metadata-store/initialized/with-data", metadata_store_initialized)
