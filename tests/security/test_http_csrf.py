"""Cross-site request forgery: what a page on another site can make a logged-in browser send (a form
or a "simple" fetch: text/plain, form-encoded or multipart bodies, an Origin header naming that site)
is refused and changes nothing; the broker's own tools and the dashboard's requests still work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import uuid

import pytest

from tests.e2e.conftest import REPO_ROOT, http_call

RABBITMQADMIN = shutil.which("rabbitmqadmin")
SIMPLE_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                "text/plain;charset=UTF-8"]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _exists(broker, path: str) -> bool:
    return http_call(broker, "GET", path)[0] == 200


@pytest.mark.parametrize("content_type", SIMPLE_TYPES)
def test_a_simple_cross_site_body_is_refused_and_changes_nothing(broker, content_type):
    queue = _name("csrf")
    path = f"/api/queues/%2F/{queue}"
    status, body, _ = http_call(broker, "PUT", path, raw=b'{"durable": true}', headers={"Content-Type": content_type})
    assert status == 415 and body["error"] == "unsupported_media_type", body
    assert not _exists(broker, path)
    # The other changing methods and routes: a user, a binding, a publish, a definitions import, a delete.
    cases = [("PUT", "/api/users/" + _name("u"), b'{"password": "p", "tags": "administrator"}'),
             ("POST", "/api/bindings/%2F/e/amq.direct/q/nowhere", b'{"routing_key": "k"}'),
             ("POST", "/api/exchanges/%2F/amq.direct/publish",
              b'{"routing_key": "k", "payload": "x", "payload_encoding": "string", "properties": {}}'),
             ("POST", "/api/definitions", b'{"queues": [{"name": "planted", "vhost": "/"}]}'),
             ("DELETE", "/api/vhosts/%2F", b"")]
    for method, route, raw in cases:
        status, body, _ = http_call(broker, method, route, raw=raw, headers={"Content-Type": content_type})
        assert status == 415 and body["error"] == "unsupported_media_type", (method, route, body)
    assert not _exists(broker, "/api/queues/%2F/planted") and _exists(broker, "/api/vhosts/%2F")


def test_a_request_from_another_origin_is_refused(broker):
    queue = _name("cross")
    path = f"/api/queues/%2F/{queue}"
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{broker.http_port + 1}",
                   f"http://localhost:{broker.http_port}", "http://127.0.0.1.evil.example"):
        status, body, _ = http_call(broker, "PUT", path, {"durable": True}, headers={"Origin": origin})
        assert status == 403 and body["error"] == "forbidden", (origin, body)
        assert "cross-origin" in body["reason"]
    assert not _exists(broker, path)
    # Before the password is even checked: a wrong one gives the same 403, not 401.
    status, _, _ = http_call(broker, "DELETE", "/api/vhosts/%2F", password="wrong",
                             headers={"Origin": "http://evil.example"})
    assert status == 403 and _exists(broker, "/api/vhosts/%2F")


def test_same_origin_json_requests_and_reads_still_work(broker):
    queue = _name("same")
    path = f"/api/queues/%2F/{queue}"
    origin = f"http://127.0.0.1:{broker.http_port}"  # what the dashboard's fetch sends
    assert http_call(broker, "PUT", path, {"durable": True}, headers={"Origin": origin})[0] == 201
    assert http_call(broker, "PUT", path, {"durable": True},
                     headers={"Content-Type": "application/json; charset=utf-8"})[0] == 204
    assert http_call(broker, "GET", path, headers={"Origin": "http://evil.example"})[0] == 200  # reads: no CORS
    assert http_call(broker, "DELETE", path, headers={"Origin": origin})[0] == 204
    # A DELETE without a body or a content type (curl -X DELETE, rabbitmqadmin) is fine.
    assert http_call(broker, "PUT", path, {})[0] == 201
    assert http_call(broker, "DELETE", path)[0] == 204


def test_lavinpyctl_still_works(broker):
    vhost, queue = _name("ctl"), _name("ctl-q")
    parts = urllib.parse.urlsplit(broker.http_url)
    env = {k: v for k, v in os.environ.items() if k != "LAVINPYCTL_URI"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["LAVINPYCTL_URI"] = f"http://guest:guest@{parts.hostname}:{parts.port}"

    def ctl(*args: str, stdin: str | None = None) -> None:
        done = subprocess.run([sys.executable, "-m", "lavinpy.cli.ctl", *args], env=env, capture_output=True,
                              text=True, timeout=60, input=stdin)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"

    ctl("add_vhost", vhost)  # PUT
    ctl("import_definitions", "-", stdin=json.dumps({"queues": [{"name": queue, "vhost": vhost}]}))  # POST
    assert _exists(broker, f"/api/queues/{urllib.parse.quote(vhost)}/{queue}")
    ctl("delete_vhost", vhost)  # DELETE
    assert not _exists(broker, f"/api/vhosts/{urllib.parse.quote(vhost)}")


@pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")
def test_rabbitmqadmin_still_works(broker):
    queue = _name("adm")
    host, port = broker.http_url.removeprefix("http://").rsplit(":", 1)

    def admin(*args: str) -> str:
        done = subprocess.run([RABBITMQADMIN, "-H", host, "-P", port, "-u", "guest", "-p", "guest", *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{args}: {done.stdout}{done.stderr}"
        return done.stdout

    admin("declare", "queue", f"name={queue}", "durable=true")
    admin("publish", "exchange=amq.default", f"routing_key={queue}", "payload=hello")
    assert "hello" in admin("get", f"queue={queue}", "ackmode=ack_requeue_false")
    admin("delete", "queue", f"name={queue}")
    assert not _exists(broker, f"/api/queues/%2F/{queue}")
