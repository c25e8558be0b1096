"""The dashboard's shovel parts in a real browser: the Shovels page and the queue page's "Move messages"
(a one-off shovel with src-delete-after: queue-length, defined through /api/parameters/shovel)."""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest

from .conftest import http_call
from .test_dashboard import _click, _fill, _login, _severe_console_errors, _text, _wait, browser  # noqa: F401

pytestmark = pytest.mark.browser


def test_move_messages_and_shovels_page(browser: Any, fresh_broker: Any) -> None:  # noqa: F811
    d = browser
    conn = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    ch = conn.channel()
    ch.queue_declare("move-src", durable=True)
    for i in range(20):
        ch.basic_publish("", "move-src", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    _login(d, fresh_broker)
    _wait(lambda: _text(d, "#whoami"), "the login")
    d.get(fresh_broker.http_url + "/#/shovels")
    _wait(lambda: "Forwarded" in _text(d, "#shovels"), "the shovels table")
    d.get(fresh_broker.http_url + "/#/queue/%2F/move-src")
    _wait(lambda: _text(d, "#move-messages"), "the Move messages form")
    # The shovel's URI is this node with no credentials (RabbitMQ's "amqp:///vhost"): it runs as the
    # logged-in user without the page writing that user's password into a parameter.
    assert d.execute_script("return localShovelUri('/')") == "amqp:///%2F"
    _fill(d, "#move-destination", "move-dst")
    _click(d, "#move-messages button")
    flash = _wait(lambda: _text(d, "#flash"), "the flash line")
    if "Not Found" in flash or "not found" in flash:
        pytest.skip("PUT /api/parameters/shovel is not served by this build")
    assert "Moving the messages" in flash, flash
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # both counts: the source's is settled after the destination's confirms
        status, queue, _ = http_call(fresh_broker, "GET", "/api/queues/%2F/move-dst")
        if (status == 200 and queue.get("messages") == 20
                and http_call(fresh_broker, "GET", "/api/queues/%2F/move-src")[1]["messages"] == 0):
            break
        time.sleep(0.2)
    assert http_call(fresh_broker, "GET", "/api/queues/%2F/move-dst")[1]["messages"] == 20
    assert http_call(fresh_broker, "GET", "/api/queues/%2F/move-src")[1]["messages"] == 0
    _wait(lambda: http_call(fresh_broker, "GET", "/api/shovels")[1] == [], "the one-off shovel to go")
    # Pause and resume from the shovels page.
    value = {"src-uri": "amqp://", "src-queue": "move-src", "dest-uri": "amqp://", "dest-queue": "move-dst"}
    assert http_call(fresh_broker, "PUT", "/api/parameters/shovel/%2F/kept", {"value": value})[0] in (201, 204)

    def state() -> str:
        return http_call(fresh_broker, "GET", "/api/shovels/vhost/%2F/kept")[1]["state"]
    _wait(lambda: state() == "running", "the shovel running")
    d.get(fresh_broker.http_url + "/#/shovels")
    _wait(lambda: "Pause" in _text(d, "#shovels .pause-resume"), "the Pause button")
    _click(d, "#shovels .pause-resume")
    _wait(lambda: state() == "paused", "the shovel paused")
    _wait(lambda: "Resume" in _text(d, "#shovels .pause-resume"), "the Resume button")
    _click(d, "#shovels .pause-resume")
    _wait(lambda: state() == "running", "the shovel resumed")
    assert not _severe_console_errors(d)
