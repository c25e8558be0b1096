"""Model-based test: random operations on a real VhostStore against a plain-Python model.

After every step each queue's ready messages (in delivery order), its unacked set, the message
bodies, the segment reference counts and the segment files on disk are compared with the model.
Small segments and a small ack-file limit make rollovers, deletions and compactions frequent. 100 runs of
up to 60 steps in CI, 300 with LAVINPY_LONG=1.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from lavinpy.store.vhost_store import VhostStore
from lavinpy.wire.position import pos_segment
from tests.helpers import LONG

SEGMENT_SIZE = 4096
ACK_FILE_MAX_BYTES = 8 * 8
DURABLE = ["d0", "d1", "d2", "d3"]
TRANSIENT = ["t0"]
QUEUES = DURABLE + TRANSIENT


def body_of(msg_id: int, size: int) -> bytes:
    return (msg_id.to_bytes(4, "little") * (size // 4 + 1))[:size]


class ModelQueue:
    """What a queue should hold: requeued ids (delivered first, by id), never-delivered ids, unacked."""

    def __init__(self) -> None:
        self.requeued: list[int] = []
        self.fifo: list[int] = []
        self.unacked: set[int] = set()

    def ready(self) -> list[int]:
        return sorted(self.requeued) + self.fifo

    def shift(self) -> int | None:
        if self.requeued:
            self.requeued.sort()
            msg = self.requeued.pop(0)
        elif self.fifo:
            msg = self.fifo.pop(0)
        else:
            return None
        self.unacked.add(msg)
        return msg

    def live(self) -> set[int]:
        return set(self.requeued) | set(self.fifo) | self.unacked


class StoreMachine(RuleBasedStateMachine):
    base: Path
    counter = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.dir = self.base / f"case{next(self.counter)}"
        self.loop = asyncio.new_event_loop()
        self.model = {name: ModelQueue() for name in QUEUES}
        self.pos_of: dict[int, int] = {}  # message id -> position
        self.id_of: dict[int, int] = {}  # position -> message id
        self.size_of: dict[int, int] = {}
        self.next_id = 0
        self.store: VhostStore | None = None
        self._open()

    def _open(self) -> None:
        store = VhostStore(self.dir, segment_size=SEGMENT_SIZE, fsync="always",
                           ack_file_max_bytes=ACK_FILE_MAX_BYTES)
        store.open()
        for name in sorted(store.queue_names_on_disk()):
            store.open_queue(name, durable=True)
        for name in DURABLE:
            store.open_queue(name, durable=True)
        store.finish_recovery()
        for name in TRANSIENT:
            store.open_queue(name, durable=False)
        self.store = store

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def queue(self, name: str):
        return self.store.queues[name]

    # ---- rules -----------------------------------------------------------------------------------

    @rule(routed_to=st.sets(st.sampled_from(QUEUES), min_size=1, max_size=5),
          size=st.one_of(st.integers(0, 64), st.integers(0, 1500), st.just(5000)),
          count=st.integers(1, 8))
    def publish(self, routed_to: set[str], size: int, count: int) -> None:
        for _ in range(count):
            msg = self.next_id
            self.next_id += 1
            pos = self.store.messages.append("amq.direct", "key", b"\x00\x00", body_of(msg, size))
            self.pos_of[msg] = pos
            self.id_of[pos] = msg
            self.size_of[msg] = size
            for name in sorted(routed_to):
                self.queue(name).push(pos)
                self.model[name].fifo.append(msg)

    @rule(name=st.sampled_from(QUEUES), count=st.integers(1, 10))
    def deliver_and_ack(self, name: str, count: int) -> None:
        for _ in range(count):
            expected = self.model[name].shift()
            pos = self.queue(name).shift()
            assert (self.id_of[pos] if pos is not None else None) == expected
            if pos is None:
                break
            self.queue(name).ack(pos)
            self.model[name].unacked.discard(expected)

    @rule(name=st.sampled_from(QUEUES), count=st.integers(1, 6), data=st.data())
    def deliver_and_requeue(self, name: str, count: int, data) -> None:
        taken = []
        for _ in range(count):
            expected = self.model[name].shift()
            pos = self.queue(name).shift()
            assert (self.id_of[pos] if pos is not None else None) == expected
            if pos is None:
                break
            taken.append(expected)
        for msg in data.draw(st.permutations(taken)):
            self.queue(name).requeue(self.pos_of[msg])
            self.model[name].unacked.discard(msg)
            self.model[name].requeued.append(msg)

    @rule(name=st.sampled_from(QUEUES), count=st.integers(1, 4))
    def deliver_only(self, name: str, count: int) -> None:
        for _ in range(count):
            expected = self.model[name].shift()
            pos = self.queue(name).shift()
            assert (self.id_of[pos] if pos is not None else None) == expected

    @precondition(lambda self: any(m.unacked for m in self.model.values()))
    @rule(data=st.data(), requeue=st.booleans())
    def settle_unacked(self, data, requeue: bool) -> None:
        name = data.draw(st.sampled_from([n for n in QUEUES if self.model[n].unacked]))
        msg = data.draw(st.sampled_from(sorted(self.model[name].unacked)))
        self.model[name].unacked.discard(msg)
        if requeue:
            self.queue(name).requeue(self.pos_of[msg])
            self.model[name].requeued.append(msg)
        else:
            self.queue(name).ack(self.pos_of[msg])

    @rule(name=st.sampled_from(QUEUES))
    def purge(self, name: str) -> None:
        model = self.model[name]
        assert self.queue(name).purge() == len(model.requeued) + len(model.fifo)
        model.requeued.clear()
        model.fifo.clear()

    @rule(name=st.sampled_from(DURABLE))
    def delete_and_redeclare(self, name: str) -> None:
        self.store.delete_queue(self.queue(name))
        self.store.open_queue(name, durable=True)
        self.model[name] = ModelQueue()

    @rule()
    def flush(self) -> None:
        self.loop.run_until_complete(self.store.flush())
        assert not self.store.pending

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        if crash:  # as if killed after a flush: no compaction, no close-time sync
            self.loop.run_until_complete(self.store.flush())
        self.store.close(clean=not crash)
        self.store = None
        for name in DURABLE:  # unacked messages come back ready, everything in enq order
            model = self.model[name]
            model.fifo = sorted(model.live())
            model.requeued.clear()
            model.unacked.clear()
        for name in TRANSIENT:
            self.model[name] = ModelQueue()
        self._open()

    # ---- checks ----------------------------------------------------------------------------------

    @invariant()
    def queues_match_model(self) -> None:
        if self.store is None:
            return
        for name in QUEUES:
            index = self.queue(name)
            model = self.model[name]
            assert [self.id_of[p] for p in index] == model.ready(), name
            assert index.ready_count == len(model.requeued) + len(model.fifo)
            assert index.unacked_count == len(model.unacked)
            assert {self.id_of[p] for p in index.unacked()} == model.unacked

    @invariant()
    def messages_read_back_intact(self) -> None:
        if self.store is None:
            return
        live = set().union(*(m.live() for m in self.model.values()))
        for msg in live:
            stored = self.store.messages.read(self.pos_of[msg])
            assert stored.body == body_of(msg, self.size_of[msg])
            assert (stored.exchange, stored.routing_key) == ("amq.direct", "key")

    @invariant()
    def only_referenced_segments_exist(self) -> None:
        if self.store is None:
            return
        refs: dict[int, int] = {}
        for model in self.model.values():
            for msg in model.live():
                seg = pos_segment(self.pos_of[msg])
                refs[seg] = refs.get(seg, 0) + 1
        messages = self.store.messages
        for seg, count in refs.items():
            assert messages.refcount(seg) == count, seg
        expected = set(refs) | {messages.current_segment_id}
        assert set(messages.segment_ids()) == expected
        messages.settle_removals()
        on_disk = {int(p.name[5:]) for p in self.dir.glob("msgs.*")}
        assert on_disk == expected


def test_store_matches_model(tmp_path: Path) -> None:
    StoreMachine.base = tmp_path
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(max_examples=300 if LONG else 100, stateful_step_count=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]),
    )
