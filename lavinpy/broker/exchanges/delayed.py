"""Exchange type ``x-delayed-message``: RabbitMQ's delayed-message plugin contract.

The exchange routes like the type named by its ``x-delayed-type`` argument (direct, fanout, topic or
headers: an inner exchange of that type holds the bindings). A message published to it with a header
``x-delay`` > 0 (ms, at most 2^32-1) is held until it is due, then routed; other messages route at
once. As the plugin does, the held copy's ``x-delay`` is set to minus the delay, so the routed message
tells consumers it was delayed and is never delayed twice.

Held messages are records in the vhost's message segments, listed in a durable index of their own
(``amq.delayed.<exchange>``), so they survive restarts; on open the due times are rebuilt from each
record's timestamp and ``x-delay``. In memory a held message is one int in a heap (due time and segment
position packed together). One ``loop.call_at`` timer is armed for the earliest due time and moves
only when an earlier message arrives: many waiting messages cost no CPU.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection, Hashable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from lavinpy.broker.exchanges.base import Binding, BindingKey, Exchange
from lavinpy.broker.exchanges.direct import DirectExchange
from lavinpy.broker.exchanges.fanout import FanoutExchange
from lavinpy.broker.exchanges.headers import HeadersExchange
from lavinpy.broker.exchanges.topic import TopicExchange
from lavinpy.broker.queues.death_headers import decode_value, header_items, set_header, signedint, with_header_items
from lavinpy.broker.settings.arguments import ArgumentError
from lavinpy.store.delayed_index import DelayedIndex
from lavinpy.store.index_kinds import ByDueTime
from lavinpy.store.message_store import MissingRecord
from lavinpy.store.record import CorruptRecord, StoredMessage
from lavinpy.wire.properties import PropertiesError

if TYPE_CHECKING:
    from lavinpy.store.vhost_store import VhostStore

log = logging.getLogger("lavinpy.delayed")

MAX_DELAY_MS = 0xFFFFFFFF  # the plugin routes larger delays at once
INDEX_PREFIX = "amq.delayed."
DUE_BATCH = 1024  # messages routed per timer callback before yielding to the loop
INNER_TYPES: dict[str, type[Exchange]] = {
    cls.type: cls for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange)}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def delay_of(headers: dict | None) -> int | None:
    """The delay requested by an ``x-delay`` header value, as the plugin reads it, or None.

    Integers are taken as they are; numeric strings are converted, floats and decimals truncated.
    Anything else (and a missing header) means no delay.
    """
    if not headers or "x-delay" not in headers:
        return None
    value = headers["x-delay"]
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str | bytes):
        try:
            return int(value)
        except ValueError:
            return None
    if isinstance(value, float | Decimal):
        return math.trunc(value) if math.isfinite(value) else None
    return None


def should_delay(delay: int | None) -> bool:
    return delay is not None and 0 < delay <= MAX_DELAY_MS


def _stored_delay(properties: bytes) -> int:
    """The delay of a held record: its x-delay header (stored negated), 0 when unreadable."""
    try:
        for key, raw in header_items(properties):
            if key == "x-delay":
                value = delay_of({"x-delay": decode_value(raw)})
                return abs(value) if value is not None else 0
    except PropertiesError:
        pass
    return 0


def negate_delay(properties: bytes, delay: int) -> bytes:
    """The properties with ``x-delay`` set to ``-delay`` (a signed int, as the plugin writes it)."""
    items = header_items(properties)
    set_header(items, "x-delay", signedint(-delay))
    return with_header_items(properties, items)


def due_time(msg: StoredMessage) -> int:
    """When a held record is due: its timestamp plus its (stored negated) x-delay."""
    return msg.timestamp + _stored_delay(msg.properties)


HELD_KIND = ByDueTime(due_time)


DueCallback = Callable[[StoredMessage], None]


class DelayedStore:
    """The held messages of one delayed exchange: their index, and the timer that releases them."""

    def __init__(self, store: VhostStore, name: str, on_due: DueCallback, *, durable: bool = True,
                 loop: asyncio.AbstractEventLoop | None = None, clock: Callable[[], int] = now_ms) -> None:
        self.store = store
        self.name = name
        self.durable = durable
        self.on_due = on_due
        self.clock = clock
        self.timer_changes = 0  # how often the timer was (re)armed: tests check there is no churn
        self._loop = loop
        self._index: DelayedIndex | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due: int | None = None
        self._pending_acks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def index(self) -> DelayedIndex:
        assert self._index is not None, "DelayedStore.open() first"
        return self._index

    def open(self) -> None:
        """Load the held messages (before the vhost store's finish_recovery) and arm the timer."""
        index = self.store.open_queue(self.name, self.durable, HELD_KIND)
        assert isinstance(index, DelayedIndex)
        self._index = index
        self._arm()

    def __len__(self) -> int:
        return self._index.ready_count if self._index is not None else 0

    def next_due(self) -> int | None:
        return self.index.next_due()

    def add(self, exchange: str, routing_key: str, properties: bytes, body: bytes, delay: int, *,
            persistent: bool = True) -> int:
        """Hold a message for ``delay`` ms; returns its position. The stored copy has x-delay = -delay."""
        timestamp = self.clock()
        pos = self.store.messages.append(exchange, routing_key, negate_delay(properties, delay), body, timestamp)
        self.index.push(pos, persistent, timestamp + delay)
        self._arm()
        return pos

    # ---- the timer ---------------------------------------------------------------------------

    def _get_loop(self) -> asyncio.AbstractEventLoop | None:
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                return None  # armed later, by the first add() or arm() inside the loop
        return self._loop

    def arm(self) -> None:
        """Arm the timer now (when open() ran outside the event loop)."""
        self._arm()

    def _arm(self) -> None:
        """Make sure one timer fires at the earliest due time; move it only if that time changed."""
        if self._closed or self._index is None:
            return
        due = self._index.next_due()
        if due is None:
            self._cancel_timer()
            return
        if self._timer is not None and self._timer_due is not None and self._timer_due <= due:
            return
        loop = self._get_loop()
        if loop is None:
            return
        self._cancel_timer()
        wait = max(0, due - self.clock()) / 1000
        self._timer = loop.call_at(loop.time() + wait, self.release_due)
        self._timer_due = due
        self.timer_changes += 1

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_due = None

    def release_due(self) -> None:
        """Route the messages that are due (up to DUE_BATCH, then again on the next loop turn).
        The timer calls this; so can a caller that knows the clock moved."""
        self._cancel_timer()
        if self._closed or self._index is None:
            return
        index = self._index
        now = self.clock()
        released: list[int] = []
        while len(released) < DUE_BATCH:
            due = index.next_due()
            if due is None or due > now:
                break
            pos = index.shift()
            assert pos is not None
            released.append(pos)
            self._route(pos)
        if released:
            self._ack_after_flush(released)
        if len(released) >= DUE_BATCH and index.next_due() is not None:
            self._timer_due = now  # more are due: continue on the next loop iteration
            self._timer = self._get_loop().call_soon(self.release_due)  # type: ignore[union-attr,assignment]
            return
        self._arm()

    def _route(self, pos: int) -> None:
        try:
            msg = self.store.messages.read(pos)
        except (CorruptRecord, MissingRecord) as err:
            log.error("delayed exchange index %r: dropping unreadable message at %#x: %s", self.name, pos, err)
            return
        try:
            self.on_due(msg)
        except Exception:
            log.exception("delayed exchange index %r: routing a due message failed; it is dropped", self.name)

    def _ack_after_flush(self, positions: list[int]) -> None:
        """Forget released messages once their routing is on disk, so a crash cannot lose them
        (at worst a message is routed twice). A transient exchange forgets them at once."""
        if not self.durable:
            for pos in positions:
                self.index.ack(pos)
            return

        async def ack_later() -> None:
            try:
                await self.store.flush()
            finally:
                if not self._closed and self._index is not None:
                    for pos in positions:
                        self._index.ack(pos)

        task = self._get_loop().create_task(ack_later())  # type: ignore[union-attr]
        self._pending_acks.add(task)
        task.add_done_callback(self._pending_acks.discard)

    # ---- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the timer. The index itself is closed (and compacted) by the vhost store's close;
        released messages whose routing was not yet flushed stay in it and are routed again on boot."""
        self._closed = True
        self._cancel_timer()
        for task in list(self._pending_acks):
            task.cancel()

    def delete(self) -> None:
        """The exchange is gone: drop the held messages and the index directory."""
        self.close()
        if self._index is not None:
            self.store.delete_queue(self._index)
            self._index = None


class DelayedExchange(Exchange):
    """``x-delayed-message``: routes like its inner ``x-delayed-type`` exchange, after ``x-delay`` ms."""

    type = "x-delayed-message"
    holds_messages = True

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        inner_type = self.arguments.get("x-delayed-type")
        if isinstance(inner_type, bytes):
            inner_type = inner_type.decode("utf-8", "replace")
        if inner_type == self.type:
            raise ArgumentError("x-delayed-type", "Invalid argument, 'x-delayed-message' can't be used "
                                                  "for 'x-delayed-type'")
        inner_class = INNER_TYPES.get(inner_type) if isinstance(inner_type, str) else None
        if inner_class is None:
            raise ArgumentError("x-delayed-type", "Invalid argument, 'x-delayed-type' must be an existing "
                                                  "exchange type")
        self.delayed_type: str = inner_type  # type: ignore[assignment]
        self.inner = inner_class(name, durable=self.durable, auto_delete=self.auto_delete,
                                 internal=self.internal, arguments=self.arguments)
        self.held: DelayedStore | None = None

    # -- routing is the inner exchange's -------------------------------------------------------

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        return self.inner.match(routing_key, headers)

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        self.inner.validate_binding(routing_key, arguments)

    def _index_add(self, key: BindingKey, binding: Binding) -> None:
        self.inner._index_add(key, binding)

    def _index_remove(self, key: BindingKey, binding: Binding) -> None:
        self.inner._index_remove(key, binding)

    # -- holding -------------------------------------------------------------------------------

    @property
    def index_name(self) -> str:
        return INDEX_PREFIX + self.name

    def open_store(self, store: VhostStore, on_due: Callable[[Exchange, StoredMessage], None], *,
                   loop: asyncio.AbstractEventLoop | None = None,
                   clock: Callable[[], int] = now_ms) -> DelayedStore:
        """Attach the held-message store (a durable exchange's held messages persist)."""
        held = DelayedStore(store, self.index_name, lambda msg: on_due(self, msg), durable=self.durable,
                            loop=loop, clock=clock)
        held.open()
        self.held = held
        return held

    def attach(self, store: VhostStore, on_due: Callable[[Exchange, StoredMessage], None]) -> None:
        self.open_store(store, on_due)

    def start_timers(self) -> None:
        if self.held is not None:
            self.held.arm()

    def close(self) -> None:
        if self.held is not None:
            self.held.close()

    def delete(self) -> None:
        if self.held is not None:
            self.held.delete()

    def hold(self, routing_key: str, properties: bytes, body: bytes, headers: dict | None) -> bool:
        """Hold the message if its x-delay asks for it; False means: route it now."""
        delay = delay_of(headers)
        if not should_delay(delay):
            return False
        if self.held is None:
            raise RuntimeError(f"delayed exchange {self.name!r} has no store; call open_store() first")
        # As the plugin, a durable exchange keeps every held message on disk, persistent or not.
        self.held.add(self.name, routing_key, properties, body, delay)  # type: ignore[arg-type]
        return True
