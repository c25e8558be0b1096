"""Exchange federation between two lavinpy brokers: the links, bindings mirrored upstream, reconnects,
loops cut by max-hops and the cluster name, the status API and lavinpyctl."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
import uuid
from urllib.parse import quote

import pika
import pytest

from tests.e2e.conftest import http_call
from tests.e2e.test_ctl import ctl
from tests.helpers import free_port

from .conftest import channel, drain, links, upstream_bindings, wait_for


def _federate(down, up, exchange: str, policy: str, upstream: str = "up", **keys) -> None:
    status, body, _ = http_call(down, "PUT", f"/api/parameters/federation-upstream/%2F/{upstream}",
                                {"value": {"uri": up.url, "reconnect-delay": 0.2, **keys}})
    assert status in (201, 204), body
    status, body, _ = http_call(down, "PUT", f"/api/policies/%2F/{policy}",
                                {"pattern": f"^{exchange}$", "apply-to": "exchanges",
                                 "definition": {"federation-upstream-set": "all"}})
    assert status in (201, 204), body


def _running(broker, exchange: str) -> dict | None:
    return next((r for r in links(broker) if r["exchange"] == exchange and r["status"] == "running"), None)


def test_messages_bindings_reconnect(pair) -> None:
    up, down = pair
    conn, ch = channel(down)
    ch.exchange_declare("fed.x", "topic", durable=True)
    ch.queue_declare("fed.q", durable=True)
    ch.queue_bind("fed.q", "fed.x", "a.#")
    _federate(down, up, "fed.x", "fed")
    row = wait_for(lambda: _running(down, "fed.x"), what="a running link")
    assert row["upstream"] == "up" and row["type"] == "exchange" and row["upstream_exchange"] == "fed.x"
    assert row["vhost"] == "/" and row["node"] and row["id"] and "guest:" not in row["uri"]
    assert row["queue"] == "federation: fed.x -> down"
    # On the upstream: the queue and the internal exchange RabbitMQ's plugin makes, bound with a.#.
    status, q, _ = http_call(up, "GET", "/api/queues/%2F/federation%3A%20fed.x%20-%3E%20down")
    assert status == 200 and q["durable"] and q["arguments"]["x-internal-purpose"] == "federation"
    wait_for(lambda: upstream_bindings(up, "fed.x") == {"a.#"}, what="the binding upstream")

    uconn, uch = channel(up)
    for i in range(20):
        uch.basic_publish("fed.x", "a.b" if i % 2 == 0 else "z.b", str(i).encode())
    got = drain(down, "fed.q", 10)
    assert sorted(int(body) for _, body in got) == list(range(0, 20, 2))  # once each, only a.#
    hop = got[0][0].headers["x-received-from"]
    assert len(hop) == 1 and hop[0]["exchange"] == "fed.x" and hop[0]["cluster-name"] == "up"
    assert hop[0]["redelivered"] is False and "guest:" not in hop[0]["uri"] and hop[0]["uri"].startswith("amqp://")

    # A binding added downstream appears upstream, and goes when it goes.
    ch.queue_declare("fed.q2", durable=True)
    ch.queue_bind("fed.q2", "fed.x", "b.*")
    wait_for(lambda: upstream_bindings(up, "fed.x") == {"a.#", "b.*"}, what="b.* mirrored")
    uch.basic_publish("fed.x", "b.c", b"late")
    assert [body for _, body in drain(down, "fed.q2", 1)] == [b"late"]
    ch.queue_unbind("fed.q2", "fed.x", "b.*")
    wait_for(lambda: upstream_bindings(up, "fed.x") == {"a.#"}, what="b.* removed upstream")

    # The link's upstream connection closed by the upstream: the link comes back and binds again.
    status, conns, _ = http_call(up, "GET", "/api/connections")
    fed = [c["name"] for c in conns if "Federation link" in (c.get("client_properties") or {}).get(
        "connection_name", "")]
    assert fed
    for name in fed:
        http_call(up, "DELETE", "/api/connections/" + quote(name, safe=""))
    wait_for(lambda: (r := next((x for x in links(down) if x["exchange"] == "fed.x"), None)) and
             r["status"] != "running", timeout=5, what="the link to notice")
    wait_for(lambda: _running(down, "fed.x"), what="the link running again")
    ch.queue_bind("fed.q2", "fed.x", "c.*")  # added while reconnected: mirrored too
    wait_for(lambda: upstream_bindings(up, "fed.x") == {"a.#", "c.*"}, what="bindings after reconnect")
    uch.basic_publish("fed.x", "a.after", b"after")
    assert [body for _, body in drain(down, "fed.q", 1)] == [b"after"]

    # The Prometheus endpoint: a running gauge and a forwarded count per link.
    with urllib.request.urlopen(down.metrics_url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    labels = f'exchange="fed.x",id="{row["id"]}",queue="",upstream="up",vhost="/"'
    running = "lavinpy_federation_link_running{" + labels + "} 1.0"
    assert running in metrics
    assert "lavinpy_federation_link_messages_forwarded{" in metrics

    # lavinpyctl: federation_status and restart_federation_link.
    out = ctl(down, "federation_status", "--formatter", "json")
    assert out.returncode == 0, out.stderr
    assert "fed.x" in out.stdout and "running" in out.stdout
    link_id = _running(down, "fed.x")["id"]
    out = ctl(down, "restart_federation_link", link_id)
    assert out.returncode == 0, out.stderr
    wait_for(lambda: _running(down, "fed.x"), what="the restarted link")
    assert ctl(down, "restart_federation_link", "nope").returncode != 0
    uconn.close()
    conn.close()


@pytest.mark.parametrize("max_hops", [1, 2])
def test_max_hops_cuts_a_loop(pair, max_hops: int) -> None:
    """Two nodes federating one exchange both ways: each message arrives once on each side, never back
    (max-hops 1 cuts it; with 2 the cluster name in its trail does)."""
    up, down = pair
    for b in (up, down):
        conn, ch = channel(b)
        ch.exchange_declare("loop.x", "fanout", durable=True)
        ch.queue_declare("loop.q", durable=True)
        ch.queue_bind("loop.q", "loop.x", "")
        conn.close()
    _federate(down, up, "loop.x", "loop", upstream="to-up", **{"max-hops": max_hops})
    _federate(up, down, "loop.x", "loop", upstream="to-down", **{"max-hops": max_hops})
    for b in (up, down):
        wait_for(lambda b=b: _running(b, "loop.x"), what="both links running")
    wait_for(lambda: upstream_bindings(up, "loop.x") and upstream_bindings(down, "loop.x"), what="bindings")
    conn, ch = channel(up)
    for i in range(10):
        ch.basic_publish("loop.x", "", str(i).encode())
    conn.close()
    here = drain(up, "loop.q", 10, settle=1.5)
    there = drain(down, "loop.q", 10, settle=0.5)
    assert sorted(int(body) for _, body in here) == list(range(10))  # not back again from down
    assert sorted(int(body) for _, body in there) == list(range(10))
    assert all(p.headers["x-received-from"][0]["cluster-name"] == "up" for p, _ in there)
    # Cut on the way back by down's x-federation-upstream exchange (hops), before leaving down.
    internal = [x for x in http_call(down, "GET", "/api/exchanges/%2F")[1]
                if x["name"].startswith("federation: loop.x -> up ")]
    assert len(internal) == 1 and internal[0]["type"] == "x-federation-upstream" and internal[0]["internal"]
    assert internal[0]["arguments"]["x-max-hops"] == max_hops
    assert sum(r["messages_received"] for r in links(up) if r["exchange"] == "loop.x") == 0
    # The policy gone: the link stops and takes its queue and internal exchange off the upstream.
    queue = "/api/queues/%2F/" + quote("federation: loop.x -> down", safe="")
    assert http_call(up, "GET", queue)[0] == 200
    assert http_call(down, "DELETE", "/api/policies/%2F/loop")[0] == 204
    wait_for(lambda: http_call(up, "GET", queue)[0] == 404, what="the upstream queue deleted")
    exchanges = http_call(up, "GET", "/api/exchanges")[1]
    assert not any(x["name"].startswith("federation: loop.x -> down") for x in exchanges)


def _put(broker, path: str, body, user: str = "guest", password: str = "guest"):
    return http_call(broker, "PUT", path, body, user=user, password=password)


def test_upstreams_and_sets_validated_as_rabbitmq(pair) -> None:
    _, down = pair
    for value, key in [({"uri": "amqp://h", "ack-mode": "sometimes"}, "ack-mode"),
                       ({"uri": "amqp://h", "prefetch-count": 0}, "prefetch-count"),
                       ({"uri": "amqp://h", "max-hops": "2"}, "max-hops"),
                       ({"uri": "amqp://h", "trust-user-id": "yes"}, "trust-user-id"),
                       ({"uri": "amqp://h", "queue-type": "stream"}, "queue-type"),
                       ({"uri": []}, "uri"), ({"prefetch-count": 5}, "uri"),
                       ({"uri": "amqp://h", "bogus": 1}, "bogus")]:
        status, body, _ = _put(down, "/api/parameters/federation-upstream/%2F/bad", {"value": value})
        assert status == 400 and key in body["reason"], (value, body)
    for value, key in [({"upstream": "up"}, "list"), ([{"prefetch-count": 1}], "upstream"),
                       ([{"upstream": "up", "uri": "amqp://h"}], "uri")]:
        status, body, _ = _put(down, "/api/parameters/federation-upstream-set/%2F/bad", {"value": value})
        assert status == 400 and key in body["reason"], (value, body)
    status, body, _ = _put(down, "/api/policies/%2F/both", {"pattern": "^none$", "definition": {
        "federation-upstream": "up", "federation-upstream-set": "all"}})
    assert status == 400 and "together" in body["reason"]


def test_rights_of_the_upstreams_creator(pair) -> None:
    up, down = pair
    for path, body in [("/api/vhosts/other", {}), ("/api/users/pm", {"password": "pm", "tags": "policymaker"}),
                       ("/api/permissions/%2F/pm", {"configure": "^$", "write": "^$", "read": ".*"}),
                       ("/api/users/outsider", {"password": "o", "tags": "policymaker"})]:
        assert _put(down, path, body)[0] in (201, 204)
    # No access to the vhost at all: refused.
    status, _, _ = _put(down, "/api/parameters/federation-upstream/%2F/o", {"value": {"uri": up.url}},
                        user="outsider", password="o")
    assert status in (401, 403)
    # A URI of this node naming a vhost the creator may not open: refused, naming it.
    status, body, _ = _put(down, "/api/parameters/federation-upstream/%2F/pmlocal", {"value": {"uri": "amqp:///other"}},
                           user="pm", password="pm")
    assert status == 400 and "may not connect to vhost \"other\"" in body["reason"]
    # Allowed to define it, but without configure and write on the exchange: the link says why.
    status, body, _ = _put(down, "/api/parameters/federation-upstream/%2F/pmup",
                           {"value": {"uri": up.url, "reconnect-delay": 0.2}}, user="pm", password="pm")
    assert status in (201, 204), body
    shown = http_call(down, "GET", "/api/parameters/federation-upstream/%2F/pmup", user="pm", password="pm")[1]
    assert shown["value"]["uri"] == up.url.replace(":guest@", ":***@")  # a policymaker sees no password
    conn, ch = channel(down)
    ch.exchange_declare("pm.x", "fanout", durable=True)
    conn.close()
    status, body, _ = _put(down, "/api/policies/%2F/pmfed", {"pattern": "^pm\\.x$", "apply-to": "exchanges",
                                                              "definition": {"federation-upstream": "pmup"}},
                           user="pm", password="pm")
    assert status in (201, 204), body
    row = wait_for(lambda: next((r for r in links(down) if r["exchange"] == "pm.x" and r["status"] == "error"), None),
                   what="the refused link")
    assert "exchange" in row["error"] and "pm.x" in row["error"] and row["upstream"] == "pmup"
    http_call(down, "DELETE", "/api/policies/%2F/pmfed")
    http_call(down, "DELETE", "/api/parameters/federation-upstream/%2F/pmup")
    wait_for(lambda: not any(r["exchange"] == "pm.x" for r in links(down)), what="the link gone with its policy")


def test_definitions_round_trip(pair) -> None:
    """Upstreams, sets and the policy survive an export, a delete and an import (its own upstream and exchange,
    whatever the module's other tests left)."""
    up, down = pair
    conn, ch = channel(down)
    ch.exchange_declare("rt.x", "fanout", durable=True)
    conn.close()
    _federate(down, up, "rt.x", "rt", upstream="rt-up")
    wait_for(lambda: _running(down, "rt.x"), what="the link running")
    assert _put(down, "/api/parameters/federation-upstream-set/%2F/site-b",
                {"value": [{"upstream": "rt-up", "prefetch-count": 10}]})[0] in (201, 204)
    status, doc, _ = http_call(down, "GET", "/api/definitions")
    assert status == 200
    mine = {(p["component"], p["name"]): p for p in doc["parameters"] if p["component"].startswith("federation")}
    assert mine[("federation-upstream", "rt-up")]["value"]["reconnect-delay"] == 0.2
    assert mine[("federation-upstream-set", "site-b")]["value"] == [{"upstream": "rt-up", "prefetch-count": 10}]
    assert any(p["name"] == "rt" and p["definition"].get("federation-upstream-set") == "all"
               for p in doc["policies"])
    for component, name in [("federation-upstream-set", "site-b"), ("federation-upstream", "rt-up")]:
        assert http_call(down, "DELETE", f"/api/parameters/{component}/%2F/{name}")[0] == 204
    wait_for(lambda: not any(r["upstream"] == "rt-up" for r in links(down)), what="the links gone")
    status, body, _ = http_call(down, "POST", "/api/definitions", doc)
    assert status in (200, 201, 204), body
    assert http_call(down, "GET", "/api/parameters/federation-upstream-set/%2F/site-b")[0] == 200
    wait_for(lambda: _running(down, "rt.x"), what="the link back after the import")


def test_queue_federation_moves_messages_only_to_consumers(pair) -> None:
    up, down = pair
    conn, ch = channel(up)
    ch.queue_declare("qf", durable=True)
    for i in range(20):
        ch.basic_publish("", "qf", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    dconn, dch = channel(down)
    dch.queue_declare("qf", durable=True)
    assert _put(down, "/api/parameters/federation-upstream/%2F/qup",
                {"value": {"uri": up.url, "reconnect-delay": 0.2, "prefetch-count": 5}})[0] in (201, 204)
    assert _put(down, "/api/policies/%2F/qfed", {"pattern": "^qf$", "apply-to": "queues",
                                                 "definition": {"federation-upstream": "qup"}})[0] in (201, 204)
    row = wait_for(lambda: next((r for r in links(down) if r.get("queue") == "qf" and r["type"] == "queue"
                                 and r["status"] == "running"), None), what="the queue link")
    assert row["upstream_queue"] == "qf" and row["upstream"] == "qup" and not row["consuming"]
    time.sleep(0.6)  # no consumer here: the messages stay upstream
    assert http_call(up, "GET", "/api/queues/%2F/qf")[1]["messages"] == 20
    got: list[int] = []
    dch.basic_consume("qf", lambda c, m, p, body: (got.append(int(body)), c.basic_ack(m.delivery_tag)))
    deadline = time.monotonic() + 15
    while len(got) < 20 and time.monotonic() < deadline:
        dconn.process_data_events(0.1)
    assert sorted(got) == list(range(20))
    out = ctl(down, "federation_status", "--formatter", "json")
    assert out.returncode == 0 and '"qf"' in out.stdout and '"queue"' in out.stdout, out.stdout
    wait_for(lambda: http_call(up, "GET", "/api/queues/%2F/qf")[1]["messages"] == 0, what="upstream emptied")
    dconn.close()
    http_call(down, "DELETE", "/api/policies/%2F/qfed")


def test_unreachable_and_refused_upstreams_say_why(pair) -> None:
    up, down = pair
    conn, ch = channel(down)
    ch.exchange_declare("why.x", "fanout", durable=True)
    conn.close()
    bad_login = up.url.replace("guest:guest@", "guest:wrong@")
    nowhere = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    for name, uri in [("nowhere", nowhere), ("badlogin", bad_login)]:
        assert _put(down, f"/api/parameters/federation-upstream/%2F/{name}",
                    {"value": {"uri": uri, "reconnect-delay": 0.2}})[0] in (201, 204)
    assert _put(down, "/api/policies/%2F/why", {"pattern": "^why\\.x$", "apply-to": "exchanges",
                                                "definition": {"federation-upstream-set": "broken"}})[0] in (201, 204)
    members = [{"upstream": "nowhere"}, {"upstream": "badlogin"}, {"upstream": "missing"}]
    assert _put(down, "/api/parameters/federation-upstream-set/%2F/broken", {"value": members})[0] in (201, 204)
    started = time.monotonic()

    def errors() -> dict[str, str] | None:
        rows = {r["upstream"]: r.get("error", "") for r in links(down) if r.get("exchange") == "why.x"}
        return rows if len(rows) == 3 and all(rows.values()) else None
    rows = wait_for(errors, what="the three links in error")
    assert "cannot connect" in rows["nowhere"] and "refused" in rows["nowhere"].lower()
    assert "ACCESS_REFUSED" in rows["badlogin"] or "403" in rows["badlogin"], rows["badlogin"]
    assert rows["missing"] == "no upstream 'missing' in vhost '/'"  # a member naming no upstream: said, no link
    for row in links(down):
        if row.get("exchange") == "why.x":
            assert row["status"] in ("error", "starting") and "wrong" not in row["uri"]
    # Retried with backoff (0.2 s doubled after each quick failure, at most 12 times): a refused connection
    # fails at once, so without backoff there would be one try every 0.2 s.
    time.sleep(max(0.0, started + 3.5 - time.monotonic()))
    failures = wait_for(lambda: next((r.get("failures") for r in links(down)
                                      if r.get("exchange") == "why.x" and r["upstream"] == "nowhere"), None),
                        what="the failures of the link")
    assert 3 <= failures <= 6, failures
    # A set naming an upstream that does not exist: said too.
    policy = {"pattern": "^why\\.x$", "apply-to": "exchanges", "definition": {"federation-upstream-set": "no-such-set"}}
    assert _put(down, "/api/policies/%2F/why", policy)[0] in (201, 204)
    wait_for(lambda: [r.get("error") for r in links(down) if r.get("exchange") == "why.x"]
             == ["no upstream set 'no-such-set' in vhost '/'"], what="the missing set said")
    http_call(down, "DELETE", "/api/policies/%2F/why")
    wait_for(lambda: not any(r.get("exchange") == "why.x" for r in links(down)), what="no link left")


def test_trust_user_id_keeps_the_user_id(pair) -> None:
    up, down = pair
    conn, ch = channel(down)
    ch.exchange_declare("t.x", "fanout", durable=True)
    ch.queue_declare("t.q", durable=True)
    ch.queue_bind("t.q", "t.x", "")
    conn.close()
    assert _put(down, "/api/parameters/federation-upstream/%2F/tup",
                {"value": {"uri": up.url, "reconnect-delay": 0.2, "trust-user-id": True}})[0] in (201, 204)
    assert _put(down, "/api/policies/%2F/trust", {"pattern": "^t\\.x$", "apply-to": "exchanges",
                                                  "definition": {"federation-upstream": "tup"}})[0] in (201, 204)
    wait_for(lambda: _running(down, "t.x"), what="the link")
    wait_for(lambda: upstream_bindings(up, "t.x"), what="the binding upstream")
    conn, ch = channel(up)
    ch.basic_publish("t.x", "", b"mine", pika.BasicProperties(user_id="guest"))
    conn.close()
    (props, body), = drain(down, "t.q", 1)
    assert body == b"mine" and props.user_id == "guest"


def _federate_queue(down, up, queue: str) -> None:
    """``queue`` on ``down`` federated from the queue of that name on ``up`` (names made from ``queue``)."""
    assert _put(down, f"/api/parameters/federation-upstream/%2F/{queue}-up",
                {"value": {"uri": up.url, "reconnect-delay": 0.2, "prefetch-count": 5}})[0] in (201, 204)
    assert _put(down, f"/api/policies/%2F/{queue}-fed", {"pattern": f"^{queue}$", "apply-to": "queues",
                                                         "definition": {"federation-upstream": f"{queue}-up"}}
                )[0] in (201, 204)


def _consuming(broker, queue: str) -> bool:
    return any(r.get("queue") == queue and r["type"] == "queue" and r.get("consuming") for r in links(broker))


def test_queue_link_yields_to_upstream_consumers_and_says_redelivered(pair) -> None:
    """The link consumes upstream at priority -1: the upstream's own consumer gets what it has credit for;
    what it gives back (requeued, redelivered) moves, and x-received-from says it was redelivered."""
    up, down = pair
    queue = f"qp-{uuid.uuid4().hex[:8]}"
    uconn, uch = channel(up)
    uch.queue_declare(queue, durable=True)
    dconn, dch = channel(down)
    dch.queue_declare(queue, durable=True)
    _federate_queue(down, up, queue)
    here: list = []
    dch.basic_consume(queue, lambda c, m, p, body: (here.append((p, body)), c.basic_ack(m.delivery_tag)))
    wait_for(lambda: (dconn.process_data_events(0.05), _consuming(down, queue))[1], what="the link consuming")
    uch.basic_qos(prefetch_count=100)
    there: list = []
    uch.basic_consume(queue, lambda c, m, p, body: there.append(m.delivery_tag))  # holds them unacked
    for i in range(20):
        uch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        uconn.process_data_events(0.05)
        dconn.process_data_events(0.05)
    assert len(there) == 20 and here == []  # none went to the link while a local consumer had credit
    uconn.close()  # the 20 go back to the queue, redelivered, and now only the link consumes
    deadline = time.monotonic() + 15
    while len(here) < 20 and time.monotonic() < deadline:
        dconn.process_data_events(0.1)
    assert sorted(int(body) for _, body in here) == list(range(20))
    props = here[0][0]
    hop = props.headers["x-received-from"]
    assert len(hop) == 1 and hop[0]["queue"] == queue and hop[0]["redelivered"] is True
    assert hop[0]["visit-count"] == 1 and "guest:" not in hop[0]["uri"]
    assert props.headers["x-original-routing-key"] == queue and props.headers["x-original-exchange"] == ""
    dconn.close()
    http_call(down, "DELETE", f"/api/policies/%2F/{queue}-fed")


def test_queues_federated_both_ways_move_each_message_once(pair) -> None:
    """Two queues, each the other's upstream: messages published on one side with the consumer on the other
    cross once, and do not come back (the receiving side's consumer outranks its link)."""
    up, down = pair
    queue = f"qb-{uuid.uuid4().hex[:8]}"
    for broker in (up, down):
        conn, ch = channel(broker)
        ch.queue_declare(queue, durable=True)
        conn.close()
    _federate_queue(down, up, queue)
    _federate_queue(up, down, queue)
    dconn, dch = channel(down)
    got: list = []
    dch.basic_consume(queue, lambda c, m, p, body: (got.append((p, body)), c.basic_ack(m.delivery_tag)))
    wait_for(lambda: (dconn.process_data_events(0.05), _consuming(down, queue))[1], what="the link consuming")
    _publish_confirmed_to_queue(up, queue, range(100))
    deadline = time.monotonic() + 15
    while len(got) < 100 and time.monotonic() < deadline:
        dconn.process_data_events(0.1)
    settle = time.monotonic() + 1.0
    while time.monotonic() < settle:
        dconn.process_data_events(0.1)
    assert sorted(int(body) for _, body in got) == list(range(100))  # each once
    assert all(p.headers["x-received-from"][0]["visit-count"] == 1 for p, _ in got)
    assert all(len(p.headers["x-received-from"]) == 1 for p, _ in got)
    row = next(r for r in links(up) if r.get("queue") == queue)
    assert row["messages_received"] == 0  # nothing went back
    assert http_call(up, "GET", f"/api/queues/%2F/{queue}")[1]["messages"] == 0
    dconn.close()
    for broker in (up, down):
        http_call(broker, "DELETE", f"/api/policies/%2F/{queue}-fed")


def _publish_confirmed_to_queue(broker, queue: str, numbers: range) -> None:
    conn, ch = channel(broker)
    ch.confirm_delivery()
    for i in numbers:
        ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()


@pytest.mark.skipif(shutil.which("rabbitmqadmin") is None, reason="rabbitmqadmin is not installed")
def test_rabbitmqadmin_lists_federation_without_traceback(pair, tmp_path) -> None:
    """Debian's rabbitmqadmin: upstreams and sets declared, listed (every format), exported and deleted;
    the links' queues and internal exchanges listed on the upstream."""
    up, down = pair
    name = f"adm-{uuid.uuid4().hex[:8]}"

    def admin(broker, *args: str) -> str:
        host, port = broker.http_url.removeprefix("http://").rsplit(":", 1)
        r = subprocess.run([shutil.which("rabbitmqadmin") or "", "-H", host, "-P", port, "-u", "guest", "-p", "guest",
                            *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "Traceback" not in r.stderr, f"{args}: {r.stdout}{r.stderr}"
        return r.stdout
    conn, ch = channel(down)
    ch.exchange_declare(f"{name}.x", "topic", durable=True)
    conn.close()
    value = json.dumps({"uri": [up.url], "reconnect-delay": 0.2, "max-hops": 2, "ack-mode": "on-confirm"})
    admin(down, "declare", "parameter", "component=federation-upstream", f"name={name}", f"value={value}")
    admin(down, "declare", "parameter", "component=federation-upstream-set", f"name={name}-set",
          "value=" + json.dumps([{"upstream": name, "prefetch-count": 50}]))
    admin(down, "declare", "policy", f"name={name}", f"pattern=^{name}\\.x$", "apply-to=exchanges",
          "definition=" + json.dumps({"federation-upstream-set": f"{name}-set"}))
    wait_for(lambda: _running(down, f"{name}.x"), what="the link")
    for fmt in ("table", "long", "tsv", "raw_json", "pretty_json", "kvp", "bash"):
        out = admin(down, "-f", fmt, "list", "parameters")
        assert name in out, (fmt, out)
        assert fmt == "bash" or "federation-upstream-set" in out
        if fmt in ("table", "kvp"):  # the links' objects upstream, with their arguments tables
            for what in ("exchanges", "queues", "bindings"):
                admin(up, "-f", fmt, "list", what)
    rows = json.loads(admin(down, "-f", "raw_json", "list", "parameters"))
    mine = {r["component"]: r["value"] for r in rows if r["name"] in (name, f"{name}-set")}
    assert mine["federation-upstream"]["max-hops"] == 2 and mine["federation-upstream-set"][0]["upstream"] == name
    queues = json.loads(admin(up, "-f", "raw_json", "list", "queues", "name", "arguments"))
    assert any(q["name"] == f"federation: {name}.x -> down" for q in queues)
    admin(down, "export", str(tmp_path / "defs.json"))
    exported = json.loads((tmp_path / "defs.json").read_text())
    assert {(p["component"], p["name"]) for p in exported["parameters"]} >= {
        ("federation-upstream", name), ("federation-upstream-set", f"{name}-set")}
    admin(down, "delete", "policy", f"name={name}")
    admin(down, "delete", "parameter", "component=federation-upstream-set", f"name={name}-set")
    admin(down, "delete", "parameter", "component=federation-upstream", f"name={name}")
    wait_for(lambda: not any(r["upstream"] == name for r in links(down)), what="the link gone")
