"""A QoS 1 fan-in's reads without sockets: 100 publishers each sending one QoS 1 PUBLISH a read (as a
client with a window sends the next one at each PUBACK) to one subscriber (window 10) that acks its
oldest delivery in a read of one PUBACK after each publish; every read driven as ``mqtt.transport``'s
driver drives one (hold the scheduler, the read, the deliveries, the output, the deferred acks). A step
is one publisher's read and one PUBACK read of the subscriber's; ``--backlog`` messages wait in the
subscriber's queue first (as in ``bench/mqtt_bench.py --publishers 100 --inflight 10``: its window is
full at each publish, and each PUBACK takes the next message from the queue). Prints the thread CPU
per step.

    PYTHONPATH=<tree> python3 bench/mqtt_fanin_reads.py --steps N

Under ``valgrind --tool=callgrind`` the instructions of two runs (N and M steps) differ by those of
M - N steps, whatever the machine's load.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import deque

from mqtt_roundtrip import connected, subscriber_harness

from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import MQTTConnection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--backlog", type=int, default=990,
                        help="messages queued first (100 publishers x a window of 10 less the subscriber's)")
    options = parser.parse_args()
    steps = options.steps
    with tempfile.TemporaryDirectory() as data_dir:
        harness, sessions, sub = subscriber_harness(data_dir)
        publishers = [connected(sessions, f"p{i}") for i in range(100)]
        packets = [codec.publish("t/a", b"x" * 16, 1, False, False, i + 1) for i in range(100)]
        scheduler, reader = harness.broker.scheduler, codec.PacketReader(1 << 24)
        deferring = hasattr(sub, "settle_deferred")

        def read(conn: MQTTConnection, data: bytes) -> bytes:
            held = scheduler.hold()
            if deferring:
                conn.receive_data(data, True)
            else:
                conn.receive_data(data)
            if scheduler.queues:
                scheduler.run_deliveries()
            out = b"".join(conn.data_to_send())
            if deferring:
                conn.settle_deferred()
            scheduler.release(held)
            harness.run_soon()
            return out

        for i in range(options.backlog):  # the subscriber's window fills, the rest waits in its queue
            read(publishers[i % 100], packets[i // 100 % 100])
        unacked = deque(codec.parse_publish(flags, body).packet_id
                        for kind, flags, body in reader.feed(b"".join(sub.data_to_send())) if kind == codec.PUBLISH)
        clock = time.thread_time_ns
        start = clock()
        for step in range(steps):  # a publish, then the PUBACK of the oldest delivery: the backlog stays
            read(publishers[step % 100], packets[step // 100 % 100])
            out = b"".join(sub.data_to_send())
            if unacked:
                out += read(sub, codec.puback(unacked.popleft()))
            unacked.extend(codec.parse_publish(flags, body).packet_id for kind, flags, body in reader.feed(out)
                           if kind == codec.PUBLISH)
        took = clock() - start
        harness.close()
    print(f"{steps} steps: {took / steps / 1e3:.1f} us a step")


if __name__ == "__main__":
    main()
