"""Topic exchange: dot-separated words, `*` matches exactly one word, `#` zero or more.

Bindings live in a trie keyed by word. Matching walks the trie as an NFA over (node, word index)
states, each state visited once and each leaving a bounded number of transitions (a `#` node swallows
one more word at a time rather than jumping to every later word), so the work grows with trie size times
key length and patterns with many `#` cannot blow up. Recent results are cached per routing key; any
bind/unbind clears the cache.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any

from lavinpy.broker.exchanges.base import Binding, BindingKey, Exchange, count_add, count_remove

CACHE_SIZE = 1024


def split_words(key: str) -> list[str]:
    """Words of a routing or binding key, as RabbitMQ splits them: "" has no words at all."""
    return key.split(".") if key else []


def pattern_words(binding_key: str) -> list[str]:
    """Binding key words with runs of `#` collapsed: `#.#` selects exactly what `#` does."""
    words: list[str] = []
    for word in split_words(binding_key):
        if word == "#" and words and words[-1] == "#":
            continue
        words.append(word)
    return words


class _Node:
    __slots__ = ("children", "destinations", "is_hash")

    def __init__(self, is_hash: bool = False) -> None:
        # Literal words, "*" and "#" are all edges; "*" and "#" are interpreted when matching.
        self.children: dict[str, _Node] = {}
        self.destinations: dict[Hashable, int] = {}
        # Reached by a `#` edge: matching may stay here while `#` swallows more words.
        self.is_hash = is_hash

    def is_empty(self) -> bool:
        return not self.children and not self.destinations


class TopicExchange(Exchange):
    type = "topic"

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._root = _Node()
        self._cache: dict[str, frozenset[Hashable]] = {}

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        cache = self._cache
        found = cache.get(routing_key)
        if found is None:
            found = frozenset(self._walk(split_words(routing_key)))
            if len(cache) >= CACHE_SIZE:
                del cache[next(iter(cache))]  # drop the oldest entry (dicts keep insertion order)
            cache[routing_key] = found
        return found

    def _walk(self, words: list[str]) -> set[Hashable]:
        found: set[Hashable] = set()
        end = len(words)
        pending: list[tuple[_Node, int]] = [(self._root, 0)]
        seen: set[tuple[int, int]] = set()
        while pending:
            node, i = pending.pop()
            state = (id(node), i)
            if state in seen:
                continue
            seen.add(state)
            children = node.children
            if i == end and node.destinations:
                found.update(node.destinations)
            if node.is_hash and i < end:
                pending.append((node, i + 1))  # the `#` that led here swallows one more word
            hash_node = children.get("#")
            if hash_node is not None:
                pending.append((hash_node, i))  # `#` matches no words yet; it can grow from its node
            if i < end:
                literal = children.get(words[i])
                if literal is not None:
                    pending.append((literal, i + 1))
                star = children.get("*")
                if star is not None:
                    pending.append((star, i + 1))
        return found

    def _index_add(self, key: BindingKey, binding: Binding) -> None:
        node = self._root
        for word in pattern_words(binding.routing_key):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node(word == "#")
            node = child
        count_add(node.destinations, binding.destination)
        self._cache.clear()

    def _index_remove(self, key: BindingKey, binding: Binding) -> None:
        path: list[tuple[_Node, str]] = []
        node = self._root
        for word in pattern_words(binding.routing_key):
            path.append((node, word))
            node = node.children[word]
        count_remove(node.destinations, binding.destination)
        # Prune nodes left without bindings or children so the trie does not grow forever.
        while path and node.is_empty():
            parent, word = path.pop()
            del parent.children[word]
            node = parent
        self._cache.clear()
