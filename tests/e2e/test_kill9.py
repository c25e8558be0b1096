"""kill -9 at a random moment never loses a confirmed persistent message (lavinpy only).

Each round a publisher with confirms pipelines persistent messages (a unique id in each body) into a
durable queue and records which ids the broker confirmed; the server is killed with SIGKILL 0.2-1.0 s in
and started again on the same data dir. Every confirmed id that was not acked must then be in the queue,
and an id seen twice must carry redelivered. Messages from earlier rounds stay in the queue (half of them
are acked each round), so recovery is also tested on data that already went through earlier crashes.
5 rounds in CI, 10 with LAVINPY_LONG=1. Run with small bodies and with bodies of several frames (written
piece by piece into their reserved record), whose length is checked after each restart.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pika
import pytest

from tests.helpers import LONG

from . import uid
from .conftest import lavinpy_only
from .rawamqp import PeerClosed, RawAMQP, commands

ROUNDS = 10 if LONG else 5
WINDOW = 300  # unconfirmed messages in flight at most


class Publisher(threading.Thread):
    def __init__(self, host: str, port: int, queue: str, round_no: int, padding: int = 200) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.queue, self.round_no = host, port, queue, round_no
        self.padding = padding
        self.window = min(WINDOW, max(4, (8 << 20) // padding))
        self.confirmed: set[str] = set()
        self.nacked: set[str] = set()
        self.sent = 0
        self.started = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except (PeerClosed, OSError, TimeoutError):
            pass  # the server was killed
        except BaseException as e:  # anything else is a test failure, reported by the main thread
            self.error = e

    def _run(self) -> None:
        c = RawAMQP(self.host, self.port, timeout=5)
        try:
            c.handshake()
            c.open_channel(1)
            c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
            c.call(1, commands.Queue.Declare(queue=self.queue, durable=True), commands.Queue.DeclareOk)
            self.started.set()
            ids: dict[int, str] = {}
            acked_upto = 0
            props = commands.Basic.Properties(delivery_mode=2)
            while True:
                while self.sent - acked_upto < self.window:
                    self.sent += 1
                    ids[self.sent] = f"{self.round_no}-{self.sent}"
                    c.publish(1, "", self.queue, ids[self.sent].encode() + b" " + b"p" * self.padding, props)
                _, f = c.recv(timeout=5)
                if isinstance(f, commands.Basic.Ack | commands.Basic.Nack):
                    tags = range(acked_upto + 1, f.delivery_tag + 1) if f.multiple else [f.delivery_tag]
                    target = self.confirmed if isinstance(f, commands.Basic.Ack) else self.nacked
                    for t in tags:
                        if t in ids:
                            target.add(ids.pop(t))
                    while acked_upto + 1 not in ids and acked_upto < self.sent:
                        acked_upto += 1
        finally:
            c.close()


def _read_all(url: str, queue: str, lengths: list[int] | None = None,
              ) -> tuple[list[tuple[str, bool, int]], pika.BlockingConnection, Any]:
    """Consume everything in the queue without acking it: [(id, redelivered, delivery tag)], the
    connection and its channel (still open, so the deliveries can be acked); each body's padding
    length goes to ``lengths``."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=0)  # everything at once: nothing is acked while reading
    total = ch.queue_declare(queue, durable=True).method.message_count
    got: list[tuple[str, bool, int]] = []
    def take(_c: Any, m: Any, _p: Any, b: bytes) -> None:
        name, _, padding = b.partition(b" ")
        got.append((name.decode(), m.redelivered, m.delivery_tag))
        if lengths is not None:
            lengths.append(len(padding) if padding.count(b"p") == len(padding) else -1)

    ch.basic_consume(queue, take)
    deadline = time.monotonic() + 30
    while len(got) < total and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    conn.process_data_events(time_limit=0.2)
    return got, conn, ch


@lavinpy_only("kills the server with SIGKILL")
@pytest.mark.timeout(240)
@pytest.mark.parametrize("padding", [200, 300_000], ids=["small", "several-frames"])
def test_kill9_never_loses_confirmed_messages(fresh_broker, padding):
    b = fresh_broker
    q = uid("kill9")
    rng = random.Random()
    must_have: set[str] = set()  # confirmed and never acked by us
    total_confirmed = 0
    for round_no in range(ROUNDS):
        pub = Publisher(b.host, b.port, q, round_no, padding)
        pub.start()
        assert pub.started.wait(10), f"round {round_no}: publisher could not start"
        time.sleep(rng.uniform(0.2, 1.0))
        b.kill9()
        pub.join(15)
        assert not pub.is_alive(), "publisher did not notice the kill"
        assert pub.error is None, f"round {round_no}: publisher failed: {pub.error!r}"
        assert not pub.nacked, f"round {round_no}: broker nacked {len(pub.nacked)} messages"
        must_have |= pub.confirmed
        total_confirmed += len(pub.confirmed)
        b.start()
        lengths: list[int] = []
        got, conn, ch = _read_all(b.url, q, lengths)
        assert set(lengths) <= {padding}, f"round {round_no}: bodies came back damaged: {sorted(set(lengths))}"
        ids = [i for i, _, _ in got]
        missing = must_have - set(ids)
        assert not missing, (f"round {round_no}: {len(missing)} confirmed messages lost after kill -9 "
                             f"(e.g. {sorted(missing)[:5]}); {len(pub.confirmed)} confirmed this round")
        seen: set[str] = set()
        for i, redelivered, _ in got:
            if i in seen:
                assert redelivered, f"round {round_no}: {i} delivered twice without redelivered"
            seen.add(i)
        # ack about half of what is there (oldest first); the rest must survive the next crashes
        half = got[: len(got) // 2]
        if half:
            ch.basic_ack(half[-1][2], multiple=True)
            ch.queue_declare(q, passive=True)
        must_have -= {i for i, _, _ in half}
        conn.close()
    assert total_confirmed > 0, "no message was ever confirmed: the test proved nothing"
