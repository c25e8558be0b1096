"""VhostStore.open_queue(name, durable, kind): one way to open every index, on real files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pamqp import commands

from lavinpy.broker.queues.priorities import priority_kind
from lavinpy.store.delayed_index import DelayedIndex
from lavinpy.store.index_kinds import FIFO, STREAM, ByDueTime, ByPriority
from lavinpy.store.priority_index import PriorityIndex
from lavinpy.store.queue_index import QueueIndex
from lavinpy.store.stream_index import StreamIndex
from lavinpy.store.vhost_store import VhostStore
from lavinpy.wire.properties import encode_properties


def open_store(path: Path) -> VhostStore:
    store = VhostStore(path, segment_size=4096, fsync="never")
    store.open()
    return store


def by_body(msg) -> int:
    return int(msg.body)


def test_each_kind_opens_its_index_and_is_registered_once(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    kinds = {"q": (FIFO, QueueIndex), "p": (ByPriority(3, lambda _props: 0), PriorityIndex),
             "d": (ByDueTime(by_body), DelayedIndex), "s": (STREAM, StreamIndex)}
    for name, (kind, cls) in kinds.items():
        index = store.open_queue(name, True, kind)
        assert type(index) is cls and store.queues[name] is index
        assert store.open_queue(name, True, kind) is index
    for name, other in (("q", STREAM), ("s", FIFO), ("p", FIFO), ("d", ByPriority(3, lambda _props: 0))):
        with pytest.raises(ValueError, match="already open as a"):
            store.open_queue(name, True, other)
    with pytest.raises(ValueError, match="must be durable"):
        store.open_queue("transient-stream", False, STREAM)
    store.close()


def test_recovered_order_comes_from_the_key_the_caller_hands_in(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    held = store.open_queue("d", True, ByDueTime(by_body))
    levels = store.open_queue("p", True, priority_kind(9))
    for due in (30, 10, 20):
        props = encode_properties(commands.Basic.Properties(priority=due // 10, delivery_mode=2))
        pos = store.messages.append("x", "rk", props, str(due).encode())
        held.push(pos, True, due)
        levels.push(pos, True, due // 10)
    store.close()

    store = open_store(tmp_path)
    held = store.open_queue("d", True, ByDueTime(by_body))
    levels = store.open_queue("p", True, priority_kind(9))
    store.finish_recovery()
    assert [int(store.messages.read(p).body) for p in held] == [10, 20, 30]
    assert [int(store.messages.read(p).body) for p in levels] == [30, 20, 10]
    assert held.next_due() == 10
    store.close()
