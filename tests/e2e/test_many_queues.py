"""Many durable queues under a small fd limit (lavinpy only).

A durable queue holds no descriptor while it is idle: its index files are opened on demand within a
budget taken from the process's fd limit. 3,000 durable queues with a persistent message each need
6,000 index files, far above a limit of 1,024: every queue must still be declared, take its message,
survive kill -9 and serve the message again.
"""

from __future__ import annotations

import os

import pytest

from . import uid
from .conftest import lavinpy_only
from .rawamqp import RawAMQP, commands

QUEUES = 3000
FD_LIMIT = 1024
BATCH = 500  # methods sent before their replies are read (keeps both socket buffers small)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def declare_all(c: RawAMQP, names: list[str], passive: bool = False) -> list[int]:
    """Pipelined declares; the message count of each queue."""
    counts: list[int] = []
    for start in range(0, len(names), BATCH):
        batch = names[start:start + BATCH]
        for name in batch:
            c.send(1, commands.Queue.Declare(queue=name, durable=True, passive=passive))
        counts.extend(c.expect(commands.Queue.DeclareOk, 1, timeout=60).message_count for _ in batch)
    return counts


def publish_confirmed(c: RawAMQP, names: list[str]) -> None:
    """One persistent message (its queue's name) to each queue, every one confirmed."""
    c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    props = commands.Basic.Properties(delivery_mode=2)
    confirmed = 0
    for start in range(0, len(names), BATCH):
        batch = names[start:start + BATCH]
        for name in batch:
            c.publish(1, "", name, name.encode(), props)
        while confirmed < start + len(batch):
            ack = c.expect(commands.Basic.Ack, 1, timeout=60)
            confirmed = ack.delivery_tag if ack.multiple else confirmed + 1


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts the server's descriptors in /proc")
@lavinpy_only("sets the server's fd limit and kills it with SIGKILL")
# Three broker starts and 3000 queues declared, written, recovered and read: 12 s on a quiet machine, over
# the suite's 60 s default at a load of 13 on 2 cores. Every AMQP exchange has its own 60 s limit for a hang.
@pytest.mark.timeout(300)
def test_thousands_of_durable_queues_under_a_small_fd_limit_survive_kill9(fresh_broker) -> None:
    b = fresh_broker
    b.stop()
    b.fd_limit = FD_LIMIT
    b.start()
    prefix = uid("many")
    names = [f"{prefix}-{i:05d}" for i in range(QUEUES)]
    with RawAMQP(b.host, b.port, timeout=60) as c:
        c.handshake()
        c.open_channel(1)
        assert declare_all(c, names) == [0] * QUEUES
        # an empty durable queue holds no descriptor
        assert open_fds(b.pid) < 100
        publish_confirmed(c, names)
        # every queue written, yet the index files open stay within the budget
        assert open_fds(b.pid) < FD_LIMIT // 2
    b.kill9()
    b.start()
    with RawAMQP(b.host, b.port, timeout=60) as c:
        c.handshake()
        c.open_channel(1)
        assert declare_all(c, names, passive=True) == [1] * QUEUES
        for name in names:
            got = c.get_message(1, name, no_ack=True)
            assert got is not None, f"{name}: its confirmed message is gone"
            assert got[2] == name.encode()
        assert open_fds(b.pid) < FD_LIMIT // 2
    assert "Too many open files" not in b.log
    b.kill9()  # a clean stop compacts 3,000 index files (seconds of fsyncs): not what this test is about
