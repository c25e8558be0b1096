"""x-delayed-message on a real VhostStore and a real asyncio loop: timing, order, restarts, no churn."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pamqp import commands

from lavinpy.broker.exchanges.delayed import INDEX_PREFIX, DelayedExchange, delay_of, negate_delay, should_delay
from lavinpy.broker.settings.arguments import ArgumentError
from lavinpy.store.record import StoredMessage
from lavinpy.store.vhost_store import VhostStore
from lavinpy.wire.properties import decode_properties, encode_properties

SEG = 64 * 1024


def props(delay: object = None, **headers: object) -> bytes:
    if delay is not None:
        headers["x-delay"] = delay
    return encode_properties(commands.Basic.Properties(delivery_mode=2, headers=headers or None))


def open_vhost(path: Path, fsync: str = "never") -> VhostStore:
    store = VhostStore(path, segment_size=SEG, fsync=fsync)
    store.open()
    return store


class Harness:
    """A delayed exchange with its store; records (time, body, headers) of every due message."""

    def __init__(self, path: Path, *, durable: bool = True, delayed_type: str = "direct", fsync: str = "never",
                 clock: Callable[[], int] | None = None) -> None:
        self.store = open_vhost(path, fsync)
        self.exchange = DelayedExchange("dx", durable=durable, arguments={"x-delayed-type": delayed_type})
        self.due: list[tuple[float, bytes, dict]] = []
        self.due_timestamps: list[int] = []  # each due message's stored timestamp (wall ms when held)
        kwargs = {"clock": clock} if clock else {}
        self.held = self.exchange.open_store(self.store, self.on_due, **kwargs)
        self.store.finish_recovery()

    def on_due(self, exchange: DelayedExchange, msg: StoredMessage) -> None:
        assert exchange is self.exchange
        self.due.append((time.monotonic(), msg.body, decode_properties(msg.properties).headers or {}))
        self.due_timestamps.append(msg.timestamp)

    def publish(self, body: bytes, delay: object = None, routing_key: str = "rk") -> bool:
        properties = props(delay)
        return self.exchange.hold(routing_key, properties, body, {"x-delay": delay} if delay is not None else None)

    def bodies(self) -> list[bytes]:
        return [body for _t, body, _h in self.due]

    def close(self) -> None:
        self.held.close()
        self.store.close()


@pytest.mark.parametrize("arguments, text", [
    ({}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": "nope"}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": 5}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": "x-delayed-message"}, "Invalid argument, 'x-delayed-message' can't be used for "
                                              "'x-delayed-type'"),
])
def test_delayed_type_is_required(arguments: dict, text: str) -> None:
    with pytest.raises(ArgumentError) as info:
        DelayedExchange("dx", arguments=arguments)
    assert info.value.name == "x-delayed-type" and info.value.text == text


@pytest.mark.parametrize("delayed_type, key, bind_args, headers, routed", [
    ("direct", "a", {}, None, {"q1"}),
    ("topic", "a.*", {}, None, {"q1"}),
    ("fanout", "ignored", {}, None, {"q1", "q2"}),
    ("headers", "", {"x-match": "all", "k": "v"}, {"k": "v"}, {"q1"}),
])
def test_routes_like_its_delayed_type(delayed_type: str, key: str, bind_args: dict, headers: dict | None,
                                      routed: set) -> None:
    ex = DelayedExchange("dx", arguments={"x-delayed-type": delayed_type})
    assert ex.type == "x-delayed-message" and ex.delayed_type == delayed_type
    assert ex.bind("q1", key, bind_args) is True
    ex.bind("q2", "other", {"x-match": "all", "k": "zzz"} if delayed_type == "headers" else {})
    assert ex.route("a.b" if delayed_type == "topic" else "a", headers) == routed
    assert ex.unbind("q1", key, bind_args) is True
    assert "q1" not in ex.route("a.b" if delayed_type == "topic" else "a", headers)


@pytest.mark.parametrize("value, delay", [
    (1000, 1000), (-5, -5), ("250", 250), ("abc", None), (12.9, 12), (True, None), (None, None), ([1], None)])
def test_delay_header_parsing(value: object, delay: int | None) -> None:
    assert delay_of({"x-delay": value}) == delay
    assert delay_of(None) is None and delay_of({}) is None


def test_which_delays_hold() -> None:
    assert [should_delay(d) for d in (None, -1, 0, 1, 2**32 - 1, 2**32)] == [False, False, False, True, True, False]


def test_negate_delay_keeps_other_headers() -> None:
    out = decode_properties(negate_delay(props(500, app="x"), 500))
    assert out.headers == {"x-delay": -500, "app": "x"} and out.delivery_mode == 2


def test_messages_route_when_due_in_due_order(tmp_path: Path) -> None:
    # A message is due at the time it was held plus its delay, so the due order is not the order of the
    # delays alone: a publisher stalled for long enough between two publishes moves the second one's due
    # time. The order is checked against each message's own due time, and each is checked not to be
    # routed before it: nothing here depends on how long the publishes or the loop's turns take.
    async def run() -> Harness:
        h = Harness(tmp_path)
        assert h.publish(b"now") is False  # no x-delay: the caller routes it at once
        assert h.publish(b"zero", 0) is False
        held: dict[bytes, tuple[int, int, float, int]] = {}  # body: wall ms around the hold, monotonic, delay
        for body, delay in ((b"late", 120), (b"early", 30), (b"middle", "70")):
            wall_before, before = time.time_ns() // 1_000_000, time.monotonic()
            assert h.publish(body, delay) is True
            held[body] = (wall_before, time.time_ns() // 1_000_000, before, int(delay))
        assert len(h.held) == 3
        deadline = time.monotonic() + 30
        while len(h.due) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sorted(h.bodies()) == sorted(held)
        due_times = [timestamp + held[body][3] for body, timestamp in zip(h.bodies(), h.due_timestamps, strict=True)]
        assert due_times == sorted(due_times), (h.bodies(), due_times)
        for (at, body, headers), timestamp in zip(h.due, h.due_timestamps, strict=True):
            wall_before, wall_after, before, delay = held[body]
            assert wall_before <= timestamp <= wall_after  # held at the time of the publish
            # Due once the clock's whole ms reach the timestamp's plus the delay: up to 1 ms before the
            # exact moment (both are truncated to whole ms), and 1 ms more for the wall clock's slewing.
            assert at - before >= (delay - 2) / 1000, body
            assert headers["x-delay"] == -delay  # routed copy says it was delayed, as the plugin does
        await h.store.flush()
        await asyncio.sleep(0)
        assert len(h.held) == 0 and h.held.index.unacked_count == 0
        h.close()
        return h
    asyncio.run(run())


def test_held_messages_survive_a_restart(tmp_path: Path) -> None:
    async def first() -> None:
        h = Harness(tmp_path, fsync="always")
        h.publish(b"soon", 100)
        h.publish(b"later", 250)
        await h.store.flush()
        h.close()

    async def second() -> Harness:
        h = Harness(tmp_path)
        assert len(h.held) == 2
        await asyncio.sleep(0.5)
        assert h.bodies() == [b"soon", b"later"]
        assert h.due[0][2]["x-delay"] == -100
        h.close()
        return h

    asyncio.run(first())
    time.sleep(0.15)  # "soon" becomes due while the broker is down
    asyncio.run(second())
    # routed and acked: nothing comes back after another restart
    async def third() -> None:
        h = Harness(tmp_path)
        assert len(h.held) == 0
        await asyncio.sleep(0.05)
        assert h.due == []
        h.close()
    asyncio.run(third())


def test_crash_before_the_routing_flush_routes_again(tmp_path: Path) -> None:
    now = [1_000_000]

    async def first() -> None:
        h = Harness(tmp_path, fsync="always", clock=lambda: now[0])
        h.publish(b"m", 20)
        await h.store.flush()
        now[0] += 30
        h.held.release_due()
        assert h.bodies() == [b"m"]
        assert h.held.index.unacked_count == 1  # forgotten only once the routing is on disk
        # killed before that flush: the index is not closed cleanly
        h.held.close()
        h.store.close(clean=False)

    async def second() -> None:
        h = Harness(tmp_path, clock=lambda: now[0])
        h.held.release_due()
        assert h.bodies() == [b"m"]  # at least once: routed again rather than lost
        await h.store.flush()
        await asyncio.sleep(0)
        assert h.held.index.unacked_count == 0
        h.close()

    asyncio.run(first())
    asyncio.run(second())


def test_transient_exchange_forgets_at_once_and_keeps_no_files(tmp_path: Path) -> None:
    async def run() -> None:
        h = Harness(tmp_path, durable=False)
        h.publish(b"m", 10)
        await asyncio.sleep(0.05)
        assert h.bodies() == [b"m"]
        assert h.held.index.unacked_count == 0 and len(h.held) == 0
        assert not h.store.queue_path(INDEX_PREFIX + "dx").exists()
        h.close()
    asyncio.run(run())


def test_thousands_waiting_arm_one_timer(tmp_path: Path) -> None:
    async def run() -> None:
        h = Harness(tmp_path)
        for i in range(3000):  # increasing due times: the first message arms the only timer
            h.publish(b"%d" % i, 60_000 + i)
        assert h.held.timer_changes == 1
        rng = random.Random(3)
        for i in range(3000):  # random later delays never move the timer either
            h.publish(b"r%d" % i, rng.randint(61_000, 600_000))
        assert h.held.timer_changes == 1
        h.publish(b"first", 30)  # an earlier message moves it once
        assert h.held.timer_changes == 2
        await asyncio.sleep(0.1)
        assert h.bodies() == [b"first"] and len(h.held) == 6000
        assert h.held.timer_changes == 3  # re-armed once for the next due message
        h.close()
    asyncio.run(run())


def test_due_burst_is_routed_in_batches(tmp_path: Path) -> None:
    now = [1_000_000]

    async def run() -> None:
        h = Harness(tmp_path, clock=lambda: now[0])
        for i in range(2500):
            h.publish(b"%d" % i, 1 + i % 7)
        now[0] += 100  # everything is due at once
        h.held.release_due()
        assert len(h.due) == 1024  # one batch, the rest on the next loop turns
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(h.due) == 2500 and len(h.held) == 0
        bodies = [int(b) for b in h.bodies()]
        delays = [1 + b % 7 for b in bodies]
        assert delays == sorted(delays)  # by due time
        h.close()
    asyncio.run(run())


def test_delete_drops_held_messages_and_the_index(tmp_path: Path) -> None:
    async def run() -> None:
        h = Harness(tmp_path)
        h.publish(b"m", 10_000)
        await h.store.flush()
        path = h.store.queue_path(h.exchange.index_name)
        assert path.exists()
        h.held.delete()
        assert not path.exists() and h.exchange.index_name not in h.store.queues
        h.store.close()
    asyncio.run(run())


def test_hold_needs_a_store() -> None:
    ex = DelayedExchange("dx", arguments={"x-delayed-type": "direct"})
    assert ex.hold("rk", props(), b"", None) is False
    with pytest.raises(RuntimeError):
        ex.hold("rk", props(5), b"", {"x-delay": 5})


def test_a_held_message_costs_one_heap_int(tmp_path: Path) -> None:
    import tracemalloc

    from lavinpy.broker.exchanges.delayed import due_time
    from lavinpy.store.delayed_index import DelayedIndex

    store = open_vhost(tmp_path)
    index = DelayedIndex("d", store.messages, None, due_of=due_time)
    index.open()
    pos = store.messages.append("dx", "rk", props(5), b"x")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(20_000):
        index.push(pos, True, 1_700_000_000_000 + i)
    per_message = (tracemalloc.get_traced_memory()[0] - before) / 20_000
    tracemalloc.stop()
    assert per_message < 64, f"{per_message:.1f} bytes per held message"
    assert index.next_due() == 1_700_000_000_000 and index.peek() == pos
    store.close()
