"""Shovels defined through /api/parameters/shovel (the parameters registry, with the server's shovel
component registered): a bad definition is a 400 naming the key, a shovel runs, survives a kill -9 of its
broker (started again at boot), restarts, a one-off move deletes itself and its parameter, and DELETE
/api/shovels/vhost/... removes both. Skipped while this build serves no shovel parameters."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika

from tests.e2e.conftest import http_call

from .test_shovel_engine import _count, _publish


def _moved(url: str, queue: str) -> int:
    """The destination queue's length; -1 until the shovel has declared it."""
    try:
        return _count(url, queue)
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code != 404:
            raise
        return -1


def _until(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _put(broker: Any, name: str, value: dict) -> tuple[int, Any]:
    status, body, _ = http_call(broker, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": value})
    return status, body


def test_shovel_parameters_through_the_api(one_broker) -> None:
    a = one_broker
    status, body = _put(a, "bad", {"src-uri": "amqp://", "src-queue": "x", "dest-uri": "amqp://", "ack-mode": "maybe"})
    assert status == 400 and "ack-mode" in body["reason"], body
    _publish(a.url, "p-src", 100)
    assert _put(a, "p1", {"src-uri": "amqp://", "src-queue": "p-src", "dest-uri": "amqp://",
                          "dest-queue": "p-dst", "reconnect-delay": 0.5})[0] in (201, 204)
    _until(lambda: _moved(a.url, "p-dst") == 100, "the messages moved")
    row = http_call(a, "GET", "/api/shovels")[1][0]
    assert (row["name"], row["state"], row["forwarded"]) == ("p1", "running", 100)
    a.kill9()
    a.start()
    _until(lambda: [r for r in http_call(a, "GET", "/api/shovels")[1] if r["state"] == "running"],
           "the shovel running again after the restart")
    _publish(a.url, "p-src", 10)
    # At least the 110: the kill may have lost the source's acks of moved messages (on-confirm moves
    # them again: duplicates, never losses).
    _until(lambda: _count(a.url, "p-dst") >= 110 and _count(a.url, "p-src") == 0, "the new messages moved")
    assert http_call(a, "DELETE", "/api/shovels/vhost/%2F/p1/restart")[0] == 204
    _publish(a.url, "once-src", 30)
    assert _put(a, "once", {"src-uri": "amqp://", "src-queue": "once-src", "dest-uri": "amqp://",
                            "dest-queue": "once-dst", "src-delete-after": "queue-length"})[0] in (201, 204)
    _until(lambda: "once" not in [r["name"] for r in http_call(a, "GET", "/api/shovels")[1]], "the one-off to go")
    assert _count(a.url, "once-dst") == 30
    assert http_call(a, "GET", "/api/parameters/shovel/%2F/once")[0] == 404
    assert http_call(a, "DELETE", "/api/shovels/vhost/%2F/p1")[0] == 204
    assert http_call(a, "GET", "/api/parameters/shovel/%2F/p1")[0] == 404
    assert http_call(a, "GET", "/api/shovels")[1] == []
