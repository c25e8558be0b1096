"""A read's record batches (BatchBuilder.build) from DeliveryColumns filled as a reader fills them --
deliveries scanned from receive buffers a few at a time, some appended by the generic frame path, decodes
in between -- equal Arrow's conversion of the rows' own plain values: whether the exchange, routing key
and property block are one run for all rows, several runs with equal values, or differ from run to run
and within one; sliced (lo, hi) or whole; with redelivered rows or none; with constant and all-null
columns of any length (the constant columns are arrays kept from batch to batch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.spark.read_rows import BATCH_ROWS, COLUMNS, BatchBuilder
from lavinpy.wire import properties, writer
from lavinpy.wire.delivery_columns import STREAM_OFFSET_ENTRY, DeliveryColumns
from tests.spark.delivery_frames import fill as fill_columns

pytestmark = pytest.mark.both_paths

FRAME_MAX = 4096
SCHEMA = pa.schema([(name, {"offset": pa.int64(), "body": pa.binary(), "redelivered": pa.bool_(),
                            "delivery_mode": pa.int32(), "priority": pa.int32(),
                            "headers": pa.map_(pa.string(), pa.string()),
                            "timestamp": pa.timestamp("us", "UTC")}.get(name, pa.string()))
                    for name in COLUMNS])
# A column subset (a query that selects some columns reads only those).
SUBSET = pa.schema([SCHEMA.field(name) for name in ("body", "offset", "routing_key", "app_id", "redelivered")])
BLOCKS = [properties.encode_property_values(delivery_mode=2, content_type="text/plain"),
          properties.encode_property_values(delivery_mode=1, priority=3, app_id="app", timestamp=1_700_000_000),
          properties.encode_property_values(),
          properties.encode_property_values(headers={"k": "v", "n": "1"}, correlation_id="c", expiration="60000")]
# Index into a delivery's properties (lavinpy.wire.properties.PROPERTY_NAMES) of each property column.
PROPERTY_INDEX = {"content_type": 0, "content_encoding": 1, "headers": 2, "delivery_mode": 3, "priority": 4,
                  "correlation_id": 5, "reply_to": 6, "expiration": 7, "message_id": 8, "timestamp": 9, "type": 10,
                  "user_id": 11, "app_id": 12}


@dataclass
class Row:
    offset: int | None  # stamped as a stream stamps it (the headers' last entry), or none
    exchange: str
    routing_key: str
    block: bytes  # the property block as published (without the stamp)
    body: bytes
    redelivered: bool = False
    generic: bool = False  # appended as the generic frame path hands a delivery over (a body over frames)

    def frames(self, tag: int) -> bytes:
        block = self.block
        if self.offset is not None:
            block = properties.append_header_entry(
                block, STREAM_OFFSET_ENTRY + self.offset.to_bytes(8, "big", signed=True))
        return b"".join(writer.deliver(1, "ctag", tag, self.redelivered, self.exchange, self.routing_key, block,
                                       self.body, FRAME_MAX))

    def properties(self) -> list[Any]:
        return properties.property_values(self.block, typed=False)

    def appended(self) -> tuple[int | None, str, str, list[Any], bytes]:
        return self.offset, self.exchange, self.routing_key, self.properties(), self.body


def fill(rows: list[Row], data: st.DataObject | None = None, cols: DeliveryColumns | None = None) -> DeliveryColumns:
    """Columns holding the rows, filled as a reader fills them (delivery_frames.fill). cols: columns made
    with room (not zeroed where compiled), as a reader's next batch gets them."""
    cols = DeliveryColumns() if cols is None else cols
    fill_columns(cols, rows, data)
    assert cols.rows == len(rows) and cols.last_tag == len(rows)
    return cols


