"""Broker operations shared by every face (AMQP channels, MQTT connections, the HTTP API).

Each takes the acting user (an ``Actor``; None for a trusted internal caller), checks its
permissions and the arguments, and raises ``errors.BrokerError`` with RabbitMQ's kinds and texts.
Faces only translate their input into these calls and the results into their replies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..access.actor import Actor
from ..errors import ACCESS_REFUSED, NOT_FOUND, BrokerChannelError

if TYPE_CHECKING:
    from ..broker import Broker
    from ..connections import ClientConnection
    from ..vhost import VHost


def vhost_not_found(name: str) -> BrokerChannelError:
    return BrokerChannelError(NOT_FOUND, f"no vhost '{name}'")


def can_see_vhost(actor: Actor | None, name: str) -> bool:
    """As RabbitMQ: monitoring and administrator users see every vhost, others those they may open."""
    return actor is None or actor.can_monitor() or actor.can_access_vhost(name)


def visible_vhosts(broker: Broker, actor: Actor | None) -> list[VHost]:
    return [v for name, v in broker.vhosts.items() if can_see_vhost(actor, name)]


def open_vhost(broker: Broker, actor: Actor | None, name: str) -> VHost:
    """The named vhost when the actor may see it: 404 when missing, 403 when hidden from the actor."""
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise vhost_not_found(name)
    if not can_see_vhost(actor, name):
        assert actor is not None
        raise BrokerChannelError(ACCESS_REFUSED, f"access to vhost '{name}' refused for user '{actor.name}'")
    return vhost


def can_see_connection(actor: Actor | None, user: str) -> bool:
    """As RabbitMQ: monitoring and administrator users see every connection, others their own."""
    return actor is None or actor.can_monitor() or user == actor.name


def check_close_connection(actor: Actor | None, user: str, name: str) -> None:
    """Closing a connection through the API: its own user or an administrator (403 otherwise)."""
    if actor is not None and user != actor.name and not actor.is_admin():
        raise BrokerChannelError(ACCESS_REFUSED, f"user '{actor.name}' may not close connection '{name}'")


def vhosts_in_scope(broker: Broker, actor: Actor | None, name: str | None) -> list[VHost]:
    """One vhost (checked) or, with no name, every vhost the actor may see."""
    return [open_vhost(broker, actor, name)] if name is not None else visible_vhosts(broker, actor)


# --- the connections of every face (broker.connections), as an actor may see and close them ------------
def visible_connections(broker: Broker, actor: Actor | None, vhost: str | None = None) -> list[ClientConnection]:
    """The logged-in connections of every face the actor may see, optionally of one vhost."""
    return [c for c in broker.connections.listed(vhost) if can_see_connection(actor, c.user)]


def find_connection(broker: Broker, actor: Actor | None, name: str) -> ClientConnection:
    """The connection the API names, of any face: 404 when there is none the actor may see."""
    for connection in visible_connections(broker, actor):
        if connection.name == name:
            return connection
    raise BrokerChannelError(NOT_FOUND, f"no connection '{name}'")


def close_connection(broker: Broker, actor: Actor | None, name: str, reason: str | None) -> None:
    """Close a connection through the API (its own user or an administrator), as its face closes one."""
    connection = find_connection(broker, actor, name)
    check_close_connection(actor, connection.user, name)
    connection.close(reason)


def visible_consumers(broker: Broker, actor: Actor | None, node: str, vhost: str | None = None) -> list[dict[str, Any]]:
    """Every consumer on the connections of vhosts the actor may see (as RabbitMQ), of every face."""
    rows: list[dict[str, Any]] = []
    for connection in broker.connections.listed(vhost):
        if connection.vhost is not None and can_see_vhost(actor, connection.vhost):
            rows += connection.consumer_infos(node)
    return rows
