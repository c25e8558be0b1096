"""The ack side of one queue with many consumers, in process (no sockets): thread CPU per acked message.

N consuming connections (driven as in the AMQP tests by their harness, a real broker on a temporary
data dir, ``fsync: never``) on one queue at prefetch P; a publisher's reads of R 16 B messages each are handed
out (3-4 per consumer at N = 1,000, R = 3,500, as the published runs of ``bench/scale.py``'s consumers curve);
every K such reads each consumer acks what it holds in one read of single basic.ack frames (7 acks per read at
K = 2, as amqpperf's consumers' reads there). The figure is the thread CPU of those ack reads (parse, settle,
the deliveries they start) per read (median and minimum over the ack phases) and per acked message (mean).

    PYTHONPATH=<tree> python3 bench/consumer_acks_bench.py [--consumers 1000 --prefetch 100 --run 3500
                                                          --every 2 --rounds 60 --multiple --hold 0]

``--hold H``: each consumer leaves its last H deliveries unacked (acks up to its tag minus H), so the queue
holds about consumers x H unacked positions (100,000 at 1,000 consumers holding 100, as under amqpperf at
prefetch 100: the sizes at which the unacked positions' memory use shows).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from consumer_harness import Harness, ack_frame, one_queue_consumers, publish_read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--consumers", type=int, default=1000)
    ap.add_argument("--prefetch", type=int, default=100)
    ap.add_argument("--run", type=int, default=3500, help="messages per publisher read")
    ap.add_argument("--every", type=int, default=2, help="publisher reads between two ack reads of a consumer")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--multiple", action="store_true", help="one basic.ack multiple=true per read instead")
    ap.add_argument("--hold", type=int, default=0, help="deliveries each consumer leaves unacked")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), fsync="never")
        pub, consumers = one_queue_consumers(h, args.consumers, args.prefetch)
        run = publish_read(pub, args.run)
        acked = [0] * len(consumers)
        phases: list[float] = []
        total = count = 0.0
        for r in range(args.rounds):
            pub.conn.receive_data(run)
            h.run_soon()
            for c in consumers:
                c.conn.data_to_send()
            pub.conn.data_to_send()
            if (r + 1) % args.every:
                continue
            reads = []
            for i, c in enumerate(consumers):
                last = c.conn.channels[1].deliveries.tag - args.hold
                if last > acked[i]:
                    data = (ack_frame(last, True) if args.multiple
                            else b"".join(ack_frame(t) for t in range(acked[i] + 1, last + 1)))
                    reads.append((c.conn, data))
                    count += last - acked[i]
                    acked[i] = last
            t0 = time.thread_time()
            for conn, data in reads:
                conn.receive_data(data)
            h.run_soon()
            for c in consumers:
                c.conn.data_to_send()
            spent = time.thread_time() - t0
            total += spent
            phases.append(spent / max(1, len(reads)))
        phases.sort()
        per_read = count / max(1, len(phases) * len(consumers))
        print(f"{per_read:.1f} acks per read; per read: median {phases[len(phases) // 2] * 1e6:.1f} µs, "
              f"min {phases[0] * 1e6:.1f} µs; mean per acked message {total / count * 1e6:.3f} µs")
        h.close()


if __name__ == "__main__":
    main()
