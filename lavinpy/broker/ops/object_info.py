"""Exchanges, queues and bindings as RabbitMQ's management API describes them (JSON-ready dicts)."""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ...wire.properties import PropertiesError, peek_timestamp
from ..exchanges.base import Exchange, freeze_arguments
from ..metrics.stats import EXCHANGE_FIELDS, QUEUE_FIELDS, counters_stats
from ..settings.operator_policies import queue_policy_info
from .node_info import node_name

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ...store.record import StoredMessage
    from ..queues.base import QueueKind
    from ..queues.queue_consumer import QueueConsumer
    from ..vhost import VHost


def jsonable(value: Any) -> Any:
    """An AMQP field value as JSON: bytes as text (or base64), decimals and timestamps as numbers."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    return value


def exchange_info(vhost: VHost, exchange: Exchange) -> dict[str, Any]:
    policy = vhost.policies.match(exchange.name, "exchange") if exchange.name else None
    info = {
        "name": exchange.name,
        "vhost": vhost.name,
        "type": exchange.type,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": jsonable(exchange.arguments),
        "user_who_performed_action": "",
        "message_stats": counters_stats(exchange.stats, EXCHANGE_FIELDS),
    }
    if policy is not None:  # RabbitMQ leaves the key out of an exchange no policy applies to
        info["policy"] = policy.name
    if exchange.dedup is not None:
        info["deduplication"] = exchange.dedup.info(exchange.stats.duplicates)
    return info


def _policy_info(queue: QueueKind) -> dict[str, Any]:
    # A queue's host is a VHost in the broker (policies and operator policies); test hosts may have none.
    policies = getattr(queue.vhost, "policies", None)
    operators = getattr(queue.vhost, "operator_policies", None)
    return queue_policy_info(policies.match(queue.name, "queue", queue.kind) if policies else None,
                             operators.match(queue.name, "queue", queue.kind) if operators else None)


def _timestamp_property(message: StoredMessage | None) -> int | None:
    if message is None:
        return None
    try:
        return peek_timestamp(message.properties)
    except PropertiesError:
        return None  # a statistics read reports nothing: the delivery path reports a damaged message


def _consumer_capacity(consumers: Iterable[QueueConsumer]) -> float:
    # RabbitMQ's figure is the share of time a consumer could take a message at once; lavinpy gives
    # that indicator's value now: 1.0 when some consumer has prefetch and channel room, else 0.0.
    return 1.0 if any(c.can_accept() for c in consumers) else 0.0


def queue_info(queue: QueueKind, now_ms: int | None = None) -> dict[str, Any]:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    ready = queue.message_count
    unacked = queue.unacked_count
    head_message = queue.head_message()
    head = head_message.timestamp if head_message is not None else None
    info: dict[str, Any] = {
        "name": queue.name,
        "vhost": queue.vhost.name,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive,
        "arguments": jsonable(queue.arguments),
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "consumers": queue.consumer_count,
        "state": "running",
        "type": queue.kind,
        "policy": queue.settings.policy,
        **_policy_info(queue),
        "node": node_name(),
        # RabbitMQ's tag of the consumer that holds the queue exclusively, null when none does
        "exclusive_consumer_tag": next((c.tag for c in queue.consumers if c.exclusive), None),
        "head_message_age_ms": max(0, now_ms - head) if head is not None else None,
        "consumer_capacity": _consumer_capacity(queue.consumers) if queue.consumers else 0,
        "message_stats": counters_stats(queue.stats, QUEUE_FIELDS),
    }
    # Figures a queue kind does not keep are left out, as RabbitMQ leaves them out (a null cell breaks
    # rabbitmqadmin's tables); so is utilisation without a consumer.
    if queue.consumers:
        info["consumer_utilisation"] = info["consumer_capacity"]
    if queue.dedup is not None:
        info["deduplication"] = queue.dedup.info(queue.stats.duplicates)
    if queue.settings.retry is not None or queue.delayed_count:
        # held for a delayed retry (counted in messages_unacknowledged too) and the returns held so far
        info["messages_delayed"] = queue.delayed_count
        info["message_stats"]["delayed_retries"] = queue.stats.retried
    stamp = _timestamp_property(head_message)  # the head message's timestamp property (seconds)
    if stamp is not None:
        info["head_message_timestamp"] = stamp
    persistent = queue.persistent_count()
    if persistent is not None:
        info["messages_persistent"] = persistent
    memory = queue.memory_bytes()
    if memory is not None:
        info["memory"] = memory
    if queue.kind == "quorum":  # RabbitMQ's replica figures; this node holds the queue (see docs/migration.md)
        info.update(leader=info["node"], members=[info["node"]], online=[info["node"]])
    return info


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's binding properties key: the routing key, plus "~" and a hash of the arguments.

    "~" is escaped inside the key so the parts cannot be confused; an empty key without arguments is "~".
    """
    quoted = quote(routing_key, safe="")
    if not arguments:
        return quoted or "~"
    digest = hashlib.sha256(repr(freeze_arguments(arguments)).encode()).digest()[:9]
    return quoted + "~" + base64.urlsafe_b64encode(digest).decode()


def binding_info(vhost: VHost, source: str, destination: str, destination_type: str, routing_key: str,
                 arguments: dict[str, Any]) -> dict[str, Any]:
    return {"source": source, "vhost": vhost.name, "destination": destination,
            "destination_type": destination_type, "routing_key": routing_key,
            "arguments": jsonable(arguments), "properties_key": properties_key(routing_key, arguments)}


def vhost_bindings(vhost: VHost) -> list[dict[str, Any]]:
    """Every binding of a vhost, with the default exchange's implicit one to each queue first."""
    out = [binding_info(vhost, "", name, "queue", name, {}) for name in vhost.queues]
    for exchange in vhost.exchanges.values():
        if exchange.name == "":
            continue
        for b in exchange.bindings():
            dest = b.destination
            kind = "exchange" if isinstance(dest, Exchange) else "queue"
            name = dest.name  # type: ignore[attr-defined]  # an exchange or a queue: both are named
            out.append(binding_info(vhost, exchange.name, name, kind, b.routing_key, b.arguments))
    return out
