"""Fixtures: one lavinpy process per test module, with vhosts ``a`` and ``b`` and users of each role.

- ``guest``: the default administrator (the broker's configured default user);
- ``pm``: policymaker, configure and write on everything of ``a``, read only on queues named ``open-*``;
  no access to ``b``;
- ``mon``: monitoring, full permissions on ``/``, ``a`` and ``b``;
- ``pmall``: policymaker with full permissions on ``/`` (the dashboard's Move messages as a non-admin).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.e2e.conftest import LocalBroker, http_call

pytestmark = pytest.mark.timeout(120)

PASSWORDS = {"pm": "pm-secret-1", "mon": "mon-secret-2", "pmall": "pmall-secret-3"}


def admin(broker: LocalBroker, method: str, path: str, body: Any = None, password: str = "guest") -> Any:
    status, reply, _ = http_call(broker, method, path, body, password=password)
    assert status in (200, 201, 204), (method, path, status, reply)
    return reply


def as_user(broker: LocalBroker, user: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    status, reply, _ = http_call(broker, method, path, body, user=user, password=PASSWORDS[user])
    return status, reply


def publish(broker: LocalBroker, vhost: str, queue: str, count: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url_for("guest", "guest", vhost)))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()


def messages(broker: LocalBroker, vhost: str, queue: str, password: str = "guest") -> int:
    """The queue's length over AMQP (-1: no such queue)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url_for("guest", password, vhost)))
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return -1
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    b = LocalBroker(Path(tmp_path_factory.mktemp("security")))
    b.start()
    try:
        for vhost in ("a", "b"):
            admin(b, "PUT", f"/api/vhosts/{vhost}")
        admin(b, "PUT", "/api/users/pm", {"password": PASSWORDS["pm"], "tags": "policymaker"})
        admin(b, "PUT", "/api/permissions/a/pm", {"configure": ".*", "write": ".*", "read": "^open-.*"})
        admin(b, "PUT", "/api/users/mon", {"password": PASSWORDS["mon"], "tags": "monitoring"})
        for vhost in ("%2F", "a", "b"):
            admin(b, "PUT", f"/api/permissions/{vhost}/mon", {"configure": ".*", "write": ".*", "read": ".*"})
            admin(b, "PUT", f"/api/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
        admin(b, "PUT", "/api/users/pmall", {"password": PASSWORDS["pmall"], "tags": "policymaker"})
        admin(b, "PUT", "/api/permissions/%2F/pmall", {"configure": ".*", "write": ".*", "read": ".*"})
        yield b
    finally:
        b.close()
