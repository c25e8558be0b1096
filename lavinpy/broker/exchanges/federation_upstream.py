"""The ``x-federation-upstream`` exchange RabbitMQ's federation links declare on their upstream.

It routes as fanout to its bindings (the link's queue), except a message that has already crossed
``x-max-hops`` links or already passed the link's downstream (``x-downstream-name`` and
``x-downstream-vhost`` in an ``x-received-from`` entry): such a message would loop, so it goes nowhere
and never leaves this broker. With it, lavinpy is an upstream for RabbitMQ's plugin and for lavinpy's
links as RabbitMQ is.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from typing import Any

from lavinpy.broker.exchanges.fanout import FanoutExchange

RECEIVED_FROM = "x-received-from"


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes | bytearray) else value


class FederationUpstreamExchange(FanoutExchange):
    type = "x-federation-upstream"

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        args = self.arguments
        hops = args.get("x-max-hops", 1)
        self.max_hops = hops if isinstance(hops, int) and not isinstance(hops, bool) else 1
        self.downstream = (_text(args.get("x-downstream-name")), _text(args.get("x-downstream-vhost")))

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        trail = headers.get(RECEIVED_FROM) if headers else None
        if isinstance(trail, list):
            if len(trail) >= self.max_hops:
                return ()
            for entry in trail:
                if isinstance(entry, Mapping) and (
                        _text(entry.get("cluster-name")), _text(entry.get("vhost"))) == self.downstream:
                    return ()
        return self._destinations
