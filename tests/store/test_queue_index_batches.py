"""QueueIndex.shift_many / ack_many / requeue_many: the same state, files and reference counts as
shift / ack / requeue one at a time, for every index kind (the kinds with their own shift/ack/requeue
get them as loops)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lavinpy.store.message_store import MessageStore
from lavinpy.store.priority_index import PriorityIndex
from lavinpy.store.queue_index import QueueIndex


def drive(directory: Path, seed: int, batched: bool, kind: str) -> tuple:
    """One random sequence of pushes (persistent or not), shifts, acks, requeues on a durable index;
    ``batched`` takes and acks several positions per call."""
    rng = random.Random(seed)
    store = MessageStore(directory, segment_size=4096)
    store.open()
    if kind == "priority":
        index: QueueIndex = PriorityIndex("q", store, directory / "q", max_priority=3,
                                          priority_of=len)
    else:
        index = QueueIndex("q", store, directory / "q", ack_file_max_bytes=512)
    index.open()
    unacked: list[int] = []
    shifted: list[int] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.35:
            for _ in range(rng.randrange(1, 8)):
                index.push(store.append("", "q", b"\x00\x00", b"x" * rng.randrange(300)), rng.random() < 0.7)
        elif op < 0.6:
            count = rng.randrange(1, 12)
            if batched:
                taken = index.shift_many(count)
            else:
                taken = [pos for pos in (index.shift() for _ in range(count)) if pos is not None]
            shifted.extend(taken)
            unacked.extend(taken)
        elif unacked:  # acks; or requeues of one or many: onto an empty heap, a few onto many, many onto some
            rng.shuffle(unacked)
            if op < 0.85:
                count = rng.randrange(1, len(unacked) + 1)
                many, each = index.ack_many, index.ack
            else:
                count = rng.choice((1, 1, rng.randrange(1, len(unacked) + 1)))
                many, each = index.requeue_many, index.requeue
            settled, unacked = unacked[:count], unacked[count:]
            if batched:
                many(settled)
            else:
                for pos in settled:
                    each(pos)
    index.write_buffers()
    state = (shifted, list(index.ready_positions()), sorted(index.unacked()), list(index.live_positions()),
             index.ready_count, {s: store.refcount(s) for s in store.segment_ids()},
             sorted(p.name for p in directory.iterdir()))
    index.close()
    # The files may be compacted at other moments (once per batch), but they must say the same.
    reopened = QueueIndex("q", store, directory / "q")
    reopened.open()
    state += (sorted(reopened.live_positions()),)
    reopened.close()
    store.close()
    return state


@pytest.mark.parametrize("kind", ["fifo", "priority"])
@pytest.mark.parametrize("seed", range(6))
def test_batches_leave_the_same_state_as_single_steps(tmp_path: Path, seed: int, kind: str) -> None:
    one = drive(tmp_path / "one", seed, False, kind)
    many = drive(tmp_path / "many", seed, True, kind)
    assert many == one
    assert one[0]  # the sequence did take messages


def test_ack_many_refuses_a_position_that_is_not_unacked(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, segment_size=4096)
    store.open()
    index = QueueIndex("q", store, tmp_path / "q")
    index.open()
    positions = [store.append("", "q", b"\x00\x00", b"x") for _ in range(3)]
    for pos in positions:
        index.push(pos)
    taken = index.shift_many(2)
    assert taken == positions[:2] and index.ready_count == 1 and index.unacked_count == 2
    with pytest.raises(KeyError):
        index.ack_many([taken[0], positions[2]])
    assert index.unacked_count == 2  # nothing was removed
    index.ack_many(taken)
    assert index.unacked_count == 0 and index.shift_many(5) == positions[2:]
    index.close()
    store.close()


def test_requeue_many_refuses_a_position_that_is_not_unacked_and_changes_nothing(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, segment_size=4096)
    store.open()
    index = QueueIndex("q", store, tmp_path / "q")
    index.open()
    positions = [store.append("", "q", b"\x00\x00", b"x" * 40) for _ in range(300)]
    for pos in positions:
        index.push(pos)
    taken = index.shift_many(200)
    with pytest.raises(KeyError):
        index.requeue_many([*taken[:150], positions[250]])
    assert index.unacked_count == 200 and index.ready_count == 100
    index.requeue_many(taken[100:][::-1])  # in any order given: back in enq order, ahead of the rest
    index.requeue_many(taken[:100])  # many onto some: the heap rebuilt
    assert index.ready_count == 300 and index.unacked_count == 0
    assert index.shift_many(250) == positions[:250] and list(index.ready_positions()) == positions[250:]
    index.close()
    store.close()


def test_read_many_reads_as_read_and_raises_as_read(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, segment_size=4096)
    store.open()
    positions = [store.append("ex", f"rk{i}", b"\x00\x00", bytes([i]) * (i * 37 % 500 + 1)) for i in range(60)]
    assert len({pos & 0xFFFFFFFF for pos in positions}) > 2  # the run crosses segments
    order = positions[5:] + positions[:5]
    assert store.read_many(order) == [store.read(pos) for pos in order]
    outside = positions[-1] + (1000 << 32)  # past the valid data of the current segment
    with pytest.raises(KeyError):
        store.read_many([positions[0], outside])
    store.close()
