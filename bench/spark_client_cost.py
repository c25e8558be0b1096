"""The Spark source's client read path in process, no socket: a stream's deliveries scanned from a
receive buffer into columns, kept to a range, and built into Arrow batches, as a read task does.

    python3 bench/spark_client_cost.py                    # prints µs a row (CPU)
    valgrind --tool=callgrind --toggle-collect=functools_reduce python3 bench/spark_client_cost.py --rounds 5
    python3 bench/spark_client_cost.py --scan-rows 1024  # a batch from 8 scans, as from receive buffers

Under callgrind only the measured rounds (inside ``functools.reduce``) are counted: instructions / rows
is the client's compute a row. ``--tree DIR`` runs another checkout's lavinpy (one with DeliveryColumns).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192, help="deliveries in the receive buffer")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--scan-rows", type=int, default=0,
                        help="deliveries a scan (as a receive buffer holds; default: all in one scan)")
    parser.add_argument("--routing-key", default="q", help="every delivery's (a queue's name, written by default)")
    parser.add_argument("--kind", choices=("stream", "classic"), default="stream",
                        help="classic: deliveries without offsets, scanned and built as a queue read's")
    parser.add_argument("--tree", default=str(REPO_ROOT))
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    import pyarrow as pa

    from lavinpy.spark.read_rows import COLUMNS, BatchBuilder
    from lavinpy.spark.streams import _range_rows
    from lavinpy.wire import writer
    from lavinpy.wire.delivery_columns import STREAM_OFFSET_ENTRY, DeliveryColumns
    from lavinpy.wire.properties import append_header_entry

    names = {"offset": pa.int64(), "body": pa.binary(), "redelivered": pa.bool_()}
    schema = pa.schema([(name, names.get(name, pa.string())) for name in COLUMNS if name != "headers"
                        and name not in ("delivery_mode", "priority", "timestamp")]
                       + [("delivery_mode", pa.int32()), ("priority", pa.int32()),
                          ("headers", pa.map_(pa.string(), pa.string())), ("timestamp", pa.timestamp("us", "UTC"))])
    builder = BatchBuilder(schema)
    first = 1000
    buf = bytearray()
    for i in range(args.rows):
        stamp = STREAM_OFFSET_ENTRY + (first + i).to_bytes(8, "big", signed=True)
        # classic: delivery mode 2 only, as the writer publishes
        props = b"\x10\x00\x02" if args.kind == "classic" else append_header_entry(b"\x00\x00", stamp)
        body = (b"event-%d-" % i).ljust(args.body_bytes, b"x")
        buf += b"".join(writer.deliver(1, "ctag", i + 1, False, "", args.routing_key, props, body, 131072))
    # The receive buffers: one, or the deliveries split into scans of --scan-rows each.
    frame_bytes = len(buf) // args.rows  # every delivery's frames have the same length here
    per_scan = args.scan_rows or args.rows
    datas = [bytes(buf[at:at + per_scan * frame_bytes]) for at in range(0, len(buf), per_scan * frame_bytes)]

    def one(total: int, _round: Any) -> int:
        columns = DeliveryColumns()
        for data in datas:  # as Receiver.receive appends each receive buffer
            columns.scan(data, 1)
            columns.decode()
        lo, hi = ((0, columns.rows) if args.kind == "classic"
                  else _range_rows(columns.offset_values, first, first + 10 * args.rows))
        return total + builder.build(columns, lo, hi).num_rows

    one(0, None)  # warm: imports, caches
    cpu = time.process_time()
    rows = functools.reduce(one, range(args.rounds), 0)
    cpu = time.process_time() - cpu
    print(f"{rows} rows, {cpu / rows * 1e6:.3f} µs a row (CPU)")


if __name__ == "__main__":
    main()
