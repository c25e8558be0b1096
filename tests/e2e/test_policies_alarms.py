"""Policies (policies.json and the Python API) and resource alarms (free disk, memory watermark)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from pathlib import Path

import aio_pika
import pika
import pytest
from pamqp import commands

from lavinpy import config as lavinpy_config
from lavinpy.server import Server
from tests.helpers import free_port

from . import bodies, get_all, settle, uid, wait_until
from .conftest import lavinpy_only
from .rawamqp import RawAMQP

pytestmark = lavinpy_only("reads and writes the broker's files or runs it in-process")


def _count(ch, q: str) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


class InProcessBroker:
    """A real lavinpy server on its own event loop thread, so a test can call its Python API."""

    def __init__(self, workdir: Path, **settings: object) -> None:
        self.port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        cfg = lavinpy_config.load(None, env={}, overrides={
            "data_dir": str(workdir / "data"), "amqp_port": self.port, "http_port": 0,
            "prometheus_port": 0, "mqtt_port": 0, **settings})
        self.server = Server(cfg)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_forever()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(15), "in-process broker did not start"

    @property
    def broker(self):
        return self.server.broker

    def call(self, fn, *args, **kwargs):
        """Run fn on the broker's loop thread and return its result."""
        async def run():
            return fn(*args, **kwargs)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def inproc(tmp_path):
    brokers: list[InProcessBroker] = []

    def start(**settings: object) -> InProcessBroker:
        b = InProcessBroker(tmp_path / f"b{len(brokers)}", **settings)
        brokers.append(b)
        return b
    yield start
    for b in brokers:
        b.stop()


def _connect(url: str) -> pika.BlockingConnection:
    params = pika.URLParameters(url)
    params.blocked_connection_timeout = 30
    return pika.BlockingConnection(params)


# --- policies -------------------------------------------------------------------------------------

def test_policies_json_applies_with_rabbitmq_precedence(fresh_broker, fresh_clients):
    fresh_broker.stop()
    vhost_dir = fresh_broker.data_dir / hashlib.sha1(b"/").hexdigest()
    vhost_dir.mkdir(parents=True, exist_ok=True)
    ae = uid("ae")
    (vhost_dir / "policies.json").write_text(json.dumps([
        {"name": "limits", "pattern": "^lim\\.", "apply-to": "queues", "priority": 1,
         "definition": {"max-length": 2, "overflow": "reject-publish", "dead-letter-exchange": "nope"}},
        {"name": "weaker", "pattern": "^lim\\.", "apply-to": "queues", "priority": 0,
         "definition": {"max-length": 1}},
        {"name": "ae", "pattern": "^src\\.", "apply-to": "exchanges", "definition": {"alternate-exchange": ae}},
    ]))
    fresh_broker.start()
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    # the highest-priority policy applies: max-length 2, reject-publish
    q1 = ch.queue_declare("lim." + uid("a"), exclusive=True).method.queue
    for body in (b"1", b"2"):
        ch.basic_publish("", q1, body)
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q1, b"3")
    # numeric limits: the smaller of argument and policy wins; others: the argument wins
    dlq = ch.queue_declare(uid("dlq"), exclusive=True).method.queue
    q2 = ch.queue_declare("lim." + uid("b"), exclusive=True, arguments={
        "x-max-length": 1, "x-overflow": "drop-head", "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dlq}).method.queue
    for body in (b"a", b"b"):
        ch.basic_publish("", q2, body)
    assert bodies(get_all(ch, q2)) == [b"b"]
    assert bodies(get_all(ch, dlq)) == [b"a"]
    q3 = ch.queue_declare("lim." + uid("c"), exclusive=True, arguments={"x-max-length": 5}).method.queue
    for body in (b"1", b"2"):
        ch.basic_publish("", q3, body)
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q3, b"3")
    # exchanges: alternate-exchange from a policy
    src = fresh_clients.track_exchange("src." + uid("x"))
    ch.exchange_declare(ae, "fanout")
    ch.exchange_declare(src, "direct")
    caught = ch.queue_declare(uid("caught"), exclusive=True).method.queue
    ch.queue_bind(caught, ae)
    ch.basic_publish(src, "nowhere", b"ae")
    assert bodies(get_all(ch, caught)) == [b"ae"]


def test_policy_python_api_applies_to_existing_queues_at_once(inproc):
    b = inproc()
    vhost = b.broker.vhosts["/"]
    conn = _connect(b.url)
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("pol." + uid("q")).method.queue
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    b.call(vhost.set_policy, "cap", "^pol\\.", {"max-length": 2})
    assert _count(ch, q) == 2  # applied at once: the oldest three are dropped
    b.call(vhost.set_policy, "cap", "^pol\\.", {"message-ttl": 100})  # replaced: no cap, a TTL
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    assert _count(ch, q) == 5
    assert wait_until(conn, lambda: _count(ch, q) == 0, 2)
    saved = json.loads((Path(b.server.config.data_dir) / hashlib.sha1(b"/").hexdigest() / "policies.json")
                       .read_text())
    assert [(p["name"], p["definition"]) for p in saved] == [("cap", {"message-ttl": 100})]
    assert b.call(vhost.delete_policy, "cap") is True
    ch.basic_publish("", q, b"stays")
    settle(conn, 0.3)
    assert _count(ch, q) == 1
    conn.close()


def test_aio_pika_policy_dead_letter_exchange(inproc):
    b = inproc()
    vhost = b.broker.vhosts["/"]

    async def main():
        conn = await aio_pika.connect(b.url)
        async with conn:
            ch = await conn.channel()
            dlq = await ch.declare_queue(uid("dlq"), exclusive=True)
            b.call(vhost.set_policy, "dlx", "^work\\.", {"dead-letter-exchange": "",
                                                         "dead-letter-routing-key": dlq.name})
            q = await ch.declare_queue("work." + uid("q"), exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"job"), routing_key=q.name)
            m = await q.get()
            await m.reject(requeue=False)
            await asyncio.sleep(0.1)
            dead = await dlq.get(no_ack=True)
            assert dead.body == b"job" and dead.headers["x-death"][0]["reason"] == "rejected"
    asyncio.run(asyncio.wait_for(main(), 30))


