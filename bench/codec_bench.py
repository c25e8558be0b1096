"""Micro-benchmark of the AMQP codec: frames parsed per second and deliveries built per second.

    python bench/codec_bench.py [--triples 200000] [--chunk 65536]

The reader is fed a stream of (basic.publish, content header, 16-byte body) triples in socket-sized
chunks, as a publishing client would send them. pamqp's own unmarshal is measured on the same bytes
as a baseline.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from pamqp import commands
from pamqp import frame as pamqp_frame

from lavinpy.wire import writer
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


def bench_peek(n: int) -> int:
    for _ in range(n):
        peek_delivery_mode(PROPS)
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--triples", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=65536, help="bytes per feed() call")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    stream = publish_stream(args.triples)
    seconds, frames = best_of(args.runs, lambda: bench_reader(stream, args.chunk))
    print(f"reader: {frames / seconds / 1e6:.2f} M frames/s ({frames // 3 / seconds / 1e6:.2f} M publishes/s; "
          f"{len(stream) / seconds / 1e6:.0f} MB/s, {args.chunk}-byte reads)")

    rich = publish_stream(args.triples, RICH_PROPS)
    seconds, frames = best_of(args.runs, lambda: bench_reader(rich, args.chunk))
    print(f"reader, richer properties: {frames / seconds / 1e6:.2f} M frames/s")

    small = stream[:len(stream) // 20]
    seconds, frames = best_of(1, lambda: bench_pamqp(small))
    print(f"pamqp.frame.unmarshal baseline: {frames / seconds / 1e6:.2f} M frames/s")

    n = args.triples
    for label, fn in (("deliver (method+header+body, one bytes)", bench_deliver),
                      ("basic_ack", bench_ack), ("peek_delivery_mode", bench_peek)):
        seconds, done = best_of(args.runs, lambda fn=fn: fn(n))
        print(f"{label}: {done / seconds / 1e6:.2f} M/s")


if __name__ == "__main__":
    main()
