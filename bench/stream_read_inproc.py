"""A stream read in process, for instruction counts: the broker's side of the Spark source's stream read.

    python bench/stream_read_inproc.py --messages 20000 --reads 1
    valgrind --tool=callgrind python3 bench/stream_read_inproc.py --messages 20000 --reads 3

A real broker on a temporary data dir and its AMQP session layer (the AMQP tests' harness, no sockets):
--messages persistent messages of --body bytes are published to stream ``s``, then read --reads times
from offset ``first`` by a consumer at --prefetch (the source's default, 2000) that acks (multiple) the
last tag of each batch of deliveries, as the source's reader does when half its prefetch is unacked.
Two runs that differ only in --reads give, by their difference, the instructions of one read of
--messages messages (the start, the publishes and the exit cancel out). It also prints the reads'
thread CPU a message.

The consumer's tag is the broker's own (``amq.ctag-...``), as the source's; ``--named-tag`` gives it a
name, which the broker tracks the offset of (``x-stream-automatic-offset-tracking``), as a client that
names its consumers (pika does) gets.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from consumer_harness import Harness, ack_frame
from pamqp import commands, frame

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--reads", type=int, default=1)
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--prefetch", type=int, default=2000)
    ap.add_argument("--named-tag", action="store_true", help="a consumer tag of its own: its offset tracked")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(tmp, fsync="never")
        try:
            pub = h.connect()
            pub.handshake()
            pub.open_channel()
            pub.send((1, commands.Queue.Declare(queue="s", durable=True, arguments={"x-queue-type": "stream"})))
            pub.read()
            one = b"".join(frame.marshal(f[1], f[0]) for f in pub.publish(1, "s", b"x" * args.body, "", PERSISTENT))
            for done in range(0, args.messages, 1000):
                pub.send(one * min(1000, args.messages - done))
                pub.read()
            delivered = 0
            spent = 0.0
            for n in range(args.reads):
                c = h.connect(("127.0.0.1", 30000 + n))
                c.handshake()
                c.open_channel()
                c.send((1, commands.Basic.Qos(prefetch_count=args.prefetch)),
                       (1, commands.Basic.Consume(queue="s", consumer_tag="reader" if args.named_tag else "",
                                                  arguments={"x-stream-offset": "first"})))
                channel = c.conn.channels[1]
                started = time.thread_time()
                acked = 0
                while acked < args.messages:
                    h.run_soon()
                    out = sum(len(b) for b in c.conn.data_to_send())
                    tag = channel.deliveries.tag
                    if tag == acked and not out:
                        raise SystemExit(f"read {n}: stalled at {tag} of {args.messages}")
                    if tag > acked:
                        c.send(ack_frame(tag, multiple=True))
                        acked = tag
                spent += time.thread_time() - started
                delivered += acked
                c.conn.lost()
            print(f"published {args.messages}, delivered {delivered} in {args.reads} reads; "
                  f"{spent / max(1, delivered) * 1e6:.2f} µs thread CPU a message read"
                  f"{' (named tag: tracked)' if args.named_tag else ''}")
        finally:
            h.close()


if __name__ == "__main__":
    main()
