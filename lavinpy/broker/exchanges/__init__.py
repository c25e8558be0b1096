"""Exchange types, one module each, and the registry that names them."""

from lavinpy.broker.exchanges.base import Binding, Exchange, InvalidBinding
from lavinpy.broker.exchanges.direct import DirectExchange
from lavinpy.broker.exchanges.fanout import FanoutExchange
from lavinpy.broker.exchanges.headers import HeadersExchange
from lavinpy.broker.exchanges.registry import EXCHANGE_TYPES, UnknownExchangeType, make_exchange
from lavinpy.broker.exchanges.topic import TopicExchange

__all__ = [
    "EXCHANGE_TYPES",
    "Binding",
    "DirectExchange",
    "Exchange",
    "FanoutExchange",
    "HeadersExchange",
    "InvalidBinding",
    "TopicExchange",
    "UnknownExchangeType",
    "make_exchange",
]
