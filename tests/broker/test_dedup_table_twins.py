"""The deduplication cache's compiled table (``_cwire.dedup_table``) and its pure-Python twin
(``DedupTable``) give the same answers, the same records for the file and the same live identifiers in
the same order, on the same random sequences: new, live and expired identifiers, blocks without one or
with another value type or their own TTL, tables that overflow (the ring grows and wraps), records taken
or skipped; and a whole cache on either table, with its file, across restarts, writes the same bytes."""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from lavinpy.broker.queues import dedup_cache
from lavinpy.broker.queues.dedup_table import CompiledTable, DedupTable, Table
from lavinpy.broker.settings.deduplication import MAX_KEY_BYTES, DedupSettings
from lavinpy.store import record
from lavinpy.store.accel import cstore
from lavinpy.store.vhost_store import VhostStore
from lavinpy.wire import accel
from lavinpy.wire.field_table import encode_table

NAME = b"x-deduplication-header"
TTL_NAME = b"x-cache-ttl"
compiled = pytest.mark.skipif(accel.cwire is None, reason="the compiled extension is not in use")


def block(value: object, **headers: object) -> bytes:
    return b"\x30\x00" + encode_table({NAME.decode(): value, **headers}) + b"\x02"


def random_blocks(rng: random.Random, count: int, ids: int) -> list[bytes]:
    values: list[object] = ["\u00fc", b"raw", 7, "z" * (MAX_KEY_BYTES - 1), "z" * MAX_KEY_BYTES,
                            "abcdefgh\u00e9", "0123456789abcde\u00ff"]  # (non-ASCII past the first eight)
    blocks = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.05:
            blocks.append(b"\x10\x00\x02")  # no headers
        elif roll < 0.1:
            blocks.append(block(rng.choice(values)))  # the whole way
        elif roll < 0.13:
            blocks.append(block(f"id{rng.randrange(ids)}", **{"x-cache-ttl": 5}))  # its own TTL
        elif roll < 0.16:  # the TTL header's name as bytes of a value, not an entry: the common message
            blocks.append(block(f"x-cache-ttl{rng.randrange(ids)}", other="x-cache-ttl"))
        else:
            blocks.append(block(f"id{rng.randrange(ids)}" + "k" * rng.randrange(40)))
    return blocks


def drive(table: Table, seed: int) -> list[object]:
    """A random sequence of the table's operations; everything it answered."""
    rng = random.Random(seed)
    trace: list[object] = []
    now = 1000
    for _ in range(300):
        now += rng.choice((0, 1, 7, 50))
        op = rng.random()
        if op < 0.5:
            duplicates: list[int] = []
            blocks = random_blocks(rng, rng.randrange(1, 40), rng.choice((5, 30, 500)))
            at = rng.randrange(len(blocks))
            ttl = rng.choice((-1, rng.randrange(0, 100)))  # (negative: never expires)
            trace.append(("run", table.run(NAME, MAX_KEY_BYTES, TTL_NAME, ttl, blocks, at, now, duplicates),
                          duplicates))
        elif op < 0.7:
            key = rng.choice((b"s", b"b")) + b"id%d" % rng.randrange(60) + b"q" * rng.randrange(300)
            table.put(key, rng.choice((0, now + rng.randrange(1, 100))))
        elif op < 0.8:
            trace.append(("get", table.get(b"sid%d" % rng.randrange(60))))
        elif op < 0.9:
            trace.append(("take", table.take_framed(rng.choice((-1, 0, now, 2 ** 60)))))
        elif op < 0.93:
            table.skip()
        else:
            trace.append(("live", table.live()))
        trace.append(("len", len(table)))
    trace.append(("end", table.live(), table.take_framed(-1)))
    return trace


@compiled
@pytest.mark.parametrize("seed", range(12))
def test_the_tables_agree_on_random_sequences(seed: int) -> None:
    for size in (1, 7, 40, 1000):
        for keep in (True, False):
            pure, fast = drive(DedupTable(size, keep), seed), drive(CompiledTable(size, keep), seed)
            assert fast == pure


