"""Message deduplication over TCP (LavinMQ's arguments): pika publishers in confirm mode get every
duplicate confirmed, never stored twice, counted in the API; a mandatory duplicate at an exchange is
not returned; and a kill -9 keeps the cache (LavinMQ's is in memory and would forget it)."""

from __future__ import annotations

import urllib.parse

import pika

from . import persistent, uid
from .conftest import http_call, lavinpy_only

pytestmark = lavinpy_only("lavinpy's deduplication cache (LavinMQ's has no persistence)")


def _publish_all(ch, exchange: str, key: str, idents: list[str], header: str = "x-deduplication-header",
                 mandatory: bool = False) -> None:
    for n, ident in enumerate(idents):
        # BlockingChannel in confirm mode raises on a nack or a return; each publish is confirmed here
        ch.basic_publish(exchange, key, f"{ident}-{n}".encode(), persistent(headers={header: ident}),
                         mandatory=mandatory)


def _queue(broker, name: str) -> dict:
    status, info, _ = http_call(broker, "GET", f"/api/queues/%2F/{urllib.parse.quote(name, safe='')}")
    assert status == 200, info
    return info


def test_queue_and_exchange_deduplicate_and_confirm(broker, clients) -> None:
    conn, ch = clients.channel()
    ch.confirm_delivery()
    queue = clients.track_queue(uid("dedup-q"))
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum", "x-message-deduplication": True,
                                                     "x-cache-size": 100})
    _publish_all(ch, "", queue, ["a", "b", "a", "c", "b", "a"])
    info = _queue(broker, queue)
    assert info["messages"] == 3 and info["deduplication"]["duplicates"] == 3, info
    assert info["deduplication"]["cache_entries"] == 3

    exchange = clients.track_exchange(uid("dedup-x"))
    ch.exchange_declare(exchange, "topic", durable=True, arguments={
        "x-message-deduplication": True, "x-deduplication-header": "msg-id", "x-cache-ttl": 60000})
    target = clients.track_queue(uid("dedup-target"))
    ch.queue_declare(target, durable=True)
    ch.queue_bind(target, exchange, "orders.#")
    _publish_all(ch, exchange, "orders.new", ["o1", "o1", "o2"], header="msg-id", mandatory=True)
    assert ch.queue_declare(target, passive=True).method.message_count == 2
    status, info, _ = http_call(broker, "GET", f"/api/exchanges/%2F/{urllib.parse.quote(exchange, safe='')}")
    assert info["deduplication"]["duplicates"] == 1 and info["deduplication"]["header"] == "msg-id", info


def test_bad_cache_size_closes_the_channel_naming_it(clients) -> None:
    _, ch = clients.channel()
    try:
        ch.queue_declare(uid("dedup-bad"), durable=True, arguments={"x-message-deduplication": True,
                                                                    "x-cache-size": -1})
    except pika.exceptions.ChannelClosedByBroker as closed:
        assert closed.reply_code == 406 and "'x-cache-size'" in closed.reply_text
    else:
        raise AssertionError("declared")


def test_kill9_keeps_the_cache(fresh_broker, fresh_clients) -> None:
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    queue = uid("dedup-kill")
    ch.queue_declare(queue, durable=True, arguments={"x-message-deduplication": True})
    _publish_all(ch, "", queue, ["k1", "k2"])
    fresh_clients.close_connections()
    fresh_broker.kill9()
    fresh_broker.start()
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    _publish_all(ch, "", queue, ["k1", "k2", "k3"])  # a publisher resending after the crash
    info = _queue(fresh_broker, queue)
    assert info["messages"] == 3 and info["deduplication"]["duplicates"] == 2, info


def test_kill9_before_a_flush_never_makes_a_retry_a_duplicate(fresh_broker, fresh_clients) -> None:
    """Messages published without confirms, a kill -9 after the cache's delayed write (20 ms) and
    before the periodic flush (200 ms): an identifier on disk always has its message with it, so
    the publisher's resend stores each message exactly once (none lost as a "duplicate")."""
    import time

    conn, ch = fresh_clients.channel()
    queue = uid("dedup-kill-unconfirmed")
    ch.queue_declare(queue, durable=True, arguments={"x-message-deduplication": True})
    idents = [f"u{n}" for n in range(20)]
    for ident in idents:
        ch.basic_publish("", queue, ident.encode(), persistent(headers={"x-deduplication-header": ident}))
    conn.process_data_events(0)
    time.sleep(0.06)
    fresh_broker.kill9()
    fresh_clients.close_connections()
    fresh_broker.start()
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    _publish_all(ch, "", queue, idents)  # the resend of everything unconfirmed
    info = _queue(fresh_broker, queue)
    assert info["messages"] == len(idents), info
