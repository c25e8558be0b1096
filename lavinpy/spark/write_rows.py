"""DataFrame rows (as Arrow record batches) -> encoded AMQP messages.

Columns: `body` (binary or string) is required; `routing_key`, `headers` (map), `content_type`,
`content_encoding`, `message_id`, `correlation_id`, `reply_to`, `type`, `app_id`, `user_id`,
`priority`, `delivery_mode`, `expiration`, `timestamp` are optional message properties; `offset`,
`exchange` and `redelivered` (what a read produces) are ignored, so a read DataFrame can be written back as is.
Any other column is an error, unless it is the `routingKeyColumn`.

Work is column-at-a-time through Arrow's C code (casts, to_pylist) and the per-message Python
loop only packs frames: with just a body it costs ~1 us per message.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from lavinpy.wire.client import ContentPacker, pack_publishes, pack_publishes_arrow
from lavinpy.wire.properties import encode_property_values

from .options import WriteOptions
from .publisher import MessageEncoder

STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "message_id", "type",
                     "user_id", "app_id")
INT_PROPERTIES = ("priority", "delivery_mode")
PROPERTY_COLUMNS = (*STRING_PROPERTIES, *INT_PROPERTIES, "headers", "expiration", "timestamp")
IGNORED_COLUMNS = ("offset", "exchange", "redelivered")
CHUNK_MESSAGES = 2000
CHUNK_BYTES = 1 << 20


class RowError(ValueError):
    """A DataFrame column or value that cannot become an AMQP message."""


# --- driver-side schema check ---------------------------------------------------------------------

def check_schema(schema: Any, opts: WriteOptions) -> None:
    """Validate a Spark StructType against the columns the writer understands (on the driver)."""
    from pyspark.sql import types as T  # noqa: N812 - Spark's own convention

    fields: dict[str, Any] = {f.name: f.dataType for f in schema.fields}
    if "body" not in fields:
        raise RowError(f"the DataFrame needs a `body` column (binary or string); it has {sorted(fields)}")
    ints = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    expected: dict[str, tuple[tuple[Any, ...], str]] = {  # Spark DataType classes
        "body": ((T.BinaryType, T.StringType), "binary or string"),
        "routing_key": ((T.StringType,), "string"),
        "headers": ((T.MapType,), "map<string, string>"),
        "expiration": ((T.StringType, *ints), "string or integer (milliseconds)"),
        "timestamp": ((T.TimestampType, T.TimestampNTZType, *ints), "timestamp or epoch seconds"),
    }
    for name in STRING_PROPERTIES:
        expected[name] = ((T.StringType,), "string")
    for name in INT_PROPERTIES:
        expected[name] = (ints, "integer")
    key_col = opts.routing_key_column
    if key_col is not None:
        if key_col not in fields:
            raise RowError(f"routingKeyColumn={key_col!r} is not a column of the DataFrame ({sorted(fields)})")
        expected[key_col] = ((T.StringType,), "string")
    for name, dtype in fields.items():
        if name in IGNORED_COLUMNS:
            continue
        if name not in expected:
            raise RowError(f"unknown column {name!r}: the writer takes body, routing_key, headers and the message "
                           f"properties {', '.join(PROPERTY_COLUMNS[:-3])}, headers, expiration, timestamp "
                           f"(select only those, or name the routing key column with routingKeyColumn)")
        types, text = expected[name]
        if not isinstance(dtype, types):
            raise RowError(f"column {name!r} has type {dtype.simpleString()}; expected {text}")
        if name == "headers" and not isinstance(dtype.keyType, T.StringType):
            raise RowError(f"column 'headers' has type {dtype.simpleString()}; expected map<string, ...>")


# --- executor-side encoding -----------------------------------------------------------------------

def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


def _body_column(col: pa.Array) -> pa.Array:
    """The body column as binary (strings as their UTF-8 bytes, no copy); no null allowed."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary() if pa.types.is_string(col.type) else pa.large_binary())
    if col.null_count:
        raise RowError(f"{col.null_count} rows have a null body")
    return col