def test_the_pure_table_forgets_the_oldest_and_skips_places_remembered_anew() -> None:
    table = DedupTable(2, True)
    table.put(b"sa", 5)
    table.put(b"sb", 0)
    table.put(b"sa", 9)  # anew: now the newest
    table.put(b"sc", 0)  # forgets b, not a
    assert table.get(b"sb") is None and table.get(b"sa") == 9 and len(table) == 2
    assert table.live() == b"\x02\x00" + (9).to_bytes(8, "little") + b"sa" + b"\x02\x00" + bytes(8) + b"sc"
    assert table.take_framed(-1).count(b"sa") == 2


def cache_run(tmp: Path, make: Callable[[int, bool], Table], seed: int,
              monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A durable cache on ``make``'s tables through random publish runs, asks one by one, expiries,
    writes and restarts: what it answered, its entries and its file."""
    monkeypatch.setattr(dedup_cache, "new_table", make)
    monkeypatch.setattr(dedup_cache, "COMPACT_MIN_RECORDS", 8)
    rng = random.Random(seed)
    store = VhostStore(tmp)
    store.open()
    settings = DedupSettings(cache_size=rng.choice((3, 10, 50)), ttl_ms=rng.choice((None, 20)))
    cache = dedup_cache.DedupCache(settings, store.open_append_file("dedup"))
    trace: list[object] = []
    now = 1000
    for _ in range(120):
        now += rng.choice((0, 3, 30))
        op = rng.random()
        blocks = random_blocks(rng, rng.randrange(1, 20), 40)
        if op < 0.6:
            trace.append(cache.new_in(blocks, now))
        elif op < 0.8:
            trace.append([cache.seen_in(b, now) for b in blocks])
        elif op < 0.9:
            assert cache._file is not None
            cache._file.take_unsynced_fds()  # a group commit's write
        elif op < 0.95:
            cache.compact()
        else:  # a restart (a clean close writes what waits)
            store.close()
            store = VhostStore(tmp)
            store.open()
            cache = dedup_cache.DedupCache(settings, store.open_append_file("dedup"))
        trace.append(list(cache.entries.items()))
    store.close()
    trace.append((tmp / "dedup").read_bytes() if (tmp / "dedup").exists() else sorted(p.name for p in tmp.iterdir()))
    return trace


@compiled
@pytest.mark.parametrize("seed", range(6))
def test_a_cache_on_either_table_answers_and_writes_the_same(tmp_path: Path, seed: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pure = cache_run(tmp_path / "pure", DedupTable, seed, monkeypatch)
    fast = cache_run(tmp_path / "fast", CompiledTable, seed, monkeypatch)
    assert fast == pure


FRAMERS = [pytest.param(record.py_frame_batch, id="pure")] + (
    [pytest.param(cstore.frame_batch, id="compiled")] if cstore is not None else [])


@pytest.mark.both_paths
@pytest.mark.parametrize("frame_batch", FRAMERS)
@pytest.mark.parametrize("size", [0, 1, 15, 1700])
@pytest.mark.parametrize("mark", [-1, 0, 7, 0x0102030405060708])
def test_a_batch_is_framed_with_zlibs_crc(frame_batch: Callable[[bytes, int], bytes], size: int, mark: int) -> None:
    """A batch is its length, the mark record (key length 0, the segment) when there is one, the records
    and zlib's CRC of the mark and records: both framers write what files written before hold."""
    records = bytes(random.Random(size).randrange(256) for _ in range(size))
    framed = frame_batch(records, mark)
    body = (struct.pack("<HQ", 0, mark) if mark >= 0 else b"") + records
    assert framed == struct.pack("<I", len(body)) + body + struct.pack("<I", zlib.crc32(body))
    assert framed == record.frame_batch(records, mark)


@pytest.mark.parametrize("seed", range(4))
def test_the_pure_runs_sole_entry_reading_is_header_spans(seed: int) -> None:
    """The pure table reads the usual block (its headers table the identifier alone) without the general
    walk: on blocks of that form, cut, lengthened or with bytes changed, it finds what header_span finds
    (an identifier remembered, a block without one kept, a stop where the walk cannot tell)."""
    rng = random.Random(seed)
    for _ in range(300):
        raw = bytearray(block(f"id{rng.randrange(10 ** 6)}"))
        for _ in range(rng.randrange(3)):  # damage: a byte changed, the block cut or lengthened
            choice = rng.randrange(3)
            if choice == 0:
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            elif choice == 1:
                del raw[rng.randrange(len(raw)):]
            else:
                raw += bytes(rng.randrange(1, 4))
        blocks = [bytes(raw)]
        pure, fast = DedupTable(10, True), CompiledTable(10, True) if accel.cwire is not None else None
        expected = _walked_run(blocks)
        got: list[int] = []
        assert (pure.run(NAME, MAX_KEY_BYTES, TTL_NAME, -1, blocks, 0, 1, got), got, pure.take_framed(-1)) == expected
        if fast is not None:
            got = []
            assert (fast.run(NAME, MAX_KEY_BYTES, TTL_NAME, -1, blocks, 0, 1, got), got,
                    fast.take_framed(-1)) == expected


def _walked_run(blocks: list[bytes]) -> tuple[tuple[int, int], list[int], bytes]:
    """What a run of one block answers by header_span's walk alone."""
    from lavinpy.wire.properties import header_span
    raw = blocks[0]
    span = header_span(raw, NAME) if raw else None
    if span == ():
        return (1, 0), [], record.frame_batch(b"", -1)
    if not span or raw[span[0]] != 0x53 or span[1] - span[0] - 5 >= MAX_KEY_BYTES:
        return (0, 0), [], record.frame_batch(b"", -1)
    text = raw[span[0] + 5:span[1]]
    if not text.isascii() or TTL_NAME in raw and header_span(raw, TTL_NAME):
        return (0, 0), [], record.frame_batch(b"", -1)
    key = b"s" + text
    return (1, 1), [], record.frame_batch(struct.pack("<HQ", len(key), 0) + key, -1)


TABLES = [pytest.param(DedupTable, id="pure")] + (
    [pytest.param(CompiledTable, id="compiled")] if accel.cwire is not None else [])


@pytest.mark.both_paths
@pytest.mark.parametrize("make", TABLES)
@pytest.mark.parametrize("seed", range(3))
def test_a_taken_batch_is_the_records_since_the_last_take_framed_with_zlibs_crc(
        make: Callable[[int, bool], Table], seed: int) -> None:
    """``take_framed`` is the records put since the last take (forgotten ones too: the file has not had
    them), in order, framed as ``frame_batch`` frames them, as the ring fills, grows and wraps."""
    rng = random.Random(seed)
    table = make(rng.choice((1, 5, 300)), True)
    put: list[bytes] = []
    for _ in range(400):
        if rng.random() < 0.8:
            key = b"s" + b"k%d" % rng.randrange(500) + b"z" * rng.randrange(rng.choice((3, 40, 400)))
            expiry = rng.choice((0, rng.randrange(1, 2 ** 63)))
            table.put(key, expiry)
            put.append(struct.pack("<HQ", len(key), expiry) + key)
        else:
            mark = rng.choice((-1, 0, rng.randrange(2 ** 62)))
            body = (struct.pack("<HQ", 0, mark) if mark >= 0 else b"") + b"".join(put)
            assert table.take_framed(mark) == struct.pack("<I", len(body)) + body + struct.pack("<I", zlib.crc32(body))
            put.clear()
    table.skip()
    assert table.take_framed(-1) == record.frame_batch(b"", -1)
