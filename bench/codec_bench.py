"""Micro-benchmark of the AMQP codec: frames parsed per second and deliveries built per second.

    python bench/codec_bench.py [--triples 200000] [--chunk 65536]

The reader is fed a stream of (basic.publish, content header, 16-byte body) triples in socket-sized
chunks, as a publishing client would send them. pamqp's own unmarshal is measured on the same bytes
as a baseline. With the compiled codec built, every figure is shown for both paths: the pure-Python
column comes from a second run of this script with LAVINPY_PURE_PYTHON=1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

from pamqp import commands
from pamqp import frame as pamqp_frame

from lavinpy.wire import accel, client, writer
from lavinpy.wire.constants import PROTOCOL_HEADER
from lavinpy.wire.properties import peek_delivery_mode
from lavinpy.wire.reader import FrameReader

BODY = b"0123456789abcdef"
PROPS = commands.Basic.Properties(delivery_mode=2).marshal()
# What a typical application sends: content type, persistence and a small headers table.
RICH_PROPS = commands.Basic.Properties(content_type="application/json", delivery_mode=2,
                                       headers={"trace-id": "abc123"}, message_id="m-1").marshal()


def publish_stream(triples: int, props: bytes = PROPS) -> bytes:
    one = (writer.method_frame(1, commands.Basic.Publish(0, "amq.direct", "bench.key"))
           + b"".join(writer.content_frames(1, props, BODY, 131072)))
    return one * triples


def best_of(runs: int, fn: Callable[[], int]) -> tuple[float, int]:
    """Smallest wall time of ``runs`` calls, and what the call returned."""
    best, result = float("inf"), 0
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_reader(stream: bytes, chunk: int) -> int:
    reader = FrameReader()
    reader.feed(PROTOCOL_HEADER)
    count = 0
    for i in range(0, len(stream), chunk):
        count += len(reader.feed(stream[i:i + chunk]))
    return count


def bench_pamqp(stream: bytes) -> int:
    count, pos, view = 0, 0, memoryview(stream)
    while pos < len(stream):
        used, _channel, _frame = pamqp_frame.unmarshal(view[pos:].tobytes()[:200])
        pos += used
        count += 1
    return count


def bench_deliver(n: int) -> int:
    deliver = writer.deliver
    for tag in range(1, n + 1):
        deliver(1, "amq.ctag-bench", tag, False, "amq.direct", "bench.key", PROPS, BODY, 131072)
    return n


def bench_ack(n: int) -> int:
    ack = writer.basic_ack
    for tag in range(1, n + 1):
        ack(1, tag, False)
    return n


def bench_split(stream: bytes, chunk: int) -> int:
    """The client side's frame splitting (Spark data source, lavinpy-perf) over the same stream."""
    count, pending = 0, b""
    for i in range(0, len(stream), chunk):
        buf = pending + stream[i:i + chunk]
        frames, used = client.split_frames(buf)
        pending = buf[used:]
        count += len(frames)
    return count


def bench_peek(n: int) -> int:
    for _ in range(n):
        peek_delivery_mode(PROPS)
    return n


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Millions per second of each operation, on the codec path this process selected."""
    out: dict[str, float] = {}
    stream = publish_stream(args.triples)
    seconds, events = best_of(args.runs, lambda: bench_reader(stream, args.chunk))
    out["reader: publishes/s (publish+header+body)"] = args.triples / seconds / 1e6
    rich = publish_stream(args.triples, RICH_PROPS)
    seconds, events = best_of(args.runs, lambda: bench_reader(rich, args.chunk))
    out["reader, richer properties: publishes/s"] = args.triples / seconds / 1e6
    seconds, frames = best_of(args.runs, lambda: bench_split(stream, args.chunk))
    out["client split_frames: frames/s"] = frames / seconds / 1e6
    n = args.triples
    for label, fn in (("deliver (method+header+body, one bytes)", bench_deliver),
                      ("basic_ack", bench_ack), ("peek_delivery_mode", bench_peek)):
        seconds, done = best_of(args.runs, lambda fn=fn: fn(n))
        out[label] = done / seconds / 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--triples", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=65536, help="bytes per feed() call")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print this path's figures as JSON only")
    args = parser.parse_args()

    figures = measure(args)
    if args.json:
        print(json.dumps(figures))
        return
    columns = {"compiled" if accel.COMPILED else "pure Python": figures}
    if accel.COMPILED:
        env = dict(os.environ, LAVINPY_PURE_PYTHON="1")
        cmd = [sys.executable, __file__, "--json", "--triples", str(args.triples), "--chunk", str(args.chunk),
               "--runs", str(args.runs)]
        pure = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
        columns = {"pure Python": pure, "compiled": figures}
    names = list(columns)
    print(f"{'M per second':44}" + "".join(f"{name:>13}" for name in names))
    for label in figures:
        print(f"{label:44}" + "".join(f"{columns[name][label]:13.2f}" for name in names))

    small = publish_stream(args.triples)[:len(publish_stream(1)) * (args.triples // 20)]
    seconds, frames = best_of(1, lambda: bench_pamqp(small))
    print(f"pamqp.frame.unmarshal baseline: {frames / seconds / 1e6:.2f} M frames/s")


if __name__ == "__main__":
    main()
