"""Topic exchange matching, edge cases and a property test against a regex reference."""

import re
import sys
from collections.abc import Callable
from types import FrameType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.broker.exchanges import TopicExchange, topic
from lavinpy.broker.exchanges.topic import CACHE_SIZE, split_words


def reference_matches(binding_key: str, routing_key: str) -> bool:
    """Straightforward reference: each word becomes `word.`; `*` is one such word, `#` any number."""
    parts = []
    for word in split_words(binding_key):
        if word == "*":
            parts.append(r"[^.]*\.")
        elif word == "#":
            parts.append(r"(?:[^.]*\.)*")
        else:
            parts.append(re.escape(word) + r"\.")
    subject = "".join(word + "." for word in split_words(routing_key))
    return re.fullmatch("".join(parts), subject) is not None


def matches(binding_key: str, routing_key: str) -> bool:
    x = TopicExchange("t")
    x.bind("q", binding_key)
    return x.route(routing_key, None) == {"q"}


CASES = [
    # (binding key, routing key, expected)
    ("a.b", "a.b", True),
    ("a.b", "a.b.c", False),
    ("a.*", "a.b", True),
    ("a.*", "a", False),
    ("a.*", "a.b.c", False),
    ("a.*", "a.", True),  # "a." has an empty second word
    ("*.*", "a.b", True),
    ("*.*", "a", False),
    ("*.*", "a.b.c", False),
    ("*.*", ".", True),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("a.#", "ab", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y", False),
    ("a.#.b", "a.b.b", True),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "x.a.y", False),
    ("#", "a.b.c", True),
    ("#", "", True),  # "" has no words and `#` matches zero words
    ("*", "", False),  # `*` needs exactly one word
    ("", "", True),
    ("", "a", False),
    ("#.#", "", True),
    ("#.#", "a.b", True),
    ("#.*", "", False),
    ("#.*", "a", True),
    ("*.#", "a", True),
    ("*.#", "", False),
    ("a..b", "a..b", True),
    ("a.*.b", "a..b", True),
    ("a..b", "a.b", False),
    ("a.#.b", "a..b", True),
    ("single", "single", True),
    ("single", "singles", False),
    ("*", "single", True),
    ("*", ".", False),  # "." is two empty words
    ("a.b", "A.B", False),
    ("a|b", "a|b", True),  # regex-special characters are literal
    ("a|b", "a", False),
]


@pytest.mark.parametrize(("binding_key", "routing_key", "expected"), CASES)
def test_topic_edge_cases(binding_key: str, routing_key: str, expected: bool) -> None:
    assert matches(binding_key, routing_key) is expected
    assert reference_matches(binding_key, routing_key) is expected  # the reference agrees


def test_255_character_keys() -> None:
    routing_key = ".".join(["w"] * 128)
    assert len(routing_key) == 255
    x = TopicExchange("t")
    x.bind("exact", routing_key)
    x.bind("tail", "#.w")
    x.bind("one", "*")
    x.bind("stars", ".".join(["*"] * 128))
    assert x.route(routing_key, None) == {"exact", "tail", "stars"}


class _StepBudgetExceeded(Exception):
    pass


def _matching_steps(x: TopicExchange, routing_key: str, budget: int = 3_000_000) -> tuple[int, frozenset]:
    """Routes once and counts the Python lines the topic module executed doing it: a measure of the
    matching work that does not depend on how fast or loaded the machine is. Past ``budget`` lines the
    route is abandoned, so a blown-up matcher fails the test instead of hanging it."""
    steps = 0

    def in_topic(frame: FrameType, event: str, arg: object) -> Callable | None:
        return count_line if frame.f_code.co_filename == topic.__file__ else None

    def count_line(frame: FrameType, event: str, arg: object) -> Callable:
        nonlocal steps
        if event == "line":
            steps += 1
            if steps > budget:
                raise _StepBudgetExceeded(f"more than {budget} steps routing {len(routing_key)} chars")
        return count_line

    previous = sys.gettrace()
    sys.settrace(in_topic)
    try:
        found = frozenset(x.route(routing_key, None))
    finally:
        sys.settrace(previous)
    return steps, found


