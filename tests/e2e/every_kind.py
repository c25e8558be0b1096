"""One object of every kind on one broker, for the tests that then read it through every monitoring face
(test_every_kind_monitoring.py).

The broker is this module's own (conftest's ``LocalBroker``, as ``fresh_broker`` starts one): its second
half runs under a disk alarm, which would block every other test's publishers on the shared broker.
Durable objects and their messages are made first; the broker then restarts with a free-disk limit no
disk meets, and the objects that live only with a connection (consumers and their unacked deliveries,
exclusive, auto-delete and transient queues, a blocked publisher) are made under the alarm.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
from pamqp import commands

from . import wait_until
from .conftest import LocalBroker, http_call
from .rawamqp import RawAMQP

VHOST = "/"
EMPTY_VHOST = "every-empty"  # a vhost with nothing declared in it
POLICY = "every-policy"

# role -> queue name; each role is one kind or state of queue
QUEUES = {
    "classic": "every-classic",  # durable, a consumer with 2 unacked, 3 ready
    "idle": "every-idle",  # durable, ready messages, no consumer
    "priority": "every-priority",  # x-max-priority, a consumer with 2 unacked, 2 ready
    "stream": "every-stream",  # a stream with 5 messages and a consumer from the first offset
    "stream_empty": "every-stream-empty",  # an empty stream, no consumer: the figure reads that broke
    "quorum": "every-quorum",  # x-queue-type quorum, ready messages, no consumer
    "policy": "every-lim.q",  # a queue a policy applies to
    "exclusive": "every-exclusive",
    "auto_delete": "every-auto-delete",
    "transient": "every-transient",
}
# role -> exchange name (the built-in amq.* and default exchanges are there too)
EXCHANGES = {
    "direct": "every.direct",
    "fanout": "every.fanout",
    "topic": "every.topic",
    "headers": "every.headers",
    "delayed": "every.delayed",  # x-delayed-message, one message held for an hour
    "internal": "every.internal",  # internal, bound from every.topic (an exchange-to-exchange binding)
    "auto_delete": "every.auto-delete",
    "chash": "every.chash",  # x-consistent-hash, the idle queue bound with weight 1
}
# what each queue holds once the world is made: (ready, unacked) as the API reports them
FIGURES = {
    "classic": (3, 2), "idle": (3, 0), "priority": (2, 2), "stream": (5, 0), "stream_empty": (0, 0),
    "policy": (2, 0), "exclusive": (0, 0), "auto_delete": (0, 0), "transient": (0, 0), "quorum": (2, 0),
}
SHOVEL = "every-shovel"  # a shovel whose source queue does not exist: terminated, with its reason
PREFETCH = 2
DISK_ALARM = "disk_free_limit: 1000000000000000000\n"  # more than any disk has free


@dataclass
class World:
    broker: LocalBroker
    connections: list[pika.BlockingConnection] = field(default_factory=list)
    raw_clients: list[RawAMQP] = field(default_factory=list)
    blocked_reasons: list[str] = field(default_factory=list)

    def close(self) -> None:
        # The broker first: it reads nothing more from a blocked publisher, whose close would wait.
        try:
            self.broker.close()
        finally:
            for raw in self.raw_clients:
                raw.close()
            for conn in self.connections:
                try:
                    if conn.is_open:
                        conn.close()
                except Exception:  # already closed by the broker's shutdown
                    pass


def connect(broker: LocalBroker) -> pika.BlockingConnection:
    params = pika.URLParameters(broker.url)
    params.heartbeat = 0  # idle between the tests: no heartbeats to miss
    params.blocked_connection_timeout = None  # stay blocked: the state under test
    params.socket_timeout = 10
    return pika.BlockingConnection(params)


def _http_ok(broker: LocalBroker, method: str, path: str, body: Any = None) -> None:
    status, reply, _ = http_call(broker, method, path, body)
    assert status in (200, 201, 204), (method, path, status, reply)


def _durable_half(broker: LocalBroker) -> None:
    """Exchanges of every type, durable queues of every kind, bindings, messages, a policy, a vhost."""
    conn = connect(broker)
    ch = conn.channel()
    for kind in ("direct", "fanout", "topic", "headers"):
        ch.exchange_declare(EXCHANGES[kind], kind, durable=True)
    ch.exchange_declare(EXCHANGES["delayed"], "x-delayed-message", durable=True,
                        arguments={"x-delayed-type": "direct"})
    ch.exchange_declare(EXCHANGES["internal"], "topic", durable=True, internal=True)
    ch.exchange_declare(EXCHANGES["chash"], "x-consistent-hash", durable=True)
    q = QUEUES
    for role in ("classic", "idle", "policy"):
        ch.queue_declare(q[role], durable=True)
    ch.queue_declare(q["priority"], durable=True, arguments={"x-max-priority": 5})
    for role in ("stream", "stream_empty"):
        ch.queue_declare(q[role], durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_declare(q["quorum"], durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_bind(q["idle"], EXCHANGES["chash"], "1")
    ch.queue_bind(q["classic"], EXCHANGES["direct"], "c")
    ch.queue_bind(q["classic"], EXCHANGES["delayed"], "c")
    ch.queue_bind(q["idle"], EXCHANGES["fanout"])
    ch.queue_bind(q["idle"], EXCHANGES["headers"], arguments={"x-match": "any", "k": "v"})
    ch.queue_bind(q["priority"], EXCHANGES["topic"], "p.#")
    ch.exchange_bind(EXCHANGES["internal"], EXCHANGES["topic"], "s.#")
    ch.queue_bind(q["stream"], EXCHANGES["internal"], "s.#")
    ch.confirm_delivery()

    def publish(exchange: str, key: str, n: int, **props: Any) -> None:
        for i in range(n):
            ch.basic_publish(exchange, key, f"{key}-{i}".encode(), pika.BasicProperties(delivery_mode=2, **props))

    publish(EXCHANGES["direct"], "c", 5)
    publish(EXCHANGES["fanout"], "", 3)
    for priority in range(4):
        publish(EXCHANGES["topic"], "p.x", 1, priority=priority)
    publish(EXCHANGES["topic"], "s.x", 5)  # through the internal exchange into the stream
    publish(EXCHANGES["delayed"], "c", 1, headers={"x-delay": 3_600_000})  # held, not routed yet
    publish("", q["policy"], 2)
    publish("", q["quorum"], 2)
    conn.close()
    _http_ok(broker, "PUT", f"/api/policies/%2F/{POLICY}",
             {"pattern": r"^every-lim\.", "apply-to": "queues", "definition": {"max-length": 100}, "priority": 1})
    _http_ok(broker, "PUT", f"/api/vhosts/{EMPTY_VHOST}", {"description": "nothing in it"})
    _http_ok(broker, "PUT", f"/api/permissions/{EMPTY_VHOST}/guest",
             {"configure": ".*", "write": ".*", "read": ".*"})
    # The objects of migration: a topic permission, limits, an operator policy, parameters, a shovel.
    _http_ok(broker, "PUT", "/api/topic-permissions/%2F/guest",
             {"exchange": "amq.topic", "write": ".*", "read": ".*"})
    _http_ok(broker, "PUT", f"/api/vhost-limits/{EMPTY_VHOST}/max-queues", {"value": 10})
    _http_ok(broker, "PUT", "/api/user-limits/guest/max-channels", {"value": 1000})
    _http_ok(broker, "PUT", f"/api/operator-policies/{EMPTY_VHOST}/every-operator-policy",
             {"pattern": "^nothing$", "definition": {"max-length": 1000}, "apply-to": "queues", "priority": 1})
    _http_ok(broker, "PUT", "/api/global-parameters/cluster_name", {"value": "every-cluster"})
    _http_ok(broker, "PUT", f"/api/parameters/shovel/%2F/{SHOVEL}",
             {"value": {"src-uri": "amqp://", "src-queue": "every-no-such-queue", "dest-uri": "amqp://",
                        "dest-queue": "every-shovel-dst", "reconnect-delay": 3600}})


def _connected_half(world: World) -> None:
    """Consumers with unacked deliveries, exclusive, auto-delete and transient queues, channels in
    confirm and tx mode, and a publisher the alarm blocks."""
    conn = connect(world.broker)
    world.connections.append(conn)
    q = QUEUES
    received: list[bytes] = []

    def on_message(_ch: Any, _method: Any, _props: Any, body: bytes) -> None:
        received.append(body)

    ch = conn.channel()
    ch.basic_qos(prefetch_count=PREFETCH)
    ch.basic_consume(q["classic"], on_message)
    ch.basic_consume(q["priority"], on_message)
    ch.basic_consume(q["stream"], on_message, arguments={"x-stream-offset": "first"})
    ch.queue_declare(q["exclusive"], exclusive=True)
    ch.basic_consume(q["exclusive"], on_message)
    ch.queue_declare(q["auto_delete"], auto_delete=True)
    ch.basic_consume(q["auto_delete"], on_message)
    ch.exchange_declare(EXCHANGES["auto_delete"], "direct", auto_delete=True)
    ch.queue_bind(q["auto_delete"], EXCHANGES["auto_delete"], "a")
    ch.queue_declare(q["transient"], durable=False)
    conn.channel().tx_select()
    conn.channel().confirm_delivery()
    assert wait_until(conn, lambda: len(received) >= 3 * PREFETCH, 10), received

    # A raw client: the broker sends connection.blocked right after open-ok, before pika could take a
    # callback for it.
    publisher = RawAMQP(world.broker.host, world.broker.port)
    world.raw_clients.append(publisher)
    publisher.handshake()
    world.blocked_reasons.append(publisher.expect(commands.Connection.Blocked, 0, timeout=5).reason)
    publisher.open_channel(1)
    # Unroutable: whether the broker read this publish before it stopped reading changes no figure.
    publisher.publish(1, EXCHANGES["direct"], "nowhere", b"held back by the alarm")


def make_world(workdir: Path) -> World:
    broker = LocalBroker(workdir)
    broker.start()
    world = World(broker)
    try:
        _durable_half(broker)
        broker.stop()
        config = workdir / "alarm.yaml"
        config.write_text(DISK_ALARM)
        broker.extra_args = ["--config", str(config)]
        broker.start()
        _connected_half(world)
    except BaseException:
        world.close()
        raise
    return world


# --- reading it back ---------------------------------------------------------------------------

def fetch(url: str, auth: bool = True) -> tuple[int, str, bytes]:
    """GET ``url``: (status, content type, body), for any status."""
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def api_json(broker: LocalBroker, path: str) -> Any:
    status, _, body = fetch(broker.http_url + path)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def q(value: str) -> str:
    return quote(value, safe="")
