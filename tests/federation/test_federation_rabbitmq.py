"""Exchange federation with a private RabbitMQ node (Debian's rabbitmq-server with its federation plugin):
RabbitMQ upstream -> lavinpy downstream (the x-federation-upstream exchange RabbitMQ knows, bindings
mirrored live), and RabbitMQ's own plugin downstream of lavinpy (lavinpy's x-federation-upstream type)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pika
import pytest

from tests.e2e.conftest import LocalBroker, http_call
from tests.e2e.rabbitmq_node import RabbitNode, needs_rabbitmq

from .conftest import channel, drain, links, named, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), needs_rabbitmq]


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RabbitNode, LocalBroker]]:
    root = tmp_path_factory.mktemp("federation-rabbit")
    rabbit = RabbitNode(root / "rabbit")
    rabbit.plugins.append("rabbitmq_federation")
    lavin = LocalBroker(root / "lavinpy")
    lavin.start()
    named(lavin, "lavin")
    rabbit.start()
    try:
        yield rabbit, lavin
    finally:
        rabbit.stop()
        lavin.stop()


def _rabbit_bindings(rabbit: RabbitNode, exchange: str) -> set[str]:
    status, body, _ = http_call(rabbit, "GET", f"/api/exchanges/%2F/{exchange}/bindings/source")
    return {b["routing_key"] for b in body} if status == 200 else set()


def test_rabbitmq_upstream_lavinpy_downstream(peers) -> None:
    rabbit, lavin = peers
    rabbit_url = rabbit.url_for("guest", "guest", "/")
    conn, ch = channel(lavin)
    ch.exchange_declare("rx", "topic", durable=True)
    ch.queue_declare("rq", durable=True)
    ch.queue_bind("rq", "rx", "k.#")
    status, body, _ = http_call(lavin, "PUT", "/api/parameters/federation-upstream/%2F/rabbit",
                                {"value": {"uri": rabbit_url, "reconnect-delay": 0.5, "max-hops": 2}})
    assert status in (201, 204), body
    status, body, _ = http_call(lavin, "PUT", "/api/policies/%2F/rfed",
                                {"pattern": "^rx$", "apply-to": "exchanges",
                                 "definition": {"federation-upstream": "rabbit"}})
    assert status in (201, 204), body
    wait_for(lambda: any(r["status"] == "running" for r in links(lavin)), timeout=20, what="the link")
    # What RabbitMQ's plugin would have made: the queue, and the internal exchange of RabbitMQ's type.
    status, exchanges, _ = http_call(rabbit, "GET", "/api/exchanges/%2F")
    internal = [x for x in exchanges if x["name"].startswith("federation: rx -> lavin ")]
    assert len(internal) == 1 and internal[0]["type"] == "x-federation-upstream" and internal[0]["internal"]
    assert internal[0]["arguments"]["x-max-hops"] == 2 and internal[0]["arguments"]["x-downstream-name"] == "lavin"
    status, q, _ = http_call(rabbit, "GET", "/api/queues/%2F/" + quote("federation: rx -> lavin", safe=""))
    assert status == 200 and q["arguments"]["x-internal-purpose"] == "federation"
    wait_for(lambda: _rabbit_bindings(rabbit, "rx") == {"k.#"}, what="k.# bound on RabbitMQ")

    rconn = pika.BlockingConnection(pika.URLParameters(rabbit_url))
    rch = rconn.channel()
    for i in range(10):
        rch.basic_publish("rx", "k.x" if i < 5 else "other", str(i).encode(), pika.BasicProperties(user_id="guest"))
    got = drain(lavin, "rq", 5)
    assert sorted(int(b) for _, b in got) == list(range(5))
    props = got[0][0]
    hop = props.headers["x-received-from"][0]
    assert hop["exchange"] == "rx" and hop["cluster-name"].startswith("lpinterop") and props.user_id is None

    ch.queue_bind("rq", "rx", "j.*")
    wait_for(lambda: _rabbit_bindings(rabbit, "rx") == {"k.#", "j.*"}, what="j.* mirrored on RabbitMQ")
    ch.queue_unbind("rq", "rx", "k.#")
    wait_for(lambda: _rabbit_bindings(rabbit, "rx") == {"j.*"}, what="k.# removed on RabbitMQ")
    rch.basic_publish("rx", "j.y", b"j")
    rch.basic_publish("rx", "k.y", b"k")
    assert [b for _, b in drain(lavin, "rq", 1)] == [b"j"]
    rconn.close()
    conn.close()


def test_rabbitmq_plugin_downstream_of_lavinpy(peers) -> None:
    """RabbitMQ's own federation link from lavinpy: it makes its x-federation-upstream exchange on lavinpy,
    and messages published to lavinpy arrive in RabbitMQ."""
    rabbit, lavin = peers
    rconn = pika.BlockingConnection(pika.URLParameters(rabbit.url_for("guest", "guest", "/")))
    rch = rconn.channel()
    rch.exchange_declare("lx", "direct", durable=True)
    rch.queue_declare("lq", durable=True)
    rch.queue_bind("lq", "lx", "hello")
    status, body, _ = http_call(rabbit, "PUT", "/api/parameters/federation-upstream/%2F/lavin",
                                {"value": {"uri": lavin.url}})
    assert status in (201, 204), body
    status, body, _ = http_call(rabbit, "PUT", "/api/policies/%2F/lfed",
                                {"pattern": "^lx$", "apply-to": "exchanges",
                                 "definition": {"federation-upstream": "lavin"}})
    assert status in (201, 204), body

    def bound() -> bool:
        status, body, _ = http_call(lavin, "GET", "/api/bindings/%2F")
        return any(b["source"] == "lx" and b["routing_key"] == "hello" for b in body)
    wait_for(bound, timeout=30, what="RabbitMQ's link binding on lavinpy")
    internal = [x for x in http_call(lavin, "GET", "/api/exchanges/%2F")[1] if x["name"].startswith("federation: lx")]
    assert len(internal) == 1 and internal[0]["type"] == "x-federation-upstream", internal
    conn, ch = channel(lavin)
    ch.basic_publish("lx", "hello", b"from lavinpy")
    conn.close()
    deadline_got = []
    for _ in range(100):
        method, props, body = rch.basic_get("lq", auto_ack=True)
        if method is not None:
            deadline_got.append((props, body))
            break
        rconn.sleep(0.1)
    assert deadline_got and deadline_got[0][1] == b"from lavinpy"
    assert deadline_got[0][0].headers["x-received-from"][0]["exchange"] == "lx"
    rconn.close()


def test_rabbitmq_export_with_federation_imports_whole(peers) -> None:
    """RabbitMQ's own export (its upstreams, a set, federation policies, and whatever its links made)
    posted to lavinpy: accepted whole, the parameters and policies there as exported, the link running."""
    rabbit, lavin = peers
    suffix = uuid.uuid4().hex[:8]
    vhost = f"fedimp-{suffix}"
    assert http_call(rabbit, "PUT", f"/api/vhosts/{vhost}", {})[0] in (201, 204)
    assert http_call(rabbit, "PUT", f"/api/permissions/{vhost}/guest",
                     {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    upstream = {"uri": [lavin.url], "prefetch-count": 200, "reconnect-delay": 1, "ack-mode": "on-publish",
                "trust-user-id": False, "max-hops": 2, "expires": 3600000, "message-ttl": 60000}
    for path, body in [(f"/api/parameters/federation-upstream/{vhost}/site-a", {"value": upstream}),
                       (f"/api/parameters/federation-upstream-set/{vhost}/sites",
                        {"value": [{"upstream": "site-a", "prefetch-count": 20}]}),
                       (f"/api/policies/{vhost}/fx", {"pattern": "^fx$", "apply-to": "exchanges",
                                                      "definition": {"federation-upstream-set": "sites"}}),
                       (f"/api/policies/{vhost}/fq", {"pattern": "^fq$", "apply-to": "queues",
                                                      "definition": {"federation-upstream": "site-a"}})]:
        status, body, _ = http_call(rabbit, "PUT", path, body)
        assert status in (201, 204), (path, body)
    conn = pika.BlockingConnection(pika.URLParameters(rabbit.url_for("guest", "guest", vhost)))
    ch = conn.channel()
    ch.exchange_declare("fx", "topic", durable=True)
    ch.queue_declare("fq", durable=True)
    ch.queue_bind("fq", "fx", "#")
    conn.close()
    status, doc, _ = http_call(rabbit, "GET", "/api/definitions")
    assert status == 200
    doc["users"] = [u for u in doc["users"] if u["name"] != "guest"]  # keep lavinpy's guest as it is
    status, body, _ = http_call(lavin, "POST", "/api/definitions", doc)
    assert status in (200, 201, 204), body
    mine = {(p["component"], p["name"]): p["value"] for p in http_call(lavin, "GET", "/api/parameters")[1]
            if p["vhost"] == vhost}
    assert mine[("federation-upstream", "site-a")] == upstream
    assert mine[("federation-upstream-set", "sites")] == [{"upstream": "site-a", "prefetch-count": 20}]
    policies = {p["name"]: p["definition"] for p in http_call(lavin, "GET", f"/api/policies/{vhost}")[1]}
    assert policies == {"fx": {"federation-upstream-set": "sites"}, "fq": {"federation-upstream": "site-a"}}
    # Imported on lavinpy, the upstream (lavinpy itself) feeds fx and fq there: both links come up.
    wait_for(lambda: {r["type"] for r in links(lavin) if r["vhost"] == vhost and r["status"] == "running"}
             == {"exchange", "queue"}, timeout=20, what="the imported links")
    for path in (f"/api/vhosts/{vhost}",):
        http_call(lavin, "DELETE", path)
        http_call(rabbit, "DELETE", path)


def _consume(conn: pika.BlockingConnection, ch, queue: str, count: int, timeout: float = 20.0) -> list:
    """``count`` messages (properties, body) through a consumer on ``queue`` (a consumer, not basic.get:
    a federated queue pulls from its upstream only while it has consumers), acked; then cancelled."""
    got: list = []
    tag = ch.basic_consume(queue, lambda c, m, p, body: (got.append((p, body)), c.basic_ack(m.delivery_tag)))
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    ch.basic_cancel(tag)
    return got


def _publish(conn: pika.BlockingConnection, queue: str, numbers: range) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for i in numbers:
        ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    ch.close()


def _queue_messages(conn: pika.BlockingConnection, queue: str) -> int:
    """Ready messages by a passive declare (RabbitMQ's HTTP counts lag by seconds)."""
    ch = conn.channel()
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    finally:
        ch.close()


@pytest.mark.parametrize("direction", ["rabbitmq-upstream", "lavinpy-upstream"])
def test_queue_federation_consumers_moved_between_sites(peers, direction: str) -> None:
    """Queue federation with RabbitMQ on either side: messages waiting at the upstream move to the
    downstream while it has a consumer (and none at the upstream); once the consumer moves to the upstream
    site, what is published there stays there for it, and nothing moves twice."""
    rabbit, lavin = peers
    queue = f"qfed-{direction}"
    rconn = pika.BlockingConnection(pika.URLParameters(rabbit.url_for("guest", "guest", "/")))
    lconn = pika.BlockingConnection(pika.URLParameters(lavin.url))
    for conn in (rconn, lconn):
        conn.channel().queue_declare(queue, durable=True)
    if direction == "rabbitmq-upstream":
        down, up_conn, down_conn = lavin, rconn, lconn
        uri = rabbit.url_for("guest", "guest", "/")
    else:
        down, up_conn, down_conn = rabbit, lconn, rconn
        uri = lavin.url
    name = f"u-{direction}"
    status, body, _ = http_call(down, "PUT", f"/api/parameters/federation-upstream/%2F/{name}",
                                {"value": {"uri": uri, "reconnect-delay": 1, "prefetch-count": 10}})
    assert status in (201, 204), body
    status, body, _ = http_call(down, "PUT", f"/api/policies/%2F/p-{direction}",
                                {"pattern": f"^{queue}$", "apply-to": "queues",
                                 "definition": {"federation-upstream": name}})
    assert status in (201, 204), body

    def link_running() -> bool:
        if down is lavin:
            rows = http_call(lavin, "GET", "/api/federation-links")[1]
            return any(r.get("queue") == queue and r.get("status") == "running" for r in rows)
        # RabbitMQ's link (its status API is another plugin): its connection to lavinpy, by the name it gives
        return any(str((c.get("client_properties") or {}).get("connection_name", "")).startswith("Federation link")
                   for c in http_call(lavin, "GET", "/api/connections")[1])
    wait_for(link_running, timeout=30, what="the queue link")
    _publish(up_conn, queue, range(10))
    time.sleep(1.0)  # no consumer downstream: they stay upstream
    assert _queue_messages(up_conn, queue) == 10 and _queue_messages(down_conn, queue) == 0
    # The consumer at the downstream site: the 10 come over.
    down_ch = down_conn.channel()
    got = _consume(down_conn, down_ch, queue, 10)
    assert sorted(int(b) for _, b in got) == list(range(10))
    assert all(p.headers["x-received-from"][0]["queue"] == queue for p, _ in got)
    wait_for(lambda: _queue_messages(up_conn, queue) == 0, what="the upstream queue emptied")
    # The consumer moved to the upstream site: the link stops consuming there (no consumer downstream), and
    # what is published there now is consumed there.
    def link_consumers() -> int:
        ch = up_conn.channel()
        try:
            return ch.queue_declare(queue, passive=True).method.consumer_count
        finally:
            ch.close()
    wait_for(lambda: link_consumers() == 0, what="the link's upstream consumer cancelled")
    up_ch = up_conn.channel()
    _publish(up_conn, queue, range(10, 20))
    got_up = _consume(up_conn, up_ch, queue, 10)
    assert sorted(int(b) for _, b in got_up) == list(range(10, 20))
    time.sleep(1.0)
    assert _queue_messages(down_conn, queue) == 0 and _queue_messages(up_conn, queue) == 0  # nothing moved twice
    for path in (f"/api/policies/%2F/p-{direction}", f"/api/parameters/federation-upstream/%2F/{name}"):
        http_call(down, "DELETE", path)
    for conn in (rconn, lconn):
        conn.channel().queue_delete(queue)
        conn.close()


def test_rabbitmq_upstream_shared_queue_outlives_one_removed_link(peers) -> None:
    """Two upstream parameters naming the same RabbitMQ (one broker twice) feed one exchange: their links
    share RabbitMQ's queue and internal exchange. Removing one under confirmed publishing loses nothing and
    leaves the other running; removing the last while another broker's link (a consumer) uses the queue
    leaves it (RabbitMQ's 406 to if-unused); once nothing consumes it, the last removal deletes it all."""
    rabbit, lavin = peers
    rabbit_url = rabbit.url_for("guest", "guest", "/")
    conn, ch = channel(lavin)
    ch.exchange_declare("rs.x", "fanout", durable=True)
    ch.queue_declare("rs.q", durable=True)
    ch.queue_bind("rs.q", "rs.x")
    conn.close()
    rconn = pika.BlockingConnection(pika.URLParameters(rabbit_url))
    rch = rconn.channel()
    rch.exchange_declare("rs.x", "fanout", durable=True)
    rch.confirm_delivery()
    queue = "federation: rs.x -> lavin"

    def put_upstream(name: str) -> None:
        status, body, _ = http_call(lavin, "PUT", f"/api/parameters/federation-upstream/%2F/{name}",
                                    {"value": {"uri": rabbit_url, "reconnect-delay": 0.5}})
        assert status in (201, 204), body

    def running() -> set[str]:
        return {r["upstream"] for r in links(lavin) if r.get("exchange") == "rs.x" and r["status"] == "running"}

    def rabbit_objects() -> set[str]:
        queues = {q["name"] for q in http_call(rabbit, "GET", "/api/queues/%2F")[1]}
        exchanges = {x["name"] for x in http_call(rabbit, "GET", "/api/exchanges/%2F")[1]}
        return ({queue} & queues) | ({f"{queue} A", f"{queue} B"} & exchanges)

    sent = 0

    def publish_for(seconds: float) -> None:
        nonlocal sent
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            rch.basic_publish("rs.x", "", str(sent).encode())  # returns once RabbitMQ confirmed it
            sent += 1

    put_upstream("rs-one")
    put_upstream("rs-two")
    status, body, _ = http_call(lavin, "PUT", "/api/parameters/federation-upstream-set/%2F/rs",
                                {"value": [{"upstream": "rs-one"}, {"upstream": "rs-two"}]})
    assert status in (201, 204), body
    status, body, _ = http_call(lavin, "PUT", "/api/policies/%2F/rsfed", {
        "pattern": "^rs\\.x$", "apply-to": "exchanges", "definition": {"federation-upstream-set": "rs"}})
    assert status in (201, 204), body
    try:
        wait_for(lambda: running() == {"rs-one", "rs-two"}, timeout=30, what="both links")
        publish_for(0.5)
        assert http_call(lavin, "DELETE", "/api/parameters/federation-upstream/%2F/rs-one")[0] == 204
        publish_for(2.0)
        assert running() == {"rs-two"}
        objects = rabbit_objects()
        assert len(objects) == 2 and queue in objects, objects  # the queue, and the exchange bound to it
        got = {int(b) for _, b in drain(lavin, "rs.q", sent)}
        assert not set(range(sent)) - got, f"confirmed upstream, lost: {len(set(range(sent)) - got)} of {sent}"

        other = pika.BlockingConnection(pika.URLParameters(rabbit_url))  # another broker's link on the queue
        other.channel().basic_consume(queue, lambda *a: None)
        assert http_call(lavin, "DELETE", "/api/parameters/federation-upstream/%2F/rs-two")[0] == 204
        wait_for(lambda: not running(), what="the last link gone")
        time.sleep(1.0)  # its cleanup, refused
        assert rabbit_objects() == objects
        other.close()

        put_upstream("rs-two")  # back on the kept queue; its removal now is the last use
        wait_for(lambda: running() == {"rs-two"}, timeout=30, what="the link again")
        assert http_call(lavin, "DELETE", "/api/parameters/federation-upstream/%2F/rs-two")[0] == 204
        wait_for(lambda: rabbit_objects() == set(), what="the queue and its exchanges deleted on RabbitMQ")
    finally:
        http_call(lavin, "DELETE", "/api/policies/%2F/rsfed")
        http_call(lavin, "DELETE", "/api/parameters/federation-upstream-set/%2F/rs")
        for name in ("rs-one", "rs-two"):
            http_call(lavin, "DELETE", f"/api/parameters/federation-upstream/%2F/{name}")
        http_call(rabbit, "DELETE", "/api/queues/%2F/" + quote(queue, safe=""))
        rconn.close()
