"""compare.py's scenarios a, b and d in process (no sockets): the broker's thread CPU per message.

A real broker on a temporary data dir (``fsync: never``) driven through the AMQP tests' harness, as
``consumer_harness.py``: each round hands every publisher one read of ``--run`` publishes, runs the loop's
deferred work and takes the consumers' output (and, in b, hands the consumer one read acking what it got).
a: 16 B transient, one publisher, one no-ack consumer; b: 1 KiB persistent on a durable queue, one
consumer at prefetch 256 acking with multiple=true, without b's publisher confirms (they wait for the
store's flush on a running event loop); d: 100 publishers with confirms on 100 queues, one no-ack consumer
each. The figure is the thread CPU (or, under callgrind, the instructions) of
the timed rounds per message, after ``--warmup`` rounds. Run from each tree with its own PYTHONPATH:

    PYTHONPATH=<tree> python3 bench/scenario_inproc_bench.py --scenario a [--run 64 --rounds 2000 --repeat 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from consumer_harness import Client, Harness, ack_frame
from pamqp import commands, frame

SHAPES = {  # publishers (one queue each, a consumer each), body size, persistent with acks, confirms
    "a": (1, 16, False, False),
    "b": (1, 1024, True, False),
    "d": (100, 16, False, True),
}


def _setup(h: Harness, scenario: str) -> tuple[list[Client], list[Client]]:
    publishers, _, persistent, confirms = SHAPES[scenario]
    pubs, cons = [], []
    for i in range(publishers):
        queue = f"q{i}"
        pub = h.connect(("127.0.0.1", 20000 + i))
        pub.handshake()
        pub.open_channel()
        pub.send((1, commands.Queue.Declare(queue=queue, durable=persistent)))
        if confirms:
            pub.send((1, commands.Confirm.Select()))
        pub.read()
        con = h.connect(("127.0.0.1", 40000 + i))
        con.handshake()
        con.open_channel()
        if persistent:
            con.send((1, commands.Basic.Qos(prefetch_count=256)))
        con.send((1, commands.Basic.Consume(queue=queue, consumer_tag="c", no_ack=not persistent)))
        con.read()
        pubs.append(pub)
        cons.append(con)
    return pubs, cons


def run_once(scenario: str, run: int, rounds: int, warmup: int) -> float:
    """Thread CPU µs per message over ``rounds`` timed rounds."""
    _, size, persistent, _ = SHAPES[scenario]
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), fsync="never")
        try:
            pubs, cons = _setup(h, scenario)
            props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
            reads = [b"".join(frame.marshal(f[1], f[0]) for f in pub.publish(1, f"q{i}", b"x" * size, properties=props))
                     * run for i, pub in enumerate(pubs)]
            acked = 0
            spent = 0.0
            for r in range(warmup + rounds):
                t0 = time.thread_time()
                for pub, data in zip(pubs, reads, strict=True):
                    pub.conn.receive_data(data)
                h.run_soon()
                for c in cons:
                    c.conn.data_to_send()
                for pub in pubs:
                    pub.conn.data_to_send()
                if persistent:  # the consumer acks what it holds in one read
                    last = cons[0].conn.channels[1].deliveries.tag
                    if last > acked:
                        cons[0].conn.receive_data(ack_frame(last, multiple=True))
                        acked = last
                        h.run_soon()
                        for c in cons:
                            c.conn.data_to_send()
                if r >= warmup:
                    spent += time.thread_time() - t0
            return spent / (rounds * run * len(pubs)) * 1e6
        finally:
            h.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=sorted(SHAPES), default="a")
    ap.add_argument("--run", type=int, default=64, help="publishes in one publisher read")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    figures = sorted(run_once(args.scenario, args.run, args.rounds, args.warmup) for _ in range(args.repeat))
    print(f"{args.scenario} run {args.run}: µs thread CPU a message: median {figures[len(figures) // 2]:.3f}, "
          f"min {figures[0]:.3f} ({', '.join(f'{f:.3f}' for f in figures)})")


if __name__ == "__main__":
    main()
