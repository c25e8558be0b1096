"""The model's delivery scheduler on its own: what a turn runs, in which order, and when it asks the
loop for another (broker.scheduler.DeliveryScheduler), with the loop's callbacks run by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lavinpy.broker.scheduler import DELIVERY_ROUNDS, DeliveryScheduler


class Loop:
    """call_soon by hand: the callbacks wait in ``soon`` until ``run_one``."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def run_one(self) -> None:
        self.soon.pop(0)()


class FakeQueue:
    """Delivers ``rounds`` times (each call one round), recording into ``log``."""

    def __init__(self, name: str, log: list[str], rounds: int = 1, fail: bool = False) -> None:
        self.name = name
        self.deleted = False
        self.log = log
        self.rounds = rounds
        self.fail = fail
        self.on_deliver: Callable[[], None] | None = None

    def deliver(self) -> bool:
        self.log.append(f"deliver {self.name}")
        if self.on_deliver is not None:
            self.on_deliver()
        if self.fail:
            raise RuntimeError("a bug in this queue")
        self.rounds -= 1
        return self.rounds > 0


class FakeOutput:
    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail = fail
        self.on_run: Callable[[], None] | None = None

    def run_pending(self) -> None:
        self.log.append(f"write {self.name}")
        if self.on_run is not None:
            self.on_run()
        if self.fail:
            raise RuntimeError("a bug in this connection's output")


@pytest.fixture
def loop() -> Loop:
    return Loop()


@pytest.fixture
def scheduler(loop: Loop) -> DeliveryScheduler:
    scheduler = DeliveryScheduler()
    scheduler.call_soon = loop.call_soon
    return scheduler


def test_one_callback_a_turn_deliveries_first_each_registered_once(scheduler: DeliveryScheduler, loop: Loop) -> None:
    log: list[str] = []
    a, b = FakeOutput("a", log), FakeOutput("b", log)
    queue = FakeQueue("q", log)
    scheduler.schedule(a)
    scheduler.schedule(a)
    scheduler.schedule_delivery(queue)
    scheduler.schedule(b)
    scheduler.schedule_delivery(queue)
    assert len(loop.soon) == 1  # however many asked
    loop.run_one()
    assert log[0] == "deliver q"
    assert sorted(log[1:]) == ["write a", "write b"]
    assert not loop.soon  # nothing left: no other turn asked


def test_output_made_by_the_deliveries_goes_out_in_the_same_turn(scheduler: DeliveryScheduler, loop: Loop) -> None:
    log: list[str] = []
    out = FakeOutput("consumer", log)
    queue = FakeQueue("q", log)
    queue.on_deliver = lambda: scheduler.schedule(out)  # a delivery written into the consumer's connection
    scheduler.schedule_delivery(queue)
    loop.run_one()
    assert log == ["deliver q", "write consumer"]
    # The turn had started: the registration asked for another, which finds nothing left to do.
    loop.run_one()
    assert log == ["deliver q", "write consumer"] and not loop.soon


def test_registered_while_the_turn_writes_runs_in_the_next_turn(scheduler: DeliveryScheduler, loop: Loop) -> None:
    log: list[str] = []
    first, later = FakeOutput("first", log), FakeOutput("later", log)
    first.on_run = lambda: scheduler.schedule(later)
    scheduler.schedule(first)
    loop.run_one()
    assert log == ["write first"]
    assert len(loop.soon) == 1
    loop.run_one()
    assert log == ["write first", "write later"]


