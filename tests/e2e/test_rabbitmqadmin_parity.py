"""Management API details rabbitmqadmin and other HTTP clients rely on, as RabbitMQ answers them: the
creator's permissions on a new vhost, vhost message counts, connection byte counters and rates, the
``policy`` field, and RabbitMQ 4's health checks (read with Debian's rabbitmqadmin and urllib)."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from urllib.parse import quote

import pika
import pytest

from .conftest import http_call, lavinpy_only
from .test_tls import TLSBroker

RABBITMQADMIN = shutil.which("rabbitmqadmin")
needs_rabbitmqadmin = pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")
pytestmark = lavinpy_only("lavinpy's management API")


def admin(broker, *args: str, user: str = "guest", password: str = "guest") -> str:
    host, port = broker.http_url.removeprefix("http://").rsplit(":", 1)
    done = subprocess.run([RABBITMQADMIN, "-H", host, "-P", port, "-u", user, "-p", password, *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@needs_rabbitmqadmin
def test_the_creator_of_a_vhost_may_use_it(fresh_broker):
    b = fresh_broker
    assert http_call(b, "PUT", "/api/users/maker", {"password": "mk", "tags": "administrator"})[0] == 201
    admin(b, "declare", "vhost", "name=made", user="maker", password="mk")
    perms = json.loads(admin(b, "-f", "raw_json", "list", "permissions"))
    assert {"user": "maker", "vhost": "made", "configure": ".*", "write": ".*", "read": ".*"} in perms
    assert not any(p["user"] == "guest" and p["vhost"] == "made" for p in perms)  # only the creator
    conn = pika.BlockingConnection(pika.URLParameters(b.url_for("maker", "mk", "made")))
    conn.channel().queue_declare("mine")
    conn.close()
    # a redeclare changes nothing: permissions taken away stay away
    assert http_call(b, "DELETE", "/api/permissions/made/maker")[0] == 204
    assert http_call(b, "PUT", "/api/vhosts/made", user="maker", password="mk")[0] == 204
    assert http_call(b, "GET", "/api/permissions/made/maker")[0] == 404


@needs_rabbitmqadmin
def test_vhosts_show_message_counts(fresh_broker):
    b = fresh_broker
    vhost = _name("counted")
    admin(b, "declare", "vhost", f"name={vhost}")
    conn = pika.BlockingConnection(pika.URLParameters(b.url_for("guest", "guest", vhost)))
    ch = conn.channel()
    for queue, kind in (("c", "classic"), ("s", "stream")):
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
        for _ in range(3):
            ch.basic_publish("", queue, b"x")
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume("c", lambda *a: None)
    conn.process_data_events(time_limit=0.5)
    status, info, _ = http_call(b, "GET", f"/api/vhosts/{quote(vhost, safe='')}")
    assert status == 200
    assert (info["messages"], info["messages_ready"], info["messages_unacknowledged"]) == (6, 5, 1)
    for name in ("messages", "messages_ready", "messages_unacknowledged"):
        assert isinstance(info[f"{name}_details"]["rate"], float)
    assert info["message_stats"]["publish"] == 6
    table = admin(b, "list", "vhosts", "name", "messages", "messages_ready", "messages_unacknowledged")
    assert [vhost, "6", "5", "1"] in [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()]
    conn.close()


def test_connections_count_bytes_with_rates(broker):
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        port = conn._impl._transport._sock.getsockname()[1]

        def mine() -> dict:
            return next(c for c in http_call(broker, "GET", "/api/connections")[1] if c["peer_port"] == port)

        before = mine()
        assert before["recv_oct"] > 0 and before["send_oct"] > 0  # the handshake
        assert before["recv_cnt"] > 0 and before["send_cnt"] > 0
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        body = b"b" * 100_000
        for _ in range(10):
            ch.basic_publish("", queue, body)
        ch.basic_consume(queue, lambda *a: None, auto_ack=True)
        conn.process_data_events(time_limit=1.0)
        after = mine()
        assert after["recv_oct"] - before["recv_oct"] >= 10 * len(body)
        assert after["send_oct"] - before["send_oct"] >= 10 * len(body)  # delivered back
        assert after["recv_cnt"] > before["recv_cnt"] and after["send_cnt"] > before["send_cnt"]
        assert after["recv_oct_details"]["rate"] > 0 and after["send_oct_details"]["rate"] > 0
        if RABBITMQADMIN:
            rows = admin(broker, "-f", "tsv", "list", "connections", "peer_port", "recv_oct", "send_oct").splitlines()
            counted = {int(r.split("\t")[0]): r.split("\t")[1:] for r in rows[1:]}  # after the header
            assert int(counted[port][0]) >= after["recv_oct"]
    finally:
        conn.close()


@needs_rabbitmqadmin
def test_policy_field_as_rabbitmq_gives_it(broker, clients):
    _, ch = clients.channel()
    plain, governed = clients.track_queue(_name("plain")), clients.track_queue(_name("gov.q"))
    exchange = clients.track_exchange(_name("gov.x"))
    ch.queue_declare(plain)
    ch.queue_declare(governed)
    ch.exchange_declare(exchange, "fanout")
    policy = _name("pol")
    assert http_call(broker, "PUT", f"/api/policies/%2F/{policy}",
                     {"pattern": "^gov\\.", "definition": {"max-length": 9}, "apply-to": "all"})[0] == 201
    try:
        queues = {q["name"]: q for q in http_call(broker, "GET", "/api/queues/%2F")[1]}
        assert queues[governed]["policy"] == policy
        # RabbitMQ's queues carry the key, null without a policy (which its own rabbitmqadmin cannot print
        # as a column): lavinpy gives "" instead.
        assert queues[plain]["policy"] == ""
        exchanges = {x["name"]: x for x in http_call(broker, "GET", "/api/exchanges/%2F")[1]}
        assert exchanges[exchange]["policy"] == policy
        assert "policy" not in exchanges["amq.direct"]  # and its exchanges leave it out
        table = admin(broker, "list", "exchanges", "name", "policy")  # a table with blanks, not a crash
        # Cells are padded to the widest value in the column, which other tests' exchanges may set.
        assert any([c.strip() for c in line.split("|")[1:3]] == [exchange, policy] for line in table.splitlines())
    finally:
        http_call(broker, "DELETE", f"/api/policies/%2F/{policy}")


HEALTHY = ["is-in-service", "protocol-listener/amqp", "protocol-listener/amqp091", "protocol-listener/amqp0-9-1",
           "protocol-listener/http", "protocol-listener/http%2Fprometheus", "below-node-connection-limit",
           "ready-to-serve-clients", "certificate-expiration/1/days", "certificate-expiration/10/years",
           "node-is-quorum-critical", "metadata-store/initialized", "metadata-store/initialized/with-data"]


@pytest.mark.parametrize("check", HEALTHY)
def test_rabbitmq_4_health_checks_pass(broker, check):
    status, body, _ = http_call(broker, "GET", f"/api/health/checks/{check}")
    assert (status, body["status"]) == (200, "ok"), body


def test_rabbitmq_4_health_checks_fail_as_rabbitmq(broker):
    status, body, _ = http_call(broker, "GET", "/api/health/checks/protocol-listener/stomp")
    assert status == 503
    assert body["status"] == "failed" and body["reason"] == "No active listener" and body["missing"] == "stomp"
    assert {"amqp", "http"} <= set(body["protocols"])
    status, body, _ = http_call(broker, "GET", "/api/health/checks/certificate-expiration/1/fortnights")
    assert status == 400 and "days, weeks, months, years" in body["reason"]
    status, body, _ = http_call(broker, "GET", "/api/health/checks/below-node-connection-limit")
    assert body["limit"] == "infinity" and body["connections"] >= 0
    status, body, _ = http_call(broker, "GET", "/api/health/checks/node-is-quorum-critical")
    assert body == {"status": "ok", "reason": "single node cluster"}
    assert http_call(broker, "GET", "/api/health/checks/ready-to-serve-clients", password="wrong")[0] == 401


def test_tls_connection_fields_and_certificate_expiration(tmp_path):
    tls = TLSBroker(tmp_path)  # its certificate is valid for one day
    try:
        conn = pika.BlockingConnection(tls.pika_params(tls.client_context()))
        port = conn._impl._transport._sock.getsockname()[1]
        listed = {c["peer_port"]: c for c in http_call(tls.broker, "GET", "/api/connections")[1]}
        assert listed[port]["ssl"] is True and listed[port]["ssl_protocol"] in ("tlsv1.2", "tlsv1.3")
        assert listed[port]["ssl_cipher"] and listed[port]["peer_cert_subject"] == ""  # no client certificate
        conn.close()
        status, body, _ = http_call(tls.broker, "GET", "/api/health/checks/certificate-expiration/0/days")
        assert (status, body) == (200, {"status": "ok"})
        status, body, _ = http_call(tls.broker, "GET", "/api/health/checks/certificate-expiration/2/days")
        assert status == 503 and body["reason"] == "Certificates expiring"
        assert [(e["certfile"], e["port"]) for e in body["expired"]] == [(str(tls.cert), tls.amqps_port)]
    finally:
        tls.broker.close()


@needs_rabbitmqadmin
def test_queue_tables_with_default_and_rabbitmq_columns(broker, clients):
    # Figures a queue kind does not keep are left out of the API's queue, not null: a null cell
    # breaks rabbitmqadmin's table (policy and exclusive_consumer_tag are null as in RabbitMQ's API).
    _, ch = clients.channel()
    names = {kind: clients.track_queue(_name(f"table-{kind}")) for kind in ("classic", "quorum", "stream")}
    for kind, name in names.items():
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": kind})
        ch.basic_publish("", name, b"m", pika.BasicProperties(delivery_mode=2, timestamp=1_700_000_000))
    exclusive = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(exclusive, lambda *a: None, exclusive=True)
    default = admin(broker, "list", "queues")
    assert all(any(f"| {name} " in line for line in default.splitlines()) for name in names.values())
    columns = ["name", "messages", "messages_persistent", "memory", "consumers", "consumer_capacity",
               "consumer_utilisation", "head_message_timestamp"]
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.split("|")[1:-1]]
                                          for line in admin(broker, "list", "queues", *columns).splitlines()
                                          if line.startswith("|"))}
    assert rows[names["classic"]][:3] == [names["classic"], "1", "1"]
    assert rows[names["classic"]][7] == "1700000000"
    assert rows[names["stream"]][2:4] == ["", ""]  # a stream keeps no persistence or memory figure
    assert rows[exclusive][4:7] == ["1", "1.0", "1.0"]
