"""Helpers of the no-loss tests: a publisher with confirms that survives failovers, the ISR as etcd
records it, and draining a queue.

The publisher runs in a thread with aio-pika, WINDOW messages in flight: each message carries a
unique id in its body and is published until a confirm comes back (after a broken connection it is
published again, through whichever node answers), so a message may be stored twice but every id it
records as confirmed was confirmed by a broker. Many messages in flight keep a kill likely to land
between a confirm and the followers' copy, were a leader to confirm early.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import aio_pika
import aio_pika.exceptions
import pika
from pamqp.commands import Basic

from .harness import PREFIX, Cluster, Etcd, Node

QUEUE = "no-loss"
WINDOW = 64  # messages published before their confirms are awaited
PERSISTENT = aio_pika.DeliveryMode.PERSISTENT


def isr(etcd: Etcd) -> list[str]:
    """The in-sync replica set recorded in etcd (empty when absent or etcd does not answer)."""
    try:
        value = etcd.get(f"{PREFIX}/isr")
    except OSError:
        return []
    return json.loads(value[0]) if value else []


def connect(port: int, timeout: float = 2.0) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, socket_timeout=timeout, stack_timeout=timeout * 2, blocked_connection_timeout=timeout,
        connection_attempts=1, heartbeat=10))


class Publisher(threading.Thread):
    """Publishes persistent messages with confirms to QUEUE, WINDOW at a time, reconnecting after failures.

    ``first`` is the node it connects to first; afterwards it tries every live node of the cluster in
    turn. ``confirmed`` is the list of confirmed ids, ``connections`` counts the connections made."""

    def __init__(self, cluster: Cluster, first: Node, body_size: int = 0) -> None:
        super().__init__(daemon=True)
        self.padding = b" " * body_size  # after the id
        self.cluster = cluster
        self.first = first
        self.confirmed: list[int] = []
        self.connections = 0
        self.ports_used: list[int] = []
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)
        assert not self.is_alive(), "the publisher did not stop"
        if self.error is not None:
            raise self.error

    def wait_for_more(self, count: int, timeout: float) -> None:
        """Until ``count`` more messages than now are confirmed."""
        target = len(self.confirmed) + count
        deadline = time.monotonic() + timeout
        while len(self.confirmed) < target:
            if self.error is not None:
                raise self.error
            if time.monotonic() > deadline:
                raise AssertionError(f"the publisher confirmed {len(self.confirmed)} of {target} in {timeout} s")
            time.sleep(0.02)

    def _candidates(self):
        yield self.first
        while True:
            for node in list(self.cluster.nodes):
                if node.alive:
                    yield node

    def run(self) -> None:
        try:
            asyncio.run(self._publish())
        except BaseException as e:  # reported by stop()
            self.error = e

    async def _publish(self) -> None:
        candidates = self._candidates()
        next_id = 0
        unconfirmed: list[int] = []  # published again on the next connection
        while not self._stop_event.is_set():
            node = next(candidates)
            try:
                connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{node.amqp_port}/", timeout=2)
            except (TimeoutError, aio_pika.exceptions.AMQPError, OSError):
                await asyncio.sleep(0.02)
                continue
            self.connections += 1
            self.ports_used.append(node.amqp_port)
            try:
                channel = await connection.channel(publisher_confirms=True)
                await channel.declare_queue(QUEUE, durable=True)
                exchange = channel.default_exchange
                while not self._stop_event.is_set():
                    batch = unconfirmed + list(range(next_id, next_id + WINDOW - len(unconfirmed)))
                    next_id = max(next_id, batch[-1] + 1)
                    messages = [aio_pika.Message(b"%d%s" % (i, self.padding), delivery_mode=PERSISTENT) for i in batch]
                    results = await asyncio.gather(*(exchange.publish(m, QUEUE, timeout=10) for m in messages),
                                                   return_exceptions=True)
                    acked = [isinstance(r, Basic.Ack) for r in results]
                    self.confirmed.extend(i for i, ok in zip(batch, acked, strict=True) if ok)
                    unconfirmed = [i for i, ok in zip(batch, acked, strict=True) if not ok]
                    if unconfirmed:
                        break
            except (TimeoutError, aio_pika.exceptions.AMQPError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 2)


def drain(port: int, expected_at_least: int, timeout: float = 60) -> list[int]:
    """Every message of QUEUE on the node serving ``port``, as ids (consumed with auto-ack)."""
    connection = connect(port, 5)
    try:
        channel = connection.channel()
        count = channel.queue_declare(QUEUE, durable=True, passive=True).method.message_count
        assert count >= expected_at_least, f"{count} messages queued, fewer than the {expected_at_least} confirmed"
        channel.basic_qos(prefetch_count=2000)
        ids: list[int] = []
        deadline = time.monotonic() + timeout
        for _method, _properties, body in channel.consume(QUEUE, auto_ack=True, inactivity_timeout=2):
            if body is None:
                if len(ids) >= count or time.monotonic() > deadline:
                    break
                continue
            ids.append(int(body.split(b" ", 1)[0]))
            if len(ids) >= count:
                break
        channel.cancel()
        return ids
    finally:
        connection.close()


def missing_and_duplicates(confirmed: list[int], consumed: list[int]) -> tuple[list[int], int]:
    seen = set(consumed)
    return [i for i in confirmed if i not in seen], len(consumed) - len(seen)
