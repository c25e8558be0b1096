"""The default exchange (""): every queue is bound to it by its own name; no explicit bindings."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from .base import Exchange


class DefaultExchange(Exchange):
    type = "direct"

    def __init__(self, lookup_queue: Callable[[str], Any]) -> None:
        super().__init__("", durable=True)
        self._lookup_queue = lookup_queue

    def route(self, routing_key: str, headers: dict[str, Any] | None = None,
              properties: bytes | None = None) -> set[Hashable]:
        queue = self._lookup_queue(routing_key)
        return {queue} if queue is not None else set()
