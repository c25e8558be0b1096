"""Stream deliveries -> Arrow record batches in the read schema (or any subset of its columns).

Batches are built with exactly the Arrow schema Spark derives from the Spark schema (Spark checks
equality), so read() can hand Spark record batches instead of Python tuples.
"""

from __future__ import annotations

import datetime as _dt
import decimal as _decimal
import json
import sys
from typing import Any

import pyarrow as pa

from lavinpy.wire.delivery_columns import NO_OFFSET, DeliveryColumns

# The columns of a read, in order. Property columns use the names the writer accepts, so a read
# DataFrame can be written back unchanged.
COLUMNS = ("offset", "body", "routing_key", "exchange", "headers", "content_type", "content_encoding",
           "delivery_mode", "priority", "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
           "type", "user_id", "app_id", "redelivered")
# Index into Delivery.properties (lavinpy.wire.properties.PROPERTY_NAMES order) of each property column.
_PROPERTY_INDEX = {"content_type": 0, "content_encoding": 1, "headers": 2, "delivery_mode": 3, "priority": 4,
                   "correlation_id": 5, "reply_to": 6, "expiration": 7, "message_id": 8, "timestamp": 9,
                   "type": 10, "user_id": 11, "app_id": 12}
BATCH_ROWS = 8192
_NAME_COLUMNS = ("exchange", "routing_key")
_NAME_AT = {"exchange": 2, "routing_key": 3}  # in a decoded span


def read_schema() -> Any:
    """The Spark StructType of a read (built by hand: parsing DDL needs a SparkContext, and
    the data source's methods run in Python workers that have none)."""
    from pyspark.sql import types as T  # noqa: N812 - Spark's own convention

    string = T.StringType()
    special = {"offset": T.LongType(), "body": T.BinaryType(), "headers": T.MapType(string, string),
               "delivery_mode": T.IntegerType(), "priority": T.IntegerType(), "timestamp": T.TimestampType(),
               "redelivered": T.BooleanType()}
    return T.StructType([T.StructField(name, special.get(name, string)) for name in COLUMNS])


def check_schema(schema: Any) -> None:
    """A user-given read schema must be a subset of the read columns with the same types."""
    full = {f.name: f.dataType for f in read_schema().fields}
    for field in schema.fields:
        if field.name not in full:
            raise ValueError(f"column {field.name!r} is not produced by the lavinpy source; its columns are "
                             f"{', '.join(COLUMNS)}")
        if field.name == "headers" and typed_headers_type(field.dataType):
            continue
        if field.dataType != full[field.name]:
            raise ValueError(f"column {field.name!r} must have type {full[field.name].simpleString()}, "
                             f"not {field.dataType.simpleString()}")


def typed_headers_type(data_type: Any) -> bool:
    """Typed headers: a struct of the headers wanted (each field's type says how to read that
    header's value), or a map from strings to one value type."""
    from pyspark.sql import types as T  # noqa: N812

    if isinstance(data_type, T.StructType):
        return True
    return (isinstance(data_type, T.MapType) and isinstance(data_type.keyType, T.StringType)
            and not isinstance(data_type.valueType, T.StringType))


def header_value(value: Any, arrow_type: pa.DataType) -> Any:
    """A header value as the Arrow type asked for; None when it has no such reading."""
    if value is None:
        return None
    try:
        if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
            return header_text(value)
        if pa.types.is_boolean(arrow_type):
            if isinstance(value, bool | int):
                return bool(value)
            text = header_text(value)
            return {"true": True, "false": False}.get((text or "").strip().lower())
        if pa.types.is_integer(arrow_type):
            return int(value) if not isinstance(value, str | bytes) else int(header_text(value) or "")
        if pa.types.is_floating(arrow_type):
            return float(value) if not isinstance(value, bytes) else float(value.decode())
        if pa.types.is_decimal(arrow_type):
            number = value if isinstance(value, _decimal.Decimal) else _decimal.Decimal(str(header_text(value)))
            return number.quantize(_decimal.Decimal(1).scaleb(-arrow_type.scale))
        if pa.types.is_timestamp(arrow_type):
            if isinstance(value, _dt.datetime):
                return value if value.tzinfo else value.replace(tzinfo=_dt.UTC)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return _dt.datetime.fromtimestamp(value, _dt.UTC)
            return _dt.datetime.fromisoformat(str(header_text(value)).replace("Z", "+00:00"))
        if pa.types.is_binary(arrow_type):
            return value if isinstance(value, bytes) else str(header_text(value)).encode()
        if pa.types.is_map(arrow_type) and isinstance(value, dict):
            item = arrow_type.item_type
            return [(k, header_value(v, item)) for k, v in value.items()]
        if pa.types.is_struct(arrow_type) and isinstance(value, dict):
            return {f.name: header_value(value.get(f.name), f.type) for f in arrow_type}
        if pa.types.is_list(arrow_type) and isinstance(value, list):
            return [header_value(v, arrow_type.value_type) for v in value]
    except (ValueError, TypeError, ArithmeticError, _decimal.InvalidOperation, OverflowError):
        return None
    return None


