"""The rules of exchange.declare and queue.declare, with RabbitMQ's replies.

The vhost applies them to every declaration (AMQP, HTTP, recovery aside); the definitions import
applies the same ones to a whole document before it changes anything, so both refuse the same things
with the same texts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ACCESS_REFUSED, PRECONDITION_FAILED, BrokerChannelError
from .exchanges.registry import UnknownExchangeType, make_exchange
from .queues.stream_arguments import validate_stream_declare
from .settings.arguments import ArgumentError, queue_type_of, validate_exchange_arguments, validate_queue_arguments
from .settings.equivalence import check_arguments, inequivalent
from .settings.names import check_name_length
from .settings.quorum_arguments import validate_quorum_declare
from .settings.refused_arguments import refusal_text, refused_argument

if TYPE_CHECKING:
    from .exchanges.base import Exchange


_EXCHANGE_DECLARE = (40, 10)
_QUEUE_DECLARE = (50, 10)


def default_exchange_refused() -> BrokerChannelError:
    return BrokerChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")


def check_exchange_name(name: str, *, exists: bool) -> None:
    """The default exchange is not declared; a new exchange's name may not start with ``amq.``."""
    if name == "":
        raise default_exchange_refused()
    check_name_length("exchange name", name)
    if name.startswith("amq.") and not exists:
        raise BrokerChannelError(ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'")


def check_exchange_equivalent(existing: Exchange, vhost: str, type_name: str, durable: bool, auto_delete: bool,
                              internal: bool, arguments: dict[str, Any]) -> None:
    """A redeclaration must match the exchange (406 inequivalent arg); a built-in one of its type always does."""
    name = existing.name
    if name == "" or (name.startswith("amq.") and existing.type == type_name):
        return
    for arg, received, current in (("type", type_name, existing.type),
                                   ("durable", durable, existing.durable),
                                   ("auto_delete", auto_delete, existing.auto_delete),
                                   ("internal", internal, existing.internal)):
        if received != current:
            raise inequivalent(arg, "exchange", name, vhost, received, current)
    check_arguments("exchange", name, vhost, arguments, existing.arguments)


def new_exchange(type_name: str, name: str, *, durable: bool, auto_delete: bool, internal: bool,
                 arguments: dict[str, Any]) -> Exchange:
    """The exchange a declaration makes. An unknown type closes the channel with 406, as RabbitMQ 4 does
    (3.x closed the connection with 503 COMMAND_INVALID); bad arguments 406 too."""
    refused = refused_argument("exchange", arguments)
    if refused is not None:
        raise BrokerChannelError(PRECONDITION_FAILED, refusal_text(refused, f"exchange '{name}'"), *_EXCHANGE_DECLARE)
    try:
        validate_exchange_arguments(arguments, f"exchange '{name}'")
        return make_exchange(type_name, name, durable=durable, auto_delete=auto_delete, internal=internal,
                             arguments=arguments)
    except UnknownExchangeType:
        raise BrokerChannelError(PRECONDITION_FAILED, f"unknown exchange type '{type_name}'",
                                 *_EXCHANGE_DECLARE) from None
    except ArgumentError as e:
        raise BrokerChannelError(PRECONDITION_FAILED, e.text) from None


def check_queue_name(name: str, *, exists: bool, server_named: bool = False) -> None:
    """A client may not name a new queue ``amq.*`` (server-generated names use that prefix)."""
    check_name_length("queue name", name)
    if not exists and name.startswith("amq.") and not server_named:
        raise BrokerChannelError(ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'")


def check_queue_equivalent(existing_durable: bool, existing_auto_delete: bool, existing_arguments: dict[str, Any],
                           name: str, vhost: str, durable: bool, auto_delete: bool,
                           arguments: dict[str, Any]) -> None:
    """A redeclaration must match the queue's flags and arguments (406 inequivalent arg)."""
    for arg, received, current in (("durable", durable, existing_durable),
                                   ("auto_delete", auto_delete, existing_auto_delete)):
        if received != current:
            raise inequivalent(arg, "queue", name, vhost, received, current)
    # RabbitMQ 4 writes the default type into a declaration without one, so "classic" given or left out
    # are the same, and a quorum queue redeclared without its type differs as 'classic'.
    received_type, current_type = queue_type_of(arguments), queue_type_of(existing_arguments)
    if received_type != current_type:
        raise inequivalent("x-queue-type", "queue", name, vhost, received_type, current_type)
    check_arguments("queue", name, vhost, _without_type(arguments), _without_type(existing_arguments))


def _without_type(arguments: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in arguments.items() if key != "x-queue-type"}


def validate_queue_declare(name: str, vhost: str, *, durable: bool, exclusive: bool, auto_delete: bool,
                           arguments: dict[str, Any], server_named: bool = False) -> str:
    """Refuse a new queue's flags and arguments as RabbitMQ does (406), and the arguments lavinpy does
    not honour (``refused_arguments``); returns the queue type."""
    refused = refused_argument("queue", arguments)
    if refused is not None:
        raise BrokerChannelError(PRECONDITION_FAILED, refusal_text(refused, f"queue '{name}' in vhost '{vhost}'"),
                                 *_QUEUE_DECLARE)
    queue_type = queue_type_of(arguments)
    if queue_type == "stream":
        if server_named:
            raise BrokerChannelError(PRECONDITION_FAILED, "Cannot declare a server-named queue for type stream")
        validate_stream_declare(name, vhost, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                                arguments=arguments)
        return queue_type
    if queue_type == "quorum":
        validate_quorum_declare(name, vhost, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                                arguments=arguments, server_named=server_named)
        return queue_type
    try:
        validate_queue_arguments(arguments, queue=name, vhost=vhost, durable=durable, exclusive=exclusive,
                                 auto_delete=auto_delete)
    except ArgumentError as e:
        raise BrokerChannelError(PRECONDITION_FAILED, e.text) from None
    return queue_type


def with_default_queue_type(arguments: dict[str, Any], default_queue_type: str | None, *, durable: bool,
                            exclusive: bool, auto_delete: bool) -> dict[str, Any]:
    """A declaration's arguments with its vhost's default queue type written in, as RabbitMQ 4 does.

    Only when the client gave no x-queue-type and the vhost has a default; a declaration the default
    type cannot take (quorum and stream: durable, not exclusive, not auto-delete) gets classic instead.
    """
    if "x-queue-type" in arguments or default_queue_type in (None, "", "undefined"):
        return arguments
    fits = default_queue_type == "classic" or (durable and not exclusive and not auto_delete)
    return {**arguments, "x-queue-type": default_queue_type if fits else "classic"}
