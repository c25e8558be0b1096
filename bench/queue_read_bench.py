"""Broker CPU per message for a classic (or quorum) queue drained the way the Spark source drains it.

    python bench/queue_read_bench.py --url amqp://guest:guest@127.0.0.1:5672/ --broker-pid 1234
    python bench/queue_read_bench.py ... --messages 120000 --consumers 2 --kind quorum

Publishes --messages persistent 100-byte messages with confirms (the Spark publisher), then drains
them with --consumers consumers at once, each with a prefetch of its share and one multiple ack at
the end (lavinpy.spark.queues.drain_partition), and prints the broker's CPU time (utime + stime
from /proc) per message for each phase, and the rates. No Spark needed.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pamqp import commands  # noqa: E402

from lavinpy.spark.client import AMQPParams, Connection  # noqa: E402
from lavinpy.spark.publisher import ConfirmPublisher  # noqa: E402
from lavinpy.spark.queues import drain_partition  # noqa: E402
from lavinpy.spark.streams import ColumnsSink  # noqa: E402

PERSISTENT = b"\x10\x00\x02"  # property flags: delivery_mode only; delivery_mode 2


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--broker-pid", type=int, required=True)
    parser.add_argument("--kind", default="classic")
    parser.add_argument("--messages", type=int, default=120_000)
    parser.add_argument("--consumers", type=int, default=2)
    args = parser.parse_args()
    params = AMQPParams.from_url(args.url)
    queue = f"queue-read-bench-{os.getpid()}"
    with Connection(params).open() as conn:
        conn.call(conn.open_channel(), commands.Queue.Declare(queue=queue, durable=True,
                                                              arguments={"x-queue-type": args.kind}),
                  commands.Queue.DeclareOk)
        publisher = ConfirmPublisher(conn)
        method = publisher.encoder.method_frame("", queue)
        packer = publisher.encoder.packer(PERSISTENT)
        cpu0, start = cpu_s(args.broker_pid), time.perf_counter()
        left = args.messages
        while left:
            count = min(5000, left)
            left -= count
            out = bytearray()
            for _ in range(count):
                publisher.encoder.append(out, method, packer, PERSISTENT, b"x" * 100)
            publisher.send_encoded(out, count)
        publisher.wait_for_confirms()
        publisher.close()
        elapsed, cpu = time.perf_counter() - start, cpu_s(args.broker_pid) - cpu0
    print(f"publish: {args.messages / elapsed:,.0f} msg/s, broker {cpu / args.messages * 1e6:.2f} µs a message")
    got = [0] * args.consumers
    share = -(-args.messages // args.consumers)

    def drain(i: int) -> None:
        sink = ColumnsSink(8192)
        for _ in drain_partition(params, queue, share, 0.5, sink):
            got[i] += sink.take().rows

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(args.consumers)]
    cpu0, start = cpu_s(args.broker_pid), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed, cpu = time.perf_counter() - start, cpu_s(args.broker_pid) - cpu0
    total = sum(got)
    print(f"drain with {args.consumers} consumers: {total:,} messages, {total / elapsed:,.0f} msg/s, "
          f"broker {cpu / max(total, 1) * 1e6:.2f} µs a message")
    with Connection(params).open() as conn:
        conn.call(conn.open_channel(), commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)


if __name__ == "__main__":
    main()
