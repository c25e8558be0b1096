"""The C store path (_cstore) and the pure-Python reference agree on the same inputs.

Records written by one decode with the other and the segments are byte-identical; damaged records
are refused with the same error; ready lists and queue indexes driven by the same operations end in
the same state. Runs whenever the extension is built, whatever LAVINPY_PURE_PYTHON says.
"""

from __future__ import annotations

import datetime
import random
import tempfile
import zlib
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from lavinpy.store import record
from lavinpy.store.message_store import MessageStore
from lavinpy.store.queue_index import QueueIndex
from lavinpy.store.ready_list import CHUNK_ENTRIES, PyReadyList

cstore = pytest.importorskip("lavinpy.store._cstore")
cstore.configure(record.StoredMessage, record.CorruptRecord)

names_text = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
short = st.text(max_size=20).filter(lambda s: len(s.encode()) <= 255)


@st.composite
def properties(draw: st.DrawFn) -> bytes:
    fields = {
        "content_type": draw(st.none() | short),
        "headers": draw(st.none() | st.dictionaries(st.text(min_size=1, max_size=8), st.integers(-5, 5) | short,
                                                    max_size=3)),
        "delivery_mode": draw(st.none() | st.sampled_from([1, 2])),
        "priority": draw(st.none() | st.integers(0, 9)),
        "correlation_id": draw(st.none() | short),
        "expiration": draw(st.none() | st.sampled_from(["0", "60000"])),
        "timestamp": draw(st.none() | st.just(datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC))),
        "app_id": draw(st.none() | short),
    }
    return commands.Basic.Properties(**{k: v for k, v in fields.items() if v is not None}).marshal()


message = st.tuples(names_text, names_text, properties(), st.binary(max_size=3000),
                    st.integers(-(1 << 63), (1 << 63) - 1))


def encode_both(exchange: str, routing_key: str, props: bytes, body: bytes, ts: int) -> tuple[bytearray, bytearray]:
    names = record.encode_names(exchange.encode(), routing_key.encode())
    size = 7 + record.record_size(exchange.encode(), routing_key.encode(), props, len(body)) + 5
    c_buf, py_buf = bytearray(size), bytearray(size)
    assert cstore.write_encoded(c_buf, 7, names, props, body, ts) == \
        record.py_write_encoded(py_buf, 7, names, props, body, ts) == size - 12
    return c_buf, py_buf


@settings(max_examples=300, deadline=None)
@given(message)
def test_records_are_byte_identical_and_decode_both_ways(msg: tuple) -> None:
    exchange, routing_key, props, body, ts = msg
    c_buf, py_buf = encode_both(exchange, routing_key, props, body, ts)
    assert c_buf == py_buf
    expected = (record.StoredMessage(ts, exchange, routing_key, props, body), len(c_buf) - 12)
    for decode in (cstore.read_record, record.py_read_record):
        for buf in (c_buf, py_buf):
            assert decode(memoryview(buf), 7, len(buf)) == expected
            got = decode(memoryview(buf), 7, len(buf), verify=False, copy=False)
            assert got == (expected[0]._replace(body=b""), expected[1])
    assert type(cstore.read_record(c_buf, 7, len(c_buf))[0]) is record.StoredMessage


def outcome(decode, buf: bytearray, end: int, verify: bool) -> tuple:
    try:
        return ("ok",) + decode(memoryview(buf), 7, end, verify=verify)
    except record.CorruptRecord as exc:
        return ("corrupt", str(exc))


@settings(max_examples=400, deadline=None)
@given(message, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, 20), st.booleans())
def test_damaged_records_are_refused_alike(msg: tuple, flips: list, cut: int, verify: bool) -> None:
    buf = encode_both(*msg)[0]
    for where, value in flips:
        buf[7 + where % (len(buf) - 7)] = value
    end = max(0, len(buf) - cut)
    assert outcome(cstore.read_record, buf, end, verify) == outcome(record.py_read_record, buf, end, verify)


