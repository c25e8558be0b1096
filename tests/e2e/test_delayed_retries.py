"""Delayed retries over TCP (x-delayed-retry-*): pika and aio-pika consumers that reject or nack,
the waits measured from outside, the delivery limit ending the retries with a dead-letter, a policy
with an exponential back-off, the API's due times and counters, and a kill -9 mid-schedule."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
import urllib.request

import pika
import pytest

from . import persistent, uid, wait_until
from .conftest import http_call, lavinpy_only

pytestmark = lavinpy_only("lavinpy's delayed retries (RabbitMQ 4.3 has only the quorum, linear form)")


def _deliveries(conn, ch, queue: str, settle, count: int, timeout: float = 10.0) -> list[tuple[float, dict, bytes]]:
    """Consume ``count`` deliveries, settling each with ``settle(ch, method)``: (arrival, headers, body)."""
    got: list[tuple[float, dict, bytes]] = []

    def on_message(channel, method, props, body) -> None:
        got.append((time.monotonic(), props.headers or {}, body))
        settle(channel, method)

    tag = ch.basic_consume(queue, on_message)
    wait_until(conn, lambda: len(got) >= count, timeout)
    ch.basic_cancel(tag)
    return got


def test_quorum_queue_rejects_wait_linearly_then_dead_letter(clients) -> None:
    conn, ch = clients.channel()
    dead, queue = clients.track_queue(uid("retry-dead")), clients.track_queue(uid("retry-qq"))
    ch.queue_declare(dead, durable=True)
    ch.queue_declare(queue, durable=True, arguments={
        "x-queue-type": "quorum", "x-delayed-retry-type": "failed", "x-delayed-retry-min": 200,
        "x-delayed-retry-max": 300, "x-delivery-limit": 2, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead})
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"job", persistent())
    got = _deliveries(conn, ch, queue, lambda c, m: c.basic_reject(m.delivery_tag, requeue=True), 3)
    assert [headers.get("x-delivery-count") for _, headers, _ in got] == [None, 1, 2]
    waits = [later[0] - earlier[0] for earlier, later in zip(got, got[1:], strict=False)]
    assert 0.18 <= waits[0] < 1.0 and 0.28 <= waits[1] < 1.0, waits  # min * 1, then capped at max
    assert wait_until(conn, lambda: ch.queue_declare(dead, passive=True).method.message_count == 1, 3)
    method, props, body = ch.basic_get(dead, auto_ack=True)
    assert body == b"job" and props.headers["x-death"][0]["reason"] == "delivery_limit"


def test_failed_type_requeues_a_nack_at_once(clients) -> None:
    conn, ch = clients.channel()
    queue = clients.track_queue(uid("retry-nack"))
    ch.queue_declare(queue, durable=True, arguments={
        "x-queue-type": "quorum", "x-delayed-retry-type": "failed", "x-delayed-retry-min": 5000})
    ch.basic_publish("", queue, b"n", persistent())
    got = _deliveries(conn, ch, queue, lambda c, m: c.basic_nack(m.delivery_tag, requeue=True)
                      if m.delivery_tag == 1 else c.basic_ack(m.delivery_tag), 2, timeout=3)
    assert len(got) == 2 and got[1][0] - got[0][0] < 1.0


@pytest.mark.parametrize(("name", "value"), [("x-delayed-retry-type", "later"), ("x-delayed-retry-min", -5),
                                             ("x-delayed-retry-multiplier", 0), ("x-delayed-retry-jitter", 150)])
def test_bad_values_close_the_channel_with_406_naming_the_argument(clients, name, value) -> None:
    _, ch = clients.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_declare(uid("retry-bad"), durable=True, arguments={"x-queue-type": "quorum", name: value})
    assert closed.value.reply_code == 406 and f"'{name}'" in closed.value.reply_text


def test_aio_pika_classic_queue_with_an_exponential_policy(broker, clients) -> None:
    aio_pika = pytest.importorskip("aio_pika")
    queue = clients.track_queue(uid("retry-pol"))
    policy = uid("retry-policy")
    status, _, _ = http_call(broker, "PUT", f"/api/policies/%2F/{policy}", {
        "pattern": f"^{queue}$", "apply-to": "queues",
        "definition": {"delayed-retry-min": 100, "delayed-retry-multiplier": 3, "delayed-retry-max": 60000}})
    assert status in (201, 204)
    path = f"/api/queues/%2F/{urllib.parse.quote(queue, safe='')}"

    async def scenario() -> list[float]:
        connection = await aio_pika.connect_robust(broker.url)
        async with connection:
            channel = await connection.channel()
            declared = await channel.declare_queue(queue, durable=True)
            await channel.default_exchange.publish(aio_pika.Message(b"x", delivery_mode=2), routing_key=queue)
            arrivals: list[float] = []
            async with declared.iterator() as messages:
                async for message in messages:
                    arrivals.append(time.monotonic())
                    if len(arrivals) == 3:
                        # held for 100 * 3^2 ms: the API shows it with its due time
                        await message.nack(requeue=True)
                        await asyncio.sleep(0.1)
                        status, peeked, _ = http_call(broker, "GET", path + "/peek?count=1")
                        assert status == 200 and peeked[0]["delayed_until"] > time.time() * 1000, peeked
                        status, info, _ = http_call(broker, "GET", path)
                        assert info["messages_delayed"] == 1 and info["message_stats"]["delayed_retries"] == 3
                        await declared.purge()
                        break
                    await message.nack(requeue=True)
            return arrivals

    try:
        arrivals = asyncio.run(scenario())
    finally:
        http_call(broker, "DELETE", f"/api/policies/%2F/{policy}")
    waits = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert 0.09 <= waits[0] < 0.8 and 0.28 <= waits[1] < 1.2, waits  # 100 ms, then 300 ms
    with urllib.request.urlopen(broker.metrics_url + "/metrics/detailed", timeout=30) as response:
        scraped = response.read().decode()
    [line] = [line for line in scraped.splitlines()
              if "_detailed_queue_messages_delayed_retries_total{" in line and queue in line]
    assert float(line.rsplit(" ", 1)[1]) == 3.0, line


def test_kill9_mid_schedule_every_retry_happens_once_on_time(fresh_broker, fresh_clients) -> None:
    conn, ch = fresh_clients.channel()
    queue = uid("retry-kill")
    ch.queue_declare(queue, durable=True, arguments={
        "x-queue-type": "quorum", "x-delayed-retry-type": "all", "x-delayed-retry-min": 2500})
    ch.confirm_delivery()
    for body in (b"a", b"b", b"c"):
        ch.basic_publish("", queue, body, persistent())
    got = _deliveries(conn, ch, queue, lambda c, m: c.basic_reject(m.delivery_tag, requeue=True), 3)
    assert sorted(body for _, _, body in got) == [b"a", b"b", b"c"]
    assert ch.queue_declare(queue, passive=True).method.message_count == 0  # all three wait
    due = time.monotonic() + 2.5
    fresh_clients.close_connections()
    fresh_broker.kill9()
    fresh_broker.start()
    conn, ch = fresh_clients.channel()
    again = _deliveries(conn, ch, queue, lambda c, m: c.basic_ack(m.delivery_tag), 3, timeout=10)
    assert sorted(body for _, _, body in again) == [b"a", b"b", b"c"]
    assert all(headers.get("x-delivery-count") == 1 for _, headers, _ in again)
    arrivals = [at for at, _, _ in again]
    assert min(arrivals) >= due - 0.2 and max(arrivals) <= due + 1.5, (due, arrivals)
    method, _, _ = ch.basic_get(queue)
    assert method is None  # once each
