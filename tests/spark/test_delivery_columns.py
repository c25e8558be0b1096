"""DeliveryColumns (lavinpy.wire.delivery_columns): runs split exactly where more than the stamped value
differs; decode gives each row the offset and properties of decoding its own property block (also when a
nested table or a string ends with bytes like the stamped entry, when the offset is not the last header,
when there is none), however the rows came (scans, appends, decodes between); the row range of an
offsets column (streams._range_rows).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.spark.streams import ColumnsSink, _range_rows
from lavinpy.wire import delivery_columns
from lavinpy.wire.delivery_columns import (
    NO_OFFSET,
    DeliveryColumns,
    offset_and_properties,
    stamped_offset_at,
)
from tests.spark.delivery_frames import (
    AFTER,
    AFTER_OFFSET,
    BASES,
    INT32,
    KINDS,
    NESTED,
    NOT_LAST,
    PLAIN,
    STAMPED,
    STRING,
    Row,
    expected_runs,
    fill,
    look_alike_after_the_offset,
    make_row,
    names,
    own_decode,
    stamped,
)

pytestmark = pytest.mark.both_paths



# --- runs --------------------------------------------------------------------------------------------


def test_runs_are_shared_only_where_deliveries_differ_in_the_stamped_value() -> None:
    changed_after = stamped(BASES[3], 21)
    changed_after = changed_after[:-1] + b"q"  # app_id "apq": a field after the headers differs
    rows = [
        make_row(PLAIN + 1, 0), make_row(PLAIN + 1, 0),  # text/plain, no offset: the same block, one run
        make_row(STAMPED + 1, 5), make_row(STAMPED + 1, 6), make_row(STAMPED + 1, -7),  # only the value differs
        make_row(STAMPED + 1, 8, exchange="other"),  # another exchange
        make_row(STAMPED + 1, 9, exchange="other", routing_key="rk2"),  # another routing key
        make_row(STAMPED + 1, 10, exchange="other", routing_key="rk2", redelivered=True),  # the flag: no matter
        make_row(STAMPED + 3, 11, "other", "rk2"),  # another block
        make_row(STAMPED + 0, 12, "other", "rk2"),
        make_row(STAMPED + 0, 13, "other", "rk2", generic=True),  # appended: a run of their own
        make_row(STAMPED + 0, 14, "other", "rk2", generic=True),  # (their properties are equal)
        make_row(STAMPED + 0, 15, "other", "rk2"),  # scanned again: a new run
        make_row(PLAIN + 2, 0),  # headers {"k": "v"}
        make_row(STAMPED + 2, 1),  # the same headers stamped: the block differs, past the value's place too
        make_row(STAMPED + 3, 20),
        Row("ex", "rk", changed_after, stamped_offset_at(changed_after), b""),  # the same but after the value
        make_row(STAMPED + 3, 22),  # the row before's again: a new run (only the last run is compared)
    ]
    assert rows[16].at == rows[15].at > 0
    for scan_split in (False, True):
        cols = DeliveryColumns()
        if scan_split:  # a call a row: a run goes on from one scan to the next
            for row in rows:
                fill(cols, [row])
        else:
            fill(cols, rows)
        assert cols.runs == expected_runs(rows)
        assert [run[0] for run in cols.runs] == [0, 2, 5, 6, 8, 9, 10, 12, 13, 14, 15, 16, 17]
        assert cols.redelivered == [7]
        assert list(cols.offset_values) == [NO_OFFSET, NO_OFFSET, 5, 6, -7, 8, 9, 10, 11, 12, 13, 14, 15, NO_OFFSET,
                                            1, 20, 21, 22]


@settings(max_examples=150)
@given(st.data())
def test_runs_and_decode_equal_each_rows_own_decode(data: st.DataObject) -> None:
    """Scans a few rows at a time, appends, decodes between: the runs split exactly where more than the
    stamped value differs; after decode(), every row's offset and properties (deliveries(), the offsets
    column, missing) are those of its own block decoded on its own."""
    rows: list[Row] = []
    for _segment in range(data.draw(st.integers(0, 6), label="segments")):
        kind = data.draw(st.integers(0, len(KINDS) - 1), label="kind")
        first = data.draw(st.integers(-2**63 + 1, 2**63 - 9), label="first offset")
        step = data.draw(st.sampled_from([0, 1]), label="offset step")
        exchange, routing_key = data.draw(names, label="exchange"), data.draw(names, label="routing key")
        alternate = data.draw(st.booleans(), label="exchange alternates")
        generic = data.draw(st.booleans(), label="generic")
        for i in range(data.draw(st.integers(1, 5), label="rows")):
            rows.append(make_row(kind, first + step * i, exchange + str(i % 2) if alternate else exchange,
                                 routing_key, data.draw(st.binary(max_size=20), label="body"),
                                 data.draw(st.booleans(), label="redelivered"), generic))
    cols = DeliveryColumns()
    fill(cols, rows, data)
    assert cols.rows == len(rows) and cols.data_len == sum(len(row.body) for row in rows)
    assert cols.runs == expected_runs(rows)
    assert cols.redelivered == [i for i, row in enumerate(rows) if row.redelivered]
    cols.decode()
    expected = [row.expected() for row in rows]
    assert list(cols.deliveries()) == expected
    assert list(cols.offset_values) == [NO_OFFSET if row[0] is None else row[0] for row in expected]
    assert cols.missing == sum(row[0] is None for row in expected)
    spans = list(cols.decoded_spans())
    assert [span[0] for span in spans[:1]] == ([0] if rows else [])
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert not spans or spans[-1][1] == len(rows)
    assert [cols.body(i) for i in range(len(rows))] == [row.body for row in rows]
    cols.decode()  # nothing new: nothing changes
    assert list(cols.deliveries()) == expected and cols.missing == sum(row[0] is None for row in expected)


# --- decode ------------------------------------------------------------------------------------------


def decoded(rows: list[Row], split: int | None = None) -> DeliveryColumns:
    cols = DeliveryColumns()
    if split is None:
        fill(cols, rows)
    else:
        fill(cols, rows[:split])
        cols.decode()
        fill(cols, rows[split:])
    cols.decode()
    return cols


def test_a_stream_runs_offsets_are_the_stamped_values_and_its_properties_decoded_once() -> None:
    rows = [make_row(STAMPED + 3, 1000 + i, body=b"m%d" % i) for i in range(6)]
    for split in (None, 2):
        cols = decoded(rows, split)
        assert list(cols.offset_values) == list(range(1000, 1006)) and cols.missing == 0
        assert len(cols.runs) == 1 and len(list(cols.decoded_spans())) == 1
        got = list(cols.deliveries())
        assert got == [row.expected() for row in rows]
        assert all(props is got[0][3] for _o, _e, _r, props, _b in got)  # one list for the run
        assert got[0][3][2] == {"k": "v", "n": 5}  # x-stream-offset taken out


def test_a_nested_table_ending_like_the_stamp_is_decoded_row_by_row() -> None:
    """The scan reads the look-alike value as the offset; the decode finds no x-stream-offset header of
    the block's own: each row is decoded with its own value (no offset; the nested table keeps it)."""
    for kind in (NESTED, STRING):
        rows = [make_row(kind, 40 + i, body=b"b%d" % i) for i in range(4)]
        for split in (None, 1, 3):
            cols = DeliveryColumns()
            fill(cols, rows[:split] if split else rows)
            assert list(cols.offset_values) == list(range(40, 40 + (split or 4)))  # as the scan read them
            assert len(cols.runs) == 1
            if split:
                cols.decode()
                fill(cols, rows[split:])
            cols.decode()
            assert list(cols.offset_values) == [NO_OFFSET] * 4 and cols.missing == 4
            assert list(cols.deliveries()) == [row.expected() for row in rows]
        if kind == NESTED:
            assert [d[3][2] for d in cols.deliveries()] == [{"n": {"x-stream-offset": 40 + i}} for i in range(4)]


