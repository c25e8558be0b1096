"""Exchange type ``x-consistent-hash``: each message goes to one bound destination, picked by a hash.

The contract of RabbitMQ's rabbitmq_consistent_hash_exchange plugin (and LavinMQ's type of the same
name):

- A binding's key is its weight, an integer from 1 to 10000 as a string; anything else is refused at
  bind time with the plugin's texts (406). A destination bound several times weighs the sum.
- A message hashes on its routing key; or, with the exchange argument ``hash-header`` (LavinMQ spells
  it ``x-hash-on``), on that header; or, with ``hash-property``, on the property ``message_id``,
  ``correlation_id`` or ``timestamp``. A message without the header or property hashes as an empty
  value: all such messages go to one destination, as the plugin's do.

The hash ring: each destination owns ``POINTS_PER_WEIGHT`` points per unit of weight, placed by a
hash of the destination's name and the point's number; a message's hash picks the first point after
it (wrapping). Unlike the plugin's, whose buckets follow the order bindings were made,
the ring depends only on which destinations are bound with which weights: the same key reaches the
same queue after a restart whatever order the bindings come back in, and binding or unbinding a
destination moves only the keys of that destination's share. The ring is rebuilt, once, on the
first message after a binding change (a restart replaying many bindings builds it once).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Collection, Hashable
from hashlib import blake2b
from struct import Struct
from typing import Any

from lavinpy.broker.exchanges.base import Binding, BindingKey, Exchange, InvalidBinding
from lavinpy.broker.settings.arguments import ArgumentError, amqp_type_name
from lavinpy.wire.field_table import encode_value
from lavinpy.wire.properties import PROPERTY_NAMES, PropertiesError, property_values

MAX_WEIGHT = 10_000  # RabbitMQ 4's limit ("The binding key must not exceed 10000")
POINTS_PER_WEIGHT = 160  # ring points per unit of weight: a weight-1 queue's share within ~5%
HASH_PROPERTIES = ("correlation_id", "message_id", "timestamp")  # the plugin's list
_WEIGHT = re.compile(r"[+-]?[0-9]+")  # what Erlang's list_to_integer accepts
_POINTS = Struct(">8Q")  # one 64-byte digest gives eight ring points
_MISSING = b""  # what a message without the hashed header or property hashes as


def _erlang_binary(text: str) -> str:
    """``text`` as RabbitMQ prints a binary with ~tp: <<"1.5">>, <<>>, <<"é"/utf8>>."""
    if not text:
        return "<<>>"
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'<<"{quoted}"/utf8>>' if not text.isascii() else f'<<"{quoted}">>'


def weight_of(routing_key: str) -> int:
    """The weight a binding key names; InvalidBinding (406) with the plugin's texts when it names none."""
    if not _WEIGHT.fullmatch(routing_key):
        raise InvalidBinding(f"The binding key must be an integer: {_erlang_binary(routing_key)}")
    weight = int(routing_key)
    if weight < 1:
        raise InvalidBinding("The binding key must be greater than 0")
    if weight > MAX_WEIGHT:
        raise InvalidBinding(f"The binding key must not exceed {MAX_WEIGHT}")
    return weight


def _hash64(data: bytes) -> int:
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "big")


def ring_points(name: bytes, count: int) -> list[int]:
    """The first ``count`` ring points of a destination: a more heavily bound one keeps these and adds more."""
    points: list[int] = []
    block = 0
    while len(points) < count:
        points.extend(_POINTS.unpack(blake2b(b"%s#%d" % (name, block), digest_size=64).digest()))
        block += 1
    del points[count:]
    return points


def ring_name(destination: Hashable) -> bytes:
    """What places a destination on the ring: its kind and name (the same after a restart)."""
    if isinstance(destination, Exchange):
        return b"exchange\0" + destination.name.encode("utf-8", "surrogatepass")
    name = getattr(destination, "name", destination)
    return b"queue\0" + str(name).encode("utf-8", "surrogatepass")


def _text_argument(exchange: str, arguments: dict[str, Any], name: str) -> str | None:
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if not isinstance(value, str):
        raise ArgumentError(name, f"invalid arg '{name}' for exchange '{exchange}': "
                                  f"{{unacceptable_type,{amqp_type_name(value)}}}")
    return value


def _value_bytes(value: Any) -> bytes:
    """A header value as hashed: a string by its UTF-8 text, an integer by its digits (whatever width
    the client sent it as), anything else by its wire form."""
    if value is None:
        return _MISSING  # a void header counts as absent
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    try:
        return encode_value(value)
    except (TypeError, ValueError):
        return repr(value).encode()


