"""Permission changes made at run time through the broker's Python API, policies set by a user, and the
modes of the files in the data directory. The broker runs in-process so that the test can call its API."""

from __future__ import annotations

import json
import os
import stat

import pika
import pytest

from lavinpy.broker.errors import ACCESS_REFUSED, BrokerChannelError

from . import channel_closed, uid
from .conftest import lavinpy_only, rabbit_password_hash
from .test_policies_alarms import InProcessBroker

pytestmark = lavinpy_only("calls the broker's Python API in-process")

PASSWORD = "pw-runtime"


@pytest.fixture
def inproc(tmp_path):
    # A permissive umask, as a default system has: the modes checked below must not depend on it.
    old_umask = os.umask(0o022)
    brokers: list[InProcessBroker] = []

    def start() -> InProcessBroker:
        b = InProcessBroker(tmp_path / f"b{len(brokers)}")
        brokers.append(b)
        return b
    try:
        yield start
    finally:
        for b in brokers:
            if b.thread.is_alive():
                b.stop()
        os.umask(old_umask)


def _url(b: InProcessBroker, username: str, password: str = PASSWORD) -> str:
    return f"amqp://{username}:{password}@127.0.0.1:{b.port}/%2F"


def _add_user(b: InProcessBroker, name: str, configure: str, write: str, read: str,
              tags: tuple[str, ...] = ()) -> None:
    users = b.broker.users
    b.call(users.add_user, name, PASSWORD, tags)
    b.call(users.set_permissions, name, "/", configure, write, read)


def test_permission_change_applies_to_open_connection(inproc):
    b = inproc()
    name = uid("u")
    _add_user(b, name, ".*", ".*", ".*")
    conn = pika.BlockingConnection(pika.URLParameters(_url(b, name)))
    ch = conn.channel()
    q = uid("q")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"before")  # the channel now caches the permission-checked exchange
    assert ch.queue_declare(q, passive=True).method.message_count == 1

    b.call(b.broker.users.set_permissions, name, "/", "^other", "^other", ".*")
    with channel_closed(403) as c:
        ch.queue_declare(uid("q"))
    assert c.reply_text.startswith("ACCESS_REFUSED - configure access to queue 'q-")
    ch = conn.channel()
    with channel_closed(403) as c:
        ch.basic_publish("", q, b"after")
        ch.basic_qos(prefetch_count=0)
    assert c.reply_text == f"ACCESS_REFUSED - write access to exchange 'amq.default' in vhost '/' " \
                           f"refused for user '{name}'"
    ch = conn.channel()
    assert ch.queue_declare(q, passive=True).method.message_count == 1

    b.call(b.broker.users.set_permissions, name, "/", ".*", ".*", ".*")
    ch.basic_publish("", q, b"again")
    assert ch.queue_declare(q, passive=True).method.message_count == 2

    b.call(b.broker.users.clear_permissions, name, "/")
    with channel_closed(403):
        ch.basic_get(q)
    assert conn.is_open
    conn.close()


def test_password_hash_change_refuses_the_old_password(inproc):
    b = inproc()
    name = uid("u")
    _add_user(b, name, ".*", ".*", ".*")
    pika.BlockingConnection(pika.URLParameters(_url(b, name))).close()
    users = b.broker.users
    generation = users.generation
    # what a definitions import or the HTTP API does: set a hash made elsewhere
    b.call(users.set_password_hash, name, rabbit_password_hash("new-password"), "rabbit_password_hashing_sha256")
    assert users.generation > generation
    params = pika.URLParameters(_url(b, name))
    params.connection_attempts = 1
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params)
    pika.BlockingConnection(pika.URLParameters(_url(b, name, "new-password"))).close()


def test_set_policy_checks_the_acting_user(inproc):
    b = inproc()
    vhost = b.broker.vhosts["/"]
    _add_user(b, "maker", "^mine", "^mine", "^mine", tags=("policymaker",))
    _add_user(b, "plain", ".*", ".*", ".*")
    definition = {"dead-letter-exchange": "amq.direct"}
    with pytest.raises(BrokerChannelError) as e:
        b.call(vhost.set_policy, "p1", "^mine", definition, user="maker")
    assert e.value.kind is ACCESS_REFUSED
    assert e.value.text == "ACCESS_REFUSED - write access to exchange 'amq.direct' in vhost '/' refused " \
                           "for user 'maker'"
    with pytest.raises(BrokerChannelError) as e:
        b.call(vhost.set_policy, "p1", "^mine", {"alternate-exchange": "mine-ae"}, user="plain")
    assert e.value.kind is ACCESS_REFUSED and "policymaker" in e.value.text
    assert b.call(vhost.policies.get, "p1") is None
    # a target the user may write to is fine; so is anything for a trusted (internal) caller
    b.call(vhost.set_policy, "p1", "^mine", {"alternate-exchange": "mine-ae"}, user="maker")
    b.call(vhost.set_policy, "p2", "^mine-dl", definition, priority=1)
    # the policy's author answers for its dead-letter exchange: a user declaring a matching queue
    # is not refused for it (RabbitMQ checks declare arguments only)
    conn = pika.BlockingConnection(pika.URLParameters(_url(b, "maker")))
    ch = conn.channel()
    ch.queue_declare("mine-dl-" + uid("q"), exclusive=True)
    conn.close()


def _modes(root) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames, ""]:
            path = os.path.join(dirpath, name) if name else dirpath
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def test_data_dir_is_owner_only(inproc, tmp_path):
    b = inproc()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("dx", "direct", durable=True)
    for q, args in (("plain", {}), ("prio", {"x-max-priority": 5}), ("strm", {"x-queue-type": "stream"})):
        ch.queue_declare(q, durable=True, arguments=args)
        ch.queue_bind(q, "dx", "k")
    for _ in range(3):
        ch.basic_publish("dx", "k", b"secret body", pika.BasicProperties(delivery_mode=2))
    ch.basic_get("plain")  # requeued when the connection closes: a redelivered-marks file at stop
    b.call(b.broker.vhosts["/"].set_policy, "ttl", "^plain$", {"message-ttl": 60000})
    b.call(b.broker.users.add_user, "someone", "pw")
    conn.close()
    b.stop()
    modes = _modes(b.server.config.data_dir)
    assert len(modes) > 10, modes
    wrong = {p: oct(m) for p, m in modes.items()
             if m != (0o700 if os.path.isdir(os.path.join(b.server.config.data_dir, p)) else 0o600)}
    assert not wrong, wrong
    assert "users.json" in modes and any(p.endswith("msgs.0000000001") for p in modes)


def test_older_data_dir_is_made_owner_only(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    # as an older lavinpy left them: complete, so nothing needs rewriting at boot
    (data / "users.json").write_text(json.dumps([{
        "name": "guest", "password_hash": rabbit_password_hash("guest"),
        "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"],
        "permissions": {"/": {"configure": ".*", "write": ".*", "read": ".*"}}}]))
    (data / "vhosts.json").write_text(json.dumps([{"name": "/", "description": "", "tags": []}]))
    os.chmod(data / "users.json", 0o644)
    old_umask = os.umask(0o022)
    try:
        b = InProcessBroker(tmp_path)
        b.stop()
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "users.json").stat().st_mode) == 0o600