def test_a_look_alike_after_the_real_offset_keeps_the_offset_row_by_row() -> None:
    rows = [make_row(AFTER, 70 + i) for i in range(3)]
    cols = decoded(rows)
    assert list(cols.offset_values) == [9, 9, 9] and cols.missing == 0
    assert [d[3][2] for d in cols.deliveries()] == [{"n": {"x-stream-offset": 70 + i}} for i in range(3)]


def test_a_nested_look_alike_equal_to_the_real_offset_is_not_taken_for_the_stamp() -> None:
    try:
        for nested in (AFTER_OFFSET, 5):  # the first one's decode is right (and cached)
            block = look_alike_after_the_offset(nested)
            assert offset_and_properties(block) == own_decode(block) == \
                (AFTER_OFFSET, [None, None, {"n": {"x-stream-offset": nested}}] + [None] * 11)
        rows = [make_row(AFTER, 5), make_row(AFTER, 6)]
        cols = decoded(rows)
        assert list(cols.deliveries()) == [row.expected() for row in rows]
    finally:
        delivery_columns._decoded_blocks.clear()  # no test after this one gets what it cached


def test_offsets_the_decode_finds_fill_only_their_own_rows() -> None:
    """x-stream-offset not as the last entry, or of type 'I': the decode finds it for the rows of that
    block; stamped rows keep the scan's values; rows without any stay without (counted as missing)."""
    rows = [make_row(STAMPED + 1, 7), make_row(NOT_LAST, 5), make_row(NOT_LAST, 5), make_row(PLAIN + 1, 0),
            make_row(INT32, 12), make_row(STAMPED + 1, 9), make_row(PLAIN, 0, generic=True)]
    for split in (None, 2, 4):
        cols = decoded(rows, split)
        assert list(cols.offset_values) == [7, 5, 5, NO_OFFSET, 12, 9, NO_OFFSET]
        assert cols.missing == 2
        assert list(cols.deliveries()) == [row.expected() for row in rows]
        assert [d[3][2] for d in cols.deliveries()] == [None, {"z": "1"}, {"z": "1"}, None, {"a": "1"}, None, None]


