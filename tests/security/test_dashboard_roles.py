"""The dashboard's parameters and policies pages in a real browser for the roles RabbitMQ lets read them: a
policymaker sees its vhost's, with URI passwords masked; a monitoring user is told it may not, and stays
logged in."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import LocalBroker
from tests.e2e.test_dashboard import _click, _login, _severe_console_errors, _text, _wait, browser  # noqa: F401

from .conftest import PASSWORDS, admin

pytestmark = pytest.mark.browser


def test_parameters_and_policies_pages_by_role(browser: Any, broker: LocalBroker) -> None:  # noqa: F811
    d = browser
    admin(broker, "PUT", "/api/parameters/shovel/a/dash-remote", {"value": {
        "src-uri": f"amqp://remote:dash-pw-77@127.0.0.1:{broker.port}/a", "src-queue": "q",
        "dest-uri": "amqp:///a", "dest-queue": "open-d", "reconnect-delay": 30}})
    admin(broker, "PUT", "/api/policies/a/dash-pol", {"pattern": "^zz", "definition": {"max-length": 5}})
    admin(broker, "PUT", "/api/policies/b/dash-pol-b", {"pattern": "^zz", "definition": {"max-length": 5}})
    _login(d, broker, "pm", PASSWORDS["pm"])
    _wait(lambda: "pm" in _text(d, "#whoami"), "pm's login")
    d.get(broker.http_url + "/#/parameters")
    table = _wait(lambda: "dash-remote" in _text(d, "#parameters") and _text(d, "#parameters"), "the parameters")
    assert "remote:***@" in table and "dash-pw-77" not in d.page_source, table
    # Edit fills the form from the row (the row also names the user who set the shovel).
    _click(d, '#parameters tr[data-key*="dash-remote"] button.edit')
    form_value = _wait(lambda: d.execute_script(
        "return document.querySelector('#parameter-form').elements['value'].value"), "the filled form")
    assert "remote:***@" in form_value and "dash-pw-77" not in form_value, form_value
    d.get(broker.http_url + "/#/policies")
    table = _wait(lambda: "dash-pol" in _text(d, "#policies") and _text(d, "#policies"), "the policies")
    assert "dash-pol-b" not in table, table
    assert not _severe_console_errors(d)
    d.execute_script("sessionStorage.clear()")
    _login(d, broker, "mon", PASSWORDS["mon"])
    _wait(lambda: "mon" in _text(d, "#whoami"), "mon's login")
    d.get(broker.http_url + "/#/policies")
    flash = _wait(lambda: "may not see policies" in _text(d, "#flash") and _text(d, "#flash"), "the refusal")
    assert "policymaker" in flash, flash
    d.get(broker.http_url + "/#/parameters")
    _wait(lambda: "may not see" in _text(d, "#flash"), "the parameters refusal")
    assert "dash-pw-77" not in d.page_source
    assert "mon" in _text(d, "#whoami")  # still logged in: a refusal is not a failed login
