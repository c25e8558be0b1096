"""A lavinpy with its MQTT listener on a free port, shared by the MQTT tests, and a paho-mqtt client
wrapper that turns the client's callbacks into queues the tests wait on."""

from __future__ import annotations

import queue
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from lavinpy.mqtt import codec
from tests.e2e.conftest import LocalBroker, shared_by_many_tests
from tests.helpers import free_port

TIMEOUT = 10.0


class MQTTBroker(LocalBroker):
    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.mqtt_port = free_port()
        self.extra_args = ["--mqtt-port", str(self.mqtt_port)]


@pytest.fixture(scope="session")
def mqtt_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MQTTBroker]:
    b = MQTTBroker(tmp_path_factory.mktemp("lavinpy-mqtt"))
    shared_by_many_tests(b)
    b.start()
    yield b
    b.close()


@pytest.fixture
def fresh_mqtt_broker(tmp_path: Path) -> Iterator[MQTTBroker]:
    b = MQTTBroker(tmp_path / "broker")
    b.start()
    yield b
    b.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Paho:
    """One paho-mqtt client (its network loop in a thread), with its events as queues."""

    def __init__(self, port: int, client_id: str, *, username: str | None = "guest", password: str | None = "guest",
                 clean_session: bool = True, protocol: int = mqtt.MQTTv311, keepalive: int = 60,
                 websocket: bool = False) -> None:
        self.port = port
        self.keepalive = keepalive
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  clean_session=clean_session, protocol=protocol,
                                  transport="websockets" if websocket else "tcp")
        if websocket:
            self.client.ws_set_options(path="/ws")
        if username is not None:
            self.client.username_pw_set(username, password)
        self.connacks: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.subacks: queue.Queue[list[Any]] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.client.on_connect = lambda c, u, flags, rc, props: self.connacks.put((flags.session_present, rc))
        self.client.on_message = lambda c, u, msg: self.messages.put(msg)
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subacks.put(list(codes))
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)

    def connect(self) -> tuple[bool, Any]:
        """(session present, reason code) of the CONNACK."""
        self.client.connect("127.0.0.1", self.port, self.keepalive)
        self.client.loop_start()
        return self.connacks.get(timeout=TIMEOUT)

    def subscribe(self, topic: str, qos: int = 0) -> list[Any]:
        self.client.subscribe(topic, qos)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos, retain)
        info.wait_for_publish(TIMEOUT)  # QoS 1: until the PUBACK
        assert info.is_published()

    def message(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def no_message(self, wait: float = 0.5) -> None:
        with pytest.raises(queue.Empty):
            self.messages.get(timeout=wait)

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self) -> None:
        """End without DISCONNECT (the socket closes under the client): an unclean end."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def raw_connect(port: int, client_id: str = "raw", username: str | None = "guest", password: bytes | None = b"guest",
                **kwargs: Any) -> socket.socket:
    """A socket that sent a CONNECT (the caller reads the CONNACK)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(codec.encode_connect(client_id, username=username, password=password, **kwargs))
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a timeout fails the test)."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
