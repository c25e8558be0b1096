"""Headers exchange: x-match modes, x- arguments, void values and AMQP value comparison."""

from decimal import Decimal
from typing import Any

import pytest

from lavinpy.broker.exchanges import HeadersExchange, InvalidBinding


def routes(arguments: dict[str, Any], headers: dict[str, Any] | None) -> bool:
    x = HeadersExchange("h")
    x.bind("q", "", arguments)
    return x.route("ignored", headers) == {"q"}


@pytest.mark.parametrize(
    ("arguments", "headers", "expected"),
    [
        # all (the default)
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x", "extra": 3}, True),
        ({"a": 1, "b": "x"}, {"a": 1}, False),
        ({"a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
        ({"x-match": "all", "a": 1}, {"a": 1}, True),
        ({"x-match": "all", "a": 1}, {"a": 2}, False),
        ({"x-match": "all", "a": 1}, None, False),
        ({}, None, True),  # nothing to compare: all matches everything
        ({"x-match": "all"}, {"a": 1}, True),
        # any
        ({"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 2, "b": 1}, False),
        ({"x-match": "any", "a": 1}, None, False),
        ({"x-match": "any"}, {"a": 1}, False),  # nothing to compare: any matches nothing
        # x- arguments are ignored by plain all/any ...
        ({"x-match": "all", "x-foo": "bar", "a": 1}, {"a": 1}, True),
        ({"x-match": "all", "x-foo": "bar"}, {}, True),
        ({"x-match": "any", "x-foo": "bar"}, {"x-foo": "bar"}, False),
        ({"x-match": "any", "x-foo": "bar", "a": 1}, {"x-foo": "bar", "a": 1}, True),
        # ... and compared by the -with-x variants, which still ignore x-match itself
        ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"a": 1}, False),
        ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"a": 1, "x-foo": "bar"}, True),
        ({"x-match": "all-with-x", "x-foo": "bar"}, {"x-foo": "baz"}, False),
        ({"x-match": "all-with-x"}, {}, True),
        ({"x-match": "any-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, True),
        ({"x-match": "any-with-x", "x-foo": "bar"}, {"x-foo": "baz"}, False),
        ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
        # a void (None) binding value only needs the header to be present
        ({"a": None}, {"a": "anything"}, True),
        ({"a": None}, {"a": None}, True),
        ({"a": None}, {"b": 1}, False),
        ({"x-match": "any", "a": None, "b": 1}, {"a": 0}, True),
        ({"a": 1}, {"a": None}, False),
        # value comparison
        ({"a": 1}, {"a": 1.0}, True),  # numbers compare by value, as Erlang == does
        ({"a": True}, {"a": 1}, False),  # booleans are not numbers
        ({"a": 1}, {"a": True}, False),
        ({"a": False}, {"a": 0}, False),
        ({"a": True}, {"a": True}, True),
        ({"a": "1"}, {"a": 1}, False),
        ({"a": "x"}, {"a": b"x"}, True),  # short/long strings are binaries on the wire
        ({"a": b"x"}, {"a": bytearray(b"x")}, True),
        ({"a": "é"}, {"a": "é".encode()}, True),
        ({"a": Decimal("1")}, {"a": 1}, False),
        ({"a": Decimal("1.5")}, {"a": Decimal("1.5")}, True),
        ({"a": [1, "x"]}, {"a": [1, b"x"]}, True),
        ({"a": [1, True]}, {"a": [1, 1]}, False),
        ({"a": {"k": "v"}}, {"a": {"k": b"v"}}, True),
        ({"a": {"k": "v"}}, {"a": {"k": "w"}}, False),
        ({"a": 1}, {"A": 1}, False),  # header names are case sensitive
    ],
)
def test_header_matching(arguments: dict[str, Any], headers: dict[str, Any] | None, expected: bool) -> None:
    assert routes(arguments, headers) is expected


def test_legacy_bytes_x_match() -> None:
    assert routes({"x-match": b"any", "a": 1, "b": 2}, {"a": 1})


@pytest.mark.parametrize("mode", ["ALL", "some", "", 1, True])
def test_invalid_x_match_is_refused(mode: Any) -> None:
    x = HeadersExchange("h")
    with pytest.raises(InvalidBinding):
        x.bind("q", "", {"x-match": mode, "a": 1})
    assert not x.has_bindings()


def test_several_bindings_same_queue_and_unbind() -> None:
    x = HeadersExchange("h")
    x.bind("q", "", {"a": 1})
    x.bind("q", "", {"b": 2})
    x.bind("q2", "", {"x-match": "any", "a": 1, "c": 3})
    assert x.route("", {"a": 1}) == {"q", "q2"}
    assert x.route("", {"b": 2}) == {"q"}
    assert x.route("", {"c": 3}) == {"q2"}
    assert x.unbind("q", "", {"a": 1})
    assert not x.unbind("q", "", {"a": 1})
    assert x.route("", {"a": 1}) == {"q2"}
    assert x.unbind_all("q") == 1
    assert x.route("", {"b": 2}) == set()


def test_routing_key_is_ignored_but_part_of_binding_identity() -> None:
    x = HeadersExchange("h")
    assert x.bind("q", "k1", {"a": 1})
    assert x.bind("q", "k2", {"a": 1})
    assert x.route("whatever", {"a": 1}) == {"q"}
    x.unbind("q", "k1", {"a": 1})
    assert x.route("", {"a": 1}) == {"q"}
