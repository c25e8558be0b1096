"""Federation links in a cluster run on the leader only; a new leader takes them over, and with ack-mode
on-confirm no confirmed message is lost when the link's node is killed mid-way (duplicates are counted)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.e2e.conftest import LocalBroker, http_call
from tests.helpers import wait_until

from .harness import Cluster, Node
from .no_loss import isr

EXCHANGE, QUEUE = "fed-cx", "fed-cq"


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[LocalBroker]:
    broker = LocalBroker(tmp_path / "upstream")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


class Publisher(threading.Thread):
    """Publishes numbered persistent messages to the upstream exchange, each confirmed before the next."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.confirmed, self.done = url, [], threading.Event()

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        ch.confirm_delivery()
        n = 0
        while not self.done.is_set():
            ch.basic_publish(EXCHANGE, "", str(n).encode(), pika.BasicProperties(delivery_mode=2))
            self.confirmed.append(n)
            n += 1
        conn.close()


def _runs_link(node: Node) -> bool:
    return f"federation link {EXCHANGE} in vhost / running" in node.log_text()


def _count(node: Node) -> int:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(node.amqp_url))
    except pika.exceptions.AMQPError:
        return -1  # between leaders
    try:
        return conn.channel().queue_declare(QUEUE, durable=True).method.message_count
    finally:
        conn.close()


def test_links_run_on_the_leader_and_a_new_leader_loses_nothing(cluster: Cluster, upstream: LocalBroker) -> None:
    nodes = cluster.start(3)
    leader = cluster.wait_for_leader(30)
    conn = pika.BlockingConnection(pika.URLParameters(leader.amqp_url))
    ch = conn.channel()
    ch.exchange_declare(EXCHANGE, "fanout", durable=True)
    ch.queue_declare(QUEUE, durable=True)
    ch.queue_bind(QUEUE, EXCHANGE, "")
    conn.close()
    assert http_call(leader, "PUT", "/api/parameters/federation-upstream/%2F/up",
                     {"value": {"uri": upstream.url, "reconnect-delay": 0.2}})[0] in (201, 204)
    policy = {"pattern": f"^{EXCHANGE}$", "apply-to": "exchanges", "definition": {"federation-upstream": "up"}}
    assert http_call(leader, "PUT", "/api/policies/%2F/fed", policy)[0] in (201, 204)
    wait_until(lambda: _runs_link(leader), 20, what="the leader's link")
    wait_until(lambda: any(b["source"] == EXCHANGE for b in http_call(upstream, "GET", "/api/bindings/%2F")[1]), 20,
               what="the binding upstream")
    cluster_name = http_call(leader, "GET", "/api/global-parameters/cluster_name")[1]["value"]

    publisher = Publisher(upstream.url)
    publisher.start()
    wait_until(lambda: _count(leader) >= 300, 20, what="messages moving")
    # every node in the ISR first: a leader that dies as its only member leaves none allowed to lead
    wait_until(lambda: len(isr(cluster.etcd)) == len(cluster.nodes), 30, 0.1, "every node in the ISR")
    leader.kill()  # the link's node, mid-way
    successor = cluster.wait_for_leader(20, exclude=leader)
    wait_until(lambda: _runs_link(successor), 20, what="the new leader to run the link")
    moved = _count(successor)
    wait_until(lambda: _count(successor) >= moved + 200, 20, what="the new leader's link to move messages")
    publisher.done.set()
    publisher.join(10)
    assert not any(_runs_link(n) for n in nodes if n not in (leader, successor))
    # The same upstream queue (the cluster's name, not the node's), and nothing left in it.
    assert http_call(successor, "GET", "/api/global-parameters/cluster_name")[1]["value"] == cluster_name
    queues = [q for q in http_call(upstream, "GET", "/api/queues/%2F")[1] if q["name"].startswith("federation: ")]
    assert [q["name"] for q in queues] == [f"federation: {EXCHANGE} -> {cluster_name}"]
    confirmed = set(publisher.confirmed)
    got: list[int] = []
    conn = pika.BlockingConnection(pika.URLParameters(successor.amqp_url))
    ch = conn.channel()

    def all_there() -> bool:
        while (message := ch.basic_get(QUEUE, auto_ack=True))[0] is not None:
            got.append(int(message[2]))
        return set(got) >= confirmed
    try:
        wait_until(all_there, 20, what="every confirmed message")
    except AssertionError:
        raise AssertionError(f"{len(confirmed - set(got))} confirmed messages missing") from None
    finally:
        conn.close()
    duplicates = len(got) - len(set(got))
    print(f"{len(confirmed)} confirmed, {len(got)} arrived, {duplicates} duplicates")
    assert duplicates <= 1000  # at most what was in flight (the prefetch) at the kill