class ConsistentHashExchange(Exchange):
    type = "x-consistent-hash"
    reads_properties = True

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        header = _text_argument(name, self.arguments, "hash-header")
        lavinmq_header = _text_argument(name, self.arguments, "x-hash-on")
        prop = _text_argument(name, self.arguments, "hash-property")
        if header is not None and lavinmq_header is not None and header != lavinmq_header:
            raise ArgumentError("x-hash-on", "hash-header and x-hash-on name different headers")
        header = header if header is not None else lavinmq_header
        if header is not None and prop is not None:
            raise ArgumentError("hash-property", "hash-header and hash-property are mutually exclusive")
        if prop is not None and prop not in HASH_PROPERTIES:
            raise ArgumentError("hash-property", f"Unsupported property: {prop}")
        self.hash_header = header
        self.hash_property = prop
        self._property_index = PROPERTY_NAMES.index(prop) if prop is not None else -1
        self._weights: dict[Hashable, int] = {}  # destination -> the sum of its bindings' weights
        self._ring: tuple[list[int], list[Hashable]] | None = None  # None: build before routing

    # -- bindings ---------------------------------------------------------------------------------

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        weight_of(routing_key)

    def _index_add(self, key: BindingKey, binding: Binding) -> None:
        destination = binding.destination
        self._weights[destination] = self._weights.get(destination, 0) + weight_of(binding.routing_key)
        self._ring = None

    def _index_remove(self, key: BindingKey, binding: Binding) -> None:
        destination = binding.destination
        remaining = self._weights[destination] - weight_of(binding.routing_key)
        if remaining:
            self._weights[destination] = remaining
        else:
            del self._weights[destination]
        self._ring = None

    def weights(self) -> dict[Hashable, int]:
        """Each bound destination's weight (the sum of its bindings' keys)."""
        return dict(self._weights)

    def _build_ring(self) -> tuple[list[int], list[Hashable]]:
        """The ring's sorted points and each point's destination. Destinations are numbered in the
        order of their ring names so that two points at the same place resolve the same way every time."""
        members = sorted(((ring_name(d), d, w) for d, w in self._weights.items()), key=lambda m: m[0])
        shift = max(1, (len(members) - 1).bit_length())
        tagged: list[int] = []
        for number, (name, _destination, weight) in enumerate(members):
            tagged.extend((point << shift) | number for point in ring_points(name, weight * POINTS_PER_WEIGHT))
        tagged.sort()
        mask = (1 << shift) - 1
        destinations = [m[1] for m in members]
        ring = ([t >> shift for t in tagged], [destinations[t & mask] for t in tagged])
        self._ring = ring
        return ring

    # -- routing ----------------------------------------------------------------------------------

    def hash_input(self, routing_key: str, headers: dict[str, Any] | None, properties: bytes | None) -> bytes:
        """The bytes a message hashes on: its routing key, or the chosen header or property."""
        if self.hash_header is not None:
            if not headers:
                return _MISSING
            return _value_bytes(headers.get(self.hash_header))
        if self._property_index >= 0:
            if not properties:
                return _MISSING
            try:
                value = property_values(properties, typed=False)[self._property_index]
            except PropertiesError:
                return _MISSING
            if value is None:
                return _MISSING
            return str(value).encode("utf-8", "surrogatepass")  # a timestamp by its seconds
        return routing_key.encode("utf-8", "surrogatepass")

    def match_properties(self, routing_key: str, headers: dict[str, Any] | None,
                         properties: bytes | None) -> Collection[Hashable]:
        return self._pick(self.hash_input(routing_key, headers, properties))

    def _pick(self, hashed: bytes) -> Collection[Hashable]:
        ring = self._ring
        if ring is None:
            ring = self._build_ring()
        points, destinations = ring
        if not points:
            return ()
        index = bisect_right(points, _hash64(hashed))
        return (destinations[index if index < len(points) else 0],)

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        return self.match_properties(routing_key, headers, None)

    def route(self, routing_key: str, headers: dict[str, Any] | None = None,
              properties: bytes | None = None) -> set[Hashable]:
        if not self._exchange_bindings and self.alternate is None:
            return set(self.match_properties(routing_key, headers, properties))
        return super().route(routing_key, headers, properties)

    def route_keys(self, keys: list[str], headers: dict[str, Any] | None = None,
                   properties: bytes | None = None) -> set[Hashable]:
        """One destination for the message however many CC/BCC keys it has, as RabbitMQ's exchange hashes
        the whole list of routing keys (or the one header or property) once."""
        if self._exchange_bindings or self.alternate is not None:
            return super().route_keys(keys, headers, properties)
        if self.hash_header is not None or self._property_index >= 0:
            return set(self.match_properties(keys[0], headers, properties))
        return set(self._pick(b"\0".join(key.encode("utf-8", "surrogatepass") for key in keys)))
