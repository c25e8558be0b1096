"""When deliveries run: the queues with deliveries to make and the faces' connections with output
waiting, drained by one callback of the event loop.

A queue that can deliver (a publish, an ack freeing prefetch room, a consumer added) asks for a turn
with ``schedule_delivery``; a face's connection with output waiting (a delivery written into it, a
reply) registers itself with ``schedule`` (anything with ``run_pending``). One callback, asked of the
loop once however many asked, runs a turn: the queues' deliveries first, at most DELIVERY_ROUNDS
rounds, each after a check of the cluster lease (a queue that still has work after that waits for the
next turn, so a busy queue cannot hold the loop), then each registered connection's ``run_pending``
once, so a batch of deliveries leaves in one write per connection. Asking during a turn asks for the
next one (a connection registered while the turn writes is written then; one registered by the turn's
deliveries is written in this turn too).
A failure in one queue or connection is logged and the turn goes on with the others.

A face may also run a turn at the end of a batch of its input (``run``, or ``run_deliveries`` for the
deliveries alone): uvloop may hand one busy socket many reads before it runs the callbacks, and a
publisher flood must not starve the consumers.

No event loop here: ``call_soon`` is the running asyncio loop's unless the adapter (a test running
the loop's callbacks by hand) gives another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from ..wire.accel import cwire

__all__ = ["DELIVERY_ROUNDS", "DeliveringQueue", "DeliveryScheduler", "PendingWork"]

log = logging.getLogger("lavinpy.scheduler")

# The first round of run_deliveries for one queue's freed window refilled from its backlog, compiled
# (_cwire_refill.c, set up by the session layer, which knows the classes it inlines); False when it is
# not that case, and the loop below (its pure twin) runs the round.
_refill: Callable[[DeliveryScheduler], bool] | None = cwire.refill if cwire is not None else None

# Rounds of the queues' deliveries in one turn. 16 x DELIVERY_BATCH is 4,096 messages, more than one
# publisher's input turn (256 KiB, about 2,900 messages of 16 B) brings in: a consumer that fell behind
# then catches up. At 4 it could not, and a publisher with one autoack consumer ran at a third of its
# rate with seconds of latency in about a third of the runs (bench/history.md, issue 31).
DELIVERY_ROUNDS = 16


class DeliveringQueue(Protocol):
    """A queue, as its turns see it (``queues.base.DeliveringQueue`` is one)."""

    name: str
    deleted: bool

    def deliver(self) -> bool:
        """Deliver what the consumers take now; True: more could go in another round."""


class PendingWork(Protocol):
    """What a face registers: one connection whose waiting output a turn writes."""

    def run_pending(self) -> None:
        """Write what is waiting (deliveries and replies, in one write) and carry out its effects."""


def _running_loop_call_soon(callback: Callable[[], None]) -> object:
    return asyncio.get_running_loop().call_soon(callback)


class DeliveryScheduler:
    def __init__(self) -> None:
        self.queues: set[DeliveringQueue] = set()  # queues with deliveries to make
        self.waiting: set[PendingWork] = set()  # connections with output to write after them
        self._scheduled = False  # a turn is asked of the loop and has not started
        self.call_soon: Callable[[Callable[[], None]], object] = _running_loop_call_soon
        # A cluster leader's lease check: False once this node may no longer serve (nothing more is
        # delivered). None: always serving.
        self.serving_guard: Callable[[], bool] | None = None

    def schedule_delivery(self, queue: DeliveringQueue) -> None:
        self.queues.add(queue)
        if not self._scheduled:
            self._scheduled = True
            self.call_soon(self.run)

    def schedule(self, work: PendingWork) -> None:
        """``work.run_pending()`` in the next turn (once, however often asked before it)."""
        self.waiting.add(work)
        if not self._scheduled:
            self._scheduled = True
            self.call_soon(self.run)

    def deliver_now(self, queue: DeliveringQueue) -> None:
        """``run_deliveries``' round for one queue, at once: a face that writes right after its read (an
        ack freed its own consumer's room) runs the step without the set and the rounds. A cluster
        leader's lease check, or a step with more to deliver, leaves the queue to a turn as before."""
        if self.serving_guard is not None:
            self.schedule_delivery(queue)
            return
        try:
            if not queue.deleted and queue.deliver():
                self.schedule_delivery(queue)
        except Exception:  # as run_deliveries: a bug in one queue must not stop the reader
            log.exception("delivery from queue '%s' failed", queue.name)

    def hold(self) -> bool:
        """A face handles a read and writes its output right after it, running the deliveries it made
        (an in-flight window's round trip): what is asked meanwhile calls the loop once, at ``release``,
        and only if something is left for a turn. False when a turn is asked already (``release`` then
        does nothing)."""
        if self._scheduled:
            return False
        self._scheduled = True
        return True

    def release(self, held: bool) -> None:
        if held:
            self._scheduled = False
            if self.queues or self.waiting:
                self._scheduled = True
                self.call_soon(self.run)

    def run(self) -> None:
        """A turn now: deliveries, then every registered connection's output. Whatever asks for a turn
        from here on (a delivery's output too) asks the loop for another: a flood of input then leaves
        the consumers a turn of their own after each batch."""
        self._scheduled = False
        if self.queues:
            self.run_deliveries()
        if self.waiting:
            waiting, self.waiting = self.waiting, set()
            for work in waiting:
                try:
                    work.run_pending()
                except Exception:  # a bug in one connection's output must not keep the others' back
                    log.exception("writing a connection's output failed")

    def delivery_failed(self, queue: DeliveringQueue, error: BaseException) -> None:
        """A queue's deliveries failed in the compiled round: logged as ``run_deliveries`` logs one."""
        log.error("delivery from queue '%s' failed", queue.name, exc_info=error)

    def run_deliveries(self) -> None:
        """Let every queue with deliveries to make deliver (a few rounds; the rest waits for a turn).
        A cluster leader's lease is checked before each round: a lease that runs out during a long turn
        stops the deliveries after at most one more round, not at the next turn."""
        guard = self.serving_guard
        rounds = 0
        if _refill is not None and _refill(self):  # the first round compiled (_cwire_refill.c): a freed window's
            rounds = 1
        while self.queues and rounds < DELIVERY_ROUNDS:
            if guard is not None and not guard():
                return
            rounds += 1
            queues, self.queues = self.queues, set()
            for queue in queues:
                try:
                    if not queue.deleted and queue.deliver():
                        self.queues.add(queue)
                except Exception:  # a bug in one queue must not stop the others' deliveries
                    log.exception("delivery from queue '%s' failed", queue.name)
        if self.queues and not self._scheduled:
            self._scheduled = True
            self.call_soon(self.run)
