"""The Spark data source's own write and read code without Spark: broker CPU per message, per queue kind.

    python bench/spark_io_bench.py                       # starts its own lavinpy, 600,000 messages a kind
    python bench/spark_io_bench.py --kinds classic --rounds 3

Two processes write (as Spark's two write tasks: `publish_batches` with confirms, 100-byte bodies),
then the partitions the data source plans are read by two processes (`read_partition` for a stream,
`QueueBatchReader.read` for a classic or quorum queue, acks after the last row) into Arrow batches.
Spark's own cost is absent, so the broker's CPU time per message (utime + stime of the broker
process over each phase) and the tasks' (each task's own process CPU time, summed) are steadier
here than in `spark_bench.py` on a shared machine. Needs pyarrow
and pyspark (only its data source classes are imported; no JVM starts).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pamqp import commands  # noqa: E402

from lavinpy.spark.client import AMQPParams, Connection  # noqa: E402

BATCH_ROWS = 8192


def _write(url: str, queue: str, batches: int) -> float:
    """One write task; returns its own CPU seconds."""
    import pyarrow as pa

    from lavinpy.spark.datasource import publish_batches
    from lavinpy.spark.options import WriteOptions

    bodies = [f"event-{i}-".ljust(100, "x").encode() for i in range(BATCH_ROWS)]
    batch = pa.RecordBatch.from_arrays([pa.array(bodies, pa.binary())], names=["body"])
    cpu = time.process_time()
    publish_batches(WriteOptions.parse({"url": url, "queue": queue}), iter([batch] * batches))
    return time.process_time() - cpu


def _read(url: str, queue: str, kind: str, partition: Any, total: int, prefetch: str) -> tuple[int, float]:
    """One read task; returns its rows and its own CPU seconds."""
    from lavinpy.spark.datasource import read_partition
    from lavinpy.spark.options import ReadOptions
    from lavinpy.spark.queue_source import QueueBatchReader, arrow_schema_of
    from lavinpy.spark.read_rows import read_schema

    opts = ReadOptions.parse({"url": url, "queue": queue, **({"prefetch": prefetch} if prefetch else {})})
    arrow_schema_of(read_schema())  # warm, as in a reused Spark worker: its first call costs ~30 ms
    cpu = time.process_time()
    batches = (read_partition(opts, read_schema(), partition) if kind == "stream"
               else QueueBatchReader(opts, read_schema(), total).read(partition))
    rows = sum(batch.num_rows for batch in batches)
    return rows, time.process_time() - cpu


def _partitions(url: str, queue: str, kind: str, total: int) -> list[Any]:
    from lavinpy.spark.datasource import LavinpyBatchReader
    from lavinpy.spark.options import ReadOptions
    from lavinpy.spark.queue_source import QueueBatchReader
    from lavinpy.spark.read_rows import read_schema

    opts = ReadOptions.parse({"url": url, "queue": queue, "maxMessagesPerPartition": str(-(-total // 2))})
    if kind == "stream":
        return LavinpyBatchReader(opts, read_schema()).partitions()
    return QueueBatchReader(opts, read_schema(), total).partitions()


def _broker_cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _queue(url: str, queue: str, kind: str | None) -> None:
    with Connection(AMQPParams.from_url(url)).open() as conn:
        ch = conn.open_channel()
        if kind is None:
            conn.call(ch, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        else:
            conn.call(ch, commands.Queue.Declare(queue=queue, durable=True, arguments={"x-queue-type": kind}),
                      commands.Queue.DeclareOk)


def one_kind(pool: Any, url: str, pid: int | None, kind: str, messages: int, prefetch: str = "") -> str:
    queue = f"io-{kind}-{uuid.uuid4().hex[:8]}"
    _queue(url, queue, kind)
    per_writer = max(1, messages // BATCH_ROWS // 2)
    total = 2 * per_writer * BATCH_ROWS
    cpu0, t0 = _broker_cpu_s(pid), time.perf_counter()
    write_cpu = sum(pool.starmap(_write, [(url, queue, per_writer)] * 2))
    cpu1, t1 = _broker_cpu_s(pid), time.perf_counter()
    parts = _partitions(url, queue, kind, total)
    reads = pool.starmap(_read, [(url, queue, kind, part, total, prefetch) for part in parts])
    got, read_cpu = sum(rows for rows, _ in reads), sum(cpu for _, cpu in reads)
    cpu2, t2 = _broker_cpu_s(pid), time.perf_counter()
    _queue(url, queue, None)
    if got != total:
        raise SystemExit(f"{kind}: read {got} messages of {total}")
    return (f"{kind:8} {total:,} messages: write {total / (t1 - t0):,.0f}/s, broker "
            f"{(cpu1 - cpu0) / total * 1e6:.2f} µs a message, tasks {write_cpu / total * 1e6:.2f}; read "
            f"({len(parts)} partitions) {total / (t2 - t1):,.0f}/s, broker "
            f"{(cpu2 - cpu1) / total * 1e6:.2f} µs a message, tasks {read_cpu / total * 1e6:.2f}; "
            f"load {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="use this broker (its CPU is then not measured)")
    parser.add_argument("--messages", type=int, default=600_000)
    parser.add_argument("--kinds", default="stream,classic")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--prefetch", default="", help="the read's prefetch option (default: the source's)")
    args = parser.parse_args()
    from spark_bench import start_lavinpy

    proc = None
    url = args.url
    if url is None:
        proc, url = start_lavinpy(Path(tempfile.mkdtemp(prefix="lavinpy-spark-io-bench-")))
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            for _ in range(args.rounds):
                for kind in args.kinds.split(","):
                    print(one_kind(pool, url, None if proc is None else proc.pid, kind.strip(), args.messages,
                                   args.prefetch),
                          flush=True)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
