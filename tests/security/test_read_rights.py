"""Read rights as RabbitMQ's: parameters, global parameters, policies and operator policies are read by
administrators and by policymakers (of the vhosts they may open), not by monitoring users; a password in
a URI is seen by administrators only (masked for everyone else, in every answer and in the logs)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.conftest import LocalBroker, http_call

from .conftest import admin, as_user

PASSWORD = "shovel-pw-9f3k"  # the remote side's password in the shovel URIs below


def _secrets(broker: LocalBroker) -> None:
    """A shovel with credentials in its URIs in ``a`` and ``b``, policies and operator policies in both."""
    remote = f"amqp://remote:{PASSWORD}@127.0.0.1:{broker.port}/a"
    for vhost in ("a", "b"):
        admin(broker, "PUT", f"/api/parameters/shovel/{vhost}/remote-{vhost}", {"value": {
            "src-uri": [remote, f"amqp://x:{PASSWORD}@localhost:1/{vhost}"], "src-queue": "q",
            "dest-uri": remote, "dest-queue": "open-d", "reconnect-delay": 30}})
        admin(broker, "PUT", f"/api/policies/{vhost}/pol-{vhost}", {"pattern": "^zz", "definition": {"max-length": 5}})
        admin(broker, "PUT", f"/api/operator-policies/{vhost}/op-{vhost}",
              {"pattern": "^zz", "definition": {"max-length": 9}})
    admin(broker, "PUT", "/api/global-parameters/g-secret", {"value": f"amqp://u:{PASSWORD}@h/"})


GETS = ["/api/overview", "/api/shovels", "/api/shovels/a", "/api/shovels/b", "/api/shovels/vhost/a/remote-a",
        "/api/queues", "/api/exchanges", "/api/connections", "/api/vhosts", "/api/whoami", "/api/nodes",
        "/api/parameters", "/api/parameters/shovel", "/api/parameters/shovel/a", "/api/parameters/shovel/a/remote-a",
        "/api/global-parameters", "/api/global-parameters/g-secret", "/api/policies", "/api/policies/a",
        "/api/operator-policies", "/api/operator-policies/a", "/api/definitions", "/api/definitions/a"]


def test_monitoring_reads_no_parameters_policies_or_passwords(broker: LocalBroker) -> None:
    _secrets(broker)
    for path in ("/api/parameters", "/api/parameters/shovel", "/api/parameters/shovel/a",
                 "/api/parameters/shovel/a/remote-a", "/api/global-parameters", "/api/global-parameters/g-secret",
                 "/api/policies", "/api/policies/a", "/api/policies/a/pol-a", "/api/operator-policies",
                 "/api/operator-policies/a", "/api/definitions", "/api/definitions/a"):
        status, body = as_user(broker, "mon", "GET", path)
        assert status == 401 and body["error"] == "not_authorised", (path, status, body)
    for path in GETS:  # whatever mon may read, no password is in it
        status, body = as_user(broker, "mon", "GET", path)
        assert PASSWORD not in json.dumps(body), (path, body)
    status, rows = as_user(broker, "mon", "GET", "/api/shovels")
    assert status == 200 and {r["name"] for r in rows} >= {"remote-a", "remote-b"}, rows
    assert all(r["src_uri"].startswith("amqp://remote:***@") for r in rows if r["name"].startswith("remote")), rows
    # Nor in the broker's log (the shovels failed to log in as "remote" meanwhile, and said so).
    assert PASSWORD not in broker.log


def test_policymaker_reads_its_vhosts_parameters_masked(broker: LocalBroker) -> None:
    _secrets(broker)
    for path in GETS:
        status, body = as_user(broker, "pm", "GET", path)
        assert PASSWORD not in json.dumps(body), (path, body)
    status, params = as_user(broker, "pm", "GET", "/api/parameters")
    assert status == 200 and {p["vhost"] for p in params} == {"a"}, params
    value = next(p for p in params if p["name"] == "remote-a")["value"]
    assert value["src-uri"][0] == f"amqp://remote:***@127.0.0.1:{broker.port}/a", value
    assert value["dest-uri"].startswith("amqp://remote:***@"), value
    assert as_user(broker, "pm", "GET", "/api/parameters/shovel/b")[0] == 401
    assert as_user(broker, "pm", "GET", "/api/parameters/shovel/b/remote-b")[0] in (401, 404)
    status, policies = as_user(broker, "pm", "GET", "/api/policies")
    assert status == 200 and {p["name"] for p in policies} == {"pol-a"}, policies
    assert as_user(broker, "pm", "GET", "/api/policies/b")[0] == 401
    status, ops = as_user(broker, "pm", "GET", "/api/operator-policies")
    assert status == 200 and {p["name"] for p in ops} == {"op-a"}, ops
    status, globals_ = as_user(broker, "pm", "GET", "/api/global-parameters")
    assert status == 200 and next(g for g in globals_ if g["name"] == "g-secret")["value"] == "amqp://u:***@h/"
    # Definitions export stays an administrator's (unmasked there: a backup must restore).
    assert as_user(broker, "pm", "GET", "/api/definitions")[0] == 401
    assert PASSWORD in json.dumps(admin(broker, "GET", "/api/definitions"))
    assert PASSWORD in json.dumps(admin(broker, "GET", "/api/parameters/shovel/a/remote-a"))


def test_move_messages_needs_no_password(broker: LocalBroker) -> None:
    """The dashboard's Move messages defines the one-off shovel with "amqp:///vhost" (no credentials): it
    runs as the logged-in user, here a policymaker, and moves the messages."""
    from .conftest import messages, publish
    from .test_links import _until

    publish(broker, "/", "mv-src", 12)
    uri = "amqp:///%2F"
    status, body = as_user(broker, "pmall", "PUT", "/api/parameters/shovel/%2F/Move%20mv-src%20to%20mv-dst", {
        "component": "shovel", "vhost": "/", "name": "Move mv-src to mv-dst", "value": {
            "src-uri": uri, "src-queue": "mv-src", "dest-uri": uri, "dest-queue": "mv-dst",
            "src-delete-after": "queue-length", "ack-mode": "on-confirm"}})
    assert status == 201, body
    _until(lambda: messages(broker, "/", "mv-dst") == 12, "the messages moved")
    assert messages(broker, "/", "mv-src") == 0
    _until(lambda: not [r for r in http_call(broker, "GET", "/api/shovels/%2F")[1] if r["name"].startswith("Move")],
           "the one-off shovel gone")
    # The page writes exactly that URI, and no longer reads the stored login.
    page = (Path(__file__).resolve().parents[2] / "lavinpy/http/static/dashboard_shovels.js").read_text()
    assert "const localShovelUri = (vhost) => `amqp:///${enc(vhost)}`;" in page
    assert "sessionStorage" not in page and "AUTH_KEY" not in page


def test_a_refused_uri_is_named_without_its_password(broker: LocalBroker) -> None:
    status, body, _ = http_call(broker, "PUT", "/api/parameters/shovel/a/bad-scheme", {"value": {
        "src-uri": f"http://u:{PASSWORD}@example.com/", "src-queue": "q", "dest-uri": "amqp://"}})
    assert status == 400 and "src-uri" in body["reason"] and "u:***@example.com" in body["reason"], body
    assert PASSWORD not in json.dumps(body) and PASSWORD not in broker.log
