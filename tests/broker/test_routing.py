"""A vhost's routing without a vhost: CC and BCC, the alternate-exchange chain, BCC taken out."""

from __future__ import annotations

from pamqp import commands

from lavinpy.broker.exchanges import DirectExchange, Exchange, FanoutExchange
from lavinpy.broker.routing import Routing
from lavinpy.wire.properties import decode_properties, encode_properties


def routing(*exchanges: Exchange) -> Routing:
    return Routing({x.name: x for x in exchanges})


def test_cc_and_bcc_add_the_queues_of_their_keys() -> None:
    direct = DirectExchange("d")
    for name in ("a", "b", "c"):
        direct.bind(name, name)
    r = routing(direct)
    assert r.route(direct, "a", None) == {"a"}
    assert r.route(direct, "a", {"CC": ["b"], "BCC": [b"c", 7]}) == {"a", "b", "c"}


def test_unroutable_follows_the_alternate_chain_once_each() -> None:
    first, second, third = DirectExchange("first"), DirectExchange("second"), FanoutExchange("third")
    third.bind("q", "")
    r = routing(first, second, third)
    assert r.route(first, "k", None) == set()
    r.set_alternate("first", "second")
    r.set_alternate("second", "third")
    assert r.route(first, "k", None) == {"q"}
    r.set_alternate("third", "first")  # a cycle of alternates ends
    third.unbind("q", "")
    assert r.route(first, "k", None) == set()
    r.set_alternate("first", None)
    assert "first" not in r.alternates


def test_route_message_drops_the_bcc_header_only() -> None:
    direct = DirectExchange("d")
    direct.bind("a", "a")
    direct.bind("b", "b")
    r = routing(direct)
    headers = {"BCC": ["b"], "x": 1}
    properties = encode_properties(commands.Basic.Properties(headers=headers))
    queues, sent = r.route_message(direct, "a", properties, headers)
    assert queues == {"a", "b"}
    assert decode_properties(sent).headers == {"x": 1}
    assert headers == {"BCC": ["b"], "x": 1}  # the caller's dict is left alone
    untouched = encode_properties(commands.Basic.Properties(headers={"x": 1}))
    assert r.route_message(direct, "a", untouched, {"x": 1})[1] == untouched