@pytest.mark.parametrize("per_body", [False, True], ids=["one-properties-block", "properties-per-body"])
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=700), properties()), min_size=1, max_size=30), st.integers(0, 6000),
       st.integers(0, 3), st.integers(1, 1 << 32 - 1))
def test_write_run_matches_record_by_record(per_body: bool, messages: list, limit: int, start: int,
                                            segment: int) -> None:
    """One properties block for the whole run (the first message's), or each body with its own."""
    bodies = [body for body, _props in messages]
    each = [props for _body, props in messages] if per_body else [messages[0][1]] * len(messages)
    blocks = each if per_body else each[0]
    start = min(start, len(bodies))
    names = record.encode_names(b"amq.direct", b"key")
    c_buf, py_buf = bytearray(6000), bytearray(6000)
    c_result = cstore.write_run(c_buf, 4, limit, segment, names, blocks, bodies, start, 1234)
    py_result = record.py_write_run(py_buf, 4, limit, segment, names, blocks, bodies, start, 1234)
    assert c_result == py_result and c_buf == py_buf
    done, end, packed, smallest, largest = c_result
    positions = array("Q")
    positions.frombytes(packed)
    assert len(positions) == done - start and end <= max(limit, 4)
    written = [len(body) for body in bodies[start:done]]
    assert (smallest, largest) == ((min(written), max(written)) if written else (0, 0))
    for i, pos in zip(range(start, done), positions, strict=True):
        assert pos & 0xFFFFFFFF == segment
        msg = record.py_read_record(memoryview(c_buf), pos >> 32, end)[0]
        assert (msg.body, msg.properties, msg.routing_key) == (bodies[i], each[i], "key")
    if done < len(bodies):  # the first one left out did not fit
        assert end + record.HEADER_SIZE + 16 + len(names) + len(each[done]) + len(bodies[done]) > limit
    c_messages = cstore.stored_messages(7, "x", "k", blocks, bodies, start, len(bodies) - start)
    assert c_messages == record.py_stored_messages(7, "x", "k", blocks, bodies, start, len(bodies) - start)
    assert [m.properties for m in c_messages] == each[start:]


def pwrite_all_of(bodies: list, blocks: bytes | list, names: bytes, limit: int, size: int) -> tuple[bytes, list]:
    """pwrite_run's calls over a run until it stops (at most 256 KiB a call): the file's bytes, each result."""
    with tempfile.TemporaryFile() as f:
        f.truncate(size)
        results, start, offset = [], 0, 4
        while start < len(bodies):
            results.append(cstore.pwrite_run(f.fileno(), offset, limit, 9, names, blocks, bodies, start, 1234))
            if results[-1][0] == start:
                break
            start, offset = results[-1][0], results[-1][1]
        f.seek(0)
        return f.read(), results


@pytest.mark.parametrize("per_body", [False, True], ids=["one-properties-block", "properties-per-body"])
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=700), properties()), min_size=1, max_size=30), st.integers(0, 6000))
def test_pwrite_run_writes_what_write_run_writes(per_body: bool, messages: list, limit: int) -> None:
    """The compiled write into a file (small runs, see message_store._PWRITE_RUN) and the write into a mapping."""
    bodies = [body for body, _props in messages]
    blocks = [props for _body, props in messages] if per_body else messages[0][1]
    names = record.encode_names(b"amq.direct", b"key")
    py_buf = bytearray(6000)
    py_result = record.py_write_run(py_buf, 4, limit, 9, names, blocks, bodies, 0, 1234)
    data, results = pwrite_all_of(bodies, blocks, names, limit, 6000)
    assert results[0] == py_result and data == py_buf