def typed_headers(values: Any, arrow_type: pa.DataType) -> pa.Array:
    """The headers column as a struct (one field per header named) or a map of typed values."""
    rows: list[Any]
    if pa.types.is_struct(arrow_type):
        rows = [None if h is None else {f.name: header_value(h.get(f.name), f.type) for f in arrow_type}
                for h in values]
    else:
        item = arrow_type.item_type
        rows = [None if h is None else [(k, header_value(v, item)) for k, v in h.items()] for h in values]
    return pa.array(rows, type=arrow_type)


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
        # The last batch's constant columns (one exchange, routing key and property list, nothing
        # redelivered: the usual batch), kept with the property list they were made from.
        self._constant: tuple[tuple[int, str, str], list[Any], list[pa.Array | None]] | None = None

    def _constant_arrays(self, spans: list[tuple[int, int, str, str, list[Any]]], n: int) -> list[pa.Array | None]:
        """The columns a batch of n rows with one decoded span has the same whatever its bodies and
        offsets (None at those two), the last batch's again when its span was the same: building each
        costs a few Arrow calls and a type's hash a column."""
        span = spans[0]
        _lo, _hi, exchange, routing_key, props = span
        key = (n, exchange, routing_key)
        kept = self._constant
        if kept is not None and kept[0] == key and kept[1] is props:
            return kept[2]
        arrays = [None if name in ("offset", "body") else
                  self._array(name, _Repeated(False if name == "redelivered" else _span_value(span, name)),
                              field.type, n)
                  for name, field in zip(self.names, self.schema, strict=True)]
        self._constant = (key, props, arrays)
        return arrays

    def build(self, cols: DeliveryColumns, lo: int = 0, hi: int | None = None) -> pa.RecordBatch:
        """Rows lo <= row < hi (all by default) of the columns as a record batch; the columns' buffers
        become the batch's (the columns are not to be appended to afterwards)."""
        cols.decode()
        n = cols.rows
        if n == 0:
            return pa.RecordBatch.from_arrays([pa.array([], field.type) for field in self.schema], schema=self.schema)
        spans = list(cols.decoded_spans())
        constant = self._constant_arrays(spans, n) if len(spans) == 1 and not cols.redelivered else None
        columns: dict[str, Any] = {}
        if constant is None:
            # Each wanted name and property column from the runs: one value, or spread over its rows.
            for name in self.names:
                if name in _NAME_AT or name in _PROPERTY_INDEX:
                    values = [_span_value(span, name) for span in spans]
                    columns[name] = _Repeated(values[0]) if len(spans) == 1 else _spread(values, spans)
            flags = [False] * n
            for row in cols.redelivered:
                flags[row] = True
            columns["redelivered"] = flags
        arrays = []
        for index, (name, field) in enumerate(zip(self.names, self.schema, strict=True)):
            if name == "offset":
                arrays.append(_offset_array(cols, field.type))
            elif name == "body" and pa.types.is_binary(field.type):
                arrays.append(pa.Array.from_buffers(field.type, n, [None, pa.py_buffer(cols.ends)[:4 * (n + 1)],
                                                                    pa.py_buffer(cols.data)[:cols.data_len]]))
            elif name == "body":
                arrays.append(pa.array([cols.body(row) for row in range(n)], field.type))
            elif constant is not None:
                arrays.append(constant[index])
            else:
                arrays.append(self._array(name, columns[name], field.type, n))
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        return batch if lo == 0 and (hi is None or hi >= n) else batch.slice(lo, (n if hi is None else hi) - lo)

    @staticmethod
    def _array(name: str, values: Any, arrow_type: pa.DataType, n: int) -> pa.Array:
        # count(False) matches each False by identity; `True not in` compares each through bool's type.
        if name == "redelivered" and (values.value is False if isinstance(values, _Repeated)
                                      else values.count(False) == n):
            return _all_false(n)  # no message redelivered: the usual case
        if isinstance(values, _Repeated):
            if values.value is None:
                return _repeated_array(None, arrow_type, n)
            if pa.types.is_string(arrow_type) or pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
                return _repeated_array(values.value, arrow_type, n)
            values = [values.value] * n
        elif name in _PROPERTY_INDEX and values.count(None) == n:
            return _repeated_array(None, arrow_type, n)
        elif name in _NAME_COLUMNS and values.count(values[0]) == n:  # one exchange, one routing key: the usual
            return _repeated_array(values[0], arrow_type, n)
        if name == "headers" and not (pa.types.is_map(arrow_type) and pa.types.is_string(arrow_type.item_type)):
            return typed_headers(values, arrow_type)
        if name == "headers":
            try:
                return pa.array(values, type=arrow_type)  # dicts of strings: converted in C
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                return pa.array([None if h is None else {k: header_text(v) for k, v in h.items()} for h in values],
                                type=arrow_type)
        if name == "timestamp":  # AMQP seconds -> microseconds
            import pyarrow.compute as pc  # here: its import takes a fresh Spark worker 20 ms, for this only

            seconds = pa.array(values, type=pa.int64())
            return pc.multiply(seconds, 1_000_000).cast(arrow_type)
        return pa.array(values, type=arrow_type)


