"""Exchange federation between two lavinpy brokers under faults: kill -9 of either side and a link start
cut short upstream lose no confirmed message."""

from __future__ import annotations

import threading
import time
import uuid
from urllib.parse import quote

import pika

from tests.e2e.conftest import http_call

from .conftest import channel, links, upstream_bindings, wait_for
from .test_federation_lavinpy import _federate, _running


class _Publisher(threading.Thread):
    """Numbered persistent messages to an exchange of ``broker``, each confirmed before the next, through
    kills of that broker: after a failure it connects again and publishes the unconfirmed number again."""

    def __init__(self, broker, exchange: str) -> None:
        super().__init__(daemon=True)
        self.broker, self.exchange, self.confirmed, self.done = broker, exchange, [], threading.Event()

    def run(self) -> None:
        n = 0
        while not self.done.is_set():
            try:
                conn, ch = channel(self.broker)
                ch.confirm_delivery()
                while not self.done.is_set():
                    ch.basic_publish(self.exchange, "", str(n).encode(), pika.BasicProperties(delivery_mode=2))
                    self.confirmed.append(n)
                    n += 1
                conn.close()
            except pika.exceptions.AMQPError:
                time.sleep(0.1)  # the broker killed or starting: try again


def _federated_fanout(up, down, prefix: str) -> str:
    """A durable fanout exchange downstream with a queue of its name bound, federated from the upstream's
    exchange of that name; its name once the link runs and its binding is made upstream."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    conn, ch = channel(down)
    ch.exchange_declare(name, "fanout", durable=True)
    ch.queue_declare(name, durable=True)
    ch.queue_bind(name, name, "")
    conn.close()
    _federate(down, up, name, name, upstream=name)
    wait_for(lambda: _running(down, name), what="the link")
    wait_for(lambda: upstream_bindings(up, name), what="the binding upstream")
    return name


def _every_confirmed(up, down, name: str, confirmed: set[int], context: str) -> list[int]:
    """The numbers read from the downstream queue ``name`` until each confirmed one arrived (duplicates
    may come first: it waits for every number, not for a count); on a timeout the error names what is
    missing, the upstream's federation queues and the links."""
    got: list[int] = []
    conn, ch = channel(down)

    def all_there() -> bool:
        while (message := ch.basic_get(name, auto_ack=True))[0] is not None:
            got.append(int(message[2]))
        return set(got) >= confirmed
    try:
        wait_for(all_there, timeout=30, what="every confirmed message")
    except AssertionError:
        _, queues, _ = http_call(up, "GET", "/api/queues/%2F")
        upstream = [{k: q.get(k) for k in ("name", "messages_ready", "messages_unacknowledged", "consumers")}
                    for q in queues if q["name"].startswith("federation:")]
        raise AssertionError(f"missing: {sorted(confirmed - set(got))[:20]}; {context}; "
                             f"upstream queues {upstream}; links {links(down)}") from None
    finally:
        conn.close()
    return got


def test_kill9_of_either_side_loses_no_confirmed_message(pair) -> None:
    """ack-mode on-confirm: the upstream's message is acknowledged only once the downstream confirmed it,
    so kill -9 of the downstream and then of the upstream, mid-way under confirmed publishing, loses
    nothing; duplicates (what was in flight at a kill) are counted."""
    up, down = pair
    name = _federated_fanout(up, down, "k")
    publisher = _Publisher(up, name)
    publisher.start()
    try:
        wait_for(lambda: len(publisher.confirmed) >= 300, what="300 confirmed")
        kills = {"down": len(publisher.confirmed)}
        down.kill9()  # the link and the downstream with it, messages in flight
        down.start()
        wait_for(lambda: _running(down, name), what="the link after the downstream's restart")
        at = len(publisher.confirmed)
        wait_for(lambda: len(publisher.confirmed) >= at + 300, what="300 more confirmed")
        kills["up"] = len(publisher.confirmed)
        up.kill9()  # the publisher's broker too
        up.start()
        wait_for(lambda: _running(down, name), timeout=30, what="the link after the upstream's restart")
        at = len(publisher.confirmed)
        wait_for(lambda: len(publisher.confirmed) >= at + 300, timeout=30, what="300 more confirmed")
    finally:
        publisher.done.set()
        publisher.join(10)
    confirmed = set(publisher.confirmed)
    got = _every_confirmed(up, down, name, confirmed, f"confirmed at the kills {kills}")
    duplicates = len(got) - len(set(got))
    print(f"{len(confirmed)} confirmed, {len(got)} arrived, {duplicates} duplicates")
    assert duplicates <= 2 * 1000  # at most what was in flight (prefetch-count) at each kill


def _internal_exchanges(up, queue: str) -> set[str]:
    status, body, _ = http_call(up, "GET", "/api/exchanges/%2F")
    assert status == 200, body
    return {x["name"][-1] for x in body if x["name"] in (f"{queue} A", f"{queue} B")}


def test_a_start_cut_short_upstream_loses_nothing_at_the_next_start(pair) -> None:
    """A link start cut short between making the new internal exchange upstream and deleting the old one
    leaves both there, the new one maybe unbound: the next start must not delete the one the messages
    flow through before the other carries the bindings (what is published meanwhile would be dropped).
    After the module's first test the exchange is federated from both tests' upstreams (the policy's set is
    "all"): two links on one upstream queue, both cut at once, whose starts take turns
    (test_shared_upstream_queue.py)."""
    up, down = pair
    name = _federated_fanout(up, down, "c")
    queue = _running(down, name)["queue"]
    publisher = _Publisher(up, name)
    publisher.start()
    try:
        for _ in range(4):
            (current,) = wait_for(lambda: len(found := _internal_exchanges(up, queue)) == 1 and found,
                                  what="one internal exchange upstream")
            stale = "A" if current == "B" else "B"
            uconn, uch = channel(up)  # what the cut-short start left: declared, not bound yet
            uch.exchange_declare(f"{queue} {stale}", "x-federation-upstream", durable=True, auto_delete=True,
                                 internal=True, arguments={"x-max-hops": 1, "x-downstream-name": "down",
                                                          "x-downstream-vhost": "/"})
            uconn.close()
            at = len(publisher.confirmed)
            wait_for(lambda at=at: len(publisher.confirmed) >= at + 50, what="50 confirmed")
            status, conns, _ = http_call(up, "GET", "/api/connections")
            for c in conns:
                if f"policy: {name})" in (c.get("client_properties") or {}).get("connection_name", ""):
                    http_call(up, "DELETE", "/api/connections/" + quote(c["name"], safe=""))
            wait_for(lambda: len(_internal_exchanges(up, queue)) == 1 and _running(down, name),
                     what="the link started again")
            at = len(publisher.confirmed)
            wait_for(lambda at=at: len(publisher.confirmed) >= at + 50, what="50 more confirmed")
    finally:
        publisher.done.set()
        publisher.join(10)
    _every_confirmed(up, down, name, set(publisher.confirmed), "the link restarted four times")
