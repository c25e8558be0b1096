"""MQTT over WebSocket before login costs no more than MQTT over TCP: no compression is negotiated, a
message over 64 KiB before CONNECT closes the socket at its first frame header (the broker's memory
stays flat under a 100 MiB one), after login a message may be as large as a packet may; and /ws is not
served while MQTT is off. At any time an unmasked client frame closes with 1002, and the fragments of a
message its client never finished are freed when the connection ends."""

from __future__ import annotations

import asyncio
import socket
import time
import zlib

import aiohttp
import pytest

from lavinpy.mqtt import codec
from tests.e2e.conftest import LocalBroker
from tests.mqtt.conftest import MQTTBroker, unique

from .conftest import rss_mib, ws_frame, ws_frame_header, ws_handshake, ws_read_frame

MIB = 1024 * 1024
RSS_SLACK_MIB = 64


def _closed_soon(sock: socket.socket) -> bool:
    """Whether the server ends the socket (a close frame, then EOF) within a few seconds."""
    sock.settimeout(10)
    while True:
        opcode, _ = ws_read_frame(sock)
        if opcode == -1:
            return True
        if opcode == 0x8:  # a close frame: the end follows
            continue


def _send_until_refused(sock: socket.socket, total: int, chunk: bytes) -> int:
    """Send up to ``total`` bytes; how many went before the server closed."""
    sent = 0
    sock.settimeout(10)
    try:
        while sent < total:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    return sent


def test_no_compression_is_negotiated(mqtt_on: MQTTBroker) -> None:
    sock, head = ws_handshake(mqtt_on.http_port, "permessage-deflate; client_max_window_bits")
    with sock:
        assert head.startswith(b"HTTP/1.1 101")
        assert b"permessage-deflate" not in head.lower()
        assert b"sec-websocket-protocol: mqtt" in head.lower()


@pytest.mark.timeout(120)
def test_a_100_mib_deflated_message_before_connect_is_refused_with_memory_flat(mqtt_on: MQTTBroker) -> None:
    before = rss_mib(mqtt_on.pid)
    # 100 MiB of zeros deflate to about 100 KiB: sent as a compressed message (RSV1) as if the
    # extension were on, in one frame and as 4 KiB fragments.
    deflater = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = deflater.compress(bytes(100 * MIB)) + deflater.flush(zlib.Z_SYNC_FLUSH)
    sock, head = ws_handshake(mqtt_on.http_port, "permessage-deflate")
    with sock:
        assert head.startswith(b"HTTP/1.1 101")
        _send_until_refused(sock, len(deflated) + 14, ws_frame(deflated, rsv1=True))
        assert _closed_soon(sock)
    small = deflated[:4096]
    sock, _ = ws_handshake(mqtt_on.http_port, "permessage-deflate")
    with sock:
        _send_until_refused(sock, len(small) + 14, ws_frame(small, rsv1=True, fin=False))
        assert _closed_soon(sock)
    assert rss_mib(mqtt_on.pid) - before < RSS_SLACK_MIB


@pytest.mark.timeout(120)
def test_a_100_mib_message_before_connect_is_refused_at_its_header(mqtt_on: MQTTBroker) -> None:
    before = rss_mib(mqtt_on.pid)
    sock, _ = ws_handshake(mqtt_on.http_port)
    with sock:
        sent = _send_until_refused(sock, 100 * MIB, ws_frame_header(100 * MIB) + bytes(MIB))
        assert _closed_soon(sock)
    assert sent < 100 * MIB
    # The same in fragments of 60 KiB: refused at the second fragment's header.
    sock, _ = ws_handshake(mqtt_on.http_port)
    with sock:
        fragment = bytes(60 * 1024)
        sock.sendall(ws_frame(fragment, fin=False))
        sent = _send_until_refused(sock, 100 * MIB, ws_frame(fragment, opcode=0x0, fin=False))
        assert _closed_soon(sock)
    assert sent < 100 * MIB
    assert rss_mib(mqtt_on.pid) - before < RSS_SLACK_MIB