def test_pwrite_run_takes_a_long_run_in_calls_of_at_most_256_kib() -> None:
    bodies = [bytes([i % 251]) * 1000 for i in range(700)]  # 700 KiB and more of records
    names = record.encode_names(b"", b"q")
    py_buf = bytearray(1 << 20)
    py_result = record.py_write_run(py_buf, 4, len(py_buf), 9, names, b"\x10\x00\x02", bodies, 0, 1234)
    data, results = pwrite_all_of(bodies, b"\x10\x00\x02", names, len(py_buf), len(py_buf))
    assert len(results) == 3 and all(end - begin <= 256 * 1024 for (_, end, *_), begin in
                                      zip(results, [4] + [r[1] for r in results], strict=False))
    assert data == py_buf and results[-1][:2] == py_result[:2]
    assert b"".join(r[2] for r in results) == py_result[2]


def test_write_run_refuses_a_properties_list_of_another_length() -> None:
    names = record.encode_names(b"", b"key")
    for write in (cstore.write_run, record.py_write_run):
        with pytest.raises(ValueError):
            write(bytearray(100), 0, 100, 1, names, [b"\0\0"], [b"a", b"b"], 0, 1)
    with tempfile.TemporaryFile() as f, pytest.raises(ValueError):
        cstore.pwrite_run(f.fileno(), 0, 100, 1, names, [b"\0\0"], [b"a", b"b"], 0, 1)


@given(st.binary(max_size=5000), st.integers(0, (1 << 32) - 1))
def test_crc32_is_zlibs(data: bytes, value: int) -> None:
    assert cstore.crc32(data, value) == zlib.crc32(data, value)


@given(st.lists(st.binary(max_size=300), max_size=40), st.integers(0, 50), st.integers(0, 50))
def test_total_size_is_the_slices_bytes(blocks: list, start: int, stop: int) -> None:
    assert cstore.total_size(blocks, start, stop) == record.py_total_size(blocks, start, stop) \
        == len(b"".join(blocks[start:stop]))


ready_ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(0, (1 << 64) - 1)),
    st.tuples(st.just("extend"), st.lists(st.integers(0, (1 << 64) - 1), max_size=CHUNK_ENTRIES + 10)),
    st.tuples(st.just("shift"), st.integers(1, CHUNK_ENTRIES + 10)),
    st.tuples(st.just("shift_many"), st.integers(-1, 2 * CHUNK_ENTRIES + 10)),
    st.tuples(st.just("extend_big"), st.integers(CHUNK_ENTRIES - 2, 3 * CHUNK_ENTRIES + 2)),
    st.tuples(st.just("peek"), st.none()),
    st.tuples(st.just("to_bytes"), st.tuples(st.integers(0, 3 * CHUNK_ENTRIES), st.integers(0, 3 * CHUNK_ENTRIES))),
    st.tuples(st.just("clear"), st.none()),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ready_ops)
def test_ready_lists_agree(ops: list) -> None:
    c_list, py_list = cstore.ReadyList(), PyReadyList()
    for op, arg in ops:
        if op == "push":
            assert c_list.push(arg) is py_list.push(arg) is None
        elif op == "extend":
            c_list.extend(array("Q", arg))
            py_list.extend(array("Q", arg))
        elif op == "shift":
            assert [c_list.shift() for _ in range(arg)] == [py_list.shift() for _ in range(arg)]
        elif op == "shift_many":
            assert c_list.shift_many(arg) == py_list.shift_many(arg)
        elif op == "extend_big":  # across block boundaries, from wherever the tail is
            c_list.extend(array("Q", range(arg)))
            py_list.extend(array("Q", range(arg)))
        elif op == "peek":
            assert c_list.peek() == py_list.peek()
        elif op == "to_bytes":
            assert c_list.to_bytes(*arg) == py_list.to_bytes(*arg) == c_list.to_bytes()[8 * arg[0]:8 * arg[1]]
            assert c_list.to_bytes(arg[0]) == py_list.to_bytes(arg[0])
        else:
            c_list.clear()
            py_list.clear()
        assert len(c_list) == len(py_list)
        assert c_list.to_bytes() == py_list.to_bytes()


