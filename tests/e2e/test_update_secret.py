"""connection.update-secret over TCP with pika on a password's login: answered update-secret-ok and
the connection goes on, whatever the secret, as RabbitMQ answers it for backends whose credentials do
not expire (its internal one); the user's permissions still decide each later operation. (A token's
new secret is checked: tests/e2e/test_oauth2.py.)"""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from .conftest import http_call, lavinpy_only

pytestmark = lavinpy_only("users made through the management API of a lavinpy started by the tests")


def _user(b, name: str, password: str, configure: str = ".*") -> None:
    assert http_call(b, "PUT", f"/api/users/{name}", {"password": password, "tags": ""})[0] in (201, 204)
    assert http_call(b, "PUT", f"/api/permissions/%2F/{name}",
                     {"configure": configure, "write": ".*", "read": ".*"})[0] in (201, 204)


def test_a_password_login_takes_any_new_secret_and_permissions_still_decide(fresh_broker):
    b = fresh_broker
    _user(b, "rot", "one")
    conn = pika.BlockingConnection(pika.URLParameters(b.url_for("rot", "one")))
    ch = conn.channel()
    _user(b, "rot", "two")
    conn.update_secret("two", "rotation")
    assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    conn.update_secret("not the password", "unchecked, as RabbitMQ's internal backend")
    assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    _user(b, "rot", "two", configure="^own-")  # fewer rights: the next declare is refused
    conn.update_secret("two", "after the change")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_declare("shared")
    assert closed.value.reply_code == 403
    assert conn.is_open
    conn.close()
