"""How long a connection that dies holding many unacked deliveries stalls the broker for everyone else.

    python bench/requeue_stall_bench.py                     # starts its own lavinpy (fsync never)
    python bench/requeue_stall_bench.py --parts 8 --rounds 3
    BROKER_PID=1234 python bench/requeue_stall_bench.py --url amqp://guest:guest@127.0.0.1:5672/

A classic queue is filled with `--parts` x 65,535 persistent 100-byte messages (the Spark writer's
code). One process then takes nearly all of them unacked, as a Spark batch-read task does (a consumer
of prefetch 65,535 per part, on channels of one connection), and drops its connection without acking:
the broker hands every delivery back to the queue. Meanwhile another connection asks the broker a
passive queue.declare in a loop. Printed per round: how long until the queue holds every message
ready again, the broker's CPU time over that, and the slowest of the other connection's round trips
(the stall the other clients see); then the time and broker CPU of reading them all again (each one
sent before must come marked redelivered). Needs pyarrow and pyspark (the data source's classes only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import spark_io_bench  # noqa: E402
from pamqp import commands  # noqa: E402
from spark_bench import start_lavinpy  # noqa: E402

from lavinpy.spark.client import AMQPParams, Connection  # noqa: E402
from lavinpy.spark.queues import MAX_PREFETCH, drain_partition  # noqa: E402
from lavinpy.spark.streams import ColumnsSink  # noqa: E402


def broker_cpu(pid: int) -> float:
    """The broker's user + system CPU seconds (0 when its process is not known: ``--url`` without
    ``BROKER_PID``)."""
    if not pid:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def ready(params: AMQPParams, queue: str) -> int:
    with Connection(params).open() as conn:
        ok = conn.call(conn.open_channel(), commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        return int(ok.message_count)


def one_round(url: str, queue: str, parts: int) -> tuple[float, float, float, int, float, float]:
    params = AMQPParams.from_url(url)
    total = parts * MAX_PREFETCH
    spark_io_bench._queue(url, queue, "classic")
    spark_io_bench._write(url, queue, -(-total // spark_io_bench.BATCH_ROWS))
    held = ready(params, queue)
    sink = ColumnsSink(8192)
    reading = drain_partition(params, queue, held, 0.5, sink)
    taken = 0
    for _ in reading:
        taken += sink.take().rows
        if taken >= held - 8192:
            break  # the last batch is never taken: the task dies holding the rest
    slowest = [0.0]
    stop = threading.Event()

    def ask() -> None:
        with Connection(params).open() as conn:
            ch = conn.open_channel()
            while not stop.is_set():
                start = time.perf_counter()
                conn.call(ch, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
                slowest[0] = max(slowest[0], time.perf_counter() - start)

    asker = threading.Thread(target=ask)
    asker.start()
    time.sleep(0.3)
    slowest[0] = 0.0
    cpu = broker_cpu(BROKER[0])
    start = time.perf_counter()
    reading.close()  # an abandoned read aborts its connection: nothing acked
    while ready(params, queue) < held:
        time.sleep(0.002)
    took = time.perf_counter() - start
    cpu = broker_cpu(BROKER[0]) - cpu
    time.sleep(0.2)
    stop.set()
    asker.join()
    # The redelivery: all of them read again (and acked), each marked redelivered.
    again_cpu = broker_cpu(BROKER[0])
    start = time.perf_counter()
    again = marked = 0
    for _ in drain_partition(params, queue, held, 0.5, sink):
        columns = sink.take()
        again += columns.rows
        marked += len(columns.redelivered)
    again_took = time.perf_counter() - start
    again_cpu = broker_cpu(BROKER[0]) - again_cpu
    # Every one comes back; those the dead consumers had been sent come marked redelivered (the
    # consumers' windows held all but the last few, never sent).
    assert again == held and taken <= marked <= held, (again, marked, taken, held)
    return took, cpu, slowest[0], taken, again_took, again_cpu


BROKER = [0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", type=int, default=8, help="consumers of 65,535 each (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="a running broker instead of one started here")
    args = parser.parse_args()
    if args.url:
        url, proc = args.url, None
        BROKER[0] = int(os.environ.get("BROKER_PID", "0"))
    else:
        proc, url = start_lavinpy(Path(tempfile.mkdtemp(prefix="requeue-stall-")), "never")
        BROKER[0] = proc.pid
    try:
        rows = []
        for n in range(args.rounds):
            took, cpu, slowest, held, again, again_cpu = one_round(url, f"requeue-stall-{n}", args.parts)
            rows.append((took, cpu, slowest, again, again_cpu))
            print(f"round {n}: {held:,} unacked handed back in {took * 1e3:.0f} ms; broker CPU {cpu * 1e3:.0f} ms; "
                  f"slowest round trip of another connection {slowest * 1e3:.0f} ms; read again in "
                  f"{again * 1e3:.0f} ms, broker CPU {again_cpu * 1e3:.0f} ms", flush=True)
        print(f"median: back in {statistics.median(r[0] for r in rows) * 1e3:.0f} ms, broker CPU "
              f"{statistics.median(r[1] for r in rows) * 1e3:.0f} ms, slowest other round trip "
              f"{statistics.median(r[2] for r in rows) * 1e3:.0f} ms; read again in "
              f"{statistics.median(r[3] for r in rows) * 1e3:.0f} ms, broker CPU "
              f"{statistics.median(r[4] for r in rows) * 1e3:.0f} ms")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
