"""The exchange base class: bindings bookkeeping and exchange-to-exchange routing.

Each exchange type subclasses `Exchange` and keeps its own routing index up to date through
`_index_add` / `_index_remove`; `match` answers "which destinations do *my* bindings select".
`route` then follows exchange-to-exchange bindings, the same walk RabbitMQ does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from lavinpy.broker.metrics.stats import MessageCounters

from ..errors import PRECONDITION_FAILED, BrokerChannelError

if TYPE_CHECKING:
    from lavinpy.broker.queues.dedup_cache import DedupCache
    from lavinpy.store.record import StoredMessage
    from lavinpy.store.vhost_store import VhostStore


class InvalidBinding(BrokerChannelError, ValueError):
    """A binding's arguments are not acceptable for this exchange type: the channel closes with 406
    and this text, as RabbitMQ does for a bad x-match."""

    def __init__(self, detail: str) -> None:
        super().__init__(PRECONDITION_FAILED, detail)


class Binding(NamedTuple):
    source: Exchange
    destination: Hashable
    routing_key: str
    arguments: dict[str, Any]


# Key identifying a binding: (destination, routing_key, hashable form of the arguments).
BindingKey = tuple[Hashable, str, Hashable]


def freeze_arguments(value: Any) -> Hashable:
    """A hashable, type-aware form of a field table, so argument tables can identify bindings.

    Values are tagged with their type so that True and 1 (equal and same hash in Python) stay
    distinct, as the typed AMQP values are distinct in RabbitMQ's binding identity.
    """
    if isinstance(value, dict):
        return frozenset((k, freeze_arguments(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return ("list", tuple(freeze_arguments(v) for v in value))
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    try:
        hash(value)
    except TypeError:
        return (type(value).__name__, repr(value))
    return (type(value).__name__, value)


class Exchange:
    """An exchange: a name, flags, arguments and bindings to queues or other exchanges.

    Destinations are any hashable objects. An `Exchange` destination is an exchange-to-exchange
    binding; anything else is treated as a queue.
    """

    type: ClassVar[str] = ""
    # Whether the exchange may hold a message back (``hold``): the publish path asks only then.
    holds_messages: ClassVar[bool] = False
    # Whether routing reads the message's properties (``match_properties``): the walk asks only then.
    reads_properties: ClassVar[bool] = False
    # Message deduplication (x-message-deduplication): the vhost opens the cache; the publish path asks it.
    dedup: DedupCache | None = None

    def __init__(
        self,
        name: str,
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments: dict[str, Any] = dict(arguments) if arguments else {}
        # Optional alternate exchange, set by the vhost. As in RabbitMQ it is consulted for every
        # exchange on the routing walk whose own bindings select nothing.
        self.alternate: Exchange | None = None
        self.stats = MessageCounters()
        self._bindings: dict[BindingKey, Binding] = {}
        # Number of bindings per destination: makes unbind_all and bound_destinations cheap.
        self._per_destination: dict[Hashable, int] = {}
        # Bindings whose destination is an exchange; when zero, route() skips the graph walk.
        self._exchange_bindings = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # -- bindings -----------------------------------------------------------------------------

    def bind(self, destination: Hashable, routing_key: str, arguments: dict[str, Any] | None = None) -> bool:
        """Add a binding; True when it is new, False when an identical one already exists."""
        args = dict(arguments) if arguments else {}
        key = (destination, routing_key, freeze_arguments(args))
        if key in self._bindings:
            return False
        self.validate_binding(routing_key, args)
        binding = Binding(self, destination, routing_key, args)
        self._bindings[key] = binding
        self._per_destination[destination] = self._per_destination.get(destination, 0) + 1
        if isinstance(destination, Exchange):
            self._exchange_bindings += 1
        self._index_add(key, binding)
        return True

    def unbind(
        self, destination: Hashable, routing_key: str, arguments: dict[str, Any] | None = None
    ) -> bool:
        """Remove a binding; False when no such binding exists."""
        key = (destination, routing_key, freeze_arguments(dict(arguments) if arguments else {}))
        binding = self._bindings.pop(key, None)
        if binding is None:
            return False
        self._forget(key, binding)
        return True

    def unbind_all(self, destination: Hashable) -> int:
        """Remove every binding to `destination` (e.g. a deleted queue); returns how many."""
        if destination not in self._per_destination:
            return 0
        keys = [k for k in self._bindings if k[0] == destination]
        for key in keys:
            self._forget(key, self._bindings.pop(key))
        return len(keys)

    def _forget(self, key: BindingKey, binding: Binding) -> None:
        destination = binding.destination
        remaining = self._per_destination[destination] - 1
        if remaining:
            self._per_destination[destination] = remaining
        else:
            del self._per_destination[destination]
        if isinstance(destination, Exchange):
            self._exchange_bindings -= 1
        self._index_remove(key, binding)

    def bindings(self) -> list[Binding]:
        return list(self._bindings.values())

    def has_bindings(self) -> bool:
        return bool(self._bindings)

    def bound_destinations(self) -> set[Hashable]:
        return set(self._per_destination)

    # -- routing ------------------------------------------------------------------------------

    def route(self, routing_key: str, headers: dict[str, Any] | None = None,
              properties: bytes | None = None) -> set[Hashable]:
        """The queues a message reaches, following exchange-to-exchange bindings.

        Each exchange is visited at most once per message (so cycles terminate) and each queue
        appears once however many paths lead to it. ``properties`` (the raw property block) is read
        only by exchange types that route on a property.
        """
        if not self._exchange_bindings and self.alternate is None:
            return set(self.match(routing_key, headers))
        queues: set[Hashable] = set()
        visited: set[Exchange] = {self}
        pending: list[Exchange] = [self]
        while pending:
            exchange = pending.pop()
            selected: Collection[Hashable] = (
                exchange.match_properties(routing_key, headers, properties) if exchange.reads_properties
                else exchange.match(routing_key, headers))
            if not selected and exchange.alternate is not None:
                selected = (exchange.alternate,)
            for destination in selected:
                if isinstance(destination, Exchange):
                    if destination not in visited:
                        visited.add(destination)
                        pending.append(destination)
                else:
                    queues.add(destination)
        return queues

    def routes_by_own_bindings(self) -> bool:
        """Whether ``route`` reads only this exchange's own bindings: no exchange-to-exchange binding
        and no alternate could take a message on to a type that routes on its headers or properties."""
        return not self._exchange_bindings and self.alternate is None

    def route_keys(self, keys: list[str], headers: dict[str, Any] | None = None,
                   properties: bytes | None = None) -> set[Hashable]:
        """The queues a message published with several routing keys (its own and the CC/BCC ones) reaches:
        those each key reaches, as RabbitMQ routes on each key of the list."""
        queues: set[Hashable] = set()
        for key in keys:
            queues |= self.route(key, headers, properties)
        return queues

    # -- messages held back, and their life cycle (a delayed exchange's; the others keep nothing) --

    def hold(self, routing_key: str, properties: bytes, body: bytes, headers: dict | None) -> bool:
        """Keep the message to route it later; False: route it now."""
        return False

    def attach(self, store: VhostStore, on_due: Callable[[Exchange, StoredMessage], None]) -> None:
        """The exchange joined a vhost: open what it keeps in ``store``; ``on_due`` routes a released message."""

    def start_timers(self) -> None:
        """The event loop runs: arm the exchange's timers."""

    def close(self) -> None:
        """The vhost is closing: stop the timers (what is kept stays on disk)."""

    def delete(self) -> None:
        """The exchange was deleted: drop what it keeps."""

    # -- per-type hooks -----------------------------------------------------------------------

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        """Destinations (queues and exchanges) selected by this exchange's own bindings.

        The result may be an internal structure: callers must only read it.
        """
        raise NotImplementedError

    def match_properties(self, routing_key: str, headers: dict[str, Any] | None,
                         properties: bytes | None) -> Collection[Hashable]:
        """``match`` for a type that also reads the message's properties (``reads_properties``)."""
        return self.match(routing_key, headers)

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        """Raise InvalidBinding when the binding cannot be added. Most types accept anything."""

    def _index_add(self, key: BindingKey, binding: Binding) -> None:
        raise NotImplementedError

    def _index_remove(self, key: BindingKey, binding: Binding) -> None:
        raise NotImplementedError


def count_add(counts: dict[Hashable, int], destination: Hashable) -> None:
    """Reference-count a destination in a routing index (several bindings may select it)."""
    counts[destination] = counts.get(destination, 0) + 1


def count_remove(counts: dict[Hashable, int], destination: Hashable) -> None:
    remaining = counts[destination] - 1
    if remaining:
        counts[destination] = remaining
    else:
        del counts[destination]