def test_many_hashes_match_in_work_linear_in_the_key_length() -> None:
    # A naive backtracking matcher tries every split of the key's words among the 20 `#`s: C(n + 20, 20)
    # ways, beyond any budget at these sizes. Each (trie node, word index) state is visited once with a
    # bounded number of transitions, so doubling the key at most about doubles the work.
    x = TopicExchange("t")
    x.bind("q", ".".join(["#", "a"] * 20) + ".b")
    x.bind("q2", "#.#.#.#.#.#.#.#.#.#.c")
    steps: dict[int, int] = {}
    for words in (60, 120):
        routing_key = ".".join(["a"] * words)
        routed = {suffix: _matching_steps(x, routing_key + suffix) for suffix in ("", ".b", ".c")}
        assert [found for _steps, found in routed.values()] == [frozenset(), {"q"}, {"q2"}]
        steps[words] = sum(count for count, _found in routed.values())
    assert steps[60] > 0  # the counter saw the matcher run
    assert steps[120] / steps[60] < 3, steps  # linear: about 2 (quadratic work would be about 4)


def test_multiple_bindings_and_unbind_prunes() -> None:
    x = TopicExchange("t")
    x.bind("q1", "a.*")
    x.bind("q2", "a.#")
    x.bind("q1", "#")
    assert x.route("a.b", None) == {"q1", "q2"}
    assert x.route("z", None) == {"q1"}
    x.unbind("q1", "#")
    assert x.route("z", None) == set()
    assert x.route("a.b", None) == {"q1", "q2"}  # cache was cleared on unbind
    x.unbind("q1", "a.*")
    x.unbind("q2", "a.#")
    assert x.route("a.b", None) == set()
    assert x._root.children == {}  # nothing left in the trie


def test_bind_after_cached_miss_is_seen() -> None:
    x = TopicExchange("t")
    assert x.route("a.b", None) == set()
    x.bind("q", "a.b")
    assert x.route("a.b", None) == {"q"}


def test_hash_runs_share_a_trie_node_but_are_distinct_bindings() -> None:
    x = TopicExchange("t")
    assert x.bind("q", "#")
    assert x.bind("q", "#.#")
    x.unbind("q", "#")
    assert x.route("a", None) == {"q"}
    x.unbind("q", "#.#")
    assert x.route("a", None) == set()


def test_cache_is_bounded() -> None:
    x = TopicExchange("t")
    x.bind("q", "#")
    for i in range(CACHE_SIZE + 50):
        assert x.route(f"k.{i}", None) == {"q"}
    assert len(x._cache) <= CACHE_SIZE


words = st.sampled_from(["a", "b", "", "ab", "*", "#"])
binding_words = st.sampled_from(["a", "b", "", "ab", "*", "#"])
routing_keys = st.lists(st.sampled_from(["a", "b", "", "ab"]), max_size=6).map(".".join)
binding_keys = st.lists(binding_words, max_size=6).map(".".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(binding_keys, max_size=8), st.lists(routing_keys, min_size=1, max_size=8))
def test_trie_agrees_with_regex_reference(bindings: list[str], keys: list[str]) -> None:
    x = TopicExchange("t")
    for i, binding_key in enumerate(bindings):
        x.bind(i, binding_key)
    for routing_key in keys:
        expected = {i for i, b in enumerate(bindings) if reference_matches(b, routing_key)}
        assert x.route(routing_key, None) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 3), binding_keys), max_size=20),
    st.lists(routing_keys, min_size=1, max_size=5),
)
def test_trie_agrees_after_bind_and_unbind(
    operations: list[tuple[bool, int, str]], keys: list[str]
) -> None:
    x = TopicExchange("t")
    live: set[tuple[int, str]] = set()
    for add, queue, binding_key in operations:
        if add:
            assert x.bind(queue, binding_key) is ((queue, binding_key) not in live)
            live.add((queue, binding_key))
        else:
            assert x.unbind(queue, binding_key) is ((queue, binding_key) in live)
            live.discard((queue, binding_key))
        for routing_key in keys:  # route between operations so stale cache entries would show
            expected = {q for q, b in live if reference_matches(b, routing_key)}
            assert x.route(routing_key, None) == expected
