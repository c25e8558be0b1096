"""The SASL mechanisms offered in connection.start, and the login a client's start-ok asks for.

PLAIN and AMQPLAIN carry a user and a password. EXTERNAL (RabbitMQ's rabbitmq_auth_mechanism_ssl)
carries nothing the broker reads: the user is the one ``ssl_cert_login_from`` takes from the client's
verified certificate, and it is offered only on a TLS connection whose client sent one. A mechanism
the broker knows but did not offer is refused as RabbitMQ refuses it (503 invalid authentication
mechanism).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pamqp import decode

from ..broker.ops import LoginRequest, PeerCertificate, certificate_user
from ..config import AUTH_MECHANISMS
from ..wire.constants import ACCESS_REFUSED, COMMAND_INVALID, INTERNAL_MECHANISM, SYNTAX_ERROR
from ..wire.errors import AMQPConnectionError

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger("lavinpy.login")
PROTOCOL = "AMQP 0-9-1"


def offered_mechanisms(config: Config, cert: PeerCertificate | None) -> list[str]:
    """``auth_mechanisms`` as this connection offers them: EXTERNAL only with a verified certificate."""
    return [m for m in config.auth_mechanisms if m != "EXTERNAL" or cert is not None]


def login_request(config: Config, mechanism: str, response: Any, cert: PeerCertificate | None,
                  peer: str | None) -> LoginRequest:
    """The login a start-ok asks for; AMQPConnectionError for a mechanism not offered or a malformed
    response."""
    if mechanism != INTERNAL_MECHANISM and mechanism not in offered_mechanisms(config, cert):
        if mechanism in AUTH_MECHANISMS:
            raise AMQPConnectionError(COMMAND_INVALID, f"invalid authentication mechanism '{mechanism}'")
        raise AMQPConnectionError(ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'")
    if mechanism == "EXTERNAL":
        assert cert is not None  # offered only then
        username = certificate_user(config, cert)
        if username is None:
            log.warning("%s login from %s: no user name in the client certificate (ssl_cert_login_from: %s)",
                        PROTOCOL, peer, config.ssl_cert_login_from)
        return LoginRequest(PROTOCOL, mechanism, username or "", None, peer, certified=username is not None)
    username, password = sasl_credentials(mechanism, response)
    return LoginRequest(PROTOCOL, mechanism, username, password, peer)


def sasl_credentials(mechanism: str, response: Any) -> tuple[str, str]:
    """(user, password) of a start-ok's ``response``; AMQPConnectionError for a malformed one or an
    unsupported mechanism."""
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response)
    if mechanism in ("PLAIN", INTERNAL_MECHANISM):  # the internal one: user and the node's token
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise AMQPConnectionError(ACCESS_REFUSED, "malformed PLAIN response")
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        try:
            _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
        except Exception:
            raise AMQPConnectionError(SYNTAX_ERROR, "malformed AMQPLAIN response") from None
        login, password = table.get("LOGIN", ""), table.get("PASSWORD", "")
        if isinstance(login, bytes):
            login = login.decode("utf-8", "replace")
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        return str(login), str(password)
    raise AMQPConnectionError(ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'")
