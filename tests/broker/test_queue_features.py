"""A classic queue's feature component, in process: the queue takes the component's message paths
while it uses a feature and its plain ones otherwise; length limits and TTL act through it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lavinpy.broker.metrics.stats import NodeCounters
from lavinpy.broker.queues.base import QueueHost, QueueKind
from lavinpy.broker.queues.queue import FEATURE_PATHS, Queue
from lavinpy.broker.settings.arguments import QueueSettings
from lavinpy.store.index_kinds import FIFO
from lavinpy.store.queue_index import QueueIndex
from lavinpy.store.record import StoredMessage
from lavinpy.store.vhost_store import VhostStore


class StandInHost:
    """``QueueHost`` without a vhost: dead-lettering and scheduling are recorded."""

    def __init__(self, store: VhostStore) -> None:
        self.name = "/"
        self.store = store
        self.node_counters = NodeCounters()
        self.corrupt_messages = 0
        self.channel_wide_prefetches = 0
        self.scheduled: list[str] = []
        self.dead_lettered: list[tuple[str, bytes, str]] = []

    def schedule_delivery(self, queue: QueueKind) -> None:
        self.scheduled.append(queue.name)

    def dead_letter(self, queue: QueueKind, msg: StoredMessage, reason: str) -> int:
        self.dead_lettered.append((queue.name, msg.body, reason))
        return 1

    def delete_queue(self, name: str) -> int:
        return 0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[VhostStore]:
    store = VhostStore(tmp_path, segment_size=1 << 16)
    store.open()
    store.finish_recovery()
    yield store
    store.close()


def make_queue(store: VhostStore, arguments: dict | None = None) -> tuple[Queue, StandInHost]:
    host = StandInHost(store)
    index = store.open_queue("q", False, FIFO)
    assert isinstance(index, QueueIndex)
    as_host: QueueHost = host
    queue = Queue(as_host, "q", index, durable=False, arguments=arguments,
                  settings=QueueSettings.resolve(arguments or {}))
    return queue, host


def publish(queue: Queue, body: bytes, properties: bytes = b"\x00\x00") -> None:
    message = StoredMessage(1000, "", "q", properties, body)
    pos = queue.vhost.store.messages.append("", "q", properties, body, 1000)
    queue.push(pos, False, message)


def bodies(queue: Queue) -> list[bytes]:
    return [msg.body for msg, _redelivered in queue.peek(100)]


def test_a_plain_queue_takes_its_plain_paths_and_a_policy_switches_them(store: VhostStore) -> None:
    queue, _host = make_queue(store)
    assert not queue.special and not any(name in queue.__dict__ for name in FEATURE_PATHS)
    queue.apply_settings(QueueSettings.resolve({}, {"max-length": 2}, "limit"))
    assert queue.special
    assert all(queue.__dict__[name].__self__ is queue.features for name in FEATURE_PATHS)
    queue.apply_settings(QueueSettings.resolve({}))
    assert not queue.special and not any(name in queue.__dict__ for name in FEATURE_PATHS)
    for body in (b"a", b"b", b"c"):
        publish(queue, body)
    assert bodies(queue) == [b"a", b"b", b"c"]  # no limit any more


def test_drop_head_keeps_the_newest_and_dead_letters_the_oldest(store: VhostStore) -> None:
    queue, host = make_queue(store, {"x-max-length": 2, "x-dead-letter-exchange": "dlx"})
    for body in (b"a", b"b", b"c"):
        publish(queue, body)
    assert bodies(queue) == [b"b", b"c"]
    assert host.dead_lettered == [("q", b"a", "maxlen")]


def test_reject_publish_refuses_when_full(store: VhostStore) -> None:
    queue, _host = make_queue(store, {"x-max-length": 1, "x-overflow": "reject-publish"})
    assert not queue.refuses(1)
    publish(queue, b"a")
    assert queue.refuses(1)
    queue.apply_settings(QueueSettings.resolve({}))
    assert not queue.refuses(1)  # the plain queue refuses nothing


def test_a_message_with_an_expiration_turns_the_ttl_on(store: VhostStore) -> None:
    queue, _host = make_queue(store)
    assert not queue.special
    queue.enable_message_ttl()
    assert queue.special and queue.features.has_ttl


def test_get_and_settle_through_the_component(store: VhostStore) -> None:
    queue, _host = make_queue(store, {"x-max-length": 10})
    publish(queue, b"a")
    taken = queue.get()
    assert taken is not None and taken[1].body == b"a" and queue.unacked_count == 1
    queue.requeue(taken[0])
    again = queue.get()
    assert again is not None and again[2] is True  # redelivered
    queue.ack(again[0])
    assert (queue.message_count, queue.unacked_count) == (0, 0)
    assert queue.get() is None and queue.vhost.node_counters.get_empty == 1
