"""MQTT 5 enhanced authentication (4.12) where the identity work provides tokens: one method,
``OAUTH2-JWT``, whose Authentication Data is an OAuth 2.0 JWT access token, decided by the model's one
login operation as the token in the password is (the ``oauth2`` backend; any user name). It is one
step: the CONNECT carries the token and gets its CONNACK (no AUTH continue). Re-authentication: the
client sends AUTH with reason 0x19 (Re-authenticate), the same method and a new token; the broker
decides it as AMQP's update-secret is decided (the same user, still allowed the vhost) and answers
AUTH 0x00 (the connection now ends at the new token's expiry) or DISCONNECT 0x87 (not authorized). An
AUTH that is not such a request is a protocol error: with another method 0x8C (bad authentication
method), on a connection that agreed none, with reason 0x18 (Continue authentication: the broker never
asks to continue), or during another re-authentication, 0x82; a bad reason code or body, 0x81."""

from __future__ import annotations

from typing import Any

from ..broker.ops import LoginRequest
from . import codec, codec5
from .properties import malformed, protocol_error

AUTH_METHOD = "OAUTH2-JWT"
SUCCESS, CONTINUE_AUTHENTICATION, REAUTHENTICATE = 0x00, 0x18, 0x19
BAD_AUTHENTICATION_METHOD = 0x8C


def connect_method(properties: dict[str, Any], packet: codec.Connect) -> str | None:
    """The CONNECT's authentication method (None: none asked); its token becomes the login's password
    (a missing user name an empty one: the token names the user). MQTTProtocolError with CONNACK 0x8C
    for a method the broker does not offer."""
    method = properties.get("authentication_method")
    if method is None:
        if "authentication_data" in properties:
            raise protocol_error("authentication data without an authentication method")
        return None
    if method != AUTH_METHOD:
        raise codec.MQTTProtocolError(f"authentication method {method!r} is not supported (only {AUTH_METHOD})",
                                      BAD_AUTHENTICATION_METHOD, BAD_AUTHENTICATION_METHOD)
    packet.password = properties.get("authentication_data", b"")
    if packet.username is None:
        packet.username = ""
    return method


def reauthentication(body: bytes, agreed: str | None, pending: bool, username: str,
                     peer_host: str | None) -> LoginRequest:
    """The login an AUTH packet asks for; MQTTProtocolError (with its reason code) for any other AUTH."""
    reason, properties = codec5.parse_auth(body)
    if reason not in (SUCCESS, CONTINUE_AUTHENTICATION, REAUTHENTICATE):
        raise malformed(f"AUTH with reason code {reason:#04x}")
    if agreed is None:
        raise protocol_error("AUTH on a connection that agreed no authentication method")
    if reason != REAUTHENTICATE:
        raise protocol_error(f"AUTH with reason code {reason:#04x} from a client (the server asked for nothing)")
    method = properties.get("authentication_method")
    if method is None:
        raise protocol_error("AUTH without an authentication method")
    if method != agreed:
        raise codec.MQTTProtocolError(f"AUTH with authentication method {method!r}, not {agreed!r}",
                                      reason=BAD_AUTHENTICATION_METHOD)
    if pending:
        raise protocol_error("AUTH while a re-authentication is being decided")
    token = properties.get("authentication_data", b"")
    return LoginRequest("MQTT", method, username, token.decode("utf-8", "replace"), peer_host)


def success(method: str) -> bytes:
    return codec5.auth(SUCCESS, {"authentication_method": method})
