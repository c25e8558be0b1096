"""MessageStore.read_many against reading each position alone: the compiled run reader
(record.read_run) and the pure-Python loop give the same messages, raise the same errors at the same
position, and stop a run at segment boundaries, large records and damaged records."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lavinpy.store import message_store as ms
from lavinpy.store.message_store import LARGE_BODY, MessageStore, MissingRecord
from lavinpy.store.record import CorruptRecord
from lavinpy.wire.position import pos_offset, pos_segment

PROPS = [b"\x10\x00\x02", b"\x90\x00\x0atext/plain\x02", b"\x00\x00"]
READERS = ["compiled", "python"] if ms.read_run is not None else ["python"]


@pytest.fixture(params=READERS)
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MessageStore:
    if request.param == "python":
        monkeypatch.setattr(ms, "read_run", None)
    store = MessageStore(tmp_path, 64 * 1024)  # small segments: runs cross them
    store.open()
    return store


def fill(store: MessageStore, count: int, seed: int) -> tuple[list[int], list[tuple]]:
    rng = random.Random(seed)
    positions, expected = [], []
    for i in range(count):
        exchange = rng.choice(["", "amq.direct", "ex\u00e9"])
        key = rng.choice(["a", "b", f"k{i % 3}"])
        props = rng.choice(PROPS)
        body = rng.randbytes(rng.choice([0, 1, 16, 1000, 5000]))
        pos = store.append(exchange, key, props, body, 1000 + i)
        store.incref(pos_segment(pos), 1)
        positions.append(pos)
        expected.append((1000 + i, exchange, key, props, body))
    return positions, expected


@pytest.mark.parametrize("seed", range(4))
def test_runs_read_as_each_alone(store: MessageStore, seed: int) -> None:
    positions, expected = fill(store, 300, seed)
    got = store.read_many(positions)
    assert [tuple(m) for m in got] == expected
    assert [tuple(store.read(p)) for p in positions] == expected
    rng = random.Random(seed)
    picked = rng.sample(range(len(positions)), 80)  # out of order, across segments
    assert [tuple(m) for m in store.read_many([positions[i] for i in picked])] == [expected[i] for i in picked]
    assert store.read_many([]) == []


def test_a_large_record_inside_a_run(store: MessageStore) -> None:
    small = store.append("ex", "k", PROPS[0], b"small", 1)
    big_body = bytes(range(256)) * (LARGE_BODY // 256 + 1)
    big = store.append("ex", "k", PROPS[0], big_body, 2)
    after = store.append("ex", "k", PROPS[0], b"after", 3)
    for pos in (small, big, after):
        store.incref(pos_segment(pos), 1)
    got = store.read_many([small, big, after, small])
    assert [bytes(m.body) for m in got] == [b"small", big_body, b"after", b"small"]
    assert type(got[1].body) is memoryview  # read in place, not copied


def test_damage_inside_a_run_raises_as_read_does(store: MessageStore) -> None:
    positions, _ = fill(store, 40, 7)
    victim = positions[25]
    segment = store._segments[pos_segment(victim)]
    segment.mm[pos_offset(victim) + 20] ^= 0xFF  # inside the payload: the CRC fails
    with pytest.raises(CorruptRecord) as one:
        store.read(victim)
    with pytest.raises(CorruptRecord) as run:
        store.read_many(positions)
    assert str(run.value) == str(one.value)
    assert [tuple(m) for m in store.read_many(positions[:25])] == [tuple(store.read(p)) for p in positions[:25]]


def test_missing_positions_raise_as_read_does(store: MessageStore) -> None:
    positions, _ = fill(store, 10, 3)
    past_end = pos_segment(positions[-1]) | ((pos_offset(positions[-1]) + 100_000) << 32)
    with pytest.raises(MissingRecord):
        store.read_many([positions[0], past_end])
    with pytest.raises(MissingRecord):
        store.read_many([positions[0], 999 | (4 << 32)])  # no such segment
