"""The broker's side of a Spark queue read in process (no sockets): CPU or instructions a delivery.

A real broker on a temporary data dir (``fsync: never``) driven through the AMQP tests' harness. The queue
(``--kind``) is filled with what the Spark writer publishes (``spark_publish_inproc.spark_reads``), then one
consumer takes ``--prefetch`` deliveries with manual acks, as a batch read's consumer does (its prefetch is
its share, up to 65,535), and acks them all with one multiple ack, as the read does once its rows are
taken. The measured part runs inside ``functools.reduce``, so that callgrind's
``--toggle-collect=functools_reduce`` counts only it:

    PYTHONPATH=<tree> python3 bench/spark_read_inproc.py --kind classic
    PYTHONHASHSEED=0 PYTHONPATH=<tree> valgrind --tool=callgrind --toggle-collect=functools_reduce \\
        --callgrind-out-file=/dev/null python3 bench/spark_read_inproc.py --kind classic --repeat 1
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from consumer_harness import Harness  # noqa: E402
from pamqp import commands  # noqa: E402
from spark_publish_inproc import BATCH_ROWS, spark_reads  # noqa: E402


def ack_multiple(tag: int) -> bytes:
    """basic.ack(tag, multiple=true) on channel 1."""
    payload = struct.pack(">HHQB", 60, 80, tag, 1)
    return struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"


async def run_once(kind: str, prefetch: int) -> float:
    """Thread CPU µs a delivery (the deliveries and the one ack)."""
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), fsync="never")
        try:
            pub = h.open_client(declare=commands.Queue.Declare(queue="q", durable=True,
                                                               arguments={"x-queue-type": kind}))
            reads = spark_reads("q", pub.conn.frame_max, 100, True, True, 262144)
            for _ in range(-(-prefetch // BATCH_ROWS)):
                for data in reads:
                    pub.conn.receive_data(data)
                    h.run_soon()
                    pub.conn.data_to_send()
                await asyncio.sleep(0)
            con = h.open_client(("127.0.0.1", 40000))
            arguments = {"x-stream-offset": "first"} if kind == "stream" else {}

            def read_all(delivered: int, _: int) -> int:
                con.send((1, commands.Basic.Qos(prefetch_count=prefetch)),
                         (1, commands.Basic.Consume(queue="q", consumer_tag="c", arguments=arguments)))
                while out := con.conn.data_to_send() or (h.run_soon() or con.conn.data_to_send()):
                    delivered += sum(map(len, out))
                con.conn.receive_data(ack_multiple(prefetch))
                h.run_soon()
                con.conn.data_to_send()
                return delivered

            t0 = time.thread_time()
            sent = functools.reduce(read_all, [0], 0)
            spent = time.thread_time() - t0
            if sent < prefetch * 100:
                raise SystemExit(f"{kind}: {sent} bytes delivered, fewer than {prefetch} bodies")
            return spent / prefetch * 1e6
        finally:
            h.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("classic", "stream", "quorum"), default="classic")
    ap.add_argument("--prefetch", type=int, default=65535, help="deliveries (the consumer's prefetch)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    figures = sorted(asyncio.run(run_once(args.kind, args.prefetch)) for _ in range(args.repeat))
    print(f"{args.kind}: µs thread CPU a delivery: median {figures[len(figures) // 2]:.3f}, min {figures[0]:.3f} "
          f"({', '.join(f'{f:.3f}' for f in figures)})")


if __name__ == "__main__":
    main()