def _timestamps(col: pa.Array) -> list[int | None]:
    """Epoch seconds (AMQP timestamps have second precision)."""
    if pa.types.is_timestamp(col.type):
        divisor = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}[col.type.unit]
        return [None if v is None else v // divisor for v in col.cast(pa.int64()).to_pylist()]
    return col.to_pylist()


def _header_value(value: Any) -> Any:
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return value


class RowEncoder:
    """Turns record batches into (encoded bytes, message count) chunks for a ConfirmPublisher."""

    def __init__(self, opts: WriteOptions, encoder: MessageEncoder) -> None:
        self.opts = opts
        self.encoder = encoder
        self.default_mode = 2 if opts.persistent else None
        self.rows = 0

    def chunks(self, batch: pa.RecordBatch) -> Iterator[tuple[bytearray, int]]:
        n = batch.num_rows
        if n == 0:
            return
        enc = self.encoder
        opts = self.opts
        body_col = _body_column(_column(batch, "body"))
        key_col = _column(batch, opts.routing_key_column) if opts.routing_key_column else _column(batch, "routing_key")
        keys = key_col.to_pylist() if key_col is not None else None
        props = self._property_columns(batch)
        exchange = opts.exchange
        default_key = opts.routing_key
        fixed_method = enc.method_frame(exchange, default_key)
        out = bytearray()
        count = 0
        if props is None:
            fixed_props = encode_property_values(delivery_mode=self.default_mode)
            packer = enc.packer(fixed_props)
            append = enc.append
            if keys is None:  # every row the same publish: packed a chunk at a time
                yield from self._fixed_chunks(body_col, fixed_method, packer, fixed_props)
                self.rows += n
                return
        bodies = body_col.to_pylist()
        if props is not None:
            append_any = enc.append_any
            encode_props = self._row_properties
        for i in range(n):
            if keys is None or keys[i] is None:
                method = fixed_method
            else:
                method = enc.method_frame(exchange, keys[i])
            if props is None:
                append(out, method, packer, fixed_props, bodies[i])
            else:
                append_any(out, method, encode_props(props, i), bodies[i])
            count += 1
            if count >= CHUNK_MESSAGES or len(out) >= CHUNK_BYTES:
                yield out, count
                out = bytearray()
                count = 0
        self.rows += n
        if count:
            yield out, count

    def _fixed_chunks(self, col: pa.Array, method: bytes, packer: ContentPacker,
                      properties: bytes) -> Iterator[tuple[bytearray, int]]:
        """``chunks`` when every row has the same method frame and properties: runs of publishes are
        packed by one call, from the binary column's two Arrow buffers (no bytes object a row) or,
        for a large_binary column, from its list of bytes."""
        enc = self.encoder
        channel, max_inline = enc.channel, enc.max_inline_body
        bodies: list[bytes] | None = None
        base = 0
        if pa.types.is_binary(col.type):
            _validity, offsets, data = col.buffers()
            data = b"" if data is None else data  # every body empty
            base = col.offset
        else:
            bodies = col.to_pylist()
        out = bytearray()
        count = 0
        i, stop = base, base + len(col)
        while i < stop:
            room = CHUNK_MESSAGES - count
            if bodies is None:
                j = pack_publishes_arrow(out, method, channel, properties, offsets, data, i, stop, room, CHUNK_BYTES,
                                         max_inline)
            else:
                j = pack_publishes(out, method, channel, properties, bodies, i, room, CHUNK_BYTES, max_inline)
            count += j - i
            i = j
            if i < stop and count < CHUNK_MESSAGES and len(out) < CHUNK_BYTES:  # empty or multi-frame body
                enc.append(out, method, packer, properties, col[i - base].as_py() if bodies is None else bodies[i])
                i += 1
                count += 1
            if count >= CHUNK_MESSAGES or len(out) >= CHUNK_BYTES:
                yield out, count
                out = bytearray()
                count = 0
        if count:
            yield out, count

    def _property_columns(self, batch: pa.RecordBatch) -> dict[str, list[Any]] | None:
        """Python lists of the property columns present in the batch (None if there are none)."""
        cols: dict[str, list[Any]] = {}
        for name in PROPERTY_COLUMNS:
            col = _column(batch, name)
            if col is None or col.null_count == len(col):
                continue
            if name == "timestamp":
                cols[name] = _timestamps(col)
            elif name == "headers":
                cols[name] = [None if v is None else {k: _header_value(x) for k, x in v} for v in col.to_pylist()]
            elif name == "expiration":
                cols[name] = [None if v is None else str(v) for v in col.to_pylist()]
            else:
                cols[name] = col.to_pylist()
        return cols or None

    def _row_properties(self, cols: dict[str, list[Any]], i: int) -> bytes:
        kwargs = {name: values[i] for name, values in cols.items()}
        if kwargs.get("delivery_mode") is None:
            kwargs["delivery_mode"] = self.default_mode
        priority = kwargs.get("priority")
        if priority is not None and not 0 <= priority <= 255:
            raise RowError(f"priority {priority} is out of range 0..255")
        try:
            return encode_property_values(**kwargs)
        except (ValueError, TypeError) as exc:
            raise RowError(f"cannot encode the properties of a row ({exc})") from exc
