"""The hand-out side of one queue with many consumers, in process (no sockets): thread CPU per delivery.

N consuming connections (driven as in the AMQP tests by their harness, a real broker on a temporary data
dir, ``fsync: never``) on one queue at prefetch P; a publisher's reads of R 16 B messages each are parsed,
stored and handed out (3-4 per consumer a round at N = 1,000, R = 3,500, as the published runs of
``bench/scale.py``'s consumers curve); every K such reads each consumer acks what it holds with one
basic.ack multiple=true (at prefetch 10 the deliveries then come from the queue's backlog, a round per
ack read), or with ``--single-acks`` one basic.ack per delivery in one read, as amqpperf acks (a broker that
keeps up with its publisher: ``--run 50 --every 1`` is about 50,000 msg/s taken once a millisecond, one
delivery a consumer read; ``--ack-reads-only`` prints the ack reads' cost per read). Timed: the publisher's
reads and the ack reads with the deliveries they start (thread CPU), per message delivered; the consumers'
output is taken outside the timing.

``--uneven``: each consumer acks only a part of its deliveries (from one to all, varying by consumer and
round), so the consumers' room differs at the next publisher read and its picks are not whole rounds (as
over sockets, where the consumers' acks arrive in reads of different sizes).

``--per-channel K``: K consumers share each connection's channel (a Spark task's parts, or an app that
consumes one queue several times on one channel), each with the prefetch.

``--priorities K``: the consumers in K consumer priorities (x-priority 0, -1, ...; by channel, or by a
channel's consumer with ``--per-channel``): a round serves the highest priority with room first.

``--held``: as over sockets while a publisher's reader thread holds more input (``sessions.input_waiting``),
each publisher read is one turn of the loop, and a consumer's small output waits for the next turns (up to
``OUTPUT_HOLD_TURNS``) instead of being written at the end of each read; before each ack phase the input
stops waiting and everything held is written.

    PYTHONPATH=<tree> python3 bench/consumer_round_bench.py [--consumers 1000 --prefetch 100 --run 3500
                                                            --every 4 --rounds 40 --repeat 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from consumer_harness import Harness, ack_frame, one_queue_consumers, publish_read


def run_once(args: argparse.Namespace) -> tuple[float, int]:
    """Thread CPU per delivered message (µs) over ``args.rounds`` publisher reads, and how many."""
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), fsync="never")
        try:
            pub, consumers = one_queue_consumers(h, args.consumers, args.prefetch, args.per_channel, args.priorities)
            run = publish_read(pub, args.run)
            acked = [0] * len(consumers)
            spent = ack_spent = 0.0
            ack_reads = 0
            delivered_before = sum(c.conn.channels[1].deliveries.tag for c in consumers)
            for r in range(args.rounds):
                t0 = time.thread_time()
                if args.held:
                    h.sessions.input_waiting = True
                    pub.conn.receive_data(run)
                    turn, h.soon[:] = list(h.soon), []
                    for callback in turn:  # one turn: what it schedules waits for the next read's turn
                        callback()
                    if (r + 1) % args.every == 0:
                        h.sessions.input_waiting = False
                        h.run_soon()
                else:
                    pub.conn.receive_data(run)
                    h.run_soon()
                spent += time.thread_time() - t0
                for c in consumers:
                    c.conn.data_to_send()
                pub.conn.data_to_send()
                if (r + 1) % args.every:
                    continue
                reads = []
                for i, c in enumerate(consumers):
                    last = c.conn.channels[1].deliveries.tag
                    if args.uneven and last > acked[i]:  # a part of what it holds, a share that varies
                        last = acked[i] + 1 + (7 * i + r) % (last - acked[i])
                    if last > acked[i]:
                        if args.single_acks:  # as amqpperf: one basic.ack per delivery, a read of them
                            data = b"".join(ack_frame(tag) for tag in range(acked[i] + 1, last + 1))
                        else:
                            data = ack_frame(last, multiple=True)
                        reads.append((c.conn, data))
                        acked[i] = last
                t0 = time.thread_time()
                for conn, data in reads:
                    conn.receive_data(data)
                h.run_soon()
                spent += time.thread_time() - t0
                ack_spent += time.thread_time() - t0
                ack_reads += len(reads)
                for c in consumers:
                    c.conn.data_to_send()
            delivered = sum(c.conn.channels[1].deliveries.tag for c in consumers) - delivered_before
            if args.ack_reads_only:
                return ack_spent / max(1, ack_reads) * 1e6, ack_reads
            return spent / max(1, delivered) * 1e6, delivered
        finally:
            h.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--consumers", type=int, default=1000)
    ap.add_argument("--prefetch", type=int, default=100)
    ap.add_argument("--per-channel", type=int, default=1,
                    help="consumers on each connection's channel, each with the prefetch (a basic.qos before each)")
    ap.add_argument("--priorities", type=int, default=1,
                    help="consumers in this many x-priority levels (0, -1, ...), in turn")
    ap.add_argument("--run", type=int, default=3500, help="messages per publisher read")
    ap.add_argument("--every", type=int, default=4, help="publisher reads between two ack reads of a consumer")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--held", action="store_true", help="a turn per publisher read, small output held between")
    ap.add_argument("--single-acks", action="store_true",
                    help="each delivery acked by its own basic.ack (multiple=false), a consumer's acks in one read")
    ap.add_argument("--uneven", action="store_true",
                    help="each consumer acks a varying part of what it holds (1 to all): uneven room, so a "
                         "published run's picks are not whole rounds (as over sockets)")
    ap.add_argument("--ack-reads-only", action="store_true",
                    help="print the ack reads' thread CPU per read (with the deliveries they start), not per message")
    args = ap.parse_args()
    runs = [run_once(args) for _ in range(args.repeat)]
    figures = sorted(figure for figure, _ in runs)
    what, counted = ("ack read", "ack reads") if args.ack_reads_only else ("delivered message", "delivered")
    print(f"µs thread CPU per {what}: min {figures[0]:.3f}, median {figures[len(figures) // 2]:.3f} "
          f"({', '.join(f'{f:.3f}' for f in figures)}); {counted} {', '.join(str(d) for _, d in runs)}")


if __name__ == "__main__":
    main()
