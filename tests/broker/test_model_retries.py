"""Delayed retries (x-delayed-retry-*) in the model, in process: which returns wait, how long, the
delivery limit composed with them, the due times kept across a restart, and the formula itself."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from lavinpy.broker.errors import BrokerChannelError
from lavinpy.broker.queues.base import QueueKind
from lavinpy.broker.settings import retries
from lavinpy.broker.settings.policies import PolicyError, make_policy
from tests.broker.model_harness import Model, death, run, until


def take(queue: QueueKind) -> int:
    taken = queue.get()
    assert taken is not None, "nothing ready"
    return taken[0]


def ready_bodies(m: Model, name: str) -> list[str]:
    return m.bodies(name)


# --- the formula ------------------------------------------------------------------------------------

def test_linear_is_rabbitmqs_min_times_n_capped_at_max() -> None:
    policy = retries.RetryPolicy("all", 1000, 3500)
    assert [policy.delay(n) for n in range(1, 6)] == [1000, 2000, 3000, 3500, 3500]


def test_exponential_multiplies_and_caps_without_huge_powers() -> None:
    policy = retries.RetryPolicy("all", 100, 1000, multiplier=2.0)
    assert [policy.delay(n) for n in range(1, 6)] == [100, 200, 400, 800, 1000]
    assert retries.RetryPolicy("all", 100, None, multiplier=10.0).delay(10**9) == retries.MAX_DELAY


def test_constant_with_multiplier_one_and_delays_past_49_7_days() -> None:
    sixty_days = 60 * 86_400_000
    assert retries.RetryPolicy("all", sixty_days, multiplier=1.0).delay(7) == sixty_days


def test_jitter_draws_below_the_delay_never_above() -> None:
    policy = retries.RetryPolicy("all", 1000, jitter=0.5)
    assert policy.delay(1, draw=lambda: 0.0) == 1000
    assert policy.delay(1, draw=lambda: 0.999) == 501
    assert all(500 <= policy.delay(1) <= 1000 for _ in range(200))


def test_types_select_failed_or_returned_settlements() -> None:
    assert retries.RetryPolicy("failed", 1).applies(True) and not retries.RetryPolicy("failed", 1).applies(False)
    assert retries.RetryPolicy("returned", 1).applies(False) and not retries.RetryPolicy("returned", 1).applies(True)
    assert retries.RetryPolicy("all", 1).applies(True) and retries.RetryPolicy("all", 1).applies(False)


def test_jitter_is_a_percentage_and_decimals_count_as_numbers() -> None:
    import decimal
    resolved = retries.resolve({"x-delayed-retry-min": 10, "x-delayed-retry-jitter": decimal.Decimal("12.5"),
                                "x-delayed-retry-multiplier": decimal.Decimal("1.5")}, {})
    assert resolved == retries.RetryPolicy("all", 10, None, 1.5, 0.125)


def test_resolve_argument_wins_min_alone_means_all_disabled_means_none() -> None:
    assert retries.resolve({"x-delayed-retry-min": 5}, {}) == retries.RetryPolicy("all", 5)
    assert retries.resolve({"x-delayed-retry-type": "disabled", "x-delayed-retry-min": 5}, {}) is None
    assert retries.resolve({}, {}) is None
    resolved = retries.resolve({"x-delayed-retry-min": 5}, {"delayed-retry-min": 9, "delayed-retry-type": "failed",
                                                             "delayed-retry-max": 50})
    assert resolved == retries.RetryPolicy("failed", 5, 50)


@pytest.mark.parametrize(("name", "value"), [
    ("x-delayed-retry-type", "sometimes"), ("x-delayed-retry-type", 3), ("x-delayed-retry-min", -1),
    ("x-delayed-retry-min", "1s"), ("x-delayed-retry-max", 1.5), ("x-delayed-retry-max", retries.MAX_DELAY + 1),
    ("x-delayed-retry-multiplier", 0.5), ("x-delayed-retry-multiplier", "2"), ("x-delayed-retry-jitter", 101),
    ("x-delayed-retry-jitter", True),
])
def test_bad_values_are_refused_naming_the_argument(tmp_path: Path, name: str, value: object) -> None:
    async def body(m: Model) -> None:
        for queue_type in ("classic", "quorum"):
            with pytest.raises(BrokerChannelError) as refused:
                m.declare(f"q-{queue_type}", durable=True, queue_type=queue_type, **{name[2:].replace("-", "_"): value})
            assert refused.value.text.startswith("PRECONDITION_FAILED") and f"'{name}'" in refused.value.text
    run(body, tmp_path)


def test_max_below_min_is_refused(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        with pytest.raises(BrokerChannelError) as refused:
            m.declare("q", delayed_retry_min=100, delayed_retry_max=10)
        assert "'x-delayed-retry-max'" in refused.value.text
    run(body, tmp_path)


def test_streams_refuse_retry_arguments(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        with pytest.raises(BrokerChannelError) as refused:
            m.declare("s", durable=True, queue_type="stream", delayed_retry_min=100)
        assert refused.value.text.startswith("PRECONDITION_FAILED") and "'x-delayed-retry-min'" in refused.value.text
    run(body, tmp_path)


def test_policy_keys_are_checked_and_named() -> None:
    validators = retries.policy_validators()
    from lavinpy.broker.settings.policies import VALIDATORS
    assert set(validators) <= set(VALIDATORS)
    make_policy("p", ".*", {"delayed-retry-type": "failed", "delayed-retry-min": 10}, 0, "queues", VALIDATORS)
    with pytest.raises(PolicyError, match="delayed-retry-jitter"):
        make_policy("p", ".*", {"delayed-retry-jitter": 700}, 0, "queues", VALIDATORS)


# --- in a queue -------------------------------------------------------------------------------------

@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_failed_return_waits_then_comes_back_with_its_count(tmp_path: Path, queue_type: str) -> None:
    async def body(m: Model) -> None:
        q = m.declare("q", durable=True, queue_type=queue_type, delayed_retry_type="failed", delayed_retry_min=150)
        m.publish("q", b"job")
        m.publish("q", b"next")
        started = time.monotonic()
        q.requeue_failed(take(q))
        assert q.delayed_count == 1 and q.stats.retried == 1
        assert ready_bodies(m, "q") == ["next"]  # the held one is not ready
        got = await until(lambda: m.get("q"), what="the retry")
        assert time.monotonic() - started >= 0.14
        assert got[0]["payload"] == "job" and got[0]["redelivered"]
        assert got[0]["properties"]["headers"]["x-delivery-count"] == 1
        assert q.delayed_count == 0
    run(body, tmp_path)


def test_failed_type_returns_a_nack_at_once_returned_type_a_reject(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        failed = m.declare("f", delayed_retry_type="failed", delayed_retry_min=60_000)
        returned = m.declare("r", delayed_retry_type="returned", delayed_retry_min=60_000)
        for name in ("f", "r"):
            m.publish(name, b"x")
        failed.requeue(take(failed))  # basic.nack / channel closed: not a failure
        returned.requeue_failed(take(returned))  # basic.reject: a failure, not a plain return
        assert (failed.message_count, failed.delayed_count) == (1, 0)
        assert (returned.message_count, returned.delayed_count) == (1, 0)
        failed.requeue_failed(take(failed))
        returned.requeue(take(returned))
        assert (failed.message_count, failed.delayed_count) == (0, 1)
        assert (returned.message_count, returned.delayed_count) == (0, 1)
    run(body, tmp_path)


def test_the_last_retry_dead_letters_with_reason_delivery_limit(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.dead_letter_target()
        q = m.declare("q", delivery_limit=2, dead_letter_exchange="dlx", delayed_retry_min=20)
        m.publish("q", b"job")
        for attempt in range(3):
            pos = await until(lambda: q.get(), what=f"attempt {attempt + 1}")
            q.requeue_failed(pos[0])
        assert q.stats.retried == 2 and q.delayed_count == 0 and q.message_count == 0
        [dead] = m.get("dead")
        assert dead["payload"] == "job" and death(dead)[0]["reason"] == "delivery_limit"
    run(body, tmp_path)


def test_a_policy_turns_retries_on_and_the_api_shows_the_due_time(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        from lavinpy.broker.ops import messages as operations_messages
        from lavinpy.broker.ops import object_info
        m.vhost.set_policy("retry", "^pol", {"delayed-retry-type": "all", "delayed-retry-min": 30_000},
                           apply_to="queues")
        q = m.declare("pol-q", durable=True)
        m.publish("pol-q", b"x")
        before = int(time.time() * 1000)
        q.requeue(take(q))
        [peeked] = operations_messages.peek_messages(None, m.vhost, "pol-q", 5)
        assert peeked["payload"] == "x" and before + 30_000 <= peeked["delayed_until"] <= before + 31_000
        info = object_info.queue_info(q)
        assert info["messages_delayed"] == 1 and info["message_stats"]["delayed_retries"] == 1
        assert m.vhost.get_queue("pol-q").purge() == 1 and q.delayed_count == 0
    run(body, tmp_path)


def test_due_times_and_counts_survive_a_restart(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        q = m.declare("q", durable=True, delayed_retry_min=400, delivery_limit=10)
        m.publish("q", b"held", delivery_mode=2)
        m.publish("q", b"other", delivery_mode=2)
        q.requeue_failed(take(q))
        started = time.monotonic()
        m.reopen()
        q = m.vhost.get_queue("q")
        assert q.delayed_count == 1 and q.message_count == 1  # the held one is not counted as ready
        assert ready_bodies(m, "q") == ["other"]  # the held one is skipped
        got = await until(lambda: m.get("q"), what="the held message")
        assert time.monotonic() - started >= 0.35
        assert got[0]["payload"] == "held" and got[0]["properties"]["headers"]["x-delivery-count"] == 1
        await asyncio.sleep(0.05)
        assert m.get("q") == []  # once
    run(body, tmp_path)


def test_retries_alone_cost_nothing_until_a_message_comes_back(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        q = m.declare("q", delayed_retry_type="returned", delayed_retry_min=30)
        assert not q.special and not q.features.bound  # the plain paths: no failures, no cost
        m.publish("q", b"x")
        m.publish("q", b"y")
        q.requeue(take(q))
        assert q.special and q.features.bound and q.delayed_count == 1
        assert [g["payload"] for g in m.get("q")] == ["y"]
        [got] = await until(lambda: m.get("q"), what="the held one")
        assert got["payload"] == "x" and got["properties"]["headers"]["x-delivery-count"] == 1
        assert not q.special and not q.features.bound  # nothing returned is left: plain again
        m.publish("q", b"z")
        q.requeue_failed(take(q))  # returned only: a reject comes back at once, still counted
        [again] = m.get("q")
        assert again["payload"] == "z" and again["properties"]["headers"]["x-delivery-count"] == 1
        assert not q.special
    run(body, tmp_path)
