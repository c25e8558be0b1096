"""MQTT connections in the dashboard, in a real browser (headless chromium, as the other dashboard
tests): listed beside AMQP ones, a page of their own with the session's subscriptions, closed there."""

from __future__ import annotations

from typing import Any

import pika

from tests.e2e.test_dashboard import _accept_confirm, _click, _login, _severe_console_errors, _text, _wait
from tests.e2e.test_dashboard import browser as browser  # noqa: F401 - the fixture, shared
from tests.e2e.test_dashboard import pytestmark as pytestmark  # noqa: F401 - skipped as the dashboard tests are

from .conftest import MQTTBroker, Paho, unique


def _rows(driver: Any) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    return [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in driver.find_elements(By.CSS_SELECTOR, "#connections tbody tr")]


def _open(driver: Any, name: str) -> None:
    """Follow the list's link to one connection's page."""
    from selenium.webdriver.common.by import By

    _wait(lambda: driver.find_elements(By.LINK_TEXT, name), f"the link to {name}")[0].click()


def test_mqtt_connection_listed_shown_and_closed_in_the_dashboard(browser: Any, mqtt_broker: MQTTBroker) -> None:
    d, b = browser, mqtt_broker
    client_id = unique("dash")
    device = Paho(b.mqtt_port, client_id)
    device.client.reconnect_delay_set(60, 120)  # closed by the test: paho is not to come back meanwhile
    device.connect()
    device.subscribe(f"{client_id}/+/temp", 1)
    device.subscribe(f"{client_id}/status", 0)
    amqp = pika.BlockingConnection(pika.URLParameters(b.url))
    amqp.channel()
    try:
        _login(d, b)
        _wait(lambda: _text(d, "#whoami"), "the login")
        _click(d, 'a[href="#/connections"]')
        # columns: name, user, vhost, protocol, channels, state, client, (close)
        mqtt_row = _wait(lambda: next((r for r in _rows(d) if r[6] == client_id), None), "the MQTT row")
        assert mqtt_row[1:6] == ["guest", "/", "MQTT 3.1.1", "0", "running"]
        assert any(r[3] == "AMQP 0-9-1" and r[4] == "1" for r in _rows(d))

        _open(d, mqtt_row[0])
        _wait(lambda: _text(d, '#connection-details td[data-field="protocol"]') == "MQTT 3.1.1", "the MQTT page")
        assert _text(d, '#connection-details td[data-field="client"]') == client_id
        subscriptions = _wait(lambda: _text(d, "#mqtt-subscriptions"), "the subscriptions")
        assert f"{client_id}/+/temp 1 mqtt-subscription-{client_id}qos1" in subscriptions
        assert f"{client_id}/status 0 mqtt-subscription-{client_id}qos0" in subscriptions
        assert "clean session true" in _text(d, "#connection-extra")

        d.get(b.http_url + "/#/connections")
        amqp_row = _wait(lambda: next((r for r in _rows(d) if r[3] == "AMQP 0-9-1"), None), "the AMQP row")
        _open(d, amqp_row[0])
        _wait(lambda: _text(d, '#connection-details td[data-field="protocol"]') == "AMQP 0-9-1", "the AMQP page")
        assert _wait(lambda: len(_text(d, "#connection-channels").splitlines()) == 2, "its one channel")

        # Closing the MQTT connection from its page: the client is disconnected.
        d.get(b.http_url + "/#/connections")
        _wait(lambda: any(r[6] == client_id for r in _rows(d)), "the MQTT row again")
        _open(d, mqtt_row[0])
        _wait(lambda: _text(d, '#connection-details td[data-field="client"]') == client_id, "the MQTT page again")
        _click(d, "button.close-connection")
        _accept_confirm(d)
        device.disconnects.get(timeout=10)
        _wait(lambda: d.current_url.endswith("#/connections"), "back on the list")
        _wait(lambda: _rows(d) and not any(r[6] == client_id for r in _rows(d)), "the MQTT row gone")
        assert _severe_console_errors(d) == []
    finally:
        device.client.loop_stop()
        amqp.close()
