"""Bindings bookkeeping, direct and fanout routing, exchange-to-exchange routing, the registry."""

import pytest

from lavinpy.broker.exchanges import (
    EXCHANGE_TYPES,
    Binding,
    DirectExchange,
    Exchange,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
    UnknownExchangeType,
    make_exchange,
)


class Queue:
    """A stand-in queue: the exchanges only need destinations to be hashable."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"


# -- constructor and registry --------------------------------------------------------------------


def test_constructor_defaults_and_flags() -> None:
    x = DirectExchange("d")
    assert (x.name, x.type, x.durable, x.auto_delete, x.internal, x.arguments) == (
        "d", "direct", True, False, False, {},
    )
    args = {"alternate-exchange": "ae"}
    y = TopicExchange("t", durable=False, auto_delete=True, internal=True, arguments=args)
    assert (y.durable, y.auto_delete, y.internal, y.arguments) == (False, True, True, args)
    args["changed"] = 1
    assert "changed" not in y.arguments  # the exchange keeps its own copy


@pytest.mark.parametrize(
    ("type_name", "cls"),
    [("direct", DirectExchange), ("fanout", FanoutExchange), ("topic", TopicExchange),
     ("headers", HeadersExchange)],
)
def test_make_exchange_builds_each_type(type_name: str, cls: type[Exchange]) -> None:
    x = make_exchange(type_name, "x", durable=False)
    assert type(x) is cls and x.type == type_name and x.name == "x" and not x.durable


def test_make_exchange_rejects_unknown_type() -> None:
    with pytest.raises(UnknownExchangeType):
        make_exchange("x-nope", "x")
    with pytest.raises(ValueError):
        make_exchange("Direct", "x")


def test_registry_accepts_new_types() -> None:
    class Custom(FanoutExchange):
        type = "x-custom"

    EXCHANGE_TYPES["x-custom"] = Custom
    try:
        assert isinstance(make_exchange("x-custom", "c"), Custom)
    finally:
        del EXCHANGE_TYPES["x-custom"]


# -- bindings ------------------------------------------------------------------------------------


def test_bind_is_idempotent_and_unbind_reports_missing() -> None:
    x = DirectExchange("d")
    q = Queue("q")
    assert not x.has_bindings()
    assert x.bind(q, "k") is True
    assert x.bind(q, "k") is False
    assert x.bind(q, "k", {}) is False  # no arguments and empty arguments are the same binding
    assert x.bindings() == [Binding(x, q, "k", {})]
    assert x.unbind(q, "other") is False
    assert x.unbind(Queue("q"), "k") is False  # a different object is a different destination
    assert x.unbind(q, "k") is True
    assert x.unbind(q, "k") is False
    assert not x.has_bindings() and x.bound_destinations() == set()


def test_binding_identity_includes_arguments() -> None:
    x = DirectExchange("d")
    assert x.bind("q", "k", {"a": 1})
    assert x.bind("q", "k", {"a": 2})
    assert x.bind("q", "k")
    assert x.bind("q", "k", {"a": True})  # bool and int are different AMQP values
    assert not x.bind("q", "k", {"a": 1})
    assert len(x.bindings()) == 4
    # Removing one of them keeps the queue routed through the others.
    assert x.unbind("q", "k", {"a": 1})
    assert x.route("k", None) == {"q"}
    assert x.unbind("q", "k", {"a": 2}) and x.unbind("q", "k") and x.unbind("q", "k", {"a": True})
    assert x.route("k", None) == set()


def test_binding_arguments_order_and_nesting() -> None:
    x = FanoutExchange("f")
    assert x.bind("q", "", {"a": 1, "b": [1, {"c": b"x"}]})
    assert not x.bind("q", "", {"b": [1, {"c": b"x"}], "a": 1})
    assert x.unbind("q", "", {"b": [1, {"c": bytearray(b"x")}], "a": 1})


def test_unbind_all_removes_only_that_destination() -> None:
    x = DirectExchange("d")
    q1, q2 = Queue("1"), Queue("2")
    x.bind(q1, "a")
    x.bind(q1, "b")
    x.bind(q1, "b", {"z": 1})
    x.bind(q2, "a")
    assert x.bound_destinations() == {q1, q2}
    assert x.unbind_all(q1) == 3
    assert x.unbind_all(q1) == 0
    assert x.bound_destinations() == {q2}
    assert x.route("a", None) == {q2}
    assert x.route("b", None) == set()
    assert [b.destination for b in x.bindings()] == [q2]


def test_bound_destinations_is_a_copy() -> None:
    x = FanoutExchange("f")
    x.bind("q", "")
    x.bound_destinations().add("other")
    assert x.bound_destinations() == {"q"}


# -- direct and fanout ---------------------------------------------------------------------------


def test_direct_routes_on_exact_key() -> None:
    x = DirectExchange("d")
    x.bind("q1", "a")
    x.bind("q2", "a")
    x.bind("q3", "A")
    x.bind("q4", "")
    assert x.route("a", None) == {"q1", "q2"}
    assert x.route("A", None) == {"q3"}
    assert x.route("", None) == {"q4"}
    assert x.route("a.b", None) == set()
    assert x.route("*", None) == set()  # no wildcards in direct exchanges


def test_route_returns_a_fresh_set() -> None:
    x = DirectExchange("d")
    x.bind("q", "a")
    x.route("a", None).add("junk")
    assert x.route("a", None) == {"q"}


def test_fanout_ignores_key_and_headers() -> None:
    x = FanoutExchange("f")
    assert x.route("anything", None) == set()
    x.bind("q1", "")
    x.bind("q2", "some-key")
    assert x.route("anything", {"h": 1}) == {"q1", "q2"}
    x.unbind("q1", "")
    assert x.route("", None) == {"q2"}


# -- exchange-to-exchange ------------------------------------------------------------------------


def test_exchange_to_exchange_routes_through_destination_rules() -> None:
    source = DirectExchange("src")
    middle = TopicExchange("mid")
    source.bind(middle, "a.b")
    source.bind("direct-q", "a.b")
    middle.bind("topic-q", "a.*")
    middle.bind("other-q", "x.*")
    assert source.route("a.b", None) == {"direct-q", "topic-q"}
    assert source.route("x.b", None) == set()  # the source's own binding key must match first
    assert middle.route("x.y", None) == {"other-q"}


def test_exchange_cycle_terminates() -> None:
    a = FanoutExchange("a")
    b = FanoutExchange("b")
    a.bind(b, "")
    b.bind(a, "")
    assert a.route("k", None) == set()
    b.bind("q", "")
    assert a.route("k", None) == {"q"}
    assert b.route("k", None) == {"q"}


def test_self_binding_terminates() -> None:
    a = FanoutExchange("a")
    a.bind(a, "")
    a.bind("q", "")
    assert a.route("k", None) == {"q"}


def test_queue_reached_twice_counts_once() -> None:
    root = FanoutExchange("root")
    left, right = DirectExchange("left"), DirectExchange("right")
    sink = FanoutExchange("sink")
    root.bind(left, "")
    root.bind(right, "")
    left.bind("q", "k")
    right.bind("q", "k")
    left.bind(sink, "k")
    right.bind(sink, "k")
    sink.bind("q", "")
    sink.bind("q2", "")
    assert root.route("k", None) == {"q", "q2"}


def test_unbinding_the_last_exchange_destination_restores_fast_path() -> None:
    a = FanoutExchange("a")
    b = FanoutExchange("b")
    b.bind("q", "")
    a.bind(b, "")
    a.bind(b, "", {"x": 1})
    assert a.unbind_all(b) == 2
    assert a.route("k", None) == set()
    a.bind("q0", "")
    assert a.route("k", None) == {"q0"}


def test_alternate_exchange_used_when_nothing_matches() -> None:
    x = DirectExchange("x")
    ae = FanoutExchange("ae")
    ae.bind("unrouted", "")
    x.alternate = ae
    x.bind("q", "known")
    assert x.route("known", None) == {"q"}
    assert x.route("unknown", None) == {"unrouted"}


def test_alternate_exchange_of_a_nested_exchange() -> None:
    # As in RabbitMQ, each exchange on the walk falls back to its own alternate exchange.
    top = FanoutExchange("top")
    nested = DirectExchange("nested")
    ae = FanoutExchange("ae")
    ae.bind("unrouted", "")
    nested.alternate = ae
    top.bind(nested, "")
    top.bind("q", "")
    assert top.route("k", None) == {"q", "unrouted"}
    ae.alternate = nested  # an alternate cycle still terminates
    assert top.route("k", None) == {"q", "unrouted"}