def _offset_array(cols: DeliveryColumns, arrow_type: pa.DataType) -> pa.Array:
    """The offset column: the columns' int64 buffer as it is when every row has an offset (a stream's),
    all null when none has (a queue's)."""
    n = cols.rows
    if cols.missing == n:
        return _repeated_array(None, arrow_type, n)
    if cols.missing == 0 and pa.types.is_int64(arrow_type) and sys.byteorder == "little":
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(cols.offsets)[:8 * n]])
    return pa.array([None if offset == NO_OFFSET else offset for offset in cols.offset_values], arrow_type)


def _span_value(span: tuple[int, int, str, str, list[Any]], name: str) -> Any:
    """A name or property column's value in a decoded span (first row, stop, exchange, routing key,
    properties)."""
    return span[_NAME_AT[name]] if name in _NAME_AT else span[4][_PROPERTY_INDEX[name]]


def _spread(values: list[Any], spans: list[tuple[Any, ...]]) -> list[Any]:
    """Each span's value repeated over its rows, in one list (list repetition and extend run in C)."""
    out: list[Any] = []
    for value, (first, stop, *_rest) in zip(values, spans, strict=True):
        out.extend([value] * (stop - first))
    return out


# Arrays of one value (or null) repeated, by (Arrow type, the value's type, value, length): a batch's
# constant columns are these arrays, made once, instead of a new array a column a batch, which Arrow
# fills element by element (or zeroes, for nulls). Made as Arrow converts a list, exactly as long as
# the batch: Arrow IPC sends a sliced map's children whole, and pa.nulls gives a map children as long
# as the map (a null headers column of 8,192 rows was 165 kB as a slice, 100 kB from pa.nulls, 34 kB
# converted). Batches are all one length but a reader's last.
_repeats: dict[tuple[Any, type, Any, int], pa.Array] = {}
_REPEATS_MAX = 64
_REPEATS_MAX_BYTES = 16 << 20  # a long string repeated 16,384 times is megabytes: the kept ones are bounded


def _repeated_array(value: Any, arrow_type: pa.DataType, n: int) -> pa.Array:
    key = (arrow_type, type(value), value, n)
    try:
        array = _repeats.get(key)
    except TypeError:  # a value that cannot be a key
        return pa.repeat(pa.scalar(value, arrow_type), n)
    if array is None:
        array = pa.array([None] * n, arrow_type) if value is None else pa.repeat(pa.scalar(value, arrow_type), n)
        kept = sum(kept.nbytes for kept in _repeats.values())
        if len(_repeats) >= _REPEATS_MAX or kept + array.nbytes > _REPEATS_MAX_BYTES:
            _repeats.clear()
        if array.nbytes <= _REPEATS_MAX_BYTES:
            _repeats[key] = array
    return array


def _all_false(n: int) -> pa.Array:
    """A boolean array of n false values, built from a zeroed bitmap."""
    return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bytes((n + 7) // 8))])


class _Repeated:
    """A property column with one value for every row."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value
