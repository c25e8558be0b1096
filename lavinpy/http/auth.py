"""HTTP basic authentication against the user store, and the management-tag gate.

As RabbitMQ's management API: no or wrong credentials are 401 with a ``WWW-Authenticate`` challenge;
a user without any management tag (administrator, monitoring, policymaker, management) is refused
with 401 ``not_authorised`` (RabbitMQ answers every authorisation refusal with 401; the error field
tells a refusal, ``not_authorised``, from failed credentials, ``not_authorized``); users listed in
``loopback_users`` log in only from a loopback address.
"""

from __future__ import annotations

import binascii
from base64 import b64decode

from aiohttp import web

from ..broker.actor import Actor
from ..broker.broker import Broker
from ..broker.users import loopback_only_refused
from .errors import ApiError

REALM = 'Basic realm="RabbitMQ Management"'


def _credentials(request: web.Request) -> tuple[str, str] | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        decoded = b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, sep, password = decoded.partition(":")
    return (name, password) if sep else None


def authenticate(broker: Broker, request: web.Request) -> Actor:
    """The acting user of a request, or ApiError 401."""
    users = broker.users
    assert users is not None
    credentials = _credentials(request)
    user = users.authenticate(*credentials) if credentials is not None else None
    if user is None or loopback_only_refused(broker.config.loopback_users, user.name, request.remote or ""):
        raise ApiError(401, "not_authorized", "Not_Authorized")
    actor = Actor(users, user.name)
    if not actor.can_manage():
        raise ApiError(401, "not_authorised", "Not management user")
    return actor
