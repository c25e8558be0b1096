"""The dashboard's node page, alarm banner, connection states and charts from the broker's samples, in
headless Chromium (as test_dashboard.py drives it). Each test runs its own broker: the alarms they
raise would block every other test's publishers."""

from __future__ import annotations

import os
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pika
import pytest
from pamqp import commands

from .conftest import REPO_ROOT, http_call
from .rawamqp import RawAMQP
from .test_dashboard import _click, _fill, _login, _severe_console_errors, _text, _wait
from .test_dashboard import browser as browser  # noqa: F401  (the fixture, shared)
from .test_dashboard import pytestmark as dashboard_marks
from .test_http_stats import restart_with_config
from .test_node_thresholds_samples import wait_for_aligned_point

pytestmark = dashboard_marks
# The screenshot kept in docs/ (for the README and release notes) is refreshed only when asked for:
# a test run leaves the checkout as it found it.
SCREENSHOT = REPO_ROOT / "docs" / "img" / "node-page.png"
SAVE_SCREENSHOT = os.environ.get("LAVINPY_SAVE_SCREENSHOTS") == "1"


def _node_path(b: Any) -> str:
    status, nodes, _ = http_call(b, "GET", "/api/nodes")
    assert status == 200, nodes
    return "/api/nodes/" + urllib.parse.quote(nodes[0]["name"], safe="")


def _set_disk_limit(b: Any, value: str) -> None:
    status, body, _ = http_call(b, "PUT", _node_path(b) + "/disk_free_limit", {"bytes": value})
    assert status == 200, body


def _banner(d: Any) -> str:
    element = d.find_element("css selector", "#alarm-banner")
    return element.text if element.is_displayed() else ""


def test_node_page_figures_and_alarm_banner_on_every_page(browser: Any, fresh_broker: Any,
                                                          tmp_path: Path) -> None:
    d, b = browser, fresh_broker
    d.set_window_size(1100, 1000)
    _login(d, b)
    _wait(lambda: d.current_url.endswith("#/overview"), "the overview")
    _click(d, 'a[href="#/node"]')
    _wait(lambda: "lavinpy" in _text(d, "#node-version"), "the node's version")
    node = http_call(b, "GET", _node_path(b))[1]
    assert _text(d, "#node-name") == node["name"]
    assert " of " in _text(d, "#node-memory") and "high watermark" in _text(d, "#node-memory")
    assert "limit" in _text(d, "#node-disk")
    fds = _text(d, "#node-fds")
    assert fds.endswith(f" of {node['fd_total']}") and int(fds.split()[0]) > 0, fds
    assert _text(d, "#node-uptime").endswith("s")
    ports = {r.text.split()[-1] for r in d.find_elements("css selector", "#node-listeners tr")[1:]}
    assert {str(b.port), str(b.http_port)} <= ports, ports
    assert _text(d, "#node-alarms") == "No alarms" and _banner(d) == ""
    for gauge in ("#gauge-memory", "#gauge-disk", "#gauge-fds"):
        assert d.find_element("css selector", gauge).is_displayed()
    shot = tmp_path / "node-page.png"
    assert d.save_screenshot(str(shot)) and 5_000 < shot.stat().st_size < 400_000
    if SAVE_SCREENSHOT:
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)

    # A disk alarm: the banner appears on this page and on every other, the node page names it.
    _set_disk_limit(b, "1000000TB")
    _wait(lambda: "free disk space" in _banner(d), "the alarm banner", timeout=12)
    _wait(lambda: "disk" in _text(d, "#node-alarms"), "the node page's alarm")
    for page in ("queues", "connections", "overview", "policies"):
        _click(d, f'a[href="#/{page}"]')
        assert "Publishers are blocked" in _banner(d), page

    # Cleared through the node page's own threshold form: the banner goes.
    _click(d, 'a[href="#/node"]')
    _wait(lambda: d.find_elements("css selector", "#disk-free-limit"), "the threshold form")
    _fill(d, "#disk-free-limit", "50MB")
    _click(d, "#threshold-form button[type=submit]")
    _wait(lambda: _text(d, "#flash") == "Thresholds set", "the thresholds to be set")
    assert http_call(b, "GET", _node_path(b))[1]["disk_free_limit"] == 50_000_000
    _wait(lambda: _banner(d) == "", "the banner to go")
    _wait(lambda: _text(d, "#node-alarms") == "No alarms", "the node page without alarms")

    # A memory alarm raised elsewhere (the API) shows as well, and goes when cleared.
    status, _, _ = http_call(b, "PUT", _node_path(b) + "/memory_high_watermark", {"absolute": "1MB"})
    assert status == 200
    _wait(lambda: "memory above" in _banner(d), "the memory alarm banner", timeout=12)
    status, _, _ = http_call(b, "PUT", _node_path(b) + "/memory_high_watermark", {"fraction": 0.99})
    _wait(lambda: _banner(d) == "", "the memory alarm banner to go", timeout=12)
    assert _severe_console_errors(d) == []


