"""HTTP basic authentication through the model's login operation, and the management-tag gate.

As RabbitMQ's management API: no or wrong credentials are 401 with a ``WWW-Authenticate`` challenge;
a user without any management tag (administrator, monitoring, policymaker, management) is refused
with 401 ``not_authorised`` (RabbitMQ answers every authorisation refusal with 401; the error field
tells a refusal, ``not_authorised``, from failed credentials, ``not_authorized``). The login itself
is the one every face uses (``broker.login``): the login throttle, the password checked off the event
loop (and remembered for a few seconds), the loopback-only users. With ``management_ssl_cert_login``
a request over HTTPS without Basic credentials whose client sent a verified certificate acts as the
certificate's user (``ssl_cert_login_from``); Basic credentials, when sent, take priority.
``Authorization: Bearer <token>`` logs in with an OAuth 2 token (the ``oauth2`` backend), as a token
sent as the Basic password does; the user and its tags come from the token.
"""

from __future__ import annotations

import binascii
from base64 import b64decode

from aiohttp import web

from ..broker.ops import Actor, Broker, LoginRequest, certificate_login, peer_certificate
from .errors import ApiError

REALM = 'Basic realm="RabbitMQ Management"'


def _credentials(request: web.Request) -> tuple[str, str] | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return "", value.strip()  # the token names its user
    if scheme.lower() != "basic" or not value:
        return None
    try:
        decoded = b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, sep, password = decoded.partition(":")
    return (name, password) if sep else None


def _certificate_user(broker: Broker, request: web.Request) -> str | None:
    config = broker.config
    if not config.management_ssl_cert_login or request.transport is None:
        return None
    return certificate_login(True, config, peer_certificate(request.transport.get_extra_info("ssl_object")))


async def authenticate(broker: Broker, request: web.Request) -> Actor:
    """The acting user of a request, or ApiError 401."""
    users = broker.users
    assert users is not None
    credentials = _credentials(request)
    if credentials is not None:
        name, password = credentials
        login = LoginRequest("HTTP", "PLAIN", name, password, request.remote or "")
    else:  # no Basic credentials: a verified client certificate's user (management_ssl_cert_login)
        cert_user = _certificate_user(broker, request)
        if cert_user is None:
            raise ApiError(401, "not_authorized", "Not_Authorized")
        login = LoginRequest("HTTP", "EXTERNAL", cert_user, None, request.remote or "", certified=True)
    outcome = await broker.logins.attempt(login).run()
    if not outcome.ok:
        raise ApiError(401, "not_authorized", "Not_Authorized")
    actor = Actor(users, outcome.username, outcome.grants)
    if not actor.can_manage():
        raise ApiError(401, "not_authorised", "Not management user")
    return actor
