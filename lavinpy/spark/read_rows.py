"""Stream deliveries -> Arrow record batches in the read schema (or any subset of its columns).

Batches are built with exactly the Arrow schema Spark derives from the Spark schema (Spark checks
equality), so read() can hand Spark record batches instead of Python tuples.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .streams import DeliveryChunk

# The columns of a read, in order. Property columns use the names the writer accepts, so a read
# DataFrame can be written back unchanged.
COLUMNS = ("offset", "body", "routing_key", "exchange", "headers", "content_type", "content_encoding",
           "delivery_mode", "priority", "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
           "type", "user_id", "app_id")
# Index into Delivery.properties (lavinpy.wire.properties.PROPERTY_NAMES order) of each property column.
_PROPERTY_INDEX = {"content_type": 0, "content_encoding": 1, "headers": 2, "delivery_mode": 3, "priority": 4,
                   "correlation_id": 5, "reply_to": 6, "expiration": 7, "message_id": 8, "timestamp": 9,
                   "type": 10, "user_id": 11, "app_id": 12}
BATCH_ROWS = 8192
_NAME_COLUMNS = ("exchange", "routing_key")


def read_schema() -> Any:
    """The Spark StructType of a read (built by hand: parsing DDL needs a SparkContext, and
    the data source's methods run in Python workers that have none)."""
    from pyspark.sql import types as T  # noqa: N812 - Spark's own convention

    string = T.StringType()
    special = {"offset": T.LongType(), "body": T.BinaryType(), "headers": T.MapType(string, string),
               "delivery_mode": T.IntegerType(), "priority": T.IntegerType(), "timestamp": T.TimestampType()}
    return T.StructType([T.StructField(name, special.get(name, string)) for name in COLUMNS])


def check_schema(schema: Any) -> None:
    """A user-given read schema must be a subset of the read columns with the same types."""
    full = {f.name: f.dataType for f in read_schema().fields}
    for field in schema.fields:
        if field.name not in full:
            raise ValueError(f"column {field.name!r} is not produced by the lavinpy source; its columns are "
                             f"{', '.join(COLUMNS)}")
        if field.dataType != full[field.name]:
            raise ValueError(f"column {field.name!r} must have type {full[field.name].simpleString()}, "
                             f"not {field.dataType.simpleString()}")


def header_text(value: Any) -> str | None:
    """Header values as strings (the column is map<string, string>)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


class BatchBuilder:
    """Collects deliveries column by column and emits record batches of `arrow_schema`."""

    def __init__(self, arrow_schema: pa.Schema, batch_rows: int = BATCH_ROWS) -> None:
        self.schema = arrow_schema
        self.names = list(arrow_schema.names)
        self.batch_rows = batch_rows

    def chunk_batches(self, chunks: Iterable[DeliveryChunk]) -> Iterator[pa.RecordBatch]:
        """Record batches of at least ``batch_rows`` rows (but the last) from chunks of deliveries."""
        pending: list[DeliveryChunk] = []
        rows = 0
        for chunk in chunks:
            pending.append(chunk)
            rows += len(chunk.offsets)
            if rows >= self.batch_rows:
                yield self.build_columns(*self._joined(pending))
                pending = []
                rows = 0
        if rows:
            yield self.build_columns(*self._joined(pending))

    @staticmethod
    def _joined(chunks: list[DeliveryChunk]) -> DeliveryChunk:
        if len(chunks) == 1:
            return chunks[0]
        return DeliveryChunk(*(list(chain.from_iterable(column)) for column in zip(*chunks, strict=True)))

    def build_columns(self, offsets: list[int], exchanges: list[str], routing_keys: list[str],
                      properties: list[list[Any]], bodies: list[bytes]) -> pa.RecordBatch:
        n = len(offsets)
        columns: dict[str, Any] = {"offset": offsets, "body": bodies, "routing_key": routing_keys,
                                   "exchange": exchanges}
        if any(name in _PROPERTY_INDEX for name in self.names):
            first = properties[0]
            if properties.count(first) == n:  # one property list for all (shared: an identity check each)
                for name, i in _PROPERTY_INDEX.items():
                    columns[name] = _Repeated(first[i])
            else:
                for name, values in zip(_PROPERTY_INDEX, zip(*properties, strict=True), strict=False):
                    columns[name] = values
        arrays = [self._array(name, columns[name], field.type, n)
                  for name, field in zip(self.names, self.schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    @staticmethod
    def _array(name: str, values: Any, arrow_type: pa.DataType, n: int) -> pa.Array:
        if isinstance(values, _Repeated):
            if values.value is None:
                return pa.nulls(n, arrow_type)
            if pa.types.is_string(arrow_type):
                return pa.repeat(pa.scalar(values.value, arrow_type), n)
            values = [values.value] * n
        elif name in _PROPERTY_INDEX and values.count(None) == n:
            return pa.nulls(n, arrow_type)
        elif name in _NAME_COLUMNS and values.count(values[0]) == n:  # one exchange, one routing key: the usual
            return pa.repeat(pa.scalar(values[0], arrow_type), n)
        if name == "headers":
            try:
                return pa.array(values, type=arrow_type)  # dicts of strings: converted in C
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                return pa.array([None if h is None else {k: header_text(v) for k, v in h.items()} for h in values],
                                type=arrow_type)
        if name == "timestamp":  # AMQP seconds -> microseconds
            seconds = pa.array(values, type=pa.int64())
            return pc.multiply(seconds, 1_000_000).cast(arrow_type)
        return pa.array(values, type=arrow_type)


class _Repeated:
    """A property column with one value for every row."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value
