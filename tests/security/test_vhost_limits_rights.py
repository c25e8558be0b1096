"""Vhost limits are changed by administrators only, as in RabbitMQ: a policymaker of the vhost is refused on
every face (the limits routes, the ``vhost-limits`` parameter, lavinpyctl), and the limits stay as they were."""

from __future__ import annotations

from tests.e2e.conftest import LocalBroker
from tests.e2e.test_ctl import ctl

from .conftest import PASSWORDS, admin, as_user


def _limits(broker: LocalBroker) -> dict:
    rows = admin(broker, "GET", "/api/vhost-limits/a")
    return rows[0]["value"] if rows else {}


def test_policymaker_may_not_change_vhost_limits(broker: LocalBroker) -> None:
    admin(broker, "PUT", "/api/vhost-limits/a/max-queues", {"value": 50})
    attempts = [
        ("PUT", "/api/vhost-limits/a/max-queues", {"value": 1}),
        ("PUT", "/api/vhost-limits/a/max-connections", {"value": 0}),
        ("DELETE", "/api/vhost-limits/a/max-queues", None),
        ("PUT", "/api/parameters/vhost-limits/a/limits", {"value": {"max-queues": 1}}),
        ("DELETE", "/api/parameters/vhost-limits/a/limits", None),
    ]
    for method, path, body in attempts:
        status, reply = as_user(broker, "pm", method, path, body)
        assert status == 401, (method, path, status, reply)
        assert "administrator" in reply["reason"], reply
    done = ctl(broker, "set_vhost_limits", "-p", "a", '{"max-queues": 1}', user="pm", password=PASSWORDS["pm"])
    assert done.returncode != 0 and "administrator" in done.stderr, done.stdout + done.stderr
    done = ctl(broker, "clear_vhost_limits", "-p", "a", user="pm", password=PASSWORDS["pm"])
    assert done.returncode != 0, done.stdout + done.stderr
    assert _limits(broker) == {"max-queues": 50}
    # The policymaker still reads them, and an administrator still changes them.
    status, rows = as_user(broker, "pm", "GET", "/api/vhost-limits/a")
    assert status == 200 and rows[0]["value"] == {"max-queues": 50}, rows
    admin(broker, "DELETE", "/api/vhost-limits/a/max-queues")
    assert _limits(broker) == {}
    # Monitoring users may not either (they were never policymakers).
    status, reply = as_user(broker, "mon", "PUT", "/api/vhost-limits/a/max-queues", {"value": 1})
    assert status == 401, reply