def test_a_failure_in_one_does_not_stop_the_others(scheduler: DeliveryScheduler, loop: Loop,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    bad_queue, good_queue = FakeQueue("bad", log, fail=True), FakeQueue("good", log)
    bad_out, good_out = FakeOutput("bad", log, fail=True), FakeOutput("good", log)
    for queue in (bad_queue, good_queue):
        scheduler.schedule_delivery(queue)
    for out in (bad_out, good_out):
        scheduler.schedule(out)
    loop.run_one()
    assert sorted(log) == ["deliver bad", "deliver good", "write bad", "write good"]
    assert "delivery from queue 'bad' failed" in caplog.text
    assert "writing a connection's output failed" in caplog.text
    # The failed queue is not run again and again: it waits until it asks again.
    assert not loop.soon and not scheduler.queues


def test_a_busy_queue_gets_rounds_then_waits_for_the_next_turn(scheduler: DeliveryScheduler, loop: Loop) -> None:
    log: list[str] = []
    busy = FakeQueue("busy", log, rounds=DELIVERY_ROUNDS + 2)
    out = FakeOutput("conn", log)
    scheduler.schedule_delivery(busy)
    scheduler.schedule(out)
    loop.run_one()
    assert log == ["deliver busy"] * DELIVERY_ROUNDS + ["write conn"]  # the output is not held back
    assert len(loop.soon) == 1  # the rest in the next turn
    log.clear()
    loop.run_one()
    assert log == ["deliver busy"] * 2 and not loop.soon


def test_deleted_queues_are_skipped_and_a_stepped_down_node_delivers_nothing(scheduler: DeliveryScheduler,
                                                                               loop: Loop) -> None:
    log: list[str] = []
    gone, kept = FakeQueue("gone", log), FakeQueue("kept", log)
    gone.deleted = True
    serving = False
    scheduler.serving_guard = lambda: serving
    scheduler.schedule_delivery(gone)
    scheduler.schedule_delivery(kept)
    scheduler.schedule(FakeOutput("conn", log))
    loop.run_one()
    assert log == ["write conn"]  # output still goes out; no deliveries while not serving
    serving = True
    scheduler.schedule_delivery(kept)
    loop.run_one()
    assert log == ["write conn", "deliver kept"]


def test_a_lease_that_runs_out_during_a_turn_stops_its_deliveries_after_the_round(scheduler: DeliveryScheduler,
                                                                                   loop: Loop) -> None:
    log: list[str] = []
    checks: list[bool] = [True, True, False]  # the lease runs out during the second round
    scheduler.serving_guard = lambda: checks.pop(0) if checks else False
    scheduler.schedule_delivery(FakeQueue("busy", log, rounds=DELIVERY_ROUNDS))
    loop.run_one()
    assert log == ["deliver busy"] * 2 and not checks
    assert not loop.soon  # a node that may no longer serve asks for no further turn


def test_a_turn_run_at_the_end_of_an_input_batch_leaves_the_consumers_another(scheduler: DeliveryScheduler,
                                                                            loop: Loop) -> None:
    log: list[str] = []
    queue, out = FakeQueue("q", log, rounds=DELIVERY_ROUNDS + 1), FakeOutput("conn", log)
    queue.on_deliver = lambda: scheduler.schedule(out)
    scheduler.schedule_delivery(queue)  # a publish in the batch: one callback asked
    scheduler.run()  # the batch's end runs the turn now
    assert log == ["deliver q"] * DELIVERY_ROUNDS + ["write conn"]
    # The deliveries' output asked for a turn after this one: with the callback asked by the publish,
    # two turns follow before the publisher's next batch is read; the queue's last round is in the first.
    assert len(loop.soon) == 2
    log.clear()
    loop.run_one()
    assert log == ["deliver q", "write conn"]
    # That turn's output asked for one more; the two left find nothing to do and ask for no other.
    assert len(loop.soon) == 2
    loop.run_one()
    loop.run_one()
    assert log == ["deliver q", "write conn"] and not loop.soon


def test_a_held_read_asks_the_loop_only_for_what_is_left(scheduler: DeliveryScheduler, loop: Loop) -> None:
    log: list[str] = []
    queue = FakeQueue("q", log)
    held = scheduler.hold()
    assert held
    scheduler.schedule_delivery(queue)  # an ack in the read: its face runs the deliveries itself
    assert loop.soon == []
    scheduler.run_deliveries()
    scheduler.release(held)
    assert loop.soon == [] and log == ["deliver q"]  # nothing left: no turn
    held = scheduler.hold()
    scheduler.schedule(FakeOutput("other", log))  # another connection's output: a turn writes it
    scheduler.release(held)
    assert len(loop.soon) == 1
    loop.run_one()
    assert log == ["deliver q", "write other"]


def test_a_hold_inside_an_asked_turn_changes_nothing(scheduler: DeliveryScheduler, loop: Loop) -> None:
    log: list[str] = []
    scheduler.schedule(FakeOutput("a", log))
    held = scheduler.hold()
    assert not held
    scheduler.schedule_delivery(FakeQueue("q", log, rounds=2))
    scheduler.release(held)
    assert len(loop.soon) == 1  # the turn asked before, once
    loop.run_one()
    assert log == ["deliver q", "deliver q", "write a"]
