"""The set-up shared by the in-process benches of one queue with many consumers (no sockets).

``consumer_acks_bench.py`` and ``consumer_round_bench.py`` drive a real broker on a temporary data dir through
the AMQP tests' harness: one publisher connection and N consuming connections on queue ``q`` at a prefetch.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import lavinpy

sys.path.insert(0, str(Path(lavinpy.__file__).resolve().parents[1] / "tests" / "amqp"))
from pamqp import commands, frame  # noqa: E402
from session_client import Client, Harness  # noqa: E402

__all__ = ["Harness", "ack_frame", "one_queue_consumers", "publish_read"]


def ack_frame(tag: int, multiple: bool = False) -> bytes:
    """One basic.ack frame on channel 1, as a consumer's read carries it."""
    payload = struct.pack(">HHQB", 60, 80, tag, 1 if multiple else 0)
    return struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"


def one_queue_consumers(h: Harness, consumers: int, prefetch: int, per_channel: int = 1,
                        priorities: int = 1) -> tuple[Client, list[Client]]:
    """A publisher with queue ``q`` declared, and ``consumers`` connections consuming it at ``prefetch``
    (``per_channel`` consumers on each one's channel, each with that prefetch; with ``priorities`` > 1,
    the j-th of a channel's consumers has x-priority -(j mod priorities), or the i-th connection's
    -(i mod priorities) when each has one)."""
    pub = h.open_client(declare=commands.Queue.Declare(queue="q"))
    out = []
    for i in range(consumers):
        c = h.open_client(("127.0.0.1", 30000 + i))
        for j in range(per_channel):
            level = (j if per_channel > 1 else i) % priorities
            c.send((1, commands.Basic.Qos(prefetch_count=prefetch)),
                   (1, commands.Basic.Consume(queue="q", consumer_tag=f"c{j}",
                                              arguments={"x-priority": -level} if level else {})))
        c.read()
        out.append(c)
    return pub, out


def publish_read(pub: Client, count: int) -> bytes:
    """A publisher's read of ``count`` 16 B messages to ``q`` through the default exchange."""
    one = b"".join(frame.marshal(f[1], f[0]) for f in pub.publish(1, "q", b"x" * 16))
    return one * count
