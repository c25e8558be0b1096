"""The login backends' interface, and the chain ``auth_backends`` names (RabbitMQ's and LavinMQ's meaning).

A login asks the backends in order; the first one that knows the user decides (its yes or no is
final, the later ones are not asked); a user no backend knows is refused. Each backend answers a
``LoginRequest`` with an ``AuthResult``: ``KNOWN`` (authenticated), ``REFUSED`` (known, and the
credentials are wrong) or ``UNKNOWN`` (not this backend's user: ask the next). A backend answers at
once (``check_now``) when that is cheap, or returns None and is then awaited (``check``: a slow hash,
a token's keys, a directory). The user's tags and permissions come from the backend that decided,
or from the one an ``authn:authz`` entry names (``AuthResult.authz``).

A certificate login (``LoginRequest.certified``: the user name taken from a verified client
certificate, no password) is decided the same way: a backend that keeps users says whether it knows
the name; one that needs a secret (a token) answers ``UNKNOWN``.

Adding a backend (``ldap``): one module with a class following ``AuthBackend``, its name
in ``config.AUTH_BACKENDS`` and a line in the broker's ``make_chain`` call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class LoginRequest:
    protocol: str  # the face, for the log: "AMQP 0-9-1", "MQTT", "HTTP"
    mechanism: str  # PLAIN, AMQPLAIN, EXTERNAL, ... (named in AMQP's refusal text)
    username: str
    password: str | None  # None: none given (refused, unless certified)
    peer: str | None  # the client's address (None: a unix socket)
    certified: bool = False  # the user name is a verified client certificate's: no password is checked


class AuthStatus(Enum):
    KNOWN = "known"  # the user is this backend's and the credentials hold
    REFUSED = "refused"  # the user is this backend's, the credentials do not hold (final)
    UNKNOWN = "unknown"  # not this backend's user: the next backend is asked


@dataclass(frozen=True, slots=True)
class AuthResult:
    status: AuthStatus
    backend: str  # the backend that answered (shown per connection, logged)
    authz: str = ""  # the backend giving tags and permissions (set by the chain)
    # A backend whose credential names the user (a token): that user, its tags and permissions
    # (a permissions.Grants; None: the user store's), and when the credential expires (epoch seconds).
    username: str = ""
    grants: Any = None
    expires_at: float | None = None


class AuthBackend(Protocol):
    """One login backend."""

    name: str
    # Whether the credentials it admits expire (a token's exp): only such a backend decides a live
    # connection's new secret (RabbitMQ's state_can_expire); the others' logins keep their state.
    state_can_expire: bool

    def check_now(self, request: LoginRequest) -> AuthResult | None:
        """The answer when it costs nothing slow, else None (then ``await check``)."""

    async def check(self, request: LoginRequest) -> AuthResult:
        """The answer, waiting for whatever is slow (off the event loop)."""


@dataclass(frozen=True, slots=True)
class ChainLink:
    authn: AuthBackend
    authz: str  # the backend whose tags and permissions the user gets


def make_chain(entries: list[str], backends: Mapping[str, Callable[[], AuthBackend]]) -> list[ChainLink]:
    """The chain of ``auth_backends`` (names, or ``authn:authz`` pairs), each backend made once.
    An unknown name is a ValueError naming it (the settings check it first)."""
    made: dict[str, AuthBackend] = {}
    chain = []
    for entry in entries:
        authn, _, authz = entry.partition(":")
        for name in (authn, authz or authn):
            if name not in backends:
                raise ValueError(f"auth_backends: unknown backend {name!r}")
        if authn not in made:
            made[authn] = backends[authn]()
        chain.append(ChainLink(made[authn], authz or authn))
    return chain
