"""Declare, delete, bind, unbind and purge, with their permission checks (RabbitMQ's rules).

``actor`` is the acting user (None: a trusted internal caller, no checks). ``owner`` is the AMQP
connection declaring or touching a queue (None over HTTP): an exclusive queue is locked (405) to every
other owner, as RabbitMQ's API, which also acts through a connection of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..access.actor import Actor
from ..declarations import validate_queue_declare
from ..errors import NOT_FOUND, BrokerChannelError
from ..settings.names import check_name_length

if TYPE_CHECKING:
    from ..exchanges.base import Exchange
    from ..queues.base import QueueKind
    from ..vhost import VHost


def _check(actor: Actor | None, kind: str, resource_type: str, name: str, vhost: VHost) -> None:
    if actor is not None:
        actor.check(kind, resource_type, name, vhost.name)


def _check_binding_key(actor: Actor | None, vhost: VHost, source: str, routing_key: str) -> None:
    """A bind or unbind to a topic exchange: the binding key against the user's topic ``read``
    permission on it (RabbitMQ's "read access to topic ..."). A missing source is left to the bind (404).
    A key longer than 255 bytes (AMQP's short string) is refused first (406)."""
    check_name_length("routing key", routing_key)
    if actor is not None:
        exchange = vhost.exchanges.get(source)
        if exchange is not None and exchange.type == "topic":
            actor.check_topic("read", vhost.name, source, exchange.type, routing_key)


# --- exchanges -------------------------------------------------------------------------------------

def declare_exchange(actor: Actor | None, vhost: VHost, name: str, type_name: str, *, passive: bool = False,
                     durable: bool = False, auto_delete: bool = False, internal: bool = False,
                     arguments: dict[str, Any] | None = None) -> Exchange:
    """Configure permission on the exchange; an alternate-exchange argument also needs read on it
    and write on the alternate."""
    arguments = dict(arguments or {})
    if not passive and actor is not None:
        actor.check("configure", "exchange", name, vhost.name)
        if name:
            actor.permissions(vhost.name).check_exchange_declare(name, arguments)
    return vhost.declare_exchange(name, type_name, passive=passive, durable=durable, auto_delete=auto_delete,
                                  internal=internal, arguments=arguments)


def get_exchange(actor: Actor | None, vhost: VHost, name: str) -> Exchange:
    """An exchange to look at (the vhost's visibility was checked when it was opened)."""
    return vhost.get_exchange(name)


def delete_exchange(actor: Actor | None, vhost: VHost, name: str, *, if_unused: bool = False,
                    missing_ok: bool = True) -> None:
    """AMQP deletes a missing exchange quietly (``missing_ok``); the HTTP API answers 404."""
    _check(actor, "configure", "exchange", name, vhost)
    if not missing_ok:
        vhost.get_exchange(name)
    vhost.delete_exchange(name, if_unused=if_unused)


def bind_exchange(actor: Actor | None, vhost: VHost, destination: str, source: str, routing_key: str,
                  arguments: dict[str, Any] | None) -> None:
    _check(actor, "write", "exchange", destination, vhost)
    _check(actor, "read", "exchange", source, vhost)
    _check_binding_key(actor, vhost, source, routing_key)
    vhost.bind_exchange(destination, source, routing_key, arguments)


def unbind_exchange(actor: Actor | None, vhost: VHost, destination: str, source: str, routing_key: str,
                    arguments: dict[str, Any] | None) -> None:
    _check(actor, "write", "exchange", destination, vhost)
    _check(actor, "read", "exchange", source, vhost)
    _check_binding_key(actor, vhost, source, routing_key)
    vhost.unbind_exchange(destination, source, routing_key, arguments)


# --- queues ----------------------------------------------------------------------------------------

def declare_queue(actor: Actor | None, vhost: VHost, name: str, *, owner: object, passive: bool = False,
                  durable: bool = False, exclusive: bool = False, auto_delete: bool = False,
                  arguments: dict[str, Any] | None = None, server_named: bool = False) -> QueueKind:
    """Configure permission on the queue; a dead-letter-exchange argument also needs read on the
    queue and write on that exchange."""
    arguments = dict(arguments or {})
    if not passive and actor is not None:
        actor.check("configure", "queue", name, vhost.name)
        actor.permissions(vhost.name).check_queue_declare(name, arguments)
    return vhost.declare_queue(name, owner=owner, passive=passive, durable=durable, exclusive=exclusive,
                               auto_delete=auto_delete, arguments=arguments, server_named=server_named)


def owned_queue(vhost: VHost, name: str, owner: object) -> QueueKind:
    """The queue (404 when missing), refused with 405 when another connection holds it exclusively."""
    queue = vhost.get_queue(name)
    vhost.check_exclusive(queue, owner)
    return queue


def readable_queue(actor: Actor | None, vhost: VHost, name: str, owner: object) -> QueueKind:
    """A queue to consume or get from, or to purge: read permission."""
    _check(actor, "read", "queue", name, vhost)
    return owned_queue(vhost, name, owner)


def get_queue(actor: Actor | None, vhost: VHost, name: str) -> QueueKind:
    """A queue to look at (the vhost's visibility was checked when it was opened)."""
    return vhost.get_queue(name)


def purge_queue(actor: Actor | None, vhost: VHost, name: str, owner: object) -> int:
    return readable_queue(actor, vhost, name, owner).purge()


def delete_queue(actor: Actor | None, vhost: VHost, name: str, *, owner: object, if_unused: bool = False,
                 if_empty: bool = False, missing_ok: bool = True) -> int:
    """Delete a queue; returns the messages it held. AMQP deletes a missing queue quietly."""
    _check(actor, "configure", "queue", name, vhost)
    queue = vhost.queues.get(name)
    if queue is None:
        if not missing_ok:
            raise BrokerChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{vhost.name}'")
        return 0
    vhost.check_exclusive(queue, owner)
    return vhost.delete_queue(name, if_unused=if_unused, if_empty=if_empty)


def set_queue_expiry(actor: Actor | None, vhost: VHost, name: str, expires_ms: int | None, owner: object) -> None:
    """Change a queue's ``x-expires`` (None: it never expires), as RabbitMQ's MQTT plugin does when a
    session's expiry interval changes: configure permission on the queue; the new arguments are checked
    as a declare's are (406: a stream has no x-expires, it is at least 1 ms)."""
    _check(actor, "configure", "queue", name, vhost)
    queue = owned_queue(vhost, name, owner)
    arguments = {key: value for key, value in queue.arguments.items() if key != "x-expires"}
    if expires_ms is not None:
        arguments["x-expires"] = expires_ms
    if arguments != queue.arguments:
        validate_queue_declare(name, vhost.name, durable=queue.durable, exclusive=queue.exclusive,
                               auto_delete=queue.auto_delete, arguments=arguments)
        vhost.set_queue_arguments(queue, arguments)


def bind_queue(actor: Actor | None, vhost: VHost, queue: str, exchange: str, routing_key: str,
               arguments: dict[str, Any] | None, owner: object) -> None:
    _check(actor, "write", "queue", queue, vhost)
    _check(actor, "read", "exchange", exchange, vhost)
    _check_binding_key(actor, vhost, exchange, routing_key)
    owned_queue(vhost, queue, owner)
    vhost.bind_queue(queue, exchange, routing_key, arguments)


def unbind_queue(actor: Actor | None, vhost: VHost, queue: str, exchange: str, routing_key: str,
                 arguments: dict[str, Any] | None, owner: object) -> None:
    _check(actor, "write", "queue", queue, vhost)
    _check(actor, "read", "exchange", exchange, vhost)
    _check_binding_key(actor, vhost, exchange, routing_key)
    existing = vhost.queues.get(queue)
    if existing is not None:  # unbinding from a queue that is gone is fine (as RabbitMQ)
        vhost.check_exclusive(existing, owner)
    vhost.unbind_queue(queue, exchange, routing_key, arguments)
