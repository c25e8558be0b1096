"""What a CONNECT asks of the model's one login operation: the user (from the CONNECT, RabbitMQ's
``vhost:user`` form, the default user for an anonymous client when allowed, or a verified client
certificate's user with ``mqtt_ssl_cert_login``), the password and the vhost."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..broker.ops import LoginRequest, PeerCertificate, certificate_login
from . import codec

if TYPE_CHECKING:
    from ..config import Config


def connect_login(config: Config, packet: codec.Connect, cert: PeerCertificate | None,
                  peer_host: str | None) -> tuple[LoginRequest, str] | None:
    """(the login, the vhost's name) a CONNECT asks for; None for an anonymous CONNECT that is not
    allowed (``mqtt_allow_anonymous``)."""
    vhost_name = config.mqtt_default_vhost
    password: str | None
    # RabbitMQ's ssl_cert_login: no user name and no password, a verified certificate's user.
    cert_user = certificate_login(config.mqtt_ssl_cert_login, config, cert) \
        if packet.username is None and packet.password is None else None
    if cert_user is not None:
        username, password = cert_user, None
    elif packet.username is None:
        if not config.mqtt_allow_anonymous:
            return None
        username, password = config.default_user, config.default_password
    else:
        username = packet.username
        if ":" in username:  # RabbitMQ's vhost:user
            vhost_name, username = username.split(":", 1)
        password = None if packet.password is None else packet.password.decode("utf-8", "replace")
    mechanism = "PLAIN" if cert_user is None else "EXTERNAL"
    return LoginRequest("MQTT", mechanism, username, password, peer_host, cert_user is not None), vhost_name


def session_timer(keepalive_check: float, expires_at: float | None) -> float:
    """Seconds to the connection's next timer: its keepalive check (0: none), or sooner the expiry of
    its login's credential (a token's exp), which closes it."""
    if expires_at is None:
        return keepalive_check
    left = max(0.001, expires_at - time.time())
    return min(keepalive_check, left) if keepalive_check else left
