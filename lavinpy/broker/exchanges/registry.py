"""Exchange types by AMQP type name. A plain dict so other modules can register more types."""

from __future__ import annotations

from typing import Any

from lavinpy.broker.exchanges.base import Exchange
from lavinpy.broker.exchanges.consistent_hash import ConsistentHashExchange
from lavinpy.broker.exchanges.delayed import DelayedExchange
from lavinpy.broker.exchanges.direct import DirectExchange
from lavinpy.broker.exchanges.fanout import FanoutExchange
from lavinpy.broker.exchanges.federation_upstream import FederationUpstreamExchange
from lavinpy.broker.exchanges.headers import HeadersExchange
from lavinpy.broker.exchanges.topic import TopicExchange


class UnknownExchangeType(ValueError):
    """exchange.declare named a type no module registered (AMQP 503 command-invalid)."""


EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    DirectExchange.type: DirectExchange,
    FanoutExchange.type: FanoutExchange,
    TopicExchange.type: TopicExchange,
    HeadersExchange.type: HeadersExchange,
    DelayedExchange.type: DelayedExchange,  # x-delayed-message (the delayed-message plugin's contract)
    ConsistentHashExchange.type: ConsistentHashExchange,  # x-consistent-hash (the plugin's, and LavinMQ's)
    FederationUpstreamExchange.type: FederationUpstreamExchange,  # x-federation-upstream (federation links')
}


def make_exchange(type_name: str, name: str, **kwargs: Any) -> Exchange:
    """A new exchange of the registered type `type_name`; kwargs go to the constructor."""
    exchange_class = EXCHANGE_TYPES.get(type_name)
    if exchange_class is None:
        raise UnknownExchangeType(f"unknown exchange type '{type_name}'")
    return exchange_class(name, **kwargs)
