"""A queue link under kill -9 of the downstream and then of the upstream, with confirmed publishing
upstream and a consumer downstream: with ack-mode on-confirm every confirmed message reaches the consumer
(duplicates, what was in flight at a kill, are counted)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pika

from tests.e2e.conftest import http_call

from .conftest import wait_for

QUEUE = "kill9-q"
CONSUMER_PREFETCH = 200  # the downstream consumer's basic.qos


class _Publisher(threading.Thread):
    """Numbered persistent messages to the upstream queue, each confirmed before the next, through kills."""

    def __init__(self, broker) -> None:
        super().__init__(daemon=True)
        self.broker, self.confirmed, self.done = broker, [], threading.Event()

    def run(self) -> None:
        n = 0
        while not self.done.is_set():
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.broker.url))
                ch = conn.channel()
                ch.confirm_delivery()
                while not self.done.is_set():
                    ch.basic_publish("", QUEUE, str(n).encode(), pika.BasicProperties(delivery_mode=2))
                    self.confirmed.append(n)
                    n += 1
                conn.close()
            except pika.exceptions.AMQPError:
                time.sleep(0.1)


class _Consumer(threading.Thread):
    """A consumer of the downstream queue (what makes the link pull), acking each message it records;
    it connects again after each kill."""

    def __init__(self, broker) -> None:
        super().__init__(daemon=True)
        self.broker, self.got, self.done = broker, [], threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.broker.url))
                ch = conn.channel()
                ch.basic_qos(prefetch_count=CONSUMER_PREFETCH)
                ch.basic_consume(QUEUE, lambda c, m, p, body: (self.got.append(int(body)), c.basic_ack(m.delivery_tag)))
                while not self.done.is_set():
                    conn.process_data_events(0.1)
                conn.close()
            except pika.exceptions.AMQPError:
                time.sleep(0.1)


def test_kill9_of_either_side_of_a_queue_link_loses_no_confirmed_message(pair) -> None:
    up, down = pair
    for broker in (up, down):
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        conn.channel().queue_declare(QUEUE, durable=True)
        conn.close()
    assert http_call(down, "PUT", "/api/parameters/federation-upstream/%2F/kq",
                     {"value": {"uri": up.url, "reconnect-delay": 0.2}})[0] in (201, 204)
    policy = {"pattern": f"^{QUEUE}$", "apply-to": "queues", "definition": {"federation-upstream": "kq"}}
    assert http_call(down, "PUT", "/api/policies/%2F/kq", policy)[0] in (201, 204)
    consumer, publisher = _Consumer(down), _Publisher(up)
    consumer.start()
    publisher.start()
    try:
        wait_for(lambda: len(consumer.got) >= 300, timeout=30, what="300 moved")
        down.kill9()  # the link, the downstream queue and its consumer's connection
        down.start()
        at = len(consumer.got)
        wait_for(lambda: len(consumer.got) >= at + 300, timeout=30, what="300 more after the downstream's restart")
        up.kill9()  # the upstream queue and the publisher's broker
        up.start()
        at = len(consumer.got)
        wait_for(lambda: len(consumer.got) >= at + 300, timeout=30, what="300 more after the upstream's restart")
    finally:
        publisher.done.set()
        publisher.join(10)
    confirmed = set(publisher.confirmed)
    try:
        wait_for(lambda: set(consumer.got) >= confirmed, timeout=30, what="every confirmed message")
    except AssertionError:
        raise AssertionError(f"missing: {sorted(confirmed - set(consumer.got))[:20]}") from None
    finally:
        consumer.done.set()
        consumer.join(10)
        http_call(down, "DELETE", "/api/policies/%2F/kq")
    duplicates = len(consumer.got) - len(set(consumer.got))
    print(f"{len(confirmed)} confirmed, {len(consumer.got)} arrived, {duplicates} duplicates")
    # Not bounded by the prefetches: a kill hands back what was in flight and also what was acked but
    # not yet written (acks reach the index files at the store's group commit); CI has seen 2,105-2,467
    # duplicates where the link and the consumer held at most 2,200. Bounded per message instead: the
    # downstream's kill hands a message back at most once on each hop (the upstream to the link, the
    # downstream queue to its consumer), the upstream's once on its hop: at most four copies of any one.
    assert max(Counter(consumer.got).values()) <= 4, Counter(consumer.got).most_common(3)
