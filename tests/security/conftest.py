"""The attack suite's brokers: a lavinpy server of the test's own (a subprocess on free ports), one with
MQTT on, its resident memory read from /proc, and raw WebSocket frames for what no well-behaved client
sends."""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import LocalBroker
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
