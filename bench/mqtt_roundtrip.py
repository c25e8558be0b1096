"""A QoS 1 fan-in's window round trip without sockets: 100 publishers x 1,000 QoS 1 messages queued for one
subscriber (window 10) that answers each write with its PUBACKs, driven as ``mqtt.transport``'s driver
drives a read (hold the scheduler, the read, the deliveries, the output; then what waits for after the
write). Prints the thread CPU per round trip up to the write (what the client waits for) and in all.

    PYTHONPATH=<tree> python3 bench/mqtt_roundtrip.py      # the tree's tests package gives the harness

``--acks-per-read 1`` splits the subscriber's PUBACKs into reads of one (a round trip is then one read).
``--round-trips N`` stops after N round trips: under ``valgrind --tool=callgrind`` the instructions of two
runs (N and M) differ by those of M - N round trips, whatever the machine's load.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.sessions import MQTTSessions
from tests.amqp.session_client import Harness


def connected(sessions: MQTTSessions, client_id: str) -> MQTTConnection:
    """An MQTT connection of ``sessions`` past its CONNECT, its CONNACK read."""
    conn = sessions.new_connection(("127.0.0.1", 50000))
    conn.start()
    conn.receive_data(codec.encode_connect(client_id, username="guest", password=b"guest", keepalive=60))
    conn.data_to_send()
    return conn


def subscriber_harness(data_dir: str) -> tuple[Harness, MQTTSessions, MQTTConnection]:
    """A broker in process (fsync never, the server's gc thresholds) with one QoS 1 subscriber of t/#."""
    gc.set_threshold(100_000, 50, 1000)  # the server's thresholds
    harness = Harness(Path(data_dir), fsync="never")
    sessions = MQTTSessions(harness.broker)
    sub = connected(sessions, "sub")
    sub.receive_data(bytes((0x82, 8)) + b"\x00\x01\x00\x03t/#\x01")
    harness.run_soon()
    sub.data_to_send()
    return harness, sessions, sub


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=0, help="stop after this many (0: all)")
    parser.add_argument("--acks-per-read", type=int, default=0,
                        help="the subscriber's PUBACKs in reads of this many (0: a write's all in one read; "
                             "1: as paho and libmosquitto send them, a PUBACK a write)")
    options = parser.parse_args()
    limit, per_read = options.round_trips, options.acks_per_read
    with tempfile.TemporaryDirectory() as data_dir:
        harness, sessions, sub = subscriber_harness(data_dir)
        for i in range(100):
            pub = connected(sessions, f"p{i}")
            pub.receive_data(b"".join(codec.publish("t/a", b"x" * 16, 1, False, False, j + 1) for j in range(1000)))
            harness.run_soon()
            pub.data_to_send()
        scheduler, reader = harness.broker.scheduler, codec.PacketReader(1 << 24)
        deferring = hasattr(sub, "settle_deferred")  # an older tree settles every ack before the write
        to_write: list[int] = []
        whole: list[int] = []
        clock = time.thread_time_ns
        out = b"".join(sub.data_to_send())
        while out and not (limit and len(whole) >= limit):
            ids = [codec.parse_publish(flags, body).packet_id for kind, flags, body in reader.feed(out)
                   if kind == codec.PUBLISH]
            step = per_read or len(ids) or 1
            outs = []
            for at in range(0, len(ids), step):
                data = b"".join(codec.puback(packet_id) for packet_id in ids[at:at + step])
                start = clock()
                held = scheduler.hold()
                if deferring:
                    sub.receive_data(data, True)
                else:
                    sub.receive_data(data)
                if scheduler.queues:
                    scheduler.run_deliveries()
                outs.append(b"".join(sub.data_to_send()))
                written = clock()
                if deferring:
                    sub.settle_deferred()
                scheduler.release(held)
                end = clock()
                to_write.append(written - start)
                whole.append(end - start)
                harness.run_soon()
            out = b"".join(outs)
        harness.close()
    for name, times in (("to the write", to_write), ("in all", whole)):
        times.sort()
        print(f"{len(times)} round trips, {name}: p10 {times[len(times) // 10] / 1e3:.1f} us, "
              f"p50 {times[len(times) // 2] / 1e3:.1f} us")


if __name__ == "__main__":
    main()
