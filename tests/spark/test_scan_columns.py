"""scan_columns (lavinpy.wire.delivery_columns), a receive buffer's deliveries appended to columns without
a Python object a delivery: the compiled twin and the pure one agree on everything (the result, the
bytearrays' filled parts and capacity, the redelivered rows, the runs, the errors), on arbitrary receive
buffers cut anywhere, from any position, a few rows at a time, after rows appended before; what it reads
(each delivery's body, stamped x-stream-offset and redelivered flag; one run a stretch of deliveries that
differ at most in the stamped value); where it stops (the bytes run out, the generic path's frames begin,
2 GiB of bodies).
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from lavinpy.wire import accel, client, writer
from lavinpy.wire.delivery_columns import (
    NO_OFFSET,
    STOP_FULL,
    STOP_OTHER,
    STOP_RAN_OUT,
    STREAM_OFFSET_ENTRY,
    DeliveryColumns,
    _scan_columns,
    scan_columns,
    stamped_offset_at,
)
from tests.spark.delivery_frames import (
    BASES,
    HEARTBEAT,
    KINDS,
    MAX_DATA,
    NESTED,
    PLAIN,
    STAMPED,
    STRING,
    copy_columns,
    deliver,
    empty_columns,
    ends_of,
    expected_runs,
    filled,
    make_row,
    names,
    needs_compiled,
    nested_look_alike,
    offsets_of,
    outcome,
    stamped,
    twins,
    value,
)
from tests.wire.frames import mutate

pytestmark = pytest.mark.both_paths


# --- scan_columns: the twins agree --------------------------------------------------------------------

offsets = st.integers(-2**63 + 1, 2**63 - 1)  # -2**63 is NO_OFFSET: never a stream's offset
_ENTRY_AND_VALUE = STREAM_OFFSET_ENTRY + value(3)
# Blocks the scan's look for a stamp must walk with care: fixed-size fields, strings, headers of
# unknown types, and truncated, overlong or odd ones (a stamp's bytes where a table cannot hold them).
odd_blocks = st.sampled_from([
    b"", b"\x00", b"\x10\x00\x02", b"\x18\x00\x02\x05", b"\x90\x00\x0atext/plain\x01", b"\x80\x00\x09abc",
    b"\x20\x00" + struct.pack(">I", 8) + b"\x01kS\x00\x00\x00\x01v", b"\x20\x00" + struct.pack(">I", 3) + b"\x01kZ",
    b"\x20\x00", b"\x20\x00\x00\x00", b"\xe0\x00\x05ab", b"\xe0\x00\x01a",
    b"\x20\x00" + struct.pack(">I", 26) + _ENTRY_AND_VALUE,  # the table's length past the block
    b"\x20\x00" + struct.pack(">I", 24) + _ENTRY_AND_VALUE[1:],  # too short to hold the entry
    b"\x20\x01" + struct.pack(">I", 25) + _ENTRY_AND_VALUE,  # a second flag word
    b"\xa0\x00\x03abc" + struct.pack(">I", 25) + _ENTRY_AND_VALUE,  # content type, then stamped headers
    b"\xe0\x00\x01a\x02bc" + struct.pack(">I", 25) + _ENTRY_AND_VALUE + b"\x02",  # and more after them
    b"\x20\x00" + struct.pack(">I", 25) + _ENTRY_AND_VALUE + b"\x02",  # trailing bytes no flag asks for
    # the entry's bytes in the content type, its value's over the (empty) headers' length: no stamp
    b"\xa0\x00\x15" + STREAM_OFFSET_ENTRY + b"abcd" + bytes(4),
])
any_block = st.one_of(st.builds(lambda kind, offset: KINDS[kind][0](offset), st.integers(0, len(KINDS) - 1), offsets),
                      odd_blocks)


channels = st.sampled_from([1, 1, 1, 0, 2])  # mostly the scanned one
whole_deliveries = st.builds(deliver, any_block, st.binary(max_size=200), st.integers(0, 2**64 - 1), names, names,
                             st.booleans(), channels)
pieces = st.one_of(
    # whole deliveries (mostly on the scanned channel 1), empty bodies too
    *[whole_deliveries] * 6,
    # a body over several frames (the generic path's)
    st.builds(deliver, any_block, st.binary(min_size=57, max_size=200), st.integers(0, 2**64 - 1), names, names,
              st.booleans(), st.just(1), st.just(64)),
    # names that are not UTF-8
    st.builds(lambda body: deliver(b"\x00\x00", body, routing_key="q").replace(b"\x01q", b"\x01\xff", 1),
              st.binary(max_size=10)),
    st.sampled_from([HEARTBEAT, writer.basic_ack(1, 5, False),
                     writer.method_frame(1, commands.Basic.Publish(0, "ex", "rk")),
                     writer._HEADER_HEAD.pack(2, 1, 14, 60, 0, 0) + b"\x00\x00\xce",  # a header alone
                     b"\x03\x00\x01\x00\x00\x00\x02ab\xce"]),  # a body frame alone
    st.binary(max_size=30),
)
flips = st.one_of(st.just([]), st.just([]),
                  st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=2))
# A receive buffer: whole deliveries on the scanned channel first (mostly), then anything.
streams = st.builds(lambda head, tail, flips: mutate(b"".join(head + tail), flips),
                    st.lists(st.builds(deliver, any_block, st.binary(max_size=200), st.integers(0, 2**64 - 1), names,
                                       names, st.booleans()), max_size=4),
                    st.lists(pieces, min_size=1, max_size=6), flips)
clean_streams = st.lists(st.one_of(whole_deliveries, pieces), max_size=4).map(b"".join)


@needs_compiled
@settings(max_examples=400)
@given(streams, st.one_of(st.just(0), st.integers(0, 60)), st.booleans(), st.sampled_from([1, 1, 1, 1, 0, 2]),
       st.one_of(st.just(0), st.just(0), st.just(0), st.integers(-1, 60)),
       st.sampled_from([0, 1, 2, 3, sys.maxsize, sys.maxsize]),
       st.one_of(st.none(), clean_streams), st.booleans(), st.sampled_from([0, 0, 0, 0, 0, 1, -1]))
def test_scan_columns_twins_agree(stream: bytes, cut: int, as_bytearray: bool, channel: int, pos: int, max_rows: int,
                                  before: bytes | None, appended: bool, skew: int) -> None:
    """From columns holding what an earlier scan (and an append) put there, or rows and data_len past
    them (skew): the same results and columns, call after call from where the last one stopped."""
    # The columns before: an earlier buffer's deliveries on the channel (None: the stream's first one,
    # whose run the scan goes on with), then maybe a generic delivery.
    if before is None:
        before = stream[:DeliveryColumns().scan(stream, channel, 0, 1)[1]]
    start = DeliveryColumns()
    start.scan(before, channel)
    if appended:
        start.append(start.last_tag + 1, None, "ex", "rk", [None] * 14, b"generic", False)
    rows, data_len = start.rows + skew, start.data_len + max(skew, 0)
    cols_c = copy_columns((start.offsets, start.ends, start.data, start.redelivered, start.runs))
    cols_py = copy_columns(cols_c)
    # Cut short as a receive buffer is: the scan stops at the cut (bytes ran out) or before it (other).
    data = stream[:len(stream) - cut]
    data = bytearray(data) if as_bytearray else data
    for _call in range(4):
        compiled = outcome(accel.cclient.scan_columns, data, channel, pos, max_rows, cols_c, rows, data_len)
        assert compiled == outcome(_scan_columns, data, channel, pos, max_rows, cols_py, rows, data_len)
        if not isinstance(compiled[0], int):
            assert compiled[0] is ValueError and skew
            break
        added, data_len, _last_tag, pos, stop = compiled
        assert filled(cols_c, rows + added, data_len) == filled(cols_py, rows + added, data_len)
        rows += added
        if not added:
            break


@needs_compiled
def test_scan_columns_twins_agree_with_any_byte_of_a_run_changed() -> None:
    """Three deliveries alike but for tags, flags, offsets and bodies, with each byte of the second set to
    a few other values in turn (one at a time): whether it is still like the first (only its tag, flag,
    stamped value or body changed), a delivery of another run, or no whole delivery, the twins agree."""
    layouts = [(stamped(BASES[1], 7), "ex", "rk", 100), (BASES[0], "", "jobs", 3), (stamped(BASES[2], 7), "é", "", 0)]
    for block, exchange, routing_key, body_len in layouts:
        parts = [deliver(block, bytes([i]) * body_len, tag=5 + i, exchange=exchange, routing_key=routing_key,
                         redelivered=i == 1) for i in range(3)]
        for at in range(len(parts[1])):
            for byte in {parts[1][at] ^ 1, parts[1][at] ^ 0x80, 0, 0xCE}:
                second = bytearray(parts[1])
                second[at] = byte
                data = parts[0] + bytes(second) + parts[2]
                cols_c, cols_py = empty_columns(), empty_columns()
                compiled = outcome(accel.cclient.scan_columns, data, 1, 0, sys.maxsize, cols_c, 0, 0)
                assert compiled == outcome(_scan_columns, data, 1, 0, sys.maxsize, cols_py, 0, 0), (at, byte)
                assert filled(cols_c, compiled[0], compiled[1]) == filled(cols_py, compiled[0], compiled[1])


@needs_compiled
@settings(max_examples=600)
@given(st.integers(0, len(KINDS) - 1), names, names, st.sampled_from([0, 1, 7, 8, 9, 100]),
       st.lists(st.tuples(offsets, st.integers(0, 2**64 - 1), st.booleans(), st.integers(0, 255)), min_size=2,
                max_size=6),
       st.one_of(st.none(), st.tuples(st.integers(1, 5), st.integers(-8, 90), st.integers(0, 255))),
       st.integers(0, 40))
def test_scan_columns_twins_agree_on_runs_of_one_layout(kind: int, exchange: str, routing_key: str, body_len: int,
                                                        rows: list[tuple[int, int, bool, int]],
                                                        flip: tuple[int, int, int] | None, cut: int) -> None:
    """The run a read is made of: deliveries alike but for their delivery tags, redelivered flags, stamped
    offsets and body bytes (the compiled scan reads those at the places the first one had them), then
    maybe one byte of a later one changed (it is then no longer like the ones before, or no longer a
    delivery), and the buffer cut short: the twins agree."""
    build = KINDS[kind][0]
    parts = [deliver(build(offset), bytes([fill]) * body_len, tag=tag, exchange=exchange, routing_key=routing_key,
                     redelivered=flag) for offset, tag, flag, fill in rows]
    data = bytearray(b"".join(parts))
    if flip is not None:
        which, at, byte = flip
        which %= len(parts)
        data[sum(map(len, parts[:which])) + at % len(parts[which])] = byte
    data = bytes(data[:len(data) - cut])
    cols_c, cols_py = empty_columns(), empty_columns()
    compiled = outcome(accel.cclient.scan_columns, data, 1, 0, sys.maxsize, cols_c, 0, 0)
    assert compiled == outcome(_scan_columns, data, 1, 0, sys.maxsize, cols_py, 0, 0)
    assert filled(cols_c, compiled[0], compiled[1]) == filled(cols_py, compiled[0], compiled[1])
    if flip is None and not cut:  # every delivery read; stamped or plain blocks make one run
        assert compiled[0] == len(rows)
        assert len(cols_c[4]) == 1 or kind >= NESTED


@needs_compiled
def test_scan_columns_picks_the_compiled_twin() -> None:
    assert scan_columns.__module__ == "lavinpy.wire.delivery_columns"
    block = stamped(b"\x00\x00", 5)
    buf = deliver(block, b"x", tag=3, redelivered=True)
    results = []
    for fn in (scan_columns, accel.cclient.scan_columns, _scan_columns):
        cols = empty_columns()
        results.append((fn(buf, 1, 0, 9, cols, 0, 0), filled(cols, 1, 1)))
    assert results[0] == results[1] == results[2]
    assert results[0][0] == (1, 1, 3, len(buf), STOP_RAN_OUT)


def test_scan_columns_at_every_cut_point() -> None:
    """A buffer cut anywhere: the whole deliveries before the cut, then STOP_RAN_OUT, by both twins."""
    rows = [make_row(STAMPED, 100, body=b"b0"), make_row(STAMPED, 101, body=b""),
            make_row(PLAIN, 0, body=b"b2", redelivered=True), make_row(STAMPED + 3, 102, body=b"b3" * 50, exchange="x"),
            make_row(STRING, 7, body=b"")]
    parts = [row.frames(10 + i) for i, row in enumerate(rows)]
    buf = b"".join(parts)
    ends = [sum(map(len, parts[:i + 1])) for i in range(len(parts))]
    for cut in range(len(buf) + 1):
        whole = sum(1 for end in ends if end <= cut)
        results = []
        for scan in twins():
            for data in (buf[:cut], bytearray(buf[:cut])):
                cols = empty_columns()
                got = scan(data, 1, 0, sys.maxsize, cols, 0, 0)
                results.append((got, filled(cols, got[0], got[1])))
        assert all(result == results[0] for result in results), cut
        (added, data_len, last_tag, pos, stop), (_o, _e, body_data, _cap, redelivered, runs) = results[0]
        assert (added, pos, stop) == (whole, ends[whole - 1] if whole else 0, STOP_RAN_OUT), cut
        assert last_tag == (9 + whole if whole else 0)
        assert body_data == b"".join(row.body for row in rows[:whole]) and data_len == len(body_data)
        assert redelivered == ([2] if whole > 2 else [])
        assert runs == expected_runs(rows[:whole])


def test_scan_columns_reads_columns_and_shares_runs() -> None:
    """Offsets, bodies and their ends, the last tag; deliveries that differ only in the stamped value
    share one run; the scan stops where the bytes run out, and at a frame that is no delivery on its
    channel (the generic path's turn)."""
    props = b"\x90\x00\x0atext/plain\x02"
    stream = b"".join(deliver(stamped(props, 100 + i), b"b%d" % i, tag=10 + i) for i in range(3))
    plain = deliver(props, b"b3", tag=13)
    at = stamped_offset_at(stamped(props, 100))
    assert stamped(props, 100)[at:at + 8] == value(100)
    for scan in twins():
        cols = empty_columns()
        assert scan(stream + plain + plain[:30], 1, 0, sys.maxsize, cols, 0, 0) == \
            (4, 8, 13, len(stream) + len(plain), STOP_RAN_OUT)
        assert offsets_of(cols, 4) == [100, 101, 102, NO_OFFSET]
        assert ends_of(cols, 4) == [0, 2, 4, 6, 8] and cols[2][:8] == b"b0b1b2b3"
        assert cols[4] == [(0, b"ex", b"rk", stamped(props, 100), at), (3, b"ex", b"rk", props, -1)]
        assert cols[3] == []
        # a frame that is no delivery on the channel: the generic path's turn
        cols = empty_columns()
        assert scan(stream + writer.basic_ack(1, 5, False), 1, 0, sys.maxsize, cols, 0, 0) == \
            (3, 6, 12, len(stream), STOP_OTHER)
        assert scan(stream, 2, 0, sys.maxsize, empty_columns(), 0, 0) == (0, 0, 0, 0, STOP_OTHER)
        # max_rows: the rows asked for, then the next call goes on (in the same run)
        cols = empty_columns()
        first = scan(stream, 1, 0, 2, cols, 0, 0)
        assert first[0] == 2 and first[4] == STOP_RAN_OUT
        assert scan(stream, 1, first[3], 5, cols, 2, first[1]) == (1, 6, 12, len(stream), STOP_RAN_OUT)
        assert offsets_of(cols, 3) == [100, 101, 102] and len(cols[4]) == 1


def test_scan_columns_reports_redelivered_deliveries() -> None:
    """Queue reads: the row of each delivery flagged redelivered, counted on from the rows before."""
    props = b"\x90\x00\x0atext/plain\x02"
    flags = [False, True, False, True, True]
    stream = b"".join(deliver(props, b"m%d" % i, tag=7 + i, exchange="", routing_key="jobs", redelivered=flag)
                      for i, flag in enumerate(flags))
    for scan in twins():
        cols = empty_columns()
        added, data_len, last_tag, used, stop = scan(stream, 1, 0, sys.maxsize, cols, 0, 0)
        assert (added, data_len, last_tag, used, stop) == (5, 10, 11, len(stream), STOP_RAN_OUT)
        assert cols[3] == [1, 3, 4] and offsets_of(cols, 5) == [NO_OFFSET] * 5
        assert scan(stream, 1, 0, sys.maxsize, cols, 5, 10)[0] == 5
        assert cols[3] == [1, 3, 4, 6, 8, 9]


def test_scan_columns_stops_where_the_generic_path_reads() -> None:
    """Whatever is not a whole delivery on the channel with its body in one frame stops the scan there
    (STOP_OTHER), after the deliveries before it."""
    first = deliver(b"\x00\x00", b"one")
    others = [
        deliver(b"\x00\x00", b"x" * 100, frame_max=64),  # a body over two frames
        deliver(b"\x00\x00", b"two", channel=2),  # another channel
        HEARTBEAT,
        writer.basic_ack(1, 5, False),
        writer.method_frame(1, commands.Basic.Cancel("ctag")),
        writer.method_frame(1, commands.Basic.Deliver("ctag", 2, False, "ex", "rk")) + client.frame(3, 1, b"two"),
        deliver(b"\x00\x00", b"two")[:-1] + b"\x00",  # a body frame not ended by 0xCE
    ]
    for other in others:
        for scan in twins():
            cols = empty_columns()
            assert scan(first + other + first, 1, 0, sys.maxsize, cols, 0, 0) == \
                (1, 3, 1, len(first), STOP_OTHER), other
            assert scan(first + other, 1, len(first), sys.maxsize, cols, 1, 3) == \
                (0, 3, 0, len(first), STOP_OTHER)


def test_scan_columns_refuses_rows_past_the_columns() -> None:
    """rows or data_len past the bytearrays given (or negative): ValueError, nothing appended."""
    buf = deliver(b"\x00\x00", b"abc")
    for scan in twins():
        for cols, rows, data_len in ((empty_columns(), -1, 0), (empty_columns(), 0, -1), (empty_columns(), 1, 0),
                                     (empty_columns(), 0, 1), ((bytearray(8), bytearray(4), bytearray(), [], []), 1, 0),
                                     ((bytearray(8), bytearray(8), bytearray(2), [], []), 1, 3)):
            before = filled(cols, 0, 0)
            with pytest.raises(ValueError, match="rows or data_len past the columns"):
                scan(buf, 1, 0, sys.maxsize, cols, rows, data_len)
            assert filled(cols, 0, 0) == before


def test_scan_columns_positions_outside_the_buffer_read_nothing() -> None:
    buf = deliver(b"\x00\x00", b"abc")
    for scan in twins():
        for pos in (-1, -len(buf), len(buf), len(buf) + 5):
            assert scan(buf, 1, pos, sys.maxsize, empty_columns(), 0, 0) == (0, 0, 0, len(buf), STOP_RAN_OUT)
        assert scan(buf, 1, 0, 0, empty_columns(), 0, 0) == (0, 0, 0, 0, STOP_RAN_OUT)


def test_a_stamp_is_only_a_trailing_entry_of_the_headers() -> None:
    """Where the stamped value's bytes are (found by both twins alike; the compiled one's shows in the
    run): the headers' last entry, after the fields before them, or nowhere."""
    entry = STREAM_OFFSET_ENTRY + value(3)
    cases = [
        (b"\x20\x00" + struct.pack(">I", 25) + entry, 2 + 4 + 17),
        (b"\xa0\x00\x03abc" + struct.pack(">I", 25) + entry, 2 + 4 + 4 + 17),
        (b"\xe0\x00\x01a\x02bc" + struct.pack(">I", 25) + entry + b"\x02", 2 + 2 + 3 + 4 + 17),
        (stamped(BASES[3], 3), len(stamped(BASES[3], 3).split(entry)[0]) + 17),
        (b"\x00\x00", -1), (b"\x80\x00\x03abc", -1), (b"\x20\x00", -1), (b"\x20\x00\x00\x00", -1),
        (b"\x20\x00" + struct.pack(">I", 26) + entry, -1),  # the table's length past the block
        (b"\x20\x00" + struct.pack(">I", 24) + entry[1:], -1),  # a table too short for the entry
        (b"\x20\x01" + struct.pack(">I", 25) + entry, -1),  # a second flag word
        (b"\xa0\x00\x15" + STREAM_OFFSET_ENTRY + b"abcd" + bytes(4), -1),  # the entry's bytes before the table
        (b"\xe0\x00\x30" + b"x" * 10, -1),  # the content type past the block
        (b"\x20\x00" + struct.pack(">I", 25) + STREAM_OFFSET_ENTRY[:-1] + b"I" + value(3), -1),  # another type
        (nested_look_alike(3), len(nested_look_alike(3)) - 8),  # (the bytes say so: the decode refutes it)
    ]
    for block, at in cases:
        assert stamped_offset_at(block) == at, block
        for scan in twins():
            runs: list[Any] = []
            buf = deliver(block, b"x")
            assert scan(buf, 1, 0, 1, (bytearray(), bytearray(4), bytearray(), [], runs), 0, 0)[0] == 1
            assert runs == [(0, b"ex", b"rk", block, at)], block


class _Huge(bytearray):
    """A data column that says it is 2 GiB long (its bytes are not): the bodies' 2 GiB bound, in reach."""

    def __len__(self) -> int:
        return MAX_DATA


def test_bodies_stop_before_2_gib() -> None:
    """Arrow's binary arrays have int32 ends: a body that would take the joined bodies past 2**31 - 1
    bytes is left for the next columns (STOP_FULL), after those that fit (an empty body always does)."""
    bodies = [b"ab", b"", b"c", b""]
    parts = [deliver(b"\x00\x00", body, tag=1 + i) for i, body in enumerate(bodies)]
    buf = b"".join(parts)
    cols = (bytearray(), bytearray(4), _Huge(), [], [])
    assert _scan_columns(buf, 1, 0, sys.maxsize, cols, 0, MAX_DATA - 2) == \
        (2, MAX_DATA, 2, len(parts[0]) + len(parts[1]), STOP_FULL)
    assert ends_of(cols, 2)[1:] == [MAX_DATA, MAX_DATA]
    at = len(parts[0]) + len(parts[1])
    assert _scan_columns(buf, 1, at, sys.maxsize, cols, 2, MAX_DATA) == (0, MAX_DATA, 0, at, STOP_FULL)
    # the bytes running out comes first: nothing to say about room
    assert _scan_columns(buf[:at + 5], 1, at, sys.maxsize, cols, 2, MAX_DATA) == (0, MAX_DATA, 0, at, STOP_RAN_OUT)
    # one byte of room: the body of one byte goes in, then the empty one
    cols = (bytearray(), bytearray(4), _Huge(), [], [])
    assert _scan_columns(buf, 1, at, sys.maxsize, cols, 0, MAX_DATA - 1) == (2, MAX_DATA, 4, len(buf), STOP_RAN_OUT)
