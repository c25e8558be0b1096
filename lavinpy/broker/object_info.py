"""Exchanges, queues and bindings as RabbitMQ's management API describes them (JSON-ready dicts)."""

from __future__ import annotations

import base64
import datetime
import decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .exchanges.base import Exchange
    from .vhost import VHost


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
    return {
        "name": exchange.name,
        "vhost": vhost.name,
        "type": exchange.type,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": jsonable(exchange.arguments),
        "policy": policy.name if policy else None,
        "user_who_performed_action": "",
    }