# --- resource alarms ------------------------------------------------------------------------------

def _blocked_raw_publisher(port: int, queue: str) -> RawAMQP:
    """A raw client: connection.blocked must come right after open-ok; then it publishes with confirms."""
    raw = RawAMQP("127.0.0.1", port)
    raw.handshake()
    blocked = raw.expect(commands.Connection.Blocked, 0, timeout=3)
    raw.blocked_reason = blocked.reason
    raw.open_channel(1)
    raw.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    # The first publish frames already read with the one that marks the connection as a publisher may
    # still be handled; from then on the broker stops reading from it.
    raw.publish(1, "", queue, b"first")
    raw.acks = []
    try:
        while True:
            raw.acks.append(raw.expect(commands.Basic.Ack, 1, timeout=0.3).delivery_tag)
    except TimeoutError:
        pass
    raw.publish(1, "", queue, b"waits")
    with pytest.raises(TimeoutError):
        raw.recv(timeout=0.5)  # no confirm while the alarm holds
    return raw


def test_disk_alarm_blocks_publishers_at_start(fresh_broker, fresh_clients, tmp_path):
    config = tmp_path / "lavinpy.yaml"
    config.write_text("disk_free_limit: 1000000000000000000\n")  # more than any disk has free
    fresh_broker.stop()
    fresh_broker.extra_args = ["--config", str(config)]
    fresh_broker.start()
    q = fresh_clients.track_queue(uid("q"))
    raw = _blocked_raw_publisher(fresh_broker.port, q)
    try:
        assert "disk" in raw.blocked_reason
        _, observer = fresh_clients.channel()  # a connection that does not publish is still served
        assert _count(observer, q) == len(raw.acks) <= 1
    finally:
        raw.close()


def test_memory_alarm_blocks_and_unblocks(inproc):
    b = inproc(memory_high_watermark="2MiB")  # far below any Python process
    q = uid("q")
    raw = _blocked_raw_publisher(b.port, q)
    try:
        assert "memory" in raw.blocked_reason
        stored = len(raw.acks)
        assert b.call(lambda: b.broker.vhosts["/"].queues[q].message_count) == stored <= 1
        b.call(b.broker.set_resource_limits, memory_high_watermark="1.0")  # all of RAM: cleared
        raw.expect(commands.Connection.Unblocked, 0, timeout=3)
        tag = 0
        while tag < 2:  # both publishes are confirmed now (maybe in one multiple ack)
            tag = raw.expect(commands.Basic.Ack, 1, timeout=3).delivery_tag
        assert b.call(lambda: b.broker.vhosts["/"].queues[q].message_count) == 2
    finally:
        raw.close()


def test_pika_sees_alarm_raised_and_cleared_at_run_time(inproc):
    b = inproc()
    conn = _connect(b.url)
    events = []
    conn.add_on_connection_blocked_callback(lambda _c, frame: events.append(("blocked", frame.method.reason)))
    conn.add_on_connection_unblocked_callback(lambda _c, frame: events.append(("unblocked", "")))
    ch = conn.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"before")
    b.call(b.broker.set_resource_limits, memory_high_watermark="1MiB")
    assert wait_until(conn, lambda: len(events) == 1, 3)
    assert events[0][0] == "blocked" and "memory" in events[0][1]
    b.call(b.broker.set_resource_limits, memory_high_watermark="0.99")
    assert wait_until(conn, lambda: len(events) == 2, 3)
    assert events[1][0] == "unblocked"
    ch.basic_publish("", q, b"after")
    assert _count(ch, q) == 2
    conn.close()


def test_aio_pika_publish_waits_while_blocked(inproc):
    b = inproc(memory_high_watermark="1.0")

    async def main():
        conn = await aio_pika.connect(b.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uid("q"), exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"before"), routing_key=q.name)
            b.call(b.broker.set_resource_limits, disk_free_limit=10**18)
            await asyncio.sleep(0.1)
            publish = asyncio.ensure_future(ch.default_exchange.publish(aio_pika.Message(b"during"),
                                                                        routing_key=q.name))
            await asyncio.sleep(0.5)
            assert not publish.done()
            started = time.monotonic()
            b.call(b.broker.set_resource_limits, disk_free_limit=1)
            await asyncio.wait_for(publish, 3)
            assert time.monotonic() - started < 3
            await q.declare()
            assert q.declaration_result.message_count == 2
    asyncio.run(asyncio.wait_for(main(), 30))


def test_bad_memory_watermark_setting_is_refused():
    with pytest.raises(lavinpy_config.ConfigError, match="memory_high_watermark"):
        lavinpy_config.load(None, env={}, overrides={"memory_high_watermark": "lots"})
