"""Where a message goes in one vhost: the exchange's bindings, the CC and BCC headers, and the chain of
alternate exchanges when nothing matched. Apart from publishing, so dead-lettering and the delayed
exchange's due messages route the same way without knowing the vhost."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..wire.properties import replace_headers

if TYPE_CHECKING:
    from .exchanges.base import Exchange


class Routing:
    """The routing of one vhost over its exchanges (the vhost's dict, read as it changes)."""

    def __init__(self, exchanges: Mapping[str, Exchange]) -> None:
        self.exchanges = exchanges
        self.alternates: dict[str, str] = {}  # exchange name -> its alternate exchange's name

    def set_alternate(self, exchange: str, alternate: str | None) -> None:
        """Give ``exchange`` an alternate exchange (a policy's or its argument's), or none."""
        if alternate:
            self.alternates[exchange] = alternate
        else:
            self.alternates.pop(exchange, None)

    def route(self, exchange: Exchange, routing_key: str, headers: dict | None,
              properties: bytes | None = None) -> set:
        """The queues a message reaches from ``exchange`` (``properties``: for the types that hash on one)."""
        keys = _routing_keys(routing_key, headers) if headers else None
        if keys is None:
            queues = exchange.route(routing_key, headers, properties)
        else:
            queues = exchange.route_keys(keys, headers, properties)
        seen = {exchange.name}
        while not queues:
            # Unroutable: follow the alternate-exchange chain, each exchange once.
            ae_name = self.alternates.get(exchange.name)
            if not ae_name or ae_name in seen:
                break
            seen.add(ae_name)
            alternate = self.exchanges.get(ae_name)
            if alternate is None:
                break
            exchange = alternate
            queues = (exchange.route(routing_key, headers, properties) if keys is None
                      else exchange.route_keys(keys, headers, properties))
        return queues

    def route_message(self, exchange: Exchange, routing_key: str, properties: bytes,
                      headers: dict | None) -> tuple[Any, bytes]:
        """The queues a message reaches, and its properties without the BCC header."""
        queues = self.route(exchange, routing_key, headers, properties)
        if headers and "BCC" in headers:
            headers = dict(headers)
            del headers["BCC"]
            properties = replace_headers(properties, headers)
        return queues, properties


def _routing_keys(routing_key: str, headers: dict) -> list[str] | None:
    """The routing key with the CC and BCC keys after it, or None when the message names no other key."""
    keys: list[str] | None = None
    for name in ("CC", "BCC"):
        extra = headers.get(name)
        if isinstance(extra, list):
            for key in extra:
                if isinstance(key, (str, bytes)):
                    if keys is None:
                        keys = [routing_key]
                    keys.append(key.decode() if isinstance(key, bytes) else key)
    return keys