def test_ready_list_gives_memory_back_when_drained() -> None:
    ready = cstore.ReadyList()
    assert ready.__sizeof__() < 100
    ready.extend(array("Q", range(1_000_000)))
    assert 8_000_000 <= ready.__sizeof__() < 8_000_000 + 2 * 8 * CHUNK_ENTRIES  # no doubling slack
    assert [ready.shift() for _ in range(999_000)] == list(range(999_000))
    assert ready.shift_many(990) == list(range(999_000, 999_990))
    # what is left: the entries' block, one spare, a small pointer array
    assert len(ready) == 10 and ready.__sizeof__() < 3 * 8 * CHUNK_ENTRIES
    assert array("Q", ready.to_bytes()).tolist() == list(range(999_990, 1_000_000))
    assert ready.shift_many(20) == list(range(999_990, 1_000_000))
    assert len(ready) == 0 and ready.__sizeof__() < 100 and ready.shift() is None


def test_ready_list_of_a_few_entries_stays_small() -> None:
    """A queue whose consumers keep up holds a handful of entries in one small block, forever."""
    ready, reference = cstore.ReadyList(), PyReadyList()
    for i in range(20_000):
        for r in (ready, reference):
            r.push(i)
            if i % 7 == 0 or len(r) > 40:  # between 1 and 40 entries, the head moving on
                r.shift()
        assert ready.peek() == reference.peek() and len(ready) == len(reference)
        assert ready.__sizeof__() < 1_000
    assert ready.to_bytes() == reference.to_bytes()
    ready.shift_many(len(ready))
    assert ready.__sizeof__() < 1_000  # a small block is kept for the next push


def test_ready_list_grows_without_copying_in_huge_extends() -> None:
    """Blocks at every boundary: extends of exact block multiples, one past, one short, after a shift."""
    ready, reference = cstore.ReadyList(), PyReadyList()
    total = 0
    for n in (CHUNK_ENTRIES, 1, CHUNK_ENTRIES - 1, 5 * CHUNK_ENTRIES, 5 * CHUNK_ENTRIES + 1, 300_000):
        chunk = array("Q", range(total, total + n))
        ready.extend(chunk)
        reference.extend(chunk)
        total += n
        assert ready.shift() == reference.shift()
        assert len(ready) == len(reference)
    assert ready.__sizeof__() < 8 * len(ready) + 3 * 8 * CHUNK_ENTRIES
    assert ready.to_bytes() == reference.to_bytes()
    assert ready.shift_many(CHUNK_ENTRIES * 3 + 7) == reference.shift_many(CHUNK_ENTRIES * 3 + 7)
    assert ready.peek() == reference.peek()
    assert ready.to_bytes() == reference.to_bytes()


def drive_index(directory: Path, ready_list: type, seed: int) -> tuple:
    """One random sequence of push / push_many / shift / ack / requeue / purge on a durable index."""
    rng = random.Random(seed)
    store = MessageStore(directory, segment_size=4096)
    store.open()
    index = QueueIndex("q", store, directory / "q")
    index.open()
    index._ready = ready_list()
    unacked: list[int] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.3:
            index.push(store.append("", "q", b"\x00\x00", b"x" * rng.randrange(200)), rng.random() < 0.7)
        elif op < 0.45:
            bodies = [b"y" * rng.randrange(300) for _ in range(rng.randrange(1, 20))]
            start = 0
            while start < len(bodies):
                start, positions = store.append_run("", "q", b"\x10\x00\x02", bodies, start, 99)[:2]
                index.push_many(positions, rng.random() < 0.7)
        elif op < 0.7:
            pos = index.shift()
            if pos is not None:
                unacked.append(pos)
        elif op < 0.85 and unacked:
            index.ack(unacked.pop(rng.randrange(len(unacked))))
        elif op < 0.97 and unacked:
            index.requeue(unacked.pop(rng.randrange(len(unacked))))
        elif op >= 0.97:
            index.purge()
    index.write_buffers()
    state = (list(index.ready_positions()), sorted(index.unacked()), list(index.live_positions()),
             index.ready_count, {s: store.refcount(s) for s in store.segment_ids()},
             (directory / "q" / "enq").read_bytes(), (directory / "q" / "ack").read_bytes())
    segments = [(directory / f"msgs.{s:010d}").read_bytes() for s in store.segment_ids()]
    index.close()
    store.close()
    return state, segments


