"""Exchange type ``x-consistent-hash``: each message goes to one bound destination, picked by a hash.

The contract of RabbitMQ's rabbitmq_consistent_hash_exchange plugin (and LavinMQ's type of the same
name):

- A binding's key is its weight, an integer from 1 to 10000 as a string; anything else is refused at
  bind time with the plugin's texts (406). A destination bound several times weighs the sum.
- A message hashes on its routing key; or, with the exchange argument ``hash-header`` (LavinMQ spells
  it ``x-hash-on``), on that header; or, with ``hash-property``, on the property ``message_id``,
  ``correlation_id`` or ``timestamp``. A message without the header or property hashes as an empty
  value: all such messages go to one destination, as the plugin's do.

Placement is weighted rendezvous hashing over a table of 131,072 slots: a message's hash picks a slot,
and the slot belongs to the destination with the best score among the bound ones, each score a draw
from a hash of the slot and the destination's name scaled by the destination's weight. A destination's
share is its weight over the total, within the slots' own sampling noise (~0.6 % for a queue with a
sixth of the weight; a hash ring at 160 points per unit of weight was off by ~8 %, and RabbitMQ's
chi-square check of weights 1,1,2,2 failed on it four runs in five). Unlike the plugin's buckets, which
follow the order bindings were made, the outcome depends only on which destinations are bound with which
weights: the same key reaches the same queue after a restart whatever order the bindings come back in,
and binding or unbinding a destination moves only the slots it wins or held. A slot is scored on the
first message that lands in it after a binding change (one short hash per bound destination), then
routing is one hash and one table read.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Collection, Hashable
from hashlib import blake2b
from math import log
from typing import Any

from lavinpy.broker.exchanges.base import Binding, BindingKey, Exchange, InvalidBinding
from lavinpy.broker.settings.arguments import ArgumentError, amqp_type_name
from lavinpy.wire.field_table import encode_value
from lavinpy.wire.properties import PROPERTY_NAMES, PropertiesError, property_values

MAX_WEIGHT = 10_000  # RabbitMQ 4's limit ("The binding key must not exceed 10000")
SLOT_BITS = 17  # 131,072 slots: a sixth of the weight gets its share within ~0.6 % (one standard deviation)
HASH_PROPERTIES = ("correlation_id", "message_id", "timestamp")  # the plugin's list
_WEIGHT = re.compile(r"[+-]?[0-9]+")  # what Erlang's list_to_integer accepts
_MASK64 = (1 << 64) - 1
_TWO_TO_MINUS_53 = 2.0 ** -53
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


def _mix64(value: int) -> int:
    """A 64-bit finaliser (splitmix64's): every input bit reaches every output bit, so the scores one
    message draws for different destinations behave as independent draws."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _unscored(typecode: str) -> int:
    """The slot value that means "not scored yet": the largest the table's item type holds."""
    return (1 << (8 * array(typecode).itemsize)) - 1


def member_seed(name: bytes) -> int:
    """What a destination mixes into every message's hash: a stable hash of its ring name."""
    return _hash64(name)


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
        self._members: list[tuple[int, float, Hashable]] | None = None  # None: build before routing
        self._slots: array[int] | None = None  # slot -> index into _members, or _unscored
        self._unscored = 0

    # -- bindings ---------------------------------------------------------------------------------

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        weight_of(routing_key)

    def _index_add(self, key: BindingKey, binding: Binding) -> None:
        destination = binding.destination
        self._weights[destination] = self._weights.get(destination, 0) + weight_of(binding.routing_key)
        self._members = None

    def _index_remove(self, key: BindingKey, binding: Binding) -> None:
        destination = binding.destination
        remaining = self._weights[destination] - weight_of(binding.routing_key)
        if remaining:
            self._weights[destination] = remaining
        else:
            del self._weights[destination]
        self._members = None

    def weights(self) -> dict[Hashable, int]:
        """Each bound destination's weight (the sum of its bindings' keys)."""
        return dict(self._weights)

    def _build_members(self) -> list[tuple[int, float, Hashable]]:
        """(seed, 1/weight, destination) per bound destination, in the order of their ring names so that
        a tie (two equal scores) resolves the same way every time."""
        members = sorted(((ring_name(d), d, w) for d, w in self._weights.items()), key=lambda m: m[0])
        self._members = [(member_seed(name), 1.0 / weight, destination) for name, destination, weight in members]
        self._slots = None
        if self._members:  # two bytes a slot while the destinations can be numbered in them
            typecode = "H" if len(self._members) < 0xFFFF else "I"
            self._unscored = _unscored(typecode)
            self._slots = array(typecode, [self._unscored]) * (1 << SLOT_BITS)
        return self._members

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
        members = self._members
        if members is None:
            members = self._build_members()
        slots = self._slots
        if slots is None:
            return ()
        slot = _hash64(hashed) >> (64 - SLOT_BITS)
        owner = slots[slot]
        if owner == self._unscored:
            owner = slots[slot] = self._score(slot, members)
        return (members[owner][2],)

    @staticmethod
    def _score(slot: int, members: list[tuple[int, float, Hashable]]) -> int:
        """The index of the destination with the lowest -ln(u)/weight, u a uniform draw from (slot,
        destination): the minimum of exponential draws with rates equal to the weights, so each
        destination wins its weight's share of the slots."""
        best, chosen = float("inf"), 0
        for index, (seed, inverse_weight, _destination) in enumerate(members):
            score = -log(((_mix64(slot ^ seed) >> 11) + 0.5) * _TWO_TO_MINUS_53) * inverse_weight
            if score < best:
                best, chosen = score, index
        return chosen

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