def test_blocked_publisher_shows_blocked_on_the_connections_page(browser: Any, fresh_broker: Any) -> None:
    d, b = browser, fresh_broker
    quiet, publisher = RawAMQP(b.host, b.port), RawAMQP(b.host, b.port)
    try:
        quiet.handshake()
        publisher.handshake()
        publisher.open_channel(1)
        _set_disk_limit(b, "1000000TB")
        publisher.expect(commands.Connection.Blocked, 0, timeout=5)
        publisher.publish(1, "", "nowhere", b"held back by the alarm")
        _login(d, b)
        _wait(lambda: d.current_url.endswith("#/overview"), "the overview")
        _click(d, 'a[href="#/connections"]')

        def states() -> list[str]:
            return sorted(e.text for e in d.find_elements("css selector", "#connections td .state"))

        assert _wait(lambda: states() == ["blocked", "blocking"], "a blocked and a blocking connection")
        _set_disk_limit(b, "50MB")
        _wait(lambda: states() == ["running", "running"], "both running again", timeout=12)
    finally:
        quiet.close()
        publisher.close()


@pytest.fixture
def sampled_broker(fresh_broker: Any) -> Any:
    restart_with_config(fresh_broker, "stats_sample_interval: 0.5\n")
    return fresh_broker


def test_queue_chart_is_full_on_load_and_messages_go_with_the_page(browser: Any, sampled_broker: Any,
                                                                 tmp_path: Path) -> None:
    d, b = browser, sampled_broker
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        ch = conn.channel()
        ch.queue_declare("charted")
        ch.confirm_delivery()
        for i in range(10):  # over 11 s: more than two 5-second points of history
            ch.basic_publish("", "charted", f"m{i}a".encode())
            ch.basic_publish("", "charted", f"m{i}b".encode())
            time.sleep(1.1)
    finally:
        conn.close()
    wait_for_aligned_point()

    _login(d, b)
    _wait(lambda: d.current_url.endswith("#/overview"), "the overview")
    # The overview's charts: drawn from the first reply, several points at once.
    rate = _wait(lambda: d.find_element("css selector", "#rate-chart").get_attribute("data-points"), "the rate chart")
    assert int(rate) >= 3, rate
    d.get(f"{b.http_url}/#/queue/%2F/charted")
    canvas = _wait(lambda: d.find_element("css selector", "#depth-chart").get_attribute("data-points") and
                   d.find_element("css selector", "#depth-chart"), "the depth chart")
    # One reply drew it: two series with a point per 5 s since the queue had messages, at least two
    # each (a chart fed by the browser's own polls would have one point per series now).
    assert int(canvas.get_attribute("data-points")) >= 4, canvas.get_attribute("data-points")
    assert canvas.get_attribute("data-max") == "20"
    assert _text(d, "#depth-messages_ready") == "20"

    # Messages read by peek are shown on this page only.
    _fill(d, "#peek-count", "2")
    _click(d, "#peek")
    _wait(lambda: d.find_elements("css selector", "#messages tbody tr"), "peeked messages")
    _click(d, 'a[href="#/queues"]')  # the page changes on the next turn of the browser's loop
    _wait(lambda: not d.find_elements("css selector", "#messages"), "the queues page without the peeked messages")
    d.get(f"{b.http_url}/#/queue/%2F/charted")
    _wait(lambda: d.find_elements("css selector", "#depth-chart"), "the queue page again")
    assert d.find_elements("css selector", "#messages tbody tr") == []
    assert _severe_console_errors(d) == []
