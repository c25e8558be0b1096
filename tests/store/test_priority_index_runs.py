"""A priority index's runs (``push_many`` with a level, ``shift_many``, ``split_taken``, ``ack_many``)
against the same operations one message at a time: the same delivery order, the same unacked and ready
positions, the same references, and after a restart the same queue (compactions included)."""

from __future__ import annotations

import random
from array import array
from pathlib import Path

import pytest
from pamqp import commands

from lavinpy.broker.queues.priorities import priority_kind
from lavinpy.store.priority_index import PriorityIndex
from lavinpy.store.vhost_store import VhostStore
from lavinpy.wire.position import pos_segment
from lavinpy.wire.properties import encode_properties

SEG = 4096
MAX_PRIORITY = 31


def open_store(path: Path) -> VhostStore:
    store = VhostStore(path, segment_size=SEG, fsync="never", ack_file_max_bytes=8 * 64)
    store.open()
    return store


def open_index(store: VhostStore) -> PriorityIndex:
    index = store.open_queue("pq", True, priority_kind(MAX_PRIORITY, 4))
    assert isinstance(index, PriorityIndex)
    return index


def scenario(path: Path, by_runs: bool, seed: int) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Random runs of one level pushed, shifted by two consumers, acked in order or not, requeued;
    returns the tags delivered, the ready and unacked tags, the references, and the tags after a
    restart (unacked ones ready again)."""
    rng = random.Random(seed)
    store = open_store(path)
    index = open_index(store)
    messages = store.messages
    tag_at: dict[int, int] = {}
    delivered: list[int] = []
    held: dict[int, list[list[int]]] = {0: [], 1: []}  # consumer -> its runs of unacked positions
    tag = 0
    for _ in range(120):
        step = rng.random()
        if step < 0.35:  # a published run of one level
            level = rng.choice([None, 0, 4, 4, 4, 9, 31, 40])
            count = rng.randint(1, 30)
            block = encode_properties(commands.Basic.Properties(priority=level, delivery_mode=2))
            positions = array("Q")
            for _ in range(count):
                pos = messages.append("ex", "rk", block, tag.to_bytes(4, "big"))
                tag_at[pos] = tag
                tag += 1
                positions.append(pos)
            pushed_level = 4 if level is None else level  # the broker hands the level it read
            if by_runs:
                index.push_many(positions, True, pushed_level)
            else:
                for pos in positions:
                    index.push(pos, True, pushed_level)
        elif step < 0.6:  # a delivery: shifted, then shared by the two consumers in turn
            count = rng.randint(1, 40)
            taken = index.shift_many(count) if by_runs else [p for p in (index.shift() for _ in range(count))
                                                             if p is not None]
            delivered.extend(tag_at[p] for p in taken)
            parts: list[list[int]] = [taken[0::2], taken[1::2]]
            if by_runs and taken:
                index.split_taken(taken, parts)
            for consumer, part in enumerate(parts):
                if part:
                    held[consumer].append(list(part))  # (the index keeps ``part`` as it is)
        elif step < 0.85:  # a consumer acks its oldest deliveries (a multiple ack), in order
            consumer = rng.randrange(2)
            runs = held[consumer]
            if runs:
                take = rng.randint(1, len(runs))
                acked = [p for run in runs[:take] for p in run]
                del runs[:take]
                if by_runs:
                    index.ack_many(acked)
                else:
                    for pos in acked:
                        index.ack(pos)
        else:  # one delivery settled out of order: acked or requeued
            consumer = rng.randrange(2)
            runs = [run for run in held[consumer] if run]
            if runs:
                run = rng.choice(runs)
                pos = run.pop(rng.randrange(len(run)))
                if rng.random() < 0.5:
                    index.ack(pos)
                else:
                    index.requeue(pos)
                held[consumer] = [r for r in held[consumer] if r]
    last = index.shift_many(3) if by_runs else [index.shift() for _ in range(3)]  # left unacked
    delivered.extend(tag_at[p] for p in last if p is not None)
    with pytest.raises(KeyError):
        index.ack_many([max(tag_at) + 8])  # never delivered: refused, nothing changed
    ready = [tag_at[p] for p in index]
    unacked = sorted(tag_at[p] for p in index.unacked())
    references = [messages.refcount(segment) for segment in sorted({pos_segment(p) for p in tag_at})]
    store.close()
    store = open_store(path)
    index = open_index(store)
    store.finish_recovery()
    after = [tag_at[p] for p in index]
    store.close()
    return delivered, ready, unacked, references, after


@pytest.mark.parametrize("seed", range(6))
def test_runs_of_a_priority_index_do_what_one_at_a_time_does(tmp_path: Path, seed: int) -> None:
    reference = scenario(tmp_path / "one", False, seed)
    assert scenario(tmp_path / "runs", True, seed) == reference
    delivered, ready, unacked, _references, after = reference
    assert delivered and unacked  # the scenario reaches what it is about (ready ones too, for most seeds)
    assert sorted(after) == sorted(ready + unacked)
