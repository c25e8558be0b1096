"""Direct exchange: a binding matches when its routing key equals the message's."""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any

from lavinpy.broker.exchanges.base import Binding, BindingKey, Exchange, count_add, count_remove

_NOTHING: dict[Hashable, int] = {}


class DirectExchange(Exchange):
    type = "direct"

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        # routing key -> {destination: number of bindings}; one dict lookup per message.
        self._routes: dict[str, dict[Hashable, int]] = {}

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        return self._routes.get(routing_key, _NOTHING)

    def _index_add(self, key: BindingKey, binding: Binding) -> None:
        count_add(self._routes.setdefault(binding.routing_key, {}), binding.destination)

    def _index_remove(self, key: BindingKey, binding: Binding) -> None:
        counts = self._routes[binding.routing_key]
        count_remove(counts, binding.destination)
        if not counts:
            del self._routes[binding.routing_key]
