"""The attack suite's brokers and roles: a lavinpy server of the test's own (a subprocess on free ports), one with
MQTT on, its resident memory read from /proc, and raw WebSocket frames for what no well-behaved client
sends.
Roles (the module-scoped ``broker``, with vhosts ``a`` and ``b``): ``guest`` the default administrator;
``pm`` policymaker, configure and write on everything of ``a``, read only on queues named ``open-*``, no
access to ``b``; ``mon`` monitoring with full permissions on ``/``, ``a`` and ``b``; ``pmall`` policymaker
with full permissions on ``/`` (the dashboard's Move messages as a non-admin).
"""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.e2e.conftest import LocalBroker, http_call
from tests.mqtt.conftest import MQTTBroker


def rss_mib(pid: int) -> float:
    """The process's resident memory (VmRSS) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    b = LocalBroker(tmp_path / "broker")
    b.start()
    yield b
    b.close()


@pytest.fixture(scope="module")
def mqtt_on(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MQTTBroker]:
    b = MQTTBroker(tmp_path_factory.mktemp("security-mqtt"))
    b.start()
    yield b
    b.close()


def ws_handshake(port: int, extensions: str | None = None) -> tuple[socket.socket, bytes]:
    """A WebSocket upgrade of /ws with subprotocol mqtt over a raw socket: (socket, the answer's head)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n")
    if extensions:
        request += f"Sec-WebSocket-Extensions: {extensions}\r\n"
    sock.sendall((request + "\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head


def ws_frame_header(length: int, *, opcode: int = 0x2, fin: bool = True, rsv1: bool = False) -> bytes:
    """A client frame's header with a zero mask (the payload goes as it is)."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    if length < 126:
        size = bytes((0x80 | length,))
    elif length < 65536:
        size = bytes((0x80 | 126,)) + length.to_bytes(2, "big")
    else:
        size = bytes((0x80 | 127,)) + length.to_bytes(8, "big")
    return bytes((first,)) + size + b"\0\0\0\0"


def ws_frame(payload: bytes, **kwargs: bool | int) -> bytes:
    return ws_frame_header(len(payload), **kwargs) + payload  # type: ignore[arg-type]


def ws_read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """(opcode, payload) of one server frame (never masked); (-1, b"") once the socket ends."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data
    try:
        first, second = exactly(2)
        length = second & 0x7F
        if length == 126:
            length = int.from_bytes(exactly(2), "big")
        elif length == 127:
            length = int.from_bytes(exactly(8), "big")
        return first & 0x0F, exactly(length)
    except (EOFError, ConnectionError):
        return -1, b""


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
