"""A link's URI query keys cannot make the broker probe files, and its error texts give away neither files nor
what a non-AMQP service answered: keys naming files (cacertfile, certfile, keyfile) are for administrators'
links only, checked when set and at each start; unknown keys are refused by name; a non-administrator sees
"TLS settings could not be loaded" without the OS error; a peer that is not an AMQP broker is named as such,
its bytes not repeated. Remote hosts stay allowed, as in RabbitMQ."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import LocalBroker, http_call
from tests.helpers import serving

from .conftest import admin, as_user


def _until(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return value


def _shovel(src: str) -> dict:
    return {"value": {"src-uri": src, "src-queue": "open-src", "dest-uri": "amqp:///a", "dest-queue": "open-dst",
                      "reconnect-delay": 30}}


def _terminated(broker: LocalBroker, name: str, user: str | None = None) -> dict:
    def row() -> dict | None:
        if user is None:
            status, rows, _ = http_call(broker, "GET", "/api/shovels/a")
        else:
            status, rows = as_user(broker, user, "GET", "/api/shovels/a")
        assert status == 200, rows
        found = next((r for r in rows if r["name"] == name), None)
        return found if found is not None and found["state"] == "terminated" and found.get("reason") else None
    return _until(row, f"shovel {name} terminated")


@pytest.mark.parametrize("key", ["cacertfile", "certfile", "keyfile"])
def test_file_keys_are_for_administrators(broker: LocalBroker, key: str) -> None:
    query = f"{key}=/etc/shadow" if key != "keyfile" else "certfile=/etc/shadow&keyfile=/etc/shadow"
    uri = f"amqps://u:p@127.0.0.1:1/?{query}"
    status, body = as_user(broker, "pm", "PUT", "/api/parameters/shovel/a/probe", _shovel(uri))
    assert status == 400, body
    assert f"'{key}'" in body["reason"] and "only administrators" in body["reason"], body
    status, body = as_user(broker, "pm", "PUT", "/api/parameters/federation-upstream/a/probe", {"value": {"uri": uri}})
    assert status == 400 and f"'{key}'" in body["reason"], body
    assert http_call(broker, "GET", "/api/parameters/shovel/a/probe")[0] == 404
    assert http_call(broker, "GET", "/api/parameters/federation-upstream/a/probe")[0] == 404


def test_unknown_query_keys_are_refused_by_name(broker: LocalBroker) -> None:
    for who in ("pm", None):
        body_in = _shovel("amqp:///a?verify=verify_none&frobnicate=1&colour=")
        if who is None:
            status, body, _ = http_call(broker, "PUT", "/api/parameters/shovel/a/odd", body_in)
        else:
            status, body = as_user(broker, who, "PUT", "/api/parameters/shovel/a/odd", body_in)
        assert status == 400, body
        assert "unknown URI query key(s) 'colour', 'frobnicate'" in body["reason"], body
    status, body, _ = http_call(broker, "PUT", "/api/parameters/federation-upstream/a/odd",
                                {"value": {"uri": "amqps://h/?cacertfile=/x&nope=1"}})
    assert status == 400 and "'nope'" in body["reason"], body


def test_tls_file_errors_are_detailed_for_administrators_only(broker: LocalBroker, tmp_path: Path) -> None:
    secret = tmp_path / "not-a-cert.pem"
    secret.write_text("TOPSECRET-LINE-1\n")
    cases = {"tls-missing": f"amqps://u:p@127.0.0.1:1/?cacertfile={tmp_path}/absent.pem",
             "tls-junk": f"amqps://u:p@127.0.0.1:1/?cacertfile={secret}"}
    try:
        for name, uri in cases.items():
            admin(broker, "PUT", f"/api/parameters/shovel/a/{name}", _shovel(uri))
        missing = _terminated(broker, "tls-missing")["reason"]
        assert "TLS settings could not be loaded: " in missing and "No such file" in missing, missing
        assert "TLS settings could not be loaded" in _terminated(broker, "tls-junk")["reason"]
        for name in cases:
            shown = _terminated(broker, name, "pm")["reason"]
            assert "TLS settings could not be loaded" in shown, shown
            for leak in ("Errno", "No such file", "TOPSECRET", "SSL", "PEM", str(tmp_path)):
                assert leak not in shown, (leak, shown)
        status, body = as_user(broker, "pm", "GET", "/api/shovels/vhost/a/tls-missing")
        assert status == 200 and "Errno" not in body["reason"], body
    finally:
        for name in cases:
            http_call(broker, "DELETE", f"/api/parameters/shovel/a/{name}")


def test_file_keys_are_checked_again_at_start(broker: LocalBroker, tmp_path: Path) -> None:
    admin(broker, "PUT", "/api/users/tmpadm", {"password": "tmpadm-pw", "tags": "administrator"})
    admin(broker, "PUT", "/api/permissions/a/tmpadm", {"configure": ".*", "write": ".*", "read": ".*"})
    try:
        status, body, _ = http_call(broker, "PUT", "/api/parameters/shovel/a/was-admin",
                                    _shovel(f"amqps://u:p@127.0.0.1:1/?cacertfile={tmp_path}/ca.pem"),
                                    user="tmpadm", password="tmpadm-pw")
        assert status == 201, body
        admin(broker, "PUT", "/api/users/tmpadm", {"password": "tmpadm-pw", "tags": "policymaker"})
        admin(broker, "DELETE", "/api/shovels/vhost/a/was-admin/restart")
        reason = _until(lambda: "only administrators" in (r := _terminated(broker, "was-admin"))["reason"] and r,
                        "the restart refused")["reason"]
        assert "'cacertfile'" in reason and 'user "tmpadm"' in reason, reason
    finally:
        http_call(broker, "DELETE", "/api/parameters/shovel/a/was-admin")
        http_call(broker, "DELETE", "/api/users/tmpadm")


BANNERS = [b"SSH-2.0-OpenSSH_9.6 banner-secret\r\n", b"HTTP/1.1 400 Bad Request\r\nX-Secret: banner-secret\r\n\r\n",
           b"220 mail.example banner-secret ESMTP\r\n",
           # Bytes that parse as a frame header: a bad frame end, and an unknown method (classes 0xdead, 0xbeef).
           b"\x01\x00\x00\x00\x00\x00\x04\xde\xad\xbe\xef\x58", b"\x01\x00\x00\x00\x00\x00\x04\xde\xad\xbe\xef\xce"]


@pytest.fixture
def banner_server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP service on a free port answering every connection with one of BANNERS (in turn) and closing."""
    current: list[bytes] = [BANNERS[0]]

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(64)
                conn.sendall(current[0])
                time.sleep(0.2)
            except OSError:
                pass

    with serving("127.0.0.1", answer) as port:
        yield port, current


