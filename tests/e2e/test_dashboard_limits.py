"""The dashboard's limits, operator policies and parameters pages in a real browser (headless chromium)."""

from __future__ import annotations

from typing import Any

from .conftest import http_call
from .test_dashboard import _click, _fill, _login, _name, _severe_console_errors, _text, _wait
from .test_dashboard import browser as browser  # noqa: F401 - the fixture, shared
from .test_dashboard import pytestmark as pytestmark  # noqa: F401 - skipped as the dashboard tests are


def _select(driver: Any, css: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.CSS_SELECTOR, css)).select_by_value(value)


def test_limits_operator_policies_and_parameters_pages(browser: Any, broker: Any) -> None:
    d = browser
    vhost = _name("dash")
    assert http_call(broker, "PUT", f"/api/vhosts/{vhost}")[0] in (201, 204)
    _login(d, broker)
    _wait(lambda: _text(d, "#whoami"), "the login")
    d.get(broker.http_url + "/#/limits")
    _fill(d, "#vhost-limit-form input[name=vhost]", vhost)
    _select(d, "#vhost-limit-form select[name=name]", "max-queues")
    _fill(d, "#vhost-limit-form input[name=value]", "3")
    _click(d, "#vhost-limit-form button")
    _wait(lambda: vhost in _text(d, "#vhost-limits") and '"max-queues":3' in _text(d, "#vhost-limits"),
          "the vhost limit listed")
    assert http_call(broker, "GET", f"/api/vhost-limits/{vhost}")[1] == [{"vhost": vhost, "value": {"max-queues": 3}}]

    d.get(broker.http_url + "/#/operator-policies")
    _fill(d, "#operator-policy-form input[name=vhost]", vhost)
    _fill(d, "#operator-policy-form input[name=name]", "cap")
    _fill(d, "#operator-policy-form input[name=pattern]", ".*")
    _fill(d, "#operator-policy-form input[name=definition]", '{"max-length": 10}')
    _click(d, "#operator-policy-form button")
    _wait(lambda: "cap" in _text(d, "#operator-policies"), "the operator policy listed")
    _fill(d, "#operator-policy-form input[name=name]", "bad")
    _fill(d, "#operator-policy-form input[name=definition]", '{"alternate-exchange": "x"}')
    _click(d, "#operator-policy-form button")
    _wait(lambda: "alternate-exchange" in _text(d, "#flash"), "the refusal shown")

    d.get(broker.http_url + "/#/parameters")
    _wait(lambda: "vhost-limits" in _text(d, "#parameters"), "the vhost-limits parameter listed")
    _fill(d, "#global-parameter-form input[name=name]", "cluster_name")
    _fill(d, "#global-parameter-form input[name=value]", '"dash-cluster"')
    _click(d, "#global-parameter-form button")
    _wait(lambda: "dash-cluster" in _text(d, "#global-parameters"), "the global parameter listed")
    assert http_call(broker, "GET", "/api/overview")[1]["cluster_name"] == "dash-cluster"
    assert http_call(broker, "DELETE", "/api/global-parameters/cluster_name")[0] == 204
    assert _severe_console_errors(d) == [] or all("400" in e["message"] for e in _severe_console_errors(d))


def test_topic_permissions_page_sets_lists_and_deletes(browser: Any, broker: Any) -> None:
    d = browser
    user = _name("topicdash")
    assert http_call(broker, "PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] in (201, 204)
    try:
        _login(d, broker)
        _wait(lambda: _text(d, "#whoami"), "the login")
        d.get(broker.http_url + "/#/topic-permissions")
        _fill(d, "#topic-permission-form input[name=user]", user)
        _fill(d, "#topic-permission-form input[name=write]", "^sensors\\.")
        _fill(d, "#topic-permission-form input[name=read]", "^alerts\\.")
        _click(d, "#topic-permission-form button")
        _wait(lambda: user in _text(d, "#topic-permissions") and "^sensors\\." in _text(d, "#topic-permissions"),
              "the topic permission listed")
        assert http_call(broker, "GET", f"/api/users/{user}/topic-permissions")[1] == [
            {"user": user, "vhost": "/", "exchange": "amq.topic", "write": "^sensors\\.", "read": "^alerts\\."}]
        key = f"topic permissions of '{user}' on 'amq.topic' in '/'"
        _click(d, f'#topic-permissions tr[data-key="{key}"] button.delete')
        d.switch_to.alert.accept()
        _wait(lambda: user not in _text(d, "#topic-permissions"), "the topic permission gone from the list")
        assert http_call(broker, "GET", f"/api/users/{user}/topic-permissions")[1] == []
    finally:
        http_call(broker, "DELETE", f"/api/users/{user}")
