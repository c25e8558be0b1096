"""A leader's own lease deadline, in-process (no etcd): the node steps down once the monotonic deadline
less the margin has come, however early its event loop's timers fire, and not before."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from lavinpy import config as settings
from lavinpy.cluster.etcd import EtcdUnavailable
from lavinpy.cluster.node import DEADLINE_MARGIN, ClusterNode

EARLY = 0.002  # how early EarlyTimersLoop fires its timers: more than uvloop's ~1.2 ms
TICK = 0.1  # the guard's promise: a deadline check at least this often


class EarlyTimersLoop(asyncio.SelectorEventLoop):
    """A loop whose timers fire EARLY seconds before the time asked, as uvloop's may: it counts whole
    milliseconds of a clock read at the start of the loop's turn."""

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,
                context: Any = None) -> asyncio.TimerHandle:
        return super().call_at(when - EARLY, callback, *args, context=context)


def _leader(tmp_path: Path) -> tuple[ClusterNode, list[float]]:
    """A node set up as leader whose step-down records when it came (and makes it a follower)."""
    cfg = settings.load(env={}, overrides={"data_dir": str(tmp_path / "data"), "clustering": True,
                                           "clustering_etcd_endpoints": "127.0.0.1:9"})
    node = ClusterNode(cfg, start_leader=None, argv=[])  # type: ignore[arg-type]  # never leads for real
    node.role = "leader"
    steps: list[float] = []

    def step_down(reason: str) -> None:
        steps.append(time.monotonic())
        node.role = "follower"  # the real one re-executes the process
    node.step_down = step_down  # type: ignore[method-assign]
    return node, steps


async def _deadlines(node: ClusterNode, steps: list[float], rounds: int) -> list[str]:
    """Arm ``rounds`` deadlines a few milliseconds ahead; what went wrong with each."""
    problems = []
    for i in range(rounds):
        node.role = "leader"
        node.deadline = time.monotonic() + DEADLINE_MARGIN + 0.005 + (i % 7) * 0.0003
        node._arm_deadline()
        due = node.deadline - DEADLINE_MARGIN
        await asyncio.sleep(0.1)
        if len(steps) != i + 1:
            problems.append(f"round {i}: {len(steps) - i} step-downs by 0.1 s after the deadline, not 1")
            del steps[i:]
            steps.append(0.0)
        elif steps[i] < due:
            problems.append(f"round {i}: stepped down {due - steps[i]:.4f} s before the deadline")
    return problems


def _run(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, list[str]]) -> list[str]:
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def test_a_deadline_timer_that_fires_early_still_steps_down_once_the_deadline_comes(tmp_path: Path) -> None:
    node, steps = _leader(tmp_path)
    assert _run(EarlyTimersLoop(), _deadlines(node, steps, 5)) == []


def test_uvloops_timers_step_down_every_time_and_never_early(tmp_path: Path) -> None:
    """The server runs on uvloop, whose timers fire about 1 ms early in roughly a third of the cases:
    40 deadlines in a row all lead to a step-down, none of them before its time."""
    uvloop = pytest.importorskip("uvloop")
    node, steps = _leader(tmp_path)
    assert _run(uvloop.new_event_loop(), _deadlines(node, steps, 40)) == []


def test_the_guard_steps_down_at_the_deadline_without_a_timer_while_etcd_hangs(tmp_path: Path) -> None:
    """With no deadline timer at all (a timer lost), the guard's tick still stops the leader within a
    tick of its deadline while every etcd read hangs for seconds."""
    node, steps = _leader(tmp_path)

    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(3)
        raise EtcdUnavailable("no endpoint could serve")

    async def never_watches(key: str) -> Any:
        await asyncio.sleep(3)
        raise EtcdUnavailable("no endpoint could serve")
        yield  # an async generator, as the client's watch

    node.etcd.get = unreachable  # type: ignore[method-assign]
    node.etcd.watch = never_watches  # type: ignore[method-assign]

    async def scenario() -> float:
        node.deadline = time.monotonic() + DEADLINE_MARGIN + 0.3
        guard = asyncio.ensure_future(node._guard_leadership())
        try:
            await asyncio.sleep(0.3 + 3 * TICK)
        finally:
            for task in [guard, *node._tasks]:
                task.cancel()
            await asyncio.gather(guard, *node._tasks, return_exceptions=True)
        return node.deadline - DEADLINE_MARGIN

    due = asyncio.run(scenario())
    assert len(steps) == 1, "the leader served on past its deadline"
    assert due <= steps[0] <= due + 2 * TICK
