"""Users, vhosts and configure/write/read permissions.

On lavinpy the users and vhosts are written to users.json / vhosts.json while the broker is stopped;
on RabbitMQ (LAVINPY_TEST_URL + LAVINPY_TEST_RABBITMQCTL) they are made with rabbitmqctl.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pika
import pytest

from . import bodies, channel_closed, get_all, uid
from .conftest import EXTERNAL_URL, Broker, Clients, ExternalBroker, LocalBroker, make_admin
from .rawamqp import CLIENT_PROPERTIES, PROTOCOL_HEADER, RawAMQP, commands

PASSWORD = "s3cret-pw"


@dataclass
class Env:
    broker: Broker
    vhost: str
    suffix: str

    def url(self, user: str, password: str = PASSWORD, vhost: str | None = None) -> str:
        return self.broker.url_for(user, password, self.vhost if vhost is None else vhost)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if EXTERNAL_URL:
        b: Broker = ExternalBroker(EXTERNAL_URL)
    else:
        b = LocalBroker(tmp_path_factory.mktemp("lavinpy-perms"))
        b.start()
    admin = make_admin(b)
    suffix = uid("p")
    vhost = f"vh-{suffix}"
    admin.add_vhost(vhost)
    users = {
        "full": (".*", ".*", ".*"),
        "ro": ("", "", ".*"),
        "wo": ("", ".*", ""),
        "lim": ("^lim-.*", "^lim-.*", "^lim-.*"),
        "binder": ("", "^bq-.*", "^bx-.*"),
        "mine": ("^mine", "^mine", "^mine"),
        "noread": (".*", ".*", ""),
    }
    for name, (c, w, r) in users.items():
        admin.add_user(f"{name}-{suffix}", PASSWORD)
        admin.set_permissions(f"{name}-{suffix}", vhost, c, w, r)
    admin.add_user(f"none-{suffix}", PASSWORD)  # no permissions anywhere
    admin.apply()
    e = Env(b, vhost, suffix)
    # objects the restricted users work on, made by the full user
    conn = pika.BlockingConnection(pika.URLParameters(e.url(f"full-{suffix}")))
    ch = conn.channel()
    for q in ("pq", "bq-1", "other-q", "lim-existing"):
        ch.queue_declare(q)
    for x in ("px", "bx-1", "other-x"):
        ch.exchange_declare(x, "direct")
    ch.queue_bind("pq", "px", "k")
    conn.close()
    try:
        yield e
    finally:
        admin.cleanup()
        if isinstance(b, LocalBroker):
            b.close()


@pytest.fixture
def pclients(env: Env) -> Iterator[Clients]:
    c = Clients(env.broker)
    yield c
    c.close()


def user(env: Env, name: str) -> str:
    return f"{name}-{env.suffix}"


def refused(permission: str, kind: str, name: str, env: Env, who: str) -> str:
    """RabbitMQ's text: "ACCESS_REFUSED - write access to exchange 'x' in vhost '/' refused for user 'u'"."""
    return (f"ACCESS_REFUSED - {permission} access to {kind} '{name}' in vhost '{env.vhost}' refused for user "
            f"'{user(env, who)}'")


def _raw_open(env: Env, username: str, password: str, vhost: str) -> commands.Connection.Close | None:
    """Handshake to vhost; the connection.close the server sends, or None if open-ok came."""
    with RawAMQP(env.broker.host, env.broker.port) as c:
        c.send_raw(PROTOCOL_HEADER)
        c.expect(commands.Connection.Start, 0)
        c.send(0, commands.Connection.StartOk(client_properties=CLIENT_PROPERTIES,
                                              response=f"\0{username}\0{password}"))
        _, f = c.recv()
        if isinstance(f, commands.Connection.Close):
            return f
        assert isinstance(f, commands.Connection.Tune)
        c.send(0, commands.Connection.TuneOk(channel_max=f.channel_max, frame_max=f.frame_max, heartbeat=0))
        c.send(0, commands.Connection.Open(virtual_host=vhost))
        _, f = c.recv()
        if isinstance(f, commands.Connection.OpenOk):
            return None
        assert isinstance(f, commands.Connection.Close), f
        return f


def test_user_from_file_can_log_in(env):
    assert _raw_open(env, user(env, "full"), PASSWORD, env.vhost) is None


def test_wrong_password_is_403(env):
    close = _raw_open(env, user(env, "full"), "not-the-password", env.vhost)
    assert close is not None and close.reply_code == 403
    assert close.reply_text.startswith("ACCESS_REFUSED")


