"""A read's batches built from several chunks (one a receive buffer): the exchange and routing-key
columns, the constant property columns and the null columns equal Arrow's conversion of the plain
joined lists, whether a name is one object in a chunk, the same value in separate objects across
chunks, or differs between or within chunks, and whatever a batch's length (the constant columns
are slices of arrays kept from batch to batch)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.spark.read_rows import BATCH_ROWS, COLUMNS, BatchBuilder
from lavinpy.spark.streams import DeliveryChunk, _chunk
from lavinpy.wire import properties

pytestmark = pytest.mark.both_paths

SCHEMA = pa.schema([(name, {"offset": pa.int64(), "body": pa.binary(), "redelivered": pa.bool_(),
                            "delivery_mode": pa.int32(), "priority": pa.int32(),
                            "headers": pa.map_(pa.string(), pa.string()),
                            "timestamp": pa.timestamp("us", "UTC")}.get(name, pa.string()))
                    for name in COLUMNS])
BLOCKS = [properties.encode_property_values(delivery_mode=2, content_type="text/plain"),
          properties.encode_property_values(delivery_mode=1, priority=3, app_id="app", timestamp=1_700_000_000),
          properties.encode_property_values()]


def fresh(name: str) -> str:
    """An equal string that is not the same object (as two scans' names are)."""
    return "".join(list(name))


def a_chunk(first: int, n: int, exchange: Any, routing_key: Any, block: bytes) -> DeliveryChunk:
    """n deliveries; a name given as a str is one object in the chunk (as a scan makes it), as a list
    each row's own."""
    exchanges = exchange if isinstance(exchange, list) else [fresh(exchange)] * n
    keys = routing_key if isinstance(routing_key, list) else [fresh(routing_key)] * n
    return _chunk(list(range(first, first + n)), exchanges, keys, [block] * n,
                  [b"m%d" % i for i in range(first, first + n)])


def plain(chunks: list[DeliveryChunk]) -> pa.Table:
    """The rows converted by Arrow from plain lists."""
    rows = [row for chunk in chunks for row in chunk.rows()]
    columns: dict[str, list[Any]] = {"offset": [r.offset for r in rows], "body": [r.body for r in rows],
                                     "routing_key": [r.routing_key for r in rows],
                                     "exchange": [r.exchange for r in rows], "redelivered": [False] * len(rows)}
    index = {"content_type": 0, "content_encoding": 1, "headers": 2, "delivery_mode": 3, "priority": 4,
             "correlation_id": 5, "reply_to": 6, "expiration": 7, "message_id": 8, "timestamp": 9, "type": 10,
             "user_id": 11, "app_id": 12}
    for name, i in index.items():
        columns[name] = [r.properties[i] for r in rows]
    columns["timestamp"] = [None if t is None else t * 1_000_000 for t in columns["timestamp"]]
    return pa.table({name: pa.array(columns[name], SCHEMA.field(name).type) for name in COLUMNS}, schema=SCHEMA)


names = st.one_of(st.sampled_from(["", "q", "bench-stream-0123abcd"]),
                  st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), names, names, st.sampled_from(range(len(BLOCKS)))),
                min_size=1, max_size=6),
       st.sampled_from([1, 7, 64, 10_000]))
def test_batches_from_chunks_equal_the_plain_conversion(shapes: list[Any], batch_rows: int) -> None:
    chunks = []
    first = 0
    for n, exchange, key, block in shapes:
        if isinstance(exchange, list):
            exchange = [exchange[0] + str(i % 2) for i in range(n)]  # differs within the chunk
        if isinstance(key, list):
            key = key[0]  # one value, maybe not the other chunks'
        chunks.append(a_chunk(first, n, exchange, key, BLOCKS[block]))
        first += n
    got = pa.Table.from_batches(list(BatchBuilder(SCHEMA, batch_rows=batch_rows).chunk_batches(chunks)), SCHEMA)
    assert got.equals(plain(chunks))


def test_constant_columns_of_any_length() -> None:
    """Batches shorter and longer than the kept arrays, one after another, with the same constant values."""
    for n in (3, BATCH_ROWS, 2 * BATCH_ROWS + 5, 10, 2 * BATCH_ROWS + 5, 1):
        chunks = [a_chunk(0, n, "", "rk", BLOCKS[0]), a_chunk(n, 2, "", "rk", BLOCKS[0])]
        got = pa.Table.from_batches(list(BatchBuilder(SCHEMA, batch_rows=10 ** 9).chunk_batches(chunks)), SCHEMA)
        assert got.num_rows == n + 2
        assert got.equals(plain(chunks))


def test_kept_constant_columns_stay_bounded() -> None:
    """Long constants (1,000- and 600-byte routing keys repeated for long batches) are right,
    and the arrays kept for later batches stay within their bound."""
    from lavinpy.spark import read_rows

    for key, n in (("k" * 1000, 3 * BATCH_ROWS), ("r" * 1000, 5), ("x" * 600, 2 * BATCH_ROWS + 1)):
        chunks = [a_chunk(0, n, "", key, BLOCKS[1]), a_chunk(n, 3, "", key, BLOCKS[1])]
        got = pa.Table.from_batches(list(BatchBuilder(SCHEMA, batch_rows=10 ** 9).chunk_batches(chunks)), SCHEMA)
        assert got.equals(plain(chunks))
        assert sum(array.nbytes for array in read_rows._repeats.values()) <= read_rows._REPEATS_MAX_BYTES
