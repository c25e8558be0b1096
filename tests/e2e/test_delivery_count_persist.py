"""x-delivery-count survives a clean restart and a kill -9: a poison message cannot dodge its limit.

A durable queue with x-delivery-limit 3 and a dead-letter queue. Each scenario returns the message
twice, stops the broker (SIGTERM or SIGKILL), starts it again on the same data, and checks that the
count goes on from 2: the next delivery says 2, and the fourth return dead-letters the message.
"""

from __future__ import annotations

import pytest

from lavinpy.store.datadir import sha1_name

from . import consume, get_all, persistent, settle, uid, wait_until
from .conftest import lavinpy_only

pytestmark = lavinpy_only("restarts and kills the server")

LIMIT = 3


def _count(ch, q: str) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


def _declare(ch, extra: dict | None = None) -> tuple[str, str]:
    dlq, q = uid("dlq"), uid("q")
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(q, durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq, "x-delivery-limit": LIMIT,
        **(extra or {})})
    return dlq, q


def _get_and_nack(ch, q: str) -> int | None:
    """basic.get the message, return it with requeue; its x-delivery-count (None when absent)."""
    method, props, body = ch.basic_get(q)
    assert method is not None, "the message is not in the queue"
    assert body == b"poison"
    ch.basic_nack(method.delivery_tag, requeue=True)
    return (props.headers or {}).get("x-delivery-count")


def _stop(broker, how: str) -> None:
    if how == "clean":
        broker.stop()
    else:
        broker.kill9()


def _finish_after_restart(clients, dlq: str, q: str) -> None:
    """After the restart: the count goes on from 2, and the fourth return dead-letters the message."""
    conn, ch = clients.channel()
    assert _count(ch, q) == 1 and _count(ch, dlq) == 0
    assert _get_and_nack(ch, q) == 2
    assert _get_and_nack(ch, q) == 3  # the third return: still within the limit
    assert wait_until(conn, lambda: _count(ch, dlq) == 1, 3), "past the limit, not dead-lettered"
    assert _count(ch, q) == 0
    [(_, props, body)] = get_all(ch, dlq)
    assert body == b"poison"
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"
    assert props.headers["x-death"][0]["queue"] == q


@pytest.mark.parametrize("how", ["clean", "kill9"])
@pytest.mark.parametrize("extra", [{}, {"x-max-priority": 5}], ids=["classic", "priority"])
def test_count_continues_after_restart(fresh_broker, fresh_clients, how, extra):
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    dlq, q = _declare(ch, extra)
    ch.basic_publish("", q, b"poison", persistent(priority=1))
    assert _get_and_nack(ch, q) is None
    assert _get_and_nack(ch, q) == 1
    # A synchronous call on the same channel: the broker has handled the nacks before it answers.
    assert _count(ch, q) == 1
    fresh_clients.close_connections()
    _stop(fresh_broker, how)
    fresh_broker.start()
    _finish_after_restart(fresh_clients, dlq, q)


@pytest.mark.parametrize("how", ["clean", "kill9"])
def test_returns_by_closed_channels_count_after_restart(fresh_broker, fresh_clients, how):
    """A consumer's channel closing with the message unacked is a return too, and is remembered."""
    dlq, q = _declare(fresh_clients.channel()[1])
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"poison", persistent())
    seen = []
    for _ in range(2):
        conn, ch = fresh_clients.channel()
        [(_, props, _)] = consume(conn, ch, q, 1)
        seen.append((props.headers or {}).get("x-delivery-count"))
        ch.close()  # unacked: back to the queue, counted
    assert seen == [None, 1]
    _, ch = fresh_clients.channel()
    assert wait_until(fresh_clients.connections[-1], lambda: _count(ch, q) == 1, 3)
    fresh_clients.close_connections()
    _stop(fresh_broker, how)
    fresh_broker.start()
    _finish_after_restart(fresh_clients, dlq, q)


@pytest.mark.parametrize("how", ["clean", "kill9"])
def test_acked_messages_leave_no_count_and_others_keep_theirs(fresh_broker, fresh_clients, how):
    """Counts of messages that left the queue do not come back, and other messages keep theirs."""
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    dlq, q = _declare(ch)
    for body in (b"acked", b"kept", b"fresh"):
        ch.basic_publish("", q, body, persistent())
    for _ in range(2):  # "acked" and "kept" are returned twice each
        first, _, _ = ch.basic_get(q)
        second, _, _ = ch.basic_get(q)
        ch.basic_nack(second.delivery_tag, multiple=True, requeue=True)
    method, props, body = ch.basic_get(q)
    assert (body, props.headers["x-delivery-count"]) == (b"acked", 2)
    ch.basic_ack(method.delivery_tag)
    assert _count(ch, q) == 2
    settle(conn, 0.6)  # acks reach the disk with the periodic flush (200 ms)
    fresh_clients.close_connections()
    _stop(fresh_broker, how)
    fresh_broker.start()
    _, ch = fresh_clients.channel()
    got = get_all(ch, q, auto_ack=True)
    assert [(body, (props.headers or {}).get("x-delivery-count")) for _, props, body in got] == [
        (b"kept", 2), (b"fresh", None)]


def test_purged_messages_leave_no_count(fresh_broker, fresh_clients):
    """After a purge only the unacked message keeps a count, in memory and in the queue's file."""
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    dlq, q = _declare(ch)
    for body in (b"held", b"purged"):
        ch.basic_publish("", q, body, persistent())
    first, _, _ = ch.basic_get(q)
    second, _, _ = ch.basic_get(q)
    ch.basic_nack(second.delivery_tag, multiple=True, requeue=True)  # both counted once
    method, props, body = ch.basic_get(q)
    assert (body, props.headers["x-delivery-count"]) == (b"held", 1)
    assert ch.queue_purge(q).method.message_count == 1
    fresh_clients.close_connections()  # "held" goes back: its second return
    fresh_broker.stop()
    counts_file = fresh_broker.data_dir / sha1_name("/") / sha1_name(q) / "delivery_counts"
    assert counts_file.stat().st_size == 16  # one entry: "held"
    fresh_broker.start()
    _, ch = fresh_clients.channel()
    got = get_all(ch, q, auto_ack=True)
    assert [(body, props.headers["x-delivery-count"]) for _, props, body in got] == [(b"held", 2)]
