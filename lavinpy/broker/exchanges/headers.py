"""Headers exchange: bindings match on message headers, per the binding's `x-match` mode.

Follows RabbitMQ's rules:
- `x-match` is `all` (the default), `any`, `all-with-x` or `any-with-x`; anything else is refused
  at bind time. The `x-match` argument itself never takes part in matching; other arguments whose
  names start with `x-` are ignored unless the mode ends in `-with-x`.
- A binding argument with a void value (None) only requires the header to be present.
- `all` with nothing left to compare matches every message; `any` with nothing matches none.
- Values compare as RabbitMQ's Erlang `==` does: numbers by value (1 == 1.0), booleans only
  with booleans (True != 1), short and long strings by content (str and bytes alike).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from decimal import Decimal
from typing import Any

from lavinpy.broker.exchanges.base import Binding, BindingKey, Exchange, InvalidBinding

MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")

# Marks a binding argument that only requires presence of the header.
_PRESENT = object()
# Tags that keep booleans and decimals from comparing equal to plain numbers.
_BOOL = object()
_DECIMAL = object()


def comparable(value: Any) -> Any:
    """A form of an AMQP field value where Python equality follows RabbitMQ's comparison."""
    kind = type(value)
    if kind is str:
        return value.encode()
    if kind is bool:
        return (_BOOL, value)
    if kind is int or kind is float or kind is bytes:
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, Decimal):
        return (_DECIMAL, value)
    if isinstance(value, dict):
        return {comparable(k): comparable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [comparable(v) for v in value]
    return value


def match_mode(arguments: dict[str, Any]) -> str:
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes | bytearray):
        mode = bytes(mode).decode("utf-8", "replace")
    return mode


class _Matcher:
    """One binding's arguments compiled for matching."""

    __slots__ = ("match_all", "pattern", "destination")

    def __init__(self, destination: Hashable, arguments: dict[str, Any]) -> None:
        mode = match_mode(arguments)
        with_x = mode.endswith("-with-x")
        self.destination = destination
        self.match_all = mode.startswith("all")
        self.pattern: tuple[tuple[str, Any], ...] = tuple(
            (name, _PRESENT if value is None else comparable(value))
            for name, value in arguments.items()
            if name != "x-match" and (with_x or not name.startswith("x-"))
        )

    def matches(self, headers: dict[str, Any]) -> bool:
        if self.match_all:
            for name, expected in self.pattern:
                if name not in headers:
                    return False
                if expected is not _PRESENT and comparable(headers[name]) != expected:
                    return False
            return True
        for name, expected in self.pattern:
            if name in headers and (expected is _PRESENT or comparable(headers[name]) == expected):
                return True
        return False


class HeadersExchange(Exchange):
    type = "headers"

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._matchers: dict[BindingKey, _Matcher] = {}

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        mode = arguments.get("x-match")
        if mode is None:
            return
        if not isinstance(mode, str | bytes | bytearray):
            raise InvalidBinding(f"Invalid x-match field type {type(mode).__name__}; expected a string")
        if match_mode(arguments) not in MATCH_MODES:
            raise InvalidBinding(
                f"Invalid x-match field value {mode!r}; expected all, any, all-with-x, or any-with-x"
            )

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        if headers is None:
            headers = {}
        found: set[Hashable] = set()
        for matcher in self._matchers.values():
            if matcher.destination not in found and matcher.matches(headers):
                found.add(matcher.destination)
        return found

    def _index_add(self, key: BindingKey, binding: Binding) -> None:
        self._matchers[key] = _Matcher(binding.destination, binding.arguments)

    def _index_remove(self, key: BindingKey, binding: Binding) -> None:
        del self._matchers[key]