def test_packets_before_connect_are_read_one_at_a_time(mqtt_on: MQTTBroker) -> None:
    """A CONNECT and a PUBLISH in one message; after the CONNACK a message of 1 MiB."""
    topic = unique("ws-one") + "/t"

    async def main() -> list[tuple[int, bytes]]:
        reader = codec.PacketReader(1 << 20)
        packets: list[tuple[int, bytes]] = []

        async def until(count: int) -> None:
            while len(packets) < count:
                message = await asyncio.wait_for(ws.receive(), 10)
                packets.extend((kind, body) for kind, _, body in reader.feed(message.data))

        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{mqtt_on.http_port}/ws"
            async with session.ws_connect(url, protocols=("mqtt",)) as ws:
                await ws.send_bytes(codec.encode_connect(unique("one"), username="guest", password=b"guest")
                                    + codec.publish(topic, bytes(1000), 1, False, False, 1))
                await until(2)
                await ws.send_bytes(codec.publish(topic, bytes(MIB), 1, False, False, 2))  # a message of 1 MiB
                await until(3)
                return packets
    assert asyncio.run(main()) == [(codec.CONNACK, b"\x00\x00"), (codec.PUBACK, b"\x00\x01"),
                                   (codec.PUBACK, b"\x00\x02")]


def test_tcp_reads_the_packets_after_connect_with_the_logged_in_limit(mqtt_on: MQTTBroker) -> None:
    """A CONNECT and, in the same write, a PUBLISH over 64 KiB: the PUBLISH is read under the limit
    the login sets, not the pre-login one (the input is read one packet at a time until then)."""
    with socket.create_connection(("127.0.0.1", mqtt_on.mqtt_port), timeout=10) as sock:
        sock.sendall(codec.encode_connect(unique("tcp-one"), username="guest", password=b"guest")
                     + codec.publish(unique("tcp") + "/t", bytes(200_000), 1, False, False, 9))
        reader = codec.PacketReader(1 << 20)
        packets: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 10
        while len(packets) < 2 and time.monotonic() < deadline:
            packets += reader.feed(sock.recv(4096))
        assert [(kind, body) for kind, _, body in packets] == [(codec.CONNACK, b"\x00\x00"),
                                                               (codec.PUBACK, b"\x00\x09")]


def test_ws_is_not_served_with_mqtt_off(tmp_path_factory: pytest.TempPathFactory) -> None:
    broker = LocalBroker(tmp_path_factory.mktemp("security-mqtt-off"))  # --mqtt-port 0
    broker.start()
    try:
        sock, head = ws_handshake(broker.http_port)
        sock.close()
        assert head.startswith(b"HTTP/1.1 404"), head[:100]
    finally:
        broker.close()


def _logged_in_ws(port: int, client_id: str) -> socket.socket:
    sock, head = ws_handshake(port)
    assert head.startswith(b"HTTP/1.1 101"), head[:100]
    sock.sendall(ws_frame(codec.encode_connect(client_id, username="guest", password=b"guest")))
    assert ws_read_frame(sock) == (0x2, codec.connack(False, codec.ACCEPTED))
    return sock


@pytest.mark.parametrize("logged_in", [False, True], ids=["before CONNECT", "after CONNECT"])
def test_an_unmasked_frame_closes_with_protocol_error(mqtt_on: MQTTBroker, logged_in: bool) -> None:
    """RFC 6455 5.1: a server closes the connection on a client frame that is not masked (1002)."""
    pingreq = bytes((0xC0, 0x00))
    if logged_in:
        sock = _logged_in_ws(mqtt_on.http_port, unique("unmasked"))
    else:
        sock, _ = ws_handshake(mqtt_on.http_port)
    with sock:
        sock.sendall(bytes((0x82, len(pingreq))) + pingreq)  # FIN, binary, no mask bit
        assert ws_read_frame(sock) == (0x8, (1002).to_bytes(2, "big"))
        assert _closed_soon(sock)


@pytest.mark.timeout(120)
def test_unfinished_messages_of_gone_clients_are_freed(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A logged-in client sends most of a large message in fragments and goes, again and again: each
    connection's fragments are freed when it ends (the response kept them in a reference cycle that
    only a full collection freed, so RSS grew by each message until then)."""
    broker = MQTTBroker(tmp_path_factory.mktemp("security-mqtt-unfinished"))  # its own: RSS undisturbed
    broker.start()
    try:
        fragment = ws_frame(bytes(MIB), opcode=0x0, fin=False)
        before = rss_mib(broker.pid)
        for round_ in range(4):
            with _logged_in_ws(broker.http_port, unique("unfinished")) as sock:
                sock.sendall(ws_frame(b"\x30", fin=False))  # a PUBLISH begins
                for _ in range(40):
                    sock.sendall(fragment)
            deadline = time.monotonic() + 10
            while rss_mib(broker.pid) - before > RSS_SLACK_MIB and time.monotonic() < deadline:
                time.sleep(0.05)
            assert rss_mib(broker.pid) - before < RSS_SLACK_MIB, (round_, rss_mib(broker.pid), before)
    finally:
        broker.close()
