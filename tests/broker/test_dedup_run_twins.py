"""The deduplication cache's run in C (``_cwire.dedup_run``, ``_cwire.dedup_records``) and its
pure-Python twins (``remember_run``, ``render_records``) give the same answers and leave the cache in
the same state, on the same random runs: new, live, expired identifiers, blocks without one, other
value types, messages with their own TTL, a cache that overflows, with and without a file."""

from __future__ import annotations

import random
from collections import deque

import pytest

from lavinpy.broker.queues.dedup_cache import remember_run, render_records
from lavinpy.broker.settings.deduplication import MAX_KEY_BYTES
from lavinpy.wire import accel
from lavinpy.wire.field_table import encode_table

NAME = b"x-deduplication-header"
TTL_NAME = b"x-cache-ttl"
compiled = pytest.mark.skipif(accel.cwire is None, reason="the compiled extension is not in use")


def block(value: object, **headers: object) -> bytes:
    return b"\x30\x00" + encode_table({NAME.decode(): value, **headers}) + b"\x02"


def random_blocks(rng: random.Random, count: int) -> list[bytes]:
    values: list[object] = [*(f"id{n}" for n in range(25)), "ü", b"raw", 7, "z" * (MAX_KEY_BYTES - 1),
                            "z" * MAX_KEY_BYTES]
    blocks = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.05:
            blocks.append(b"\x10\x00\x02")  # no headers
        elif roll < 0.1:
            blocks.append(b"\x30\x00" + encode_table({"other": "x"}) + b"\x02")  # headers, no identifier
        elif roll < 0.15:
            blocks.append(block(rng.choice(values), **{"x-cache-ttl": 5}))
        elif roll < 0.17:
            blocks.append(b"\x30\x01\x00\x00")  # a flag continuation word: the finder cannot tell
        else:
            blocks.append(block(rng.choice(values)))
    return blocks


def one_way(way: object, blocks: list[bytes], rng: random.Random, written: bool) -> list[object]:
    """Every step's answer and the cache's state after it, taking the run as the cache would."""
    entries: dict[bytes | str, int] = {}
    arrivals: deque[bytes | str] = deque()
    unwritten: list[bytes | str] | None = [] if written else None
    trace: list[object] = []
    at, now = 0, 1000
    while at < len(blocks):
        duplicates: list[int] = []
        expiry = rng.choice([0, now + 30])
        stop, added = way(blocks, at, NAME, MAX_KEY_BYTES, TTL_NAME, entries, arrivals, 10, expiry, now,  # type: ignore[operator]
                          unwritten, duplicates)
        trace.append((stop, added, duplicates, list(entries.items()), list(arrivals),
                      None if unwritten is None else list(unwritten)))
        at = stop + 1  # (the caller takes the message it stopped at the whole way)
        now += rng.randint(0, 20)
    return trace


@compiled
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("written", [True, False])
def test_the_compiled_run_and_its_twin_agree(seed: int, written: bool) -> None:
    blocks = random_blocks(random.Random(seed), 500)
    assert accel.cwire is not None
    pure = one_way(remember_run, blocks, random.Random(seed + 100), written)
    fast = one_way(accel.cwire.dedup_run, blocks, random.Random(seed + 100), written)
    assert fast == pure
    assert any(step[2] for step in pure) and len(pure[-1][3]) == 10  # duplicates met, the cache filled
    assert any(step[1] for step in pure) == written


def test_a_run_stops_where_the_whole_way_is_needed() -> None:
    entries: dict[bytes | str, int] = {"old": 500, "live": 0}
    arrivals: deque[bytes | str] = deque(entries)
    blocks = [block("new"), block("live"), b"\x10\x00\x02", block("old"), block("after")]
    duplicates: list[int] = []
    assert remember_run(blocks, 0, NAME, MAX_KEY_BYTES, TTL_NAME, entries, arrivals, 10, 0, 1000, [], duplicates) \
        == (3, 1)  # "old" expired at 500: remembered anew by the caller
    assert duplicates == [1] and list(arrivals) == ["old", "live", "new"]
    assert remember_run([block(1)], 0, NAME, MAX_KEY_BYTES, TTL_NAME, entries, arrivals, 10, 0, 1000, None,
                        duplicates) == (0, 0)  # an integer identifier: the whole way


@pytest.mark.parametrize("seed", range(3))
def test_the_compiled_records_and_their_twin_agree(seed: int) -> None:
    rng = random.Random(seed)
    keys: list[bytes | str] = [rng.choice([f"k{n}", b"s\xc3\xbc", b"i7", b"h" + bytes(32), ""]) for n in range(200)]
    expiries = [rng.choice([0, 1, 2**40, 2**64 - 1]) for _ in keys]
    records = render_records(keys, expiries)
    assert records[:2] == (len(keys[0]) + (type(keys[0]) is str)).to_bytes(2, "little")
    if accel.cwire is not None:
        assert accel.cwire.dedup_records(keys, expiries) == records
        assert accel.cwire.dedup_records([], []) == render_records([], []) == b""