def test_unknown_user_is_403(env):
    close = _raw_open(env, uid("nobody"), PASSWORD, env.vhost)
    assert close is not None and close.reply_code == 403


def test_vhost_without_permission_is_530(env):
    close = _raw_open(env, user(env, "none"), PASSWORD, env.vhost)
    assert close is not None and close.reply_code == 530
    assert close.reply_text == f"NOT_ALLOWED - access to vhost '{env.vhost}' refused for user '{user(env, 'none')}'"
    close = _raw_open(env, "guest", "guest", env.vhost)
    assert close is not None and close.reply_code == 530


def test_user_without_permission_on_default_vhost(env):
    close = _raw_open(env, user(env, "full"), PASSWORD, "/")
    assert close is not None and close.reply_code == 530


def test_pika_sees_access_refused_on_vhost(env):
    params = pika.URLParameters(env.url(user(env, "none")))
    params.connection_attempts = 1
    with pytest.raises((pika.exceptions.ProbableAccessDeniedError, pika.exceptions.ConnectionClosedByBroker)):
        pika.BlockingConnection(params)


def test_full_user(env, pclients):
    _, ch = pclients.channel(env.url(user(env, "full")))
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.basic_publish("", q, b"1")
    ch.basic_publish("px", "k", b"2")
    assert bodies(get_all(ch, q)) == [b"1"]
    assert b"2" in bodies(get_all(ch, "pq"))


def test_declare_without_configure_is_403(env, pclients):
    conn, ch = pclients.channel(env.url(user(env, "ro")))
    name = uid("q")
    with channel_closed(403) as c:
        ch.queue_declare(name)
    assert c.reply_text == refused("configure", "queue", name, env, "ro")
    ch = conn.channel()
    with channel_closed(403) as c:
        ch.exchange_declare("newx", "direct")
    assert c.reply_text == refused("configure", "exchange", "newx", env, "ro")
    ch = conn.channel()
    with channel_closed(403) as c:
        ch.queue_delete("pq")
    assert c.reply_text == refused("configure", "queue", "pq", env, "ro")


def test_publish_without_write_is_403(env, pclients):
    conn, ch = pclients.channel(env.url(user(env, "ro")))
    with channel_closed(403) as c:
        ch.basic_publish("px", "k", b"x")
        ch.basic_qos(prefetch_count=0)
    assert c.reply_text == refused("write", "exchange", "px", env, "ro")
    # the default exchange is checked as 'amq.default'
    ch = conn.channel()
    with channel_closed(403) as c:
        ch.basic_publish("", "pq", b"x")
        ch.basic_qos(prefetch_count=0)
    assert c.reply_text == refused("write", "exchange", "amq.default", env, "ro")


def test_get_and_consume_without_read_are_403(env, pclients):
    conn, ch = pclients.channel(env.url(user(env, "wo")))
    ch.basic_publish("px", "k", b"from-wo")  # write is allowed
    ch.basic_qos(prefetch_count=0)
    with channel_closed(403) as c:
        ch.basic_get("pq")
    assert c.reply_text == refused("read", "queue", "pq", env, "wo")
    ch = conn.channel()
    with channel_closed(403) as c:
        ch.basic_consume("pq", lambda *a: None)
    assert c.reply_text == refused("read", "queue", "pq", env, "wo")
    ch = conn.channel()
    with channel_closed(403) as c:
        ch.queue_purge("pq")  # purge needs read permission
    assert c.reply_text == refused("read", "queue", "pq", env, "wo")
    # the reader can read what wo wrote
    _, rch = pclients.channel(env.url(user(env, "ro")))
    assert b"from-wo" in bodies(get_all(rch, "pq"))


def test_regex_limited_user(env, pclients):
    conn, ch = pclients.channel(env.url(user(env, "lim")))
    q = "lim-" + uid("q")
    ch.queue_declare(q, auto_delete=False)
    ch.exchange_declare("lim-x", "fanout")
    ch.queue_bind(q, "lim-x")
    ch.basic_publish("lim-x", "", b"ok")
    assert bodies(get_all(ch, q)) == [b"ok"]
    ch.queue_delete(q)
    ch.exchange_delete("lim-x")
    other = uid("q")
    with channel_closed(403) as c:
        ch.queue_declare(other)
    assert c.reply_text == refused("configure", "queue", other, env, "lim")
    ch = conn.channel()
    with channel_closed(403) as c:
        ch.basic_get("pq")
    assert c.reply_text == refused("read", "queue", "pq", env, "lim")