def test_a_service_that_is_not_amqp_is_named_without_its_banner(broker: LocalBroker,
                                                                banner_server: tuple[int, list[bytes]]) -> None:
    port, current = banner_server
    for i, banner in enumerate(BANNERS):
        current[0] = banner
        name = f"probe-{i}"
        status, body = as_user(broker, "pm", "PUT", f"/api/parameters/shovel/a/{name}",
                               _shovel(f"amqp://u:p@127.0.0.1:{port}/"))
        assert status == 201, body  # a remote host is allowed, as in RabbitMQ
        try:
            for user in ("pm", None):
                reason = _terminated(broker, name, user)["reason"]
                assert f"127.0.0.1:{port}" in reason, reason
                # RabbitMQ-like: the peer closed, timed out, or is not an AMQP broker; nothing it sent.
                assert reason.endswith(("connection closed", "not an AMQP 0-9-1 broker")), reason
                said = reason.split(f"127.0.0.1:{port}: ", 1)[1]
                size = int.from_bytes(banner[3:7], "big")  # a frame size made of the banner's bytes
                for leak in ("banner-secret", banner[:4].decode("latin-1"), "dead", "beef", "58", str(size), "0x"):
                    assert leak not in said, (leak, reason)
        finally:
            as_user(broker, "pm", "DELETE", f"/api/parameters/shovel/a/{name}")


def test_rabbitmqs_other_uri_keys_are_accepted(broker: LocalBroker) -> None:
    """A RabbitMQ shovel URI with its usual query keys (heartbeat=...) is taken as RabbitMQ takes it."""
    value = {"src-uri": "amqp://guest:guest@127.0.0.1:1/?heartbeat=10&connection_timeout=5000",
             "src-queue": "keys-src", "dest-uri": "amqp:///", "dest-queue": "keys-dest"}
    status, reply, _ = http_call(broker, "PUT", "/api/parameters/shovel/%2F/rabbitmq-keys",
                                 {"value": value})
    assert status in (201, 204), reply
    http_call(broker, "DELETE", "/api/parameters/shovel/%2F/rabbitmq-keys")


