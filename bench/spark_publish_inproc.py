"""The broker's side of a Spark write in process (no sockets): CPU or instructions a message.

A real broker on a temporary data dir (``--fsync``: its default, always) driven through the AMQP tests' harness. One
publisher connection sends exactly what the Spark writer sends (``RowEncoder`` over an Arrow batch of
``--body``-byte bodies: basic.publish with mandatory, delivery mode 2, publisher confirms) into a durable
queue of ``--kind``, cut into reads of ``--read-bytes`` as a socket hands them over; each read is
followed by the loop's deferred work and the connection's output (the confirms). ``--plain`` sends
scenario a's messages instead (16 B transient, not mandatory, no confirms, a transient classic queue),
and the flags below take one of the Spark writer's choices away at a time. The figure is the thread
CPU of the timed rounds a message; under callgrind, take the instructions of two runs with different
``--rounds`` and divide their difference by the messages of the extra rounds:

    PYTHONPATH=<tree> python3 bench/spark_publish_inproc.py --kind classic
    PYTHONHASHSEED=0 PYTHONPATH=<tree> valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python3 bench/spark_publish_inproc.py --kind stream --rounds R --repeat 1   (R = 6, then 2)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa  # noqa: E402
from consumer_harness import Harness  # noqa: E402
from pamqp import commands  # noqa: E402

from lavinpy.spark.options import WriteOptions  # noqa: E402
from lavinpy.spark.publisher import MessageEncoder  # noqa: E402
from lavinpy.spark.write_rows import RowEncoder  # noqa: E402

BATCH_ROWS = 8192


def spark_reads(queue: str, frame_max: int, body: int, mandatory: bool, persistent: bool,
                read_bytes: int) -> list[bytes]:
    """One Arrow batch of the writer's rows as its publisher sends them, cut into socket reads."""
    opts = WriteOptions.parse({"url": "amqp://localhost", "queue": queue, "mandatory": str(mandatory).lower(),
                               "persistent": str(persistent).lower()})
    rows = RowEncoder(opts, MessageEncoder(1, frame_max, mandatory))
    bodies = [f"event-{i}-".ljust(body, "x").encode()[:body] for i in range(BATCH_ROWS)]
    batch = pa.RecordBatch.from_arrays([pa.array(bodies, pa.binary())], names=["body"])
    data = b"".join(bytes(chunk) for chunk, _ in rows.chunks(batch))
    return [data[i:i + read_bytes] for i in range(0, len(data), read_bytes)]


def run_once(args: Any) -> float:
    """Thread CPU µs a message over ``args.rounds`` timed batches (on an event loop: the confirms
    wait for the store's flush, which runs as the loop's tasks)."""
    return asyncio.run(_run_once(args))


async def _run_once(args: Any) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), fsync=args.fsync)
        try:
            pub = h.connect()
            pub.handshake()
            pub.open_channel()
            durable = not args.plain
            arguments = {"x-queue-type": args.kind} if durable else {}
            pub.send((1, commands.Queue.Declare(queue="q", durable=durable, arguments=arguments)))
            if not args.plain and not args.no_confirm:
                pub.send((1, commands.Confirm.Select()))
            pub.read()
            frame_max = pub.conn.frame_max
            if args.plain:
                reads = spark_reads("q", frame_max, 16, False, False, args.read_bytes)
            else:
                reads = spark_reads("q", frame_max, args.body, not args.no_mandatory, not args.transient,
                                    args.read_bytes)
            conn = pub.conn
            confirms = conn.channels[1].confirms
            confirming = confirms is not None

            async def batches(rounds: int) -> float:
                spent = 0.0
                for _ in range(rounds):
                    t0 = time.thread_time()
                    for data in reads:
                        conn.receive_data(data)
                        h.run_soon()
                        conn.data_to_send()
                        await asyncio.sleep(0)  # the loop's turn: flushes done resolve their confirms
                    while confirming and confirms.sent < confirms.seq:  # every confirm out before the next batch
                        await asyncio.sleep(0.0005)
                        h.run_soon()
                        conn.data_to_send()
                    spent += time.thread_time() - t0
                return spent

            await batches(args.warmup)
            spent = await batches(args.rounds)
            return spent / (args.rounds * BATCH_ROWS) * 1e6
        finally:
            h.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("classic", "stream", "quorum"), default="classic")
    ap.add_argument("--plain", action="store_true", help="scenario a's messages instead of the Spark writer's")
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--no-mandatory", action="store_true")
    ap.add_argument("--no-confirm", action="store_true")
    ap.add_argument("--transient", action="store_true", help="delivery mode unset instead of 2")
    ap.add_argument("--fsync", default="always", help="the broker's fsync policy (its default: always)")
    ap.add_argument("--read-bytes", type=int, default=65536, help="bytes a socket read hands the broker")
    ap.add_argument("--rounds", type=int, default=20, help="batches of 8,192 rows timed")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    figures = sorted(run_once(args) for _ in range(args.repeat))
    print(f"{'plain' if args.plain else args.kind}: µs thread CPU a message: median {figures[len(figures) // 2]:.3f}, "
          f"min {figures[0]:.3f} ({', '.join(f'{f:.3f}' for f in figures)})")


if __name__ == "__main__":
    main()
