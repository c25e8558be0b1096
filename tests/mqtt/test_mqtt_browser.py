"""MQTT over WebSocket from a real browser: headless chromium (driven as the dashboard tests drive it)
loads a page served over HTTP with a small MQTT 3.1.1 client written for the test (browser_client.html),
which connects to the broker's /ws with the subprotocol "mqtt". A message pika publishes to amq.topic
reaches the page; a message the page publishes with QoS 1 reaches a pika consumer."""

from __future__ import annotations

import functools
import http.server
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.e2e.conftest import http_call
from tests.e2e.test_dashboard import _wait
from tests.e2e.test_dashboard import browser as browser  # noqa: F401 - the fixture, shared
from tests.e2e.test_dashboard import pytestmark as pytestmark  # noqa: F401 - skipped as the dashboard tests are

from .conftest import MQTTBroker, unique

PAGE = Path(__file__).with_name("browser_client.html")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def page_server() -> Iterator[str]:
    """An HTTP server of this directory's page (the page's origin is not the broker's, as in a web app)."""
    handler = functools.partial(_Quiet, directory=str(PAGE.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{PAGE.name}"
    finally:
        server.shutdown()
        server.server_close()


def test_browser_page_speaks_mqtt_over_websocket_with_amqp(browser: Any, mqtt_broker: MQTTBroker,
                                                           page_server: str) -> None:
    d, b = browser, mqtt_broker
    prefix = unique("browser")
    amqp = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        channel = amqp.channel()
        inbox = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(inbox, "amq.topic", f"{prefix}.from.browser")  # MQTT topic <prefix>/from/browser
        query = urllib.parse.urlencode({"ws": f"ws://127.0.0.1:{b.http_port}/ws", "client": prefix,
                                        "sub": f"{prefix}/to/+"})
        d.get(f"{page_server}?{query}")
        state = lambda: d.execute_script("return window.mqtt")  # noqa: E731
        _wait(lambda: state()["suback"] is not None, "the page's SUBACK")
        assert (state()["protocol"], state()["connack"], state()["suback"]) == ("mqtt", 0, 1)

        channel.basic_publish("amq.topic", f"{prefix}.to.browser", b"hello browser")
        received = _wait(lambda: state()["received"], "the message in the page")
        assert received == [{"topic": f"{prefix}/to/browser", "qos": 1, "retain": False, "payload": "hello browser"}]
        # The page's PUBACK settles the delivery on the subscription's queue.
        queue_path = f"/api/queues/%2F/mqtt-subscription-{prefix}qos1"
        _wait(lambda: http_call(b, "GET", queue_path)[1].get("messages_unacknowledged") == 0, "the delivery acked")

        packet_id = d.execute_script("return window.publish(arguments[0], 'hello broker', 1)", f"{prefix}/from/browser")
        _wait(lambda: packet_id in state()["pubacks"], "the PUBACK in the page")
        method, properties, body = _wait(lambda: (got := channel.basic_get(inbox, auto_ack=True))[0] and got,
                                         "the page's message in the AMQP queue")
        assert body == b"hello broker" and method.routing_key == f"{prefix}.from.browser"
        assert properties.delivery_mode == 2 and properties.headers["x-mqtt-publish-qos"] == 1
        assert not state()["closed"]
    finally:
        amqp.close()
