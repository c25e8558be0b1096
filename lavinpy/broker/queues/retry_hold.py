"""The messages a queue holds for a delayed retry, by due time (queues wing).

A held message stays unacknowledged in the queue's index (nothing is copied or moved), its due time
is on file (``store.delivery_counts.RetryDueTimes``) before it is held, and one timer releases the
due ones back to the head of the queue. After a restart the index has every unacked message ready
again: the queue skips a held one when it comes to it (``holds``), and the timer releases it then.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from ...store.delivery_counts import DeliveryCounts
from .ttl import Timer, now_ms

RELEASE_BATCH = 1024  # due messages released per timer callback before yielding to the loop


class RetryHold:
    """A queue's held messages: ``due`` (position -> due ms, the file's dict) and a heap over it."""

    def __init__(self, file: DeliveryCounts, release: Callable[[int], None]) -> None:
        self._file = file
        self.due: dict[int, int] = file.counts  # recovered entries: held until their time
        self._release = release
        self._heap: list[tuple[int, int]] = [(due, pos) for pos, due in self.due.items()]
        heapq.heapify(self._heap)
        self._timer = Timer(self._on_timer)
        self.start()  # with no loop running yet, the vhost's start arms it

    def __len__(self) -> int:
        return len(self.due)

    def hold(self, pos: int, due_ms: int) -> None:
        """Hold an unacked message until ``due_ms`` (on file when this returns)."""
        self._file.set(pos, due_ms)
        heapq.heappush(self._heap, (due_ms, pos))
        self._timer.arm_before(due_ms)

    def holds(self, pos: int) -> bool:
        return pos in self.due

    def forget(self, pos: int) -> None:
        """The message left the queue (acked, dead-lettered, purged)."""
        self.due.pop(pos, None)

    def items(self) -> Iterator[tuple[int, int]]:
        """(position, due ms) of the held messages, earliest first."""
        return iter(sorted(self.due.items(), key=lambda item: item[1]))

    def start(self) -> None:
        if self._heap:
            self._timer.arm_before(self._heap[0][0])

    def stop(self) -> None:
        self._timer.cancel()

    def _on_timer(self) -> None:
        now = now_ms()
        heap, due = self._heap, self.due
        for _ in range(RELEASE_BATCH):
            if not heap:
                return
            at, pos = heap[0]
            if at > now:
                self._timer.arm_before(at)
                return
            heapq.heappop(heap)
            if due.get(pos) != at:
                continue  # released already, or held again for a later time (its own entry)
            del due[pos]
            self._release(pos)
        if heap:
            self._timer.arm_before(now)  # more may be due: continue on the next loop turn
