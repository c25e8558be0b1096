"""MQTT 5 enhanced authentication against a real OpenID Connect provider (tests/e2e/oidc_provider.py):
a client connects with the OAUTH2-JWT method and a token as its authentication data, re-authenticates
with AUTH 0x19 and a new token before the first expires (answered AUTH 0x00, the connection outlives
the first token), is disconnected with 0x87 when a re-authentication brings another user's token or
when its token expires without one."""

from __future__ import annotations

import socket
import time
from typing import Any

from lavinpy.mqtt import codec, codec5
from lavinpy.mqtt.auth5 import AUTH_METHOD
from lavinpy.mqtt.properties import read_properties

from .conftest import lavinpy_only
from .oidc_provider import OAuthBroker, OIDCProvider, claims_of, wait_past
from .oidc_provider import ob as ob  # one provider and one broker for the module
from .oidc_provider import provider as provider
from .test_oauth2 import ALL, client

pytestmark = lavinpy_only("starts lavinpy with the oauth2 backend")


class Raw5:
    """An MQTT 5 client of raw packets (paho has no AUTH packet to send)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = codec.PacketReader(1 << 20)
        self.reader.auth = True
        self.pending: list[tuple[int, int, bytes]] = []

    def packet(self) -> tuple[int, int, bytes] | None:
        """The next packet, None when the broker closed the connection."""
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.pending += self.reader.feed(data)
        return self.pending.pop(0)

    def connect(self, token: str) -> tuple[int, dict[str, Any]]:
        self.sock.sendall(codec5.encode_connect(f"a5-{time.monotonic_ns()}", properties={
            "authentication_method": AUTH_METHOD, "authentication_data": token.encode()}))
        found = self.packet()
        assert found is not None and found[0] == codec.CONNACK
        return found[2][1], read_properties(found[2], 2, "CONNACK")[0]

    def reauthenticate(self, token: str) -> tuple[int, int] | None:
        """(packet type, reason code) of the answer to AUTH 0x19."""
        self.sock.sendall(codec5.auth(0x19, {"authentication_method": AUTH_METHOD,
                                              "authentication_data": token.encode()}))
        found = self.packet()
        return None if found is None else (found[0], found[2][0])

    def ping(self) -> tuple[int, int] | None:
        self.sock.sendall(b"\xc0\x00")
        found = self.packet()
        return None if found is None else (found[0], found[2][0] if found[2] else -1)

    def close(self) -> None:
        self.sock.close()


def test_connect_reauthenticate_and_outlive_the_first_token(ob: OAuthBroker, provider: OIDCProvider) -> None:
    client_id = f"mqtt5-renewing-{time.monotonic_ns()}"
    provider.add_client(client_id, ALL, lifetime=3)
    short = provider.token(client_id)
    provider.clients[client_id].lifetime = 300
    renewed = provider.token(client_id)
    raw = Raw5(ob.mqtt_port)
    try:
        reason, props = raw.connect(short)
        assert reason == 0 and props["authentication_method"] == AUTH_METHOD
        assert raw.reauthenticate(renewed) == (codec.AUTH, 0x00)
        wait_past(claims_of(short)["exp"] + 1)
        assert raw.ping() == (codec.PINGRESP, -1)  # past the first token's exp: the new one holds
    finally:
        raw.close()


def test_reauthentication_with_another_users_token_disconnects_0x87(ob: OAuthBroker, provider: OIDCProvider) -> None:
    raw = Raw5(ob.mqtt_port)
    try:
        assert raw.connect(client(provider, ALL))[0] == 0
        assert raw.reauthenticate(client(provider, ALL)) == (codec.DISCONNECT, 0x87)
        assert raw.packet() is None
    finally:
        raw.close()


def test_token_expiry_without_reauthentication_disconnects_0x87(ob: OAuthBroker, provider: OIDCProvider) -> None:
    token = client(provider, ALL, lifetime=2)
    raw = Raw5(ob.mqtt_port)
    try:
        assert raw.connect(token)[0] == 0
        found = raw.packet()  # nothing sent: the broker's DISCONNECT at the token's exp
        assert found is not None and found[0] == codec.DISCONNECT and found[2][0] == 0x87
        assert time.time() >= claims_of(token)["exp"]
    finally:
        raw.close()


def test_a_bad_token_gets_connack_0x86_and_another_method_0x8c(ob: OAuthBroker, provider: OIDCProvider) -> None:
    raw = Raw5(ob.mqtt_port)
    try:
        assert raw.connect("not-a-token")[0] == 0x86
    finally:
        raw.close()
    raw = Raw5(ob.mqtt_port)
    try:
        raw.sock.sendall(codec5.encode_connect("m", properties={"authentication_method": "SCRAM-SHA-256"}))
        found = raw.packet()
        assert found is not None and found[2][:2] == b"\x00\x8c"
    finally:
        raw.close()