def test_a_uris_connection_settings_are_honoured_and_checked(broker: LocalBroker) -> None:
    """heartbeat, channel_max and frame_max in a shovel's URI are what its connection asks for (as
    RabbitMQ's shovels do); a value out of range, or a mechanism RabbitMQ's URIs do not name (the node's
    internal one), is refused with 400 naming the key."""
    for query, key in (("heartbeat=often", "heartbeat"), ("frame_max=100", "frame_max"),
                       ("auth_mechanism=lavinpy-internal", "auth_mechanism")):
        value = {"src-uri": f"amqp://guest:guest@127.0.0.1:{broker.port}/?{query}", "src-queue": "tuned-src",
                 "dest-uri": "amqp:///", "dest-queue": "tuned-dest"}
        status, reply, _ = http_call(broker, "PUT", "/api/parameters/shovel/%2F/badly-tuned", {"value": value})
        assert status == 400 and key in str(reply), (status, reply)
    for queue in ("tuned-src", "tuned-dest"):
        http_call(broker, "PUT", f"/api/queues/%2F/{queue}", {"durable": True})
    value = {"src-uri": f"amqp://guest:guest@127.0.0.1:{broker.port}/?heartbeat=7&channel_max=5&frame_max=8192",
             "src-queue": "tuned-src", "dest-uri": "amqp:///", "dest-queue": "tuned-dest"}
    status, reply, _ = http_call(broker, "PUT", "/api/parameters/shovel/%2F/tuned", {"value": value})
    assert status in (201, 204), reply
    try:
        def tuned() -> dict | None:
            _status, conns, _ = http_call(broker, "GET", "/api/connections")
            return next((c for c in conns if "(source)" in (c.get("client_properties") or {}).get(
                "connection_name", "") and "tuned" in c["client_properties"]["connection_name"]), None)
        conn = _until(tuned, "the shovel's source connection")
        assert (conn["timeout"], conn["channel_max"], conn["frame_max"]) == (7, 5, 8192)
    finally:
        http_call(broker, "DELETE", "/api/parameters/shovel/%2F/tuned")


def test_a_links_secrets_are_shown_masked(broker: LocalBroker) -> None:
    """The user's password and the key file's passphrase (the ``password`` key) are masked in every status,
    and in the parameters a non-administrator reads (an administrator edits and exports them whole)."""
    src = "amqps://u:user-secret@127.0.0.1:1/?verify=verify_none&password=key-secret&heartbeat=5"
    admin(broker, "PUT", "/api/parameters/shovel/a/masked", _shovel(src))
    admin(broker, "PUT", "/api/parameters/federation-upstream/a/masked", {"value": {"uri": src}})
    try:
        shown = [as_user(broker, "pm", "GET", "/api/parameters/shovel/a/masked")[1]["value"]["src-uri"],
                 as_user(broker, "pm", "GET", "/api/parameters/federation-upstream/a/masked")[1]["value"]["uri"],
                 _terminated(broker, "masked")["src_uri"], _terminated(broker, "masked", "pm")["src_uri"]]
        for text in shown:
            assert "secret" not in text, text
        assert shown[0] == "amqps://u:***@127.0.0.1:1/?verify=verify_none&password=***&heartbeat=5", shown
        assert shown[1] == shown[2] == shown[3] == shown[0], shown
        assert admin(broker, "GET", "/api/parameters/shovel/a/masked")["value"]["src-uri"] == src
    finally:
        http_call(broker, "DELETE", "/api/parameters/shovel/a/masked")
        http_call(broker, "DELETE", "/api/parameters/federation-upstream/a/masked")


def test_a_fifo_named_as_a_links_ca_file_stops_only_that_link(broker: LocalBroker, tmp_path: Path) -> None:
    """An administrator's link naming a FIFO (read for ever by OpenSSL, with the event loop waiting) fails at
    once with a reason, and the broker goes on answering."""
    fifo = tmp_path / "ca-fifo"
    os.mkfifo(fifo)
    admin(broker, "PUT", "/api/parameters/shovel/a/fifo", _shovel(f"amqps://u:p@127.0.0.1:1/?cacertfile={fifo}"))
    try:
        reason = _terminated(broker, "fifo")["reason"]
        assert "is not a regular file" in reason, reason
        assert http_call(broker, "GET", "/api/overview")[0] == 200
    finally:
        http_call(broker, "DELETE", "/api/parameters/shovel/a/fifo")
