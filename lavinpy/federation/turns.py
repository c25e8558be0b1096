"""This node's exchange links on one upstream queue: their starts take turns, and their cleanups leave the
queue to whichever still uses it.

Two links of one federated exchange whose upstreams name the same upstream exchange of the same broker (two
upstream parameters for two nodes of one cluster, under an upstream set of "all", or the same broker twice)
share the upstream queue, whose name has no upstream's name in it (RabbitMQ's naming), and with it the
internal exchanges A and B.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

TurnKey = tuple[str, str, str]  # the upstream broker (its cluster name, else host:port), its vhost, the queue


class StartTurns:
    """This node's link starts that work on one upstream queue, one at a time; and which links use it.

    A start deletes and declares the suffix it takes, then deletes the other: run at the same time, one
    start deletes the exchange the other's has just bound (or the one both still carry) while no other is
    bound, and what is published upstream meanwhile is routed nowhere, though confirmed. One start at a
    time, each start finds the one before it done: one exchange bound, and it binds its new one before
    deleting that. The links that started before keep their bindings on the new one (``current``).

    A link removed for good deletes the queue and its internal exchange upstream, but only as the last of
    this node's links using it (``leave``): the others still consume the queue and bind through the
    exchange. Links removed together (a policy deleted) leave in turn; the last one deletes once the others
    have closed their connections (``others_closed``), since their consumers would keep the queue in use."""

    def __init__(self) -> None:
        self._locks: dict[TurnKey, asyncio.Lock] = {}
        self._wanting: dict[TurnKey, int] = {}
        self._users: dict[TurnKey, set[object]] = {}
        self._closing: dict[TurnKey, int] = {}  # links that left while others used the queue, not closed yet
        self._all_closed: dict[TurnKey, asyncio.Event] = {}
        self._current: dict[TurnKey, str] = {}  # the internal exchange the latest start made, bound to the queue

    def wanting(self, key: TurnKey) -> int:
        """How many starts hold or wait for the turn of ``key``."""
        return self._wanting.get(key, 0)

    @contextlib.asynccontextmanager
    async def turn(self, key: TurnKey) -> AsyncIterator[None]:
        """Held from a start's first look at the upstream queue's exchanges to its deletion of the old one,
        and over a cleanup's deletions."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        self._wanting[key] = self._wanting.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            left = self._wanting[key] - 1
            if left:
                self._wanting[key] = left
            else:  # nobody holds or waits: the lock (bound to this loop) goes
                del self._wanting[key], self._locks[key]

    def made(self, key: TurnKey, internal: str) -> None:
        """A start on the queue of ``key`` has made ``internal`` and deleted the other: this node's other
        links on the queue keep their bindings on it from now on (``current``)."""
        self._current[key] = internal

    def current(self, key: TurnKey) -> str | None:
        return self._current.get(key)

    def use(self, key: TurnKey, link: object) -> None:
        """``link`` uses the upstream queue of ``key`` (from its first start until it stops: between starts
        too, it will consume the queue again)."""
        self._users.setdefault(key, set()).add(link)

    def leave(self, key: TurnKey, link: object) -> int:
        """``link`` stops using the queue of ``key``: how many of this node's links still do. When some do,
        ``closed`` must follow once ``link``'s connections are closed."""
        users = self._users.get(key, set())
        users.discard(link)
        if not users:
            self._users.pop(key, None)
            self._current.pop(key, None)
            return 0
        self._closing[key] = self._closing.get(key, 0) + 1
        return len(users)

    def closed(self, key: TurnKey) -> None:
        """A link that left while others used the queue has closed its connections."""
        left = self._closing.get(key, 0) - 1
        if left > 0:
            self._closing[key] = left
            return
        self._closing.pop(key, None)
        event = self._all_closed.pop(key, None)
        if event is not None:
            event.set()

    async def others_closed(self, key: TurnKey, timeout: float) -> None:
        """Until every link that left the queue before has closed its connections (or ``timeout``)."""
        if not self._closing.get(key):
            return
        event = self._all_closed.setdefault(key, asyncio.Event())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


START_TURNS = StartTurns()
