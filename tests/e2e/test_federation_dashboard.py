"""The dashboard's Federation page in a real browser: an upstream added through its form (to this same
node, "amqp://"), a policy federating an exchange, the link listed as running and restarted."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import http_call
from .test_dashboard import _click, _fill, _login, _severe_console_errors, _text, _wait, browser  # noqa: F401

pytestmark = pytest.mark.browser


def test_federation_page(browser: Any, fresh_broker: Any) -> None:  # noqa: F811
    d = browser
    b = fresh_broker
    assert http_call(b, "PUT", "/api/exchanges/%2F/dash.fed", {"type": "fanout", "durable": True})[0] in (201, 204)
    _login(d, b)
    _wait(lambda: _text(d, "#whoami"), "the login")
    d.get(b.http_url + "/#/federation")
    _wait(lambda: "Upstream" in _text(d, "#federation-links"), "the links table")
    _fill(d, "#add-upstream input[name=name]", "self")
    _fill(d, "#add-upstream input[name=uri]", b.url)
    _click(d, "#add-upstream button")
    _wait(lambda: "self" in _text(d, "#federation-upstreams"), "the new upstream listed")
    assert http_call(b, "GET", "/api/parameters/federation-upstream/%2F/self")[1]["value"]["uri"] == b.url
    policy = {"pattern": "^dash\\.fed$", "apply-to": "exchanges", "definition": {"federation-upstream": "self"}}
    assert http_call(b, "PUT", "/api/policies/%2F/dash", policy)[0] in (201, 204)
    _wait(lambda: "running" in _text(d, "#federation-links"), "the link running")
    _click(d, "#federation-links button")
    _wait(lambda: "restarted" in _text(d, "#flash"), "the restart")
    assert not _severe_console_errors(d)