def test_rows_without_offsets_are_counted_missing() -> None:
    """A queue's deliveries: no offsets, each counted once however many decodes."""
    rows = [make_row(PLAIN + k % 3, 0, body=b"q%d" % k, generic=k == 4) for k in range(7)]
    cols = DeliveryColumns()
    for k in range(0, 7, 2):
        fill(cols, rows[k:k + 2])
        cols.decode()
        assert cols.missing == min(k + 2, 7)
    assert list(cols.deliveries()) == [row.expected() for row in rows]
    assert all(offset == NO_OFFSET for offset in cols.offset_values)


def test_columns_read_back_and_fresh_ones_are_empty() -> None:
    rows = [make_row(STAMPED, 2**40 + i, body=bytes([i]) * i) for i in range(5)]
    cols = decoded(rows)
    offsets = cols.offset_values
    assert len(offsets) == 5 and offsets[0] == 2**40 and offsets[-1] == 2**40 + 4 and offsets[1:3] == [2**40 + 1,
                                                                                                        2**40 + 2]
    with pytest.raises(IndexError):
        offsets[5]
    with pytest.raises(IndexError):
        offsets[-6]
    assert [cols.body(i) for i in range(5)] == [row.body for row in rows]
    cols.set_offset(1, None)
    cols.set_offset(2, -5)
    assert list(cols.offset_values)[:3] == [2**40, NO_OFFSET, -5]
    sink = ColumnsSink(batch_rows=4)  # the reader's: taken once full, new columns with room for a batch
    sink.columns = cols
    assert sink.full() and sink.room() == 1
    assert sink.take() is cols
    new = sink.columns
    assert (new.rows, new.data_len, new.runs, new.redelivered, new.missing, list(new.offset_values)) == \
        (0, 0, [], [], 0, [])
    assert len(new.offsets) >= 8 * 4 and len(new.data) >= cols.data_len
    assert sink.room() == 4 and not sink.full()


# --- the rows of a range ------------------------------------------------------------------------------


@given(st.lists(st.integers(0, 40), max_size=20).map(sorted), st.integers(-5, 45), st.integers(-5, 45))
def test_range_rows_are_the_rows_in_the_range(values: list[int], start: int, end: int) -> None:
    cols = DeliveryColumns()
    fill(cols, [make_row(STAMPED, v) for v in values])
    offsets = cols.offset_values
    lo, hi = _range_rows(offsets, start, end)
    inside = [i for i, v in enumerate(values) if start <= v < end]
    assert 0 <= lo <= hi <= len(values)
    assert list(range(lo, hi)) == inside