def plain(rows: list[Row], schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    """The rows converted by Arrow from plain lists."""
    props = [row.properties() for row in rows]
    columns: dict[str, list[Any]] = {"offset": [r.offset for r in rows], "body": [r.body for r in rows],
                                     "routing_key": [r.routing_key for r in rows],
                                     "exchange": [r.exchange for r in rows],
                                     "redelivered": [r.redelivered for r in rows]}
    for name, i in PROPERTY_INDEX.items():
        columns[name] = [p[i] for p in props]
    columns["timestamp"] = [None if t is None else t * 1_000_000 for t in columns["timestamp"]]
    return pa.RecordBatch.from_arrays([pa.array(columns[name], schema.field(name).type) for name in schema.names],
                                      schema=schema)


def built(rows: list[Row], schema: pa.Schema = SCHEMA, lo: int = 0, hi: int | None = None,
          data: st.DataObject | None = None) -> pa.RecordBatch:
    batch = BatchBuilder(schema).build(fill(rows, data), lo, hi)
    batch.validate(full=True)
    assert batch.schema == schema
    return batch


def expected(rows: list[Row], schema: pa.Schema = SCHEMA, lo: int = 0, hi: int | None = None) -> pa.RecordBatch:
    return plain(rows[lo:hi], schema)


def fresh(name: str) -> str:
    """An equal string that is not the same object."""
    return "".join(list(name))


names = st.sampled_from(["", "q", "bench-stream-0123abcd", "é"])


@settings(max_examples=80)
@given(st.lists(st.tuples(st.integers(1, 40), names, names, st.booleans(), st.sampled_from(range(len(BLOCKS))),
                          st.booleans(), st.booleans(), st.sampled_from(["none", "some", "all"])),
                min_size=1, max_size=6),
       st.booleans(), st.data())
def test_batches_equal_the_plain_conversion(segments: list[Any], subset: bool, data: st.DataObject) -> None:
    """Runs of deliveries (names and a block each; the exchange alternating within some), stamped or not,
    scanned or appended, some redelivered: a batch and its slices are the plain conversion's."""
    rows: list[Row] = []
    for n, exchange, key, alternates, block, stream, generic, flags in segments:
        for i in range(n):
            rows.append(Row(len(rows) if stream else None, exchange + str(i % 2) if alternates else fresh(exchange),
                            fresh(key), BLOCKS[block], b"m%d" % len(rows) if i % 5 else b"",
                            flags == "all" or (flags == "some" and i % 3 == 1), generic))
    schema = SUBSET if subset else SCHEMA
    lo = data.draw(st.integers(0, len(rows)))
    hi = data.draw(st.one_of(st.none(), st.integers(lo, len(rows) + 2)))
    assert built(rows, schema, lo, hi, data).equals(expected(rows, schema, lo, hi))


def stream_rows(n: int, first: int = 0, exchange: str = "", key: str = "rk", block: bytes = BLOCKS[0],
                **kwargs: Any) -> list[Row]:
    return [Row(first + i, fresh(exchange), fresh(key), block, b"m%d" % (first + i), **kwargs) for i in range(n)]


def test_one_run_and_many_runs() -> None:
    """A stream's usual batch (one run: every name and property column one value), and batches whose
    runs differ in each of the exchange, the routing key and the block, or only in being two runs."""
    one = stream_rows(50)
    assert len(fill(one).runs) == 1
    assert built(one).equals(expected(one))
    batch = built(one)
    assert batch.column("routing_key").to_pylist() == ["rk"] * 50
    assert batch.column("offset").to_pylist() == list(range(50))
    assert batch.column("app_id").null_count == 50 and batch.column("delivery_mode").to_pylist() == [2] * 50
    for later in (stream_rows(7, 50, exchange="amq.direct"), stream_rows(7, 50, key="other"),
                  stream_rows(7, 50, block=BLOCKS[3]), stream_rows(7, 50, generic=True)):
        rows = one + later
        assert len(fill(rows).runs) == 2
        assert built(rows).equals(expected(rows))
        for lo, hi in ((0, 50), (50, 57), (45, 55), (3, 4), (0, 0)):
            assert built(rows, lo=lo, hi=hi).equals(expected(rows, lo=lo, hi=hi)), (lo, hi)
    many = [row for i in range(20) for row in stream_rows(3, 3 * i, key=f"k{i % 3}", block=BLOCKS[i % len(BLOCKS)])]
    assert len(fill(many).runs) == 20
    assert built(many).equals(expected(many))
    assert built(many, SUBSET, 10, 40).equals(expected(many, SUBSET, 10, 40))


def test_redelivered_flags() -> None:
    """Queue reads: no offsets; the redelivered column true exactly on the flagged rows, scanned or appended."""
    for flags in ([False] * 9, [False, True] + [False] * 7, [True] * 6, [i % 4 == 3 for i in range(30)]):
        for generic_from in (len(flags), 2, 0):
            rows = [Row(None, "", "jobs", BLOCKS[i % 2], b"m%d" % i if i % 4 else b"", flag, i >= generic_from)
                    for i, flag in enumerate(flags)]
            batch = built(rows)
            assert batch.equals(expected(rows))
            assert batch.column("redelivered").to_pylist() == flags
            assert batch.column("offset").null_count == len(flags)
            assert built(rows, lo=1, hi=len(flags) - 1).equals(expected(rows, lo=1, hi=len(flags) - 1))


def test_an_empty_batch() -> None:
    for schema in (SCHEMA, SUBSET):
        batch = BatchBuilder(schema).build(DeliveryColumns())
        assert batch.num_rows == 0 and batch.schema == schema


def test_constant_columns_of_any_length() -> None:
    """Batches shorter and longer than the kept arrays, one after another, with the same constant values
    (in one run, or in two runs with equal values: scanned, then appended)."""
    for n in (3, BATCH_ROWS, 2 * BATCH_ROWS + 5, 10, 2 * BATCH_ROWS + 5, 1):
        rows = stream_rows(n) + stream_rows(2, n, generic=True)
        batch = built(rows)
        assert batch.num_rows == n + 2
        assert batch.equals(expected(rows))
        assert built(rows, lo=n - 1, hi=n + 1).equals(expected(rows, lo=n - 1, hi=n + 1))


def test_kept_constant_columns_stay_bounded() -> None:
    """Long constants (255-byte names and properties, the most a short string holds, repeated for long
    batches: more than the bound of the arrays kept, in all) are right, and the arrays kept for later
    batches stay within their bound."""
    from lavinpy.spark import read_rows

    for char, n in (("k", 2 * BATCH_ROWS + 1), ("r", 5), ("x", BATCH_ROWS)):
        long = char * 255
        block = properties.encode_property_values(content_type=long, correlation_id=long, message_id=long,
                                                  app_id=long, delivery_mode=2)
        rows = (stream_rows(n, exchange=long, key=long, block=block)
                + stream_rows(3, n, exchange=long, key=long, block=block, generic=True))
        batch = built(rows)
        assert batch.equals(expected(rows)) and batch.column("app_id").to_pylist() == [long] * (n + 3)
        assert sum(array.nbytes for array in read_rows._repeats.values()) <= read_rows._REPEATS_MAX_BYTES


def ipc_bytes(batch: pa.RecordBatch) -> int:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer_:
        writer_.write_batch(batch)
    return sink.getvalue().size


def test_batches_send_spark_no_more_bytes_than_the_plain_conversion() -> None:
    """Spark takes a read's batches as Arrow IPC: a built batch, whose constant and null columns are
    kept from batch to batch, is as many bytes as the plain conversion of its rows, for a full batch,
    a reader's shorter last one and a longer one after them."""
    builder = BatchBuilder(SCHEMA)
    first = 0
    for n in (BATCH_ROWS, BATCH_ROWS, 100, BATCH_ROWS, 2 * BATCH_ROWS + 1, BATCH_ROWS):
        rows = stream_rows(n, first)
        first += n
        batch = builder.build(fill(rows, cols=DeliveryColumns(n, 16 * n)))
        assert batch.equals(plain(rows))
        assert ipc_bytes(batch) == ipc_bytes(plain(rows)), n


def test_one_builder_for_many_batches_gives_each_its_own_columns() -> None:
    """A reader builds every batch with one builder, which keeps the last batch's constant columns:
    batches of one length and one span (one decoded property list for all, kept from batch to batch for
    a stream's stamped blocks and a queue's plain ones alike) but another exchange, routing key, block or
    redelivered flag, or the same ones again, each equal their own plain conversion."""
    sequence = [("", "rk", 0, False), ("", "rk", 0, False), ("other", "rk", 0, False), ("other", "k2", 0, False),
                ("other", "k2", 3, False), ("other", "k2", 3, True), ("other", "k2", 3, False), ("", "rk", 0, False),
                ("", "rk", 1, False), ("", "rk", 0, False)]
    for schema, stream in ((SCHEMA, True), (SUBSET, True), (SCHEMA, False), (SUBSET, False)):
        builder = BatchBuilder(schema)
        first = 0
        for n in (5, 5, 7):
            for exchange, key, block, redelivered in sequence:
                rows = [Row(first + i if stream else None, fresh(exchange), fresh(key), BLOCKS[block],
                            b"b%d" % (first + i), redelivered and i == n - 1) for i in range(n)]
                batch = builder.build(fill(rows, cols=DeliveryColumns(n, 16 * n)))
                batch.validate(full=True)
                assert batch.equals(plain(rows, schema)), (schema.names, n, exchange, key, block, redelivered)
                first += n