@pytest.mark.parametrize("seed", range(8))
def test_queue_index_state_is_the_same_with_either_ready_list(tmp_path: Path, seed: int) -> None:
    c_state, c_segments = drive_index(tmp_path / "c", cstore.ReadyList, seed)
    py_state, py_segments = drive_index(tmp_path / "py", PyReadyList, seed)
    assert c_state == py_state
    assert len(c_segments) == len(py_segments)


@given(st.lists(st.binary(max_size=50), max_size=20), st.integers(0, 25), st.integers(0, 25), names_text,
       properties())
def test_stored_messages_of_a_run_agree(bodies: list, start: int, count: int, exchange: str, props: bytes) -> None:
    args = (1700000000000, exchange, "rk", props, bodies, start, count)
    try:
        expected = record.py_stored_messages(*args)
    except IndexError:
        with pytest.raises(IndexError):
            cstore.stored_messages(*args)
        return
    got = cstore.stored_messages(*args)
    assert got == expected and all(type(m) is record.StoredMessage for m in got)
    assert [m.body for m in got] == bodies[start:start + count]


def rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_drained_ready_list_gives_its_pages_back_to_the_system() -> None:
    """Its blocks are mapped, not heap chunks that allocations in between would keep resident."""
    before = rss_anon_kib()
    ready = cstore.ReadyList()
    kept = []
    for _ in range(1000):
        ready.extend(array("Q", range(4 * CHUNK_ENTRIES)))  # 128 MiB in all
        kept.append(bytes(3000))  # heap allocations between the blocks, still alive after the drain
    assert rss_anon_kib() - before > 100_000
    while len(ready):
        ready.shift_many(10_000)
    assert rss_anon_kib() - before < 16_000
    assert len(kept) == 1000


# Positions as the store makes them (offset << 32 | segment; few segments, so that radix digits repeat
# and their passes are skipped) and any 64-bit words.
store_positions = st.tuples(st.integers(0, (1 << 32) - 1), st.integers(0, 3)).map(lambda t: t[0] << 32 | t[1])
any_words = st.integers(0, (1 << 64) - 1)


@settings(max_examples=200)
@given(st.lists(store_positions | any_words, max_size=700), st.lists(store_positions | any_words, max_size=300))
def test_enq_order_sort_matches_the_python_sort(positions: list[int], keys: list[int]) -> None:
    """Positions and enq-order keys sorted into enq order, below and above the comparison sort's size."""
    from lavinpy.store.index_files import py_enq_sorted

    got = array("Q")
    got.frombytes(cstore.enq_order_sort(array("Q", positions), array("Q", keys)))
    assert got == py_enq_sorted(array("Q", positions), keys)


def test_enq_order_sort_matches_the_python_sort_at_every_size() -> None:
    """Around the comparison sort's limit (256) and well past it (the radix sort's passes)."""
    from lavinpy.store.index_files import py_enq_sorted

    rng = random.Random(7)
    for n in (2, 255, 256, 257, 5000):
        for segments in (1, 3, 1 << 20):
            positions = array("Q", (rng.randrange(1 << 32) << 32 | rng.randrange(segments) for _ in range(n)))
            keys = [rng.randrange(segments) << 32 | rng.randrange(1 << 32) for _ in range(n // 3)]
            got = array("Q")
            got.frombytes(cstore.enq_order_sort(positions, array("Q", keys)))
            assert got == py_enq_sorted(positions, keys), (n, segments)


def test_enq_order_sort_refuses_a_torn_entry() -> None:
    with pytest.raises(ValueError, match="8-byte entries"):
        cstore.enq_order_sort(b"\x00" * 12, b"")