def test_bind_needs_write_on_queue_and_read_on_exchange(env, pclients):
    conn, ch = pclients.channel(env.url(user(env, "binder")))
    ch.queue_bind("bq-1", "bx-1", "k")
    ch.queue_unbind("bq-1", "bx-1", "k")
    with channel_closed(403) as c:
        ch.queue_bind("other-q", "bx-1", "k")
    assert c.reply_text == refused("write", "queue", "other-q", env, "binder")
    ch = conn.channel()
    with channel_closed(403) as c:
        ch.queue_bind("bq-1", "other-x", "k")
    assert c.reply_text == refused("read", "exchange", "other-x", env, "binder")


def test_refused_channel_does_not_hurt_connection(env, pclients):
    conn, ch = pclients.channel(env.url(user(env, "ro")))
    with channel_closed(403):
        ch.queue_declare(uid("q"))
    ch = conn.channel()
    ch.queue_declare("pq", passive=True)
    assert conn.is_open


# --- declares that name an exchange to publish to later (dead-letter, alternate) ---------------------

def test_dead_letter_exchange_argument_needs_write_on_it(env, pclients):
    """The hole: a user limited to ^mine dead-lettered its own messages into another user's queue."""
    conn, ch = pclients.channel(env.url(user(env, "mine")))
    name = "mine-" + uid("q")
    with channel_closed(403) as c:
        ch.queue_declare(name, arguments={"x-dead-letter-exchange": "px", "x-dead-letter-routing-key": "k"})
    assert c.reply_text == refused("write", "exchange", "px", env, "mine")
    # the default exchange is checked as amq.default, as for publishes
    ch = conn.channel()
    with channel_closed(403) as c:
        ch.queue_declare(name, arguments={"x-dead-letter-exchange": ""})
    assert c.reply_text == refused("write", "exchange", "amq.default", env, "mine")
    # nothing was declared, and the connection goes on: an exchange it may write to is fine
    ch = conn.channel()
    with channel_closed(404):
        ch.queue_declare(name, passive=True)
    ch = conn.channel()
    ch.queue_declare(name, auto_delete=True, arguments={"x-dead-letter-exchange": "mine-dlx"})
    assert conn.is_open


def test_dead_letter_exchange_argument_needs_read_on_the_queue(env, pclients):
    _, ch = pclients.channel(env.url(user(env, "noread")))
    name = uid("q")
    with channel_closed(403) as c:
        ch.queue_declare(name, arguments={"x-dead-letter-exchange": "px"})
    assert c.reply_text == refused("read", "queue", name, env, "noread")


def test_refused_dead_letter_route_delivers_nothing_to_other_queue(env, pclients):
    _, full = pclients.channel(env.url(user(env, "full")))
    victim = uid("victim")
    full.queue_declare(victim, auto_delete=True)
    full.queue_bind(victim, "px", victim)
    _, ch = pclients.channel(env.url(user(env, "mine")))
    with channel_closed(403):
        ch.queue_declare("mine-" + uid("q"), exclusive=True, arguments={
            "x-dead-letter-exchange": "px", "x-dead-letter-routing-key": victim, "x-message-ttl": 0})
    assert full.queue_declare(victim, passive=True).method.message_count == 0


def test_alternate_exchange_argument_needs_write_on_it(env, pclients):
    conn, ch = pclients.channel(env.url(user(env, "mine")))
    name = "mine-" + uid("x")
    with channel_closed(403) as c:
        ch.exchange_declare(name, "fanout", arguments={"alternate-exchange": "px"})
    assert c.reply_text == refused("write", "exchange", "px", env, "mine")
    ch = conn.channel()
    with channel_closed(404):
        ch.exchange_declare(name, "fanout", passive=True)
    ch = conn.channel()
    ch.exchange_declare(name, "fanout", auto_delete=True, arguments={"alternate-exchange": "mine-ae"})
    ch.exchange_delete(name)


def test_alternate_exchange_argument_needs_read_on_the_exchange(env, pclients):
    _, ch = pclients.channel(env.url(user(env, "noread")))
    name = uid("x")
    with channel_closed(403) as c:
        ch.exchange_declare(name, "fanout", arguments={"alternate-exchange": "px"})
    assert c.reply_text == refused("read", "exchange", name, env, "noread")
