"""Links act as their creator: a shovel is checked against the rights of the user who sets it (when set,
through the API and a definitions import, and again whenever it starts) and runs on the node as that user,
never as the default user; it needs no password, so a changed default password stops none."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika

from lavinpy.shovel.client import ShovelClientError, connect
from lavinpy.wire.constants import INTERNAL_MECHANISM
from lavinpy.wire.uri import AMQPURL
from tests.e2e.conftest import LocalBroker, http_call

from .conftest import PASSWORDS, admin, as_user, messages, publish


def _until(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _shovel_row(broker: LocalBroker, vhost: str, name: str) -> dict | None:
    status, rows, _ = http_call(broker, "GET", f"/api/shovels/{vhost}")
    assert status == 200, rows
    return next((r for r in rows if r["name"] == name), None)


def _cross(src: str, dest: str, **keys: Any) -> dict:
    return {"src-uri": src, "src-queue": "secret", "dest-uri": dest, "dest-queue": "loot", **keys}


def test_policymaker_cross_vhost_shovel_refused(broker: LocalBroker) -> None:
    publish(broker, "b", "secret", 10)
    # Draining b into a, and publishing from a into b: the URI's vhost is b, which pm may not open.
    for value in (_cross("amqp:///b", "amqp:///a"), _cross("amqp:///a", "amqp:///b", **{"src-queue": "open-x"}),
                  _cross(["amqp:///a", "amqp:///b"], "amqp:///a", **{"src-queue": "open-x"})):
        status, body = as_user(broker, "pm", "PUT", "/api/parameters/shovel/a/steal", {"value": value})
        assert status == 400, body
        assert 'may not connect to vhost "b"' in body["reason"] and "pm" in body["reason"], body
    # A policymaker may not set parameters in a vhost it cannot open at all (the parameter's own vhost).
    status, body = as_user(broker, "pm", "PUT", "/api/parameters/shovel/b/steal",
                           {"value": _cross("amqp:///b", "amqp:///b")})
    assert status == 401, body
    assert http_call(broker, "GET", "/api/parameters/shovel/a/steal")[0] == 404
    time.sleep(0.5)
    assert messages(broker, "b", "secret") == 10
    assert messages(broker, "a", "loot") == -1


def test_policymaker_without_read_cannot_shovel_from_a_queue(broker: LocalBroker) -> None:
    publish(broker, "a", "closed", 5)
    status, body = as_user(broker, "pm", "PUT", "/api/parameters/shovel/a/peek", {"value": {
        "src-uri": "amqp:///a", "src-queue": "closed", "dest-uri": "amqp:///a", "dest-queue": "open-peek"}})
    assert status == 400, body
    assert "src-queue: read access to queue 'closed' in vhost 'a' refused for user 'pm'" in body["reason"], body
    # The URI with no vhost is the parameter's vhost: the same check.
    status, body = as_user(broker, "pm", "PUT", "/api/parameters/shovel/a/peek", {"value": {
        "src-uri": "amqp://", "src-queue": "closed", "dest-uri": "amqp://", "dest-queue": "open-peek"}})
    assert status == 400 and "read access to queue 'closed'" in body["reason"], body
    assert messages(broker, "a", "closed") == 5


def test_policymaker_shovel_runs_as_its_creator_and_is_checked_at_each_start(broker: LocalBroker) -> None:
    publish(broker, "a", "open-src", 7)
    status, body = as_user(broker, "pm", "PUT", "/api/parameters/shovel/a/mine", {"value": {
        "src-uri": "amqp:///a", "src-queue": "open-src", "dest-uri": "amqp:///a", "dest-queue": "open-dst"}})
    assert status == 201, body
    _until(lambda: messages(broker, "a", "open-dst") == 7, "pm's shovel to move the messages")
    # Recorded with the parameter (an administrator sees it; the export carries it).
    assert admin(broker, "GET", "/api/parameters/shovel/a/mine")["user"] == "pm"
    shovels = [p for p in admin(broker, "GET", "/api/definitions")["parameters"] if p["name"] == "mine"]
    assert shovels and shovels[0]["user"] == "pm"
    # It logged in as pm, with no password: the connection is pm's.
    conns = [c for c in admin(broker, "GET", "/api/connections") if "Shovel mine" in str(c.get("client_properties"))]
    assert conns and {c["user"] for c in conns} == {"pm"}, conns
    # pm loses read on the source: the next start is refused, with the reason in the status.
    admin(broker, "PUT", "/api/permissions/a/pm", {"configure": ".*", "write": ".*", "read": "^open-dst$"})
    try:
        admin(broker, "DELETE", "/api/shovels/vhost/a/mine/restart")
        row = _until(lambda: (r := _shovel_row(broker, "a", "mine")) and r["state"] == "terminated" and r,
                     "the shovel refused at its restart")
        assert "read access to queue 'open-src' in vhost 'a' refused for user 'pm'" in row["reason"], row
        publish(broker, "a", "open-src", 3)
        time.sleep(0.5)
        assert messages(broker, "a", "open-src") == 3
    finally:
        admin(broker, "PUT", "/api/permissions/a/pm", {"configure": ".*", "write": ".*", "read": "^open-.*"})
        admin(broker, "DELETE", "/api/parameters/shovel/a/mine")


def test_definitions_import_checks_the_recorded_user(broker: LocalBroker) -> None:
    doc = {"parameters": [{"component": "shovel", "vhost": "a", "name": "imported", "user": "pm",
                           "value": _cross("amqp:///b", "amqp:///a")}]}
    # Only administrators import definitions (RabbitMQ's rule).
    status, body = as_user(broker, "pm", "POST", "/api/definitions", doc)
    assert status == 401, body
    status, body, _ = http_call(broker, "POST", "/api/definitions", doc)
    assert status == 400, body
    assert "imported" in body["reason"] and 'user "pm" may not connect to vhost "b"' in body["reason"], body
    assert http_call(broker, "GET", "/api/parameters/shovel/a/imported")[0] == 404
    # Without a recorded user the shovel is the importing administrator's, and runs.
    publish(broker, "b", "import-src", 4)
    doc = {"parameters": [{"component": "shovel", "vhost": "b", "name": "imported", "value": {
        "src-uri": "amqp:///b", "src-queue": "import-src", "dest-uri": "amqp:///b", "dest-queue": "import-dst",
        "src-delete-after": "queue-length"}}]}
    status, body, _ = http_call(broker, "POST", "/api/definitions", doc)
    assert status == 204, body
    _until(lambda: messages(broker, "b", "import-dst") == 4, "the imported shovel to move the messages")


def test_internal_login_needs_the_node_token(broker: LocalBroker) -> None:
    """The internal mechanism takes no password: a guessed token, the default password or an empty
    one is refused like a wrong password."""
    async def attempt(user: str, token: str) -> str:
        url = AMQPURL(host=broker.host, port=broker.port, user=user, password=token, mechanism=INTERNAL_MECHANISM)
        try:
            client = await connect(url, "intruder")
        except ShovelClientError as e:
            return str(e)
        await client.close(1.0)
        return "logged in"

    for user, token in (("guest", "guest"), ("guest", ""), ("pm", "0" * 64), ("nobody", "x")):
        reason = asyncio.run(attempt(user, token))
        assert "ACCESS_REFUSED" in reason and INTERNAL_MECHANISM in reason, reason


def test_admin_shovel_survives_a_default_password_change(tmp_path: Path) -> None:
    b = LocalBroker(tmp_path / "pw")
    b.start()
    try:
        publish(b, "/", "keep-src", 5)
        status, body, _ = http_call(b, "PUT", "/api/parameters/shovel/%2F/keep", {"value": {
            "src-uri": "amqp://", "src-queue": "keep-src", "dest-uri": "amqp:///%2F", "dest-queue": "keep-dst",
            "reconnect-delay": 0.2}})
        assert status == 201, body
        _until(lambda: messages(b, "/", "keep-dst") == 5, "the shovel to move the messages")
        admin(b, "PUT", "/api/users/guest", {"password": "changed-pw", "tags": "administrator"})
        # A restart logs in again (and so does a restarted broker): with the internal identity.
        admin(b, "DELETE", "/api/shovels/vhost/%2F/keep/restart", password="changed-pw")
        b.restart()
        _until(lambda: (r := http_call(b, "GET", "/api/shovels", password="changed-pw")[1])
               and r[0]["state"] == "running", "the shovel running after the restart")
        conn = pika.BlockingConnection(pika.URLParameters(b.url_for("guest", "changed-pw")))
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "keep-src", str(i).encode())
        conn.close()
        _until(lambda: messages(b, "/", "keep-dst", password="changed-pw") == 10, "the moves after the change")
        assert "changed-pw" not in b.log
        # The creator is kept in the stored parameter (the file a cluster replicates) across the restart.
        assert admin(b, "GET", "/api/parameters/shovel/%2F/keep", password="changed-pw")["user"] == "guest"
    finally:
        b.close()


def test_ctl_set_parameter_checks_the_user(broker: LocalBroker, capsys: Any) -> None:
    from lavinpy.cli.ctl import main

    uri = f"--uri=http://pm:{PASSWORDS['pm']}@127.0.0.1:{broker.http_port}"
    value = json.dumps(_cross("amqp:///b", "amqp:///a"))
    assert main([uri, "set_parameter", "-p", "a", "shovel", "ctl-steal", value]) != 0
    err = capsys.readouterr().err
    assert 'may not connect to vhost' in err and "b" in err, err
    assert http_call(broker, "GET", "/api/parameters/shovel/a/ctl-steal")[0] == 404
    value = json.dumps({"src-uri": "amqp:///a", "src-queue": "open-ctl", "dest-uri": "amqp:///a",
                        "dest-queue": "open-ctl-dst"})
    assert main([uri, "set_parameter", "-p", "a", "shovel", "ctl-ok", value]) == 0
    assert admin(broker, "GET", "/api/parameters/shovel/a/ctl-ok")["user"] == "pm"
    admin(broker, "DELETE", "/api/parameters/shovel/a/ctl-ok")
