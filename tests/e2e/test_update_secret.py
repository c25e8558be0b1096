"""connection.update-secret over TCP with pika: a rotated password is accepted on a live connection,
a wrong one closes it with 530 NOT_ALLOWED (RabbitMQ's answer)."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from .conftest import http_call, lavinpy_only

pytestmark = lavinpy_only("users made through the management API of a lavinpy started by the tests")


def _user(b, name: str, password: str) -> None:
    assert http_call(b, "PUT", f"/api/users/{name}", {"password": password, "tags": ""})[0] in (201, 204)
    assert http_call(b, "PUT", f"/api/permissions/%2F/{name}",
                     {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)


def test_rotated_password_keeps_the_connection_and_a_wrong_one_closes_it(fresh_broker):
    b = fresh_broker
    _user(b, "rot", "one")
    conn = pika.BlockingConnection(pika.URLParameters(b.url_for("rot", "one")))
    ch = conn.channel()
    _user(b, "rot", "two")
    conn.update_secret("two", "rotation")
    assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.update_secret("one", "stale")
        ch.queue_declare("", exclusive=True)
    assert closed.value.reply_code == 530
    assert closed.value.reply_text == "NOT_ALLOWED - New secret was refused by one of the backends"
