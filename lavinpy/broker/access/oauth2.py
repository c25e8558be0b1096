"""``oauth2``: a JWT access token as the password (any user name), or HTTP's ``Authorization: Bearer``.

A password that is not shaped like a JWT is not this backend's (``UNKNOWN``: the next backend is
asked). A token is checked as RabbitMQ's OAuth 2 backend checks it: its audience names one resource
server (``oauth2_settings``), its signature verifies with a key of that server's provider (the JWKS,
``oauth2_keys``) under an asymmetric algorithm the provider allows (``none`` and HS* never: the keys
are public), ``exp`` is in the future and ``nbf`` in the past (``auth_oauth2_leeway`` seconds of
skew), ``iss`` is the provider's issuer when both are known. The user is the first of
``preferred_username_claims`` the token has; its tags and permissions are its scopes
(``token_grants``), checked by the same code as a stored user's.

A good token is remembered (by a digest) until it expires, so its signature is checked once however
often it logs in (each HTTP request with a Bearer token is a login); a refused one is remembered for
``REFUSED_SECONDS``, and its refusal logged once, with the reason.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .auth_backends import AuthResult, AuthStatus, LoginRequest
from .oauth2_keys import KeyFetchError, ProviderKeys
from .oauth2_settings import MAX_SCOPES, OAuth2Settings, ResourceServer, oauth2_settings
from .token_grants import TokenGrants

if TYPE_CHECKING:
    from ...config import Config
    from .users import UserStore

log = logging.getLogger("lavinpy.login")

CACHE_ENTRIES = 10_000  # good tokens remembered at most (the oldest go first)
REFUSED_SECONDS = 10.0  # a refused token is refused again at once this long, without a new log line
MAX_TOKEN_BYTES = 64 * 1024
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


class Refused(Exception):
    """The token is refused; the text says why (logged, never sent to the client)."""


@dataclass(frozen=True, slots=True)
class TokenLogin:
    username: str
    grants: TokenGrants
    expires_at: float | None  # the token's exp (epoch seconds)
    resource_server: str


def looks_like_jwt(secret: str | None) -> bool:
    return secret is not None and len(secret) <= MAX_TOKEN_BYTES and _JWT_SHAPE.fullmatch(secret) is not None


def _segment(text: str) -> Any:
    try:
        return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError):
        raise Refused("malformed token (a part is not base64url JSON)") from None


class OAuth2Backend:
    """The ``oauth2`` auth backend (``auth_backends.AuthBackend``)."""

    name = "oauth2"
    state_can_expire = True  # a token's exp ends the connection unless a new token renews it

    def __init__(self, config: Config, store: Callable[[], UserStore | None]) -> None:
        self.store = store  # the broker's user store, once loaded (for the vhosts that exist)
        self.settings: OAuth2Settings = oauth2_settings(config)
        self.providers = {name: ProviderKeys(p) for name, p in self.settings.providers.items()}
        self._good: dict[bytes, TokenLogin] = {}
        self._refused: dict[bytes, float] = {}  # digest -> until (monotonic)

    # --- auth_backends.AuthBackend ----------------------------------------------------------------
    def check_now(self, request: LoginRequest) -> AuthResult | None:
        token = request.password
        if request.certified or not looks_like_jwt(token):
            return AuthResult(AuthStatus.UNKNOWN, self.name)
        assert token is not None
        digest = hashlib.sha256(token.encode()).digest()
        try:
            login = self._cached(digest)
            if login is None:
                header, claims, server, keys = self._peek(token)
                key = keys.key(header.get("kid"))
                if key is None:
                    if keys.settings.static_only:
                        raise Refused(f"unknown signing key id {header.get('kid')!r} (not among the static keys)")
                    if keys.fetched_at and not keys.may_refresh():
                        raise Refused(f"unknown signing key id {header.get('kid')!r}")
                    return None  # the keys are fetched first (check)
                login = self._verify(token, digest, header, claims, server, key)
        except Refused as e:
            return self._refuse(digest, str(e))
        return self._known(login)

    async def check(self, request: LoginRequest) -> AuthResult:
        result = self.check_now(request)
        if result is not None:
            return result
        token = request.password
        assert token is not None
        digest = hashlib.sha256(token.encode()).digest()
        try:
            header, claims, server, keys = self._peek(token)
            if not keys.may_refresh():  # unknown key ids cannot make the broker fetch without bound
                raise Refused(f"unknown signing key id {header.get('kid')!r} (the keys were just fetched)")
            try:
                await keys.refresh()
            except KeyFetchError as e:
                raise Refused(f"the signing keys could not be fetched: {e}") from None
            key = keys.key(header.get("kid"))
            if key is None:
                raise Refused(f"unknown signing key id {header.get('kid')!r}")
            login = self._verify(token, digest, header, claims, server, key)
        except Refused as e:
            return self._refuse(digest, str(e))
        return self._known(login)

    # --- the checks -------------------------------------------------------------------------------
    def _cached(self, digest: bytes) -> TokenLogin | None:
        login = self._good.get(digest)
        if login is not None:
            if login.expires_at is not None and login.expires_at <= time.time() - self.settings.leeway:
                del self._good[digest]
                raise Refused(f"the token of user {login.username!r} expired at {login.expires_at:.0f}")
            return login
        until = self._refused.get(digest)
        if until is not None:
            if until > time.monotonic():
                raise _Repeated()
            del self._refused[digest]
        return None

    def _peek(self, token: str) -> tuple[dict, dict, ResourceServer, ProviderKeys]:
        """The unverified header and claims, the resource server the audience names, its provider's keys."""
        header_text, claims_text, _ = token.split(".")
        header, claims = _segment(header_text), _segment(claims_text)
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise Refused("malformed token (the header or the claims are not a JSON object)")
        server = self.settings.resolve(claims.get("aud"))
        if isinstance(server, str):
            raise Refused(server)
        keys = self.providers[server.provider]
        alg = header.get("alg")
        if alg not in keys.settings.algorithms:
            accepted = ", ".join(keys.settings.algorithms)
            raise Refused(f"signing algorithm {alg!r} is not accepted (accepted: {accepted})")
        return header, claims, server, keys

    def _verify(self, token: str, digest: bytes, header: dict, claims: dict, server: ResourceServer,
                key: Any) -> TokenLogin:
        from joserfc import jwt
        from joserfc.errors import JoseError

        provider = self.providers[server.provider].settings
        try:
            with warnings.catch_warnings():  # joserfc warns that EdDSA is deprecated (RFC 9864): still used
                warnings.simplefilter("ignore")
                verified = jwt.decode(token, key, algorithms=[header["alg"]])
        except JoseError as e:
            raise Refused(f"the signature does not verify ({e.error})") from None
        except (ValueError, TypeError) as e:
            raise Refused(f"malformed token ({e})") from None
        claims = verified.claims
        now, leeway = time.time(), self.settings.leeway
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if exp is None:
            if server.require_exp:
                raise Refused("the token has no exp claim")
        elif not isinstance(exp, int | float) or isinstance(exp, bool):
            raise Refused("the token's exp claim is not a number")
        elif exp <= now - leeway:
            raise Refused(f"the token expired at {exp:.0f} (now {now:.0f})")
        if nbf is not None and (not isinstance(nbf, int | float) or nbf > now + leeway):
            raise Refused(f"the token is not valid before {nbf}")
        issuer = claims.get("iss")
        if provider.issuer and issuer is not None and str(issuer).rstrip("/") != provider.issuer.rstrip("/"):
            raise Refused(f"the token was issued by {issuer!r}, not by {provider.issuer!r}")
        scopes = server.scopes(claims)
        if len(scopes) > MAX_SCOPES:
            raise Refused(f"the token has more than {MAX_SCOPES} scopes")
        username = server.username(claims)
        store = self.store()
        if store is None:
            raise Refused("the broker is starting")
        grants = TokenGrants(store, username, scopes, claims)
        grants.expires_at = float(exp) if exp is not None else None
        login = TokenLogin(username, grants, grants.expires_at, server.id)
        good = self._good
        good[digest] = login
        while len(good) > CACHE_ENTRIES:
            del good[next(iter(good))]
        return login

    def _known(self, login: TokenLogin) -> AuthResult:
        return AuthResult(AuthStatus.KNOWN, self.name, username=login.username, grants=login.grants,
                          expires_at=login.expires_at)

    def _refuse(self, digest: bytes, reason: str) -> AuthResult:
        if reason:  # a repeat of a refusal logged already has no reason
            log.warning("OAuth 2 token refused: %s", reason)
            refused = self._refused
            refused[digest] = time.monotonic() + REFUSED_SECONDS
            while len(refused) > CACHE_ENTRIES:
                del refused[next(iter(refused))]
        return AuthResult(AuthStatus.REFUSED, self.name)


class _Repeated(Refused):
    """A token refused a moment ago: refused again, not logged again."""

    def __init__(self) -> None:
        super().__init__("")
