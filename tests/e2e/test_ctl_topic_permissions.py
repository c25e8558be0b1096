"""Topic permissions through lavinpyctl (rabbitmqctl's forms), enforced on the publishes they name."""

from __future__ import annotations

import json
import uuid

import pika
import pytest

from . import channel_closed
from .conftest import lavinpy_only
from .test_ctl import ctl

pytestmark = lavinpy_only("lavinpyctl against a lavinpy started by the tests")


def _ok(done) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_set_list_enforce_and_clear(broker) -> None:
    vhost, user = f"tv-{uuid.uuid4().hex[:8]}", f"tu-{uuid.uuid4().hex[:8]}"
    _ok(ctl(broker, "add_vhost", vhost))
    _ok(ctl(broker, "add_user", user, "pw"))
    _ok(ctl(broker, "set_permissions", "-p", vhost, user, ".*", ".*", ".*"))
    _ok(ctl(broker, "set_topic_permissions", "-p", vhost, user, "amq.topic", "^{username}\\.", ".*"))
    listed = json.loads(_ok(ctl(broker, "--formatter", "json", "list_topic_permissions", "-p", vhost)))
    assert [(t["user"], t["exchange"], t["write"], t["read"]) for t in listed] == [
        (user, "amq.topic", "^{username}\\.", ".*")]
    mine = json.loads(_ok(ctl(broker, "--formatter", "json", "list_user_topic_permissions", user)))
    assert [(t["vhost"], t["exchange"]) for t in mine] == [(vhost, "amq.topic")]

    conn = pika.BlockingConnection(pika.URLParameters(broker.url_for(user, "pw", vhost)))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", f"{user}.ok", b"allowed")
        with channel_closed(403, f"access to topic 'other.x' in exchange 'amq.topic' in vhost '{vhost}'"):
            ch.basic_publish("amq.topic", "other.x", b"refused")
            ch.basic_qos(prefetch_count=0)
    finally:
        conn.close()

    _ok(ctl(broker, "clear_topic_permissions", "-p", vhost, user, "amq.topic"))
    assert json.loads(_ok(ctl(broker, "--formatter", "json", "list_topic_permissions", "-p", vhost))) == []
    bad = ctl(broker, "set_topic_permissions", "-p", vhost, "nobody", "amq.topic", ".*", ".*")
    assert bad.returncode != 0 and "nobody" in (bad.stdout + bad.stderr)
    _ok(ctl(broker, "delete_vhost", vhost))
    _ok(ctl(broker, "delete_user", user))


@pytest.mark.parametrize("argv", [["set_topic_permissions", "u", "amq.topic", ".*"], ["list_user_topic_permissions"]])
def test_usage_errors_exit_64(broker, argv) -> None:
    assert ctl(broker, *argv).returncode == 64
