"""Bounded protocol fuzzing: recorded pika sessions, mutated and replayed against one broker.

At least 20,000 mutated frames (bit flips, truncation, splices, length fields...) over about a thousand
connections, 50,000 with LAVINPY_LONG=1; the broker must never answer 541, never log a traceback, keep
serving a witness client and keep its RSS growth under 20 MiB. bench/fuzz.py runs the same loop for longer.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from pathlib import Path

import pika
import pytest

from tests.helpers import LONG

from .conftest import ON_LAVINPY, REPO_ROOT

# CI's run replays each recorded session's frames with fixed seeds; the long run, more of the same.
MUTATED_FRAMES = 50_000 if LONG else 20_000
BUDGET_S = 80.0 if LONG else 40.0


def _load_fuzzer():
    spec = importlib.util.spec_from_file_location("lavinpy_bench_fuzz", REPO_ROOT / "bench" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def witness_round_trip(url: str, queue: str) -> None:
    """A well-behaved client: declare, publish with confirms, get the message back."""
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, auto_delete=False)
        ch.basic_publish("", queue, b"witness", pika.BasicProperties(headers={"n": 1}))
        method, props, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"witness" and props.headers == {"n": 1}
        ch.queue_delete(queue)


@pytest.mark.skipif(not ON_LAVINPY, reason="reads the broker's log and RSS")
@pytest.mark.timeout(180)
def test_mutated_pika_sessions_never_get_541(fresh_broker):
    fuzz = _load_fuzzer()
    url = fresh_broker.url
    sessions = fuzz.record_sessions(url)
    assert len(sessions) == 2 and all(len(s) > 20 for s in sessions), [len(s) for s in sessions]
    witness_round_trip(url, "witness.before")
    rss_before = rss_kib(fresh_broker.pid)

    stats = fuzz.FuzzStats()
    started = time.monotonic()
    asyncio.run(fuzz.replay(fresh_broker.host, fresh_broker.port, sessions, frames=MUTATED_FRAMES // 2,
                            seconds=BUDGET_S / 2, seed=20240601, stats=stats))
    witness_round_trip(url, "witness.during")  # between two halves: the broker still serves others
    asyncio.run(fuzz.replay(fresh_broker.host, fresh_broker.port, sessions, frames=MUTATED_FRAMES,
                            seconds=BUDGET_S - (time.monotonic() - started), seed=20240602, stats=stats))
    elapsed = time.monotonic() - started

    assert stats.internal_errors == [], stats.internal_errors[:10]
    assert stats.frames_mutated >= MUTATED_FRAMES, (
        f"only {stats.frames_mutated} mutated frames in {elapsed:.0f} s over {stats.connections} connections")
    # The mutations reached the protocol: the broker refused many of them, in several ways.
    assert sum(stats.close_codes.values()) > stats.connections // 4, stats.close_codes
    assert len(stats.close_codes) >= 4, stats.close_codes
    witness_round_trip(url, "witness.after")
    log = fresh_broker.log
    assert "Traceback" not in log and "internal error" not in log, log[log.find("Traceback") - 2000:][:6000]
    growth_mib = (rss_kib(fresh_broker.pid) - rss_before) / 1024
    assert growth_mib < 20, f"RSS grew {growth_mib:.1f} MiB"
    assert len(log) < 5_000_000, "client errors must be logged one rate-limited line each"
