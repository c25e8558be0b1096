"""Fanout exchange: every binding matches, whatever the routing key and headers."""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any

from lavinpy.broker.exchanges.base import Binding, BindingKey, Exchange, count_add, count_remove


class FanoutExchange(Exchange):
    type = "fanout"

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._destinations: dict[Hashable, int] = {}

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        return self._destinations

    def _index_add(self, key: BindingKey, binding: Binding) -> None:
        count_add(self._destinations, binding.destination)

    def _index_remove(self, key: BindingKey, binding: Binding) -> None:
        count_remove(self._destinations, binding.destination)
