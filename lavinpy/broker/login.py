"""One login operation for every face (AMQP, MQTT, the HTTP API), in one order of checks.

A face starts an attempt with the credentials it read (``Logins.attempt``) and gets its throttle
delay at once (``LoginAttempt.delay``: the address's failed attempts, those in flight included); it
waits that long with its own timer, then asks for the outcome: ``decide_now`` when the password is
cheap to check (a SHA-256 hash, a cached success), else ``await decide()``, which checks a slow
(bcrypt) hash in a small worker pool, never on the event loop. The checks run in RabbitMQ's order:
the throttle's delay, the credentials, the loopback-only users rule; then, once the vhost is known,
``Logins.admit`` (the vhost, the connection limits, the user's access to the vhost). The outcome is
a success with the user, or a typed refusal with RabbitMQ's text, which each face renders (AMQP
403/530, MQTT CONNACK codes, HTTP 401).

Passwords: a user unknown to the store is checked against a dummy hash of the slowest kind in the
store, so an unknown name takes as long as a known one; a good check is remembered for
``CACHE_SECONDS`` (by user and a keyed hash of the password, forgotten on any change to the users),
so the HTTP API's Basic credentials on every request cost one check per few seconds; a bcrypt user
is rehashed to RabbitMQ's salted SHA-256 form on its first good login (``rehash_bcrypt_on_login``).

Who decides: the backends of ``auth_backends`` in order (``auth_backends``: the first that knows the
user decides); ``local`` is the user store with the password checks above. A certificate login
(``LoginRequest.certified``: AMQP's EXTERNAL, MQTT's ssl_cert_login, HTTPS with a client
certificate) has no password: the backend that knows the certificate's user name admits it, and the
throttle, the loopback rule and the vhost checks apply as to any login.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from ..wire.constants import INTERNAL_MECHANISM
from ..wire.passwords import BCRYPT_ALGORITHM, DEFAULT_ALGORITHM, hash_password, verify_password
from .access.actor import Actor
from .access.auth_backends import AuthBackend, AuthResult, AuthStatus, ChainLink, LoginRequest, make_chain
from .access.internal_login import InternalLogins
from .access.users import loopback_only_refused
from .errors import NOT_ALLOWED, BrokerConnectionError, BrokerError

if TYPE_CHECKING:
    from ..config import Config
    from .access.client_limits import ClientLimits
    from .access.login_throttle import LoginThrottle
    from .access.permissions import Grants
    from .access.users import UserStore
    from .vhost import VHost

log = logging.getLogger("lavinpy.login")

__all__ = ["LoginAttempt", "LoginOutcome", "LoginRequest", "Logins", "Refusal", "admit_connection"]

CACHE_SECONDS = 5.0  # a good password check is remembered this long
CACHE_ENTRIES = 10_000  # at most this many remembered checks (the oldest go first)
# Slow checks waiting for the pool at most: past it an attempt is refused at once (counted as a
# failure), so a flood of logins from many addresses costs bounded CPU and memory.
MAX_WAITING_CHECKS = 64


def _pool_size() -> int:
    """Threads checking slow hashes: bcrypt releases the GIL, so each may take a core; at most
    half of them, so that the event loop keeps one."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class Broker(Protocol):
    """What a login needs of the broker."""

    config: Config
    users: UserStore | None
    vhosts: dict[str, VHost]
    client_limits: ClientLimits
    login_throttle: LoginThrottle
    internal_logins: InternalLogins


class Refusal(Enum):
    CREDENTIALS = "credentials"  # unknown user, wrong or no password (AMQP 403, MQTT 4, HTTP 401)
    LOOPBACK = "loopback"  # one of loopback_users from a remote address (AMQP 403, MQTT 5, HTTP 401)
    NOT_ALLOWED = "not_allowed"  # the vhost, its or the user's connection limit, vhost access (AMQP 530, MQTT 5)


@dataclass(frozen=True, slots=True)
class LoginOutcome:
    username: str
    refusal: Refusal | None = None
    text: str = ""  # RabbitMQ's text of the refusal
    vhost: VHost | None = None  # set by ``Logins.admit``
    actor: Actor | None = None
    backend: str = ""  # the auth backend that decided
    grants: Grants | None = None  # the user's tags and permissions when not the user store's (a token's)
    expires_at: float | None = None  # when the credential expires (epoch seconds): the session ends then

    @property
    def ok(self) -> bool:
        return self.refusal is None


class Logins:
    """The broker's login operation: the throttle, the password checks and their pool and cache."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.throttle = broker.login_throttle
        self._pool: ThreadPoolExecutor | None = None  # made at the first slow check
        self._waiting = 0  # slow checks submitted and not done
        self._key = os.urandom(32)  # keys the cache's password digests (never stored in the clear)
        self._cache: dict[tuple[str, bytes], float] = {}  # (user, digest) -> expiry
        self._cache_generation = -1
        self._dummies: dict[str, str] = {}  # a bcrypt salt prefix ("$2a$12$") -> a dummy hash of that cost
        # ((users generation, user count), the slowest hash): looked for again after any change of the users
        self._slowest: tuple[tuple[int, int], tuple[str, str] | None] = ((-1, -1), None)
        self.chain: list[ChainLink] = make_chain(broker.config.auth_backends, {
            "local": lambda: LocalBackend(self), "oauth2": self._oauth2, "ldap": self._ldap})
        self.counts: dict[tuple[str, str], int] = {}  # (backend, "ok" | "refused") -> logins

    def _ldap(self) -> AuthBackend:
        from .access.ldap_backend import LdapBackend  # ldap3 is imported only by a broker that uses a directory

        return LdapBackend(self.broker.config, lambda: self.broker.users)

    def _oauth2(self) -> AuthBackend:
        from .access.oauth2 import OAuth2Backend  # joserfc is imported only by a broker that uses tokens

        return OAuth2Backend(self.broker.config, lambda: self.broker.users)

    def attempt(self, request: LoginRequest) -> LoginAttempt:
        """A login starts: counted by the throttle from now (attempts, not answers)."""
        return LoginAttempt(self, request, self.throttle.begin(request.peer))

    def admit(self, outcome: LoginOutcome, vhost: str) -> LoginOutcome:
        """A logged-in user opens ``vhost``: the vhost exists, its and the user's connection limits, the
        user's access (RabbitMQ's order); the connection is counted when admitted
        (``client_limits.connection_closed`` uncounts it)."""
        if not outcome.ok:
            return outcome
        try:
            opened, actor = admit_connection(self.broker, outcome.username, vhost, outcome.grants)
        except BrokerError as e:
            return LoginOutcome(outcome.username, Refusal.NOT_ALLOWED, e.text)
        return LoginOutcome(outcome.username, vhost=opened, actor=actor, backend=outcome.backend,
                            grants=outcome.grants, expires_at=outcome.expires_at)

    def decides_new_secret(self, login: LoginOutcome | None) -> bool:
        """Whether a live connection's new secret (AMQP update-secret, MQTT 5 re-authentication) is
        decided as a login (``attempt``, then ``secret_updated``): only when the backend that admitted
        the connection has credentials that expire (a token). A login by password, directory or
        certificate keeps its state, and the new secret is accepted as it is, unchecked: RabbitMQ asks
        only the backends whose state can expire and answers update-secret-ok without asking others."""
        if login is None:
            return False
        return any(link.authn.name == login.backend and link.authn.state_can_expire for link in self.chain)

    def secret_updated(self, outcome: LoginOutcome, vhost: str, username: str) -> LoginOutcome:
        """The outcome of a connection's ``update-secret``, decided as a login of the connection's user
        (``attempt`` with the new secret as the password): refused, it is RabbitMQ's refusal of a new
        secret (530); accepted, the user must still have access to the connection's vhost, as
        RabbitMQ checks again; a token must name the connection's ``username`` again (RabbitMQ's rule).
        The connection is not counted again."""
        if outcome.ok and outcome.username != username:
            log.warning("secret update was refused for user %r: the new token is user %r's", username,
                        outcome.username)
            outcome = LoginOutcome(username, Refusal.CREDENTIALS)
        if not outcome.ok:
            log.warning("secret update was refused for user %r", username)
            return LoginOutcome(username, Refusal.NOT_ALLOWED,
                                "NOT_ALLOWED - New secret was refused by one of the backends")
        users = self.broker.users
        assert users is not None
        grants: Grants = users if outcome.grants is None else outcome.grants
        opened = self.broker.vhosts.get(vhost)
        if opened is None or not grants.can_access_vhost(username, vhost):
            return LoginOutcome(username, Refusal.NOT_ALLOWED,
                                f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{username}'")
        return LoginOutcome(username, vhost=opened, actor=Actor(users, username, outcome.grants),
                            backend=outcome.backend, grants=outcome.grants, expires_at=outcome.expires_at)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # --- password checks ------------------------------------------------------------------------
    def _stored(self, username: str) -> tuple[str, str, str | None]:
        """(hash, algorithm, dummy) to check a password of ``username`` against. For an unknown user
        (``dummy`` not None: the bcrypt salt prefix of the cost, or ""), a dummy hash of the slowest
        kind in the store ("" while the dummy of that cost is not made yet)."""
        users = self.broker.users
        assert users is not None
        stored = users.password_of(username)
        if stored is not None:
            return stored[0], stored[1], None
        version = (users.generation, users.user_count())
        if self._slowest[0] != version:
            self._slowest = (version, users.slowest_hash())
        slowest = self._slowest[1]
        if slowest is None:
            return self._dummies.setdefault("", hash_password(os.urandom(12).hex())), DEFAULT_ALGORITHM, ""
        prefix = slowest[0][:7]
        return self._dummies.get(prefix, ""), BCRYPT_ALGORITHM, prefix

    def _digest(self, username: str, password: str) -> tuple[str, bytes]:
        return username, hmac.new(self._key, password.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def _cached(self, username: str, password: str) -> bool:
        users = self.broker.users
        assert users is not None
        if self._cache_generation != users.generation:  # a user changed: nothing remembered holds
            self._cache.clear()
            self._cache_generation = users.generation
            return False
        expiry = self._cache.get(self._digest(username, password))
        return expiry is not None and expiry > time.monotonic()

    def _remember(self, username: str, password: str) -> None:
        users = self.broker.users
        assert users is not None
        if self._cache_generation != users.generation:
            self._cache.clear()
            self._cache_generation = users.generation
        cache = self._cache
        key = self._digest(username, password)
        cache.pop(key, None)
        cache[key] = time.monotonic() + CACHE_SECONDS
        while len(cache) > CACHE_ENTRIES:
            del cache[next(iter(cache))]

    def _check(self, password: str, password_hash: str, algorithm: str) -> bool:
        try:
            return verify_password(password, password_hash, algorithm)
        except ValueError as e:  # an unsupported algorithm, bcrypt not installed
            log.warning("a password check failed: %s", e)
            return False

    def _slow_check(self, password: str, password_hash: str, algorithm: str, prefix: str) -> bool:
        """In a pool thread: the check, or for an unknown user (``prefix``: its dummy's cost) the
        making of the dummy hash (as slow as a check)."""
        if not password_hash and prefix:  # the dummy of this cost is made by its first use
            cost = int(prefix[4:6]) if prefix[4:6].isdigit() else 12
            self._dummies.setdefault(prefix, _bcrypt_dummy(cost))
            return False
        return self._check(password, password_hash, algorithm)

    async def _in_pool(self, password: str, password_hash: str, algorithm: str, prefix: str) -> bool | None:
        """The slow check in the pool; None when too many wait already (refused at once)."""
        if self._waiting >= MAX_WAITING_CHECKS:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_pool_size(), thread_name_prefix="lavinpy-login")
        self._waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._pool, self._slow_check, password, password_hash, algorithm, prefix)
        finally:
            self._waiting -= 1

    def _rehash(self, username: str, password: str, checked: str) -> None:
        """A bcrypt user's first good login: RabbitMQ's SHA-256 hash of the same password from now on
        (unless the password changed while it was checked)."""
        users = self.broker.users
        assert users is not None
        stored = users.password_of(username)
        if stored is None or stored != (checked, BCRYPT_ALGORITHM):
            return
        try:
            users.set_password_hash(username, hash_password(password), DEFAULT_ALGORITHM)
        except OSError as e:
            log.warning("user %r: the bcrypt password hash was not replaced: %s", username, e)
            return
        log.info("user %r: bcrypt password hash replaced by %s on a good login", username, DEFAULT_ALGORITHM)


def admit_connection(broker: Broker, username: str, name: str, grants: Grants | None = None) -> tuple[VHost, Actor]:
    """A connection of any face opening vhost ``name`` as the logged-in ``username``: the vhost must
    exist, its and the user's connection limits are checked before the user's access (RabbitMQ's
    order), and the admitted connection is counted (``connection_closed`` uncounts it). ``grants``:
    the user's tags and permissions when they are not the user store's (a token's scopes)."""
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise BrokerConnectionError(NOT_ALLOWED, f"vhost {name} not found")
    users = broker.users
    assert users is not None
    broker.client_limits.check_connection(name, username)
    if not (users if grants is None else grants).can_access_vhost(username, name):
        raise BrokerConnectionError(NOT_ALLOWED, f"access to vhost '{name}' refused for user '{username}'")
    broker.client_limits.connection_opened(name, username)
    return vhost, Actor(users, username, grants)


def _bcrypt_dummy(cost: int) -> str:
    import bcrypt  # only called for a store that holds bcrypt hashes, so the package is there

    return str(bcrypt.hashpw(os.urandom(12).hex().encode(), bcrypt.gensalt(cost, b"2a")).decode("ascii"))


class LoginAttempt:
    """One login from ``Logins.attempt`` to its outcome. The face waits ``delay`` seconds first."""

    __slots__ = ("logins", "request", "delay", "_done", "_step")

    def __init__(self, logins: Logins, request: LoginRequest, delay: float) -> None:
        self.logins = logins
        self.request = request
        self.delay = delay
        self._done = False
        self._step = 0  # the chain's backend asked next

    def decide_now(self) -> LoginOutcome | None:
        """After the delay: the outcome when it costs nothing slow, else None (``await decide()``)."""
        request, logins = self.request, self.logins
        password = request.password
        if password is None and not request.certified:
            return self._conclude(None)
        if request.mechanism == INTERNAL_MECHANISM and password is not None:  # the node's own link
            users = logins.broker.users
            internal = logins.broker.internal_logins
            ok = users is not None and internal.verify(request.username, password, request.peer, users)
            if not ok or users is None:
                return self._conclude(AuthResult(AuthStatus.REFUSED, "internal"))
            # A token user's link: the rights and the expiry its creator's token had.
            return self._conclude(AuthResult(AuthStatus.KNOWN, "internal", "internal",
                                             grants=internal.creator_grants(request.username, users),
                                             expires_at=internal.creator_expiry(request.username, users)))
        chain = logins.chain
        while self._step < len(chain):  # the first backend that knows the user decides
            link = chain[self._step]
            result = link.authn.check_now(request)
            if result is None:
                return None
            if result.status is not AuthStatus.UNKNOWN:
                return self._conclude(_linked(result, link))
            self._step += 1
        return self._conclude(None)  # no backend knows the user

    async def decide(self) -> LoginOutcome:
        """After the delay: the outcome, slow checks awaited (a slow hash in the worker pool)."""
        while True:
            outcome = self.decide_now()
            if outcome is not None:
                return outcome
            link = self.logins.chain[self._step]
            try:
                result = await link.authn.check(self.request)
            except BaseException:
                self.abandon()
                raise
            if result.status is not AuthStatus.UNKNOWN:
                return self._conclude(_linked(result, link))
            self._step += 1

    async def run(self) -> LoginOutcome:
        """The delay, then the outcome (for a face that can simply wait: the HTTP API)."""
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        except BaseException:
            self.abandon()
            raise
        return await self.decide()

    def abandon(self) -> None:
        """The client went away before the outcome: the attempt counts as failed (it proved nothing)."""
        if not self._done:
            self._done = True
            request = self.request
            self.logins.throttle.end(request.peer, request.username, request.mechanism, False)

    def _conclude(self, result: AuthResult | None) -> LoginOutcome:
        """The backends' answer (None: no backend knows the user), then the loopback-only rule."""
        request, logins = self.request, self.logins
        ok = result is not None and result.status is AuthStatus.KNOWN
        username = result.username if ok and result is not None and result.username else request.username
        backend = result.backend if result is not None else "none"
        key = (backend, "ok" if ok else "refused")
        logins.counts[key] = logins.counts.get(key, 0) + 1
        if not self._done:
            self._done = True
            logins.throttle.end(request.peer, username, f"{request.mechanism}, {request.protocol}", ok)
        if not ok:
            # Logged (rate-limited) by the login throttle, not per attempt.
            return LoginOutcome(username, Refusal.CREDENTIALS,
                                f"ACCESS_REFUSED - Login was refused using authentication mechanism "
                                f"{request.mechanism}. For details see the broker logfile.")
        assert result is not None
        if loopback_only_refused(logins.broker.config.loopback_users, username, request.peer):
            log.warning("%s login from %s: user %r may only connect from loopback", request.protocol,
                        request.peer, username)
            return LoginOutcome(username, Refusal.LOOPBACK,
                                f"ACCESS_REFUSED - user '{username}' can only connect via localhost")
        grants = result.grants if result.authz == result.backend else None
        return LoginOutcome(username, backend=result.backend, grants=grants, expires_at=result.expires_at)


def _linked(result: AuthResult, link: ChainLink) -> AuthResult:
    """A backend's answer with the chain's authz backend (its grants hold only when it is the same)."""
    return AuthResult(result.status, result.backend, link.authz, result.username, result.grants, result.expires_at)


class LocalBackend:
    """``local``: the user store; a password checked against its hash (a slow one in the pool), a
    good check remembered; a certificate's user admitted when the store has it."""

    name = "local"
    state_can_expire = False  # a password's login holds until the connection ends

    def __init__(self, logins: Logins) -> None:
        self.logins = logins

    def _result(self, request: LoginRequest, known: bool, ok: bool) -> AuthResult:
        if not known:
            return AuthResult(AuthStatus.UNKNOWN, self.name)
        if ok and request.password is not None and not request.certified:
            self.logins._remember(request.username, request.password)
        return AuthResult(AuthStatus.KNOWN if ok else AuthStatus.REFUSED, self.name)

    def check_now(self, request: LoginRequest) -> AuthResult | None:
        logins = self.logins
        users = logins.broker.users
        assert users is not None
        password = request.password
        if request.certified or password is None:  # no password to check: does the store know the user?
            return self._result(request, users.password_of(request.username) is not None, request.certified)
        if logins._cached(request.username, password):
            return AuthResult(AuthStatus.KNOWN, self.name)
        password_hash, algorithm, dummy = logins._stored(request.username)
        if algorithm == BCRYPT_ALGORITHM:
            return None
        return self._result(request, dummy is None, logins._check(password, password_hash, algorithm))

    async def check(self, request: LoginRequest) -> AuthResult:
        result = self.check_now(request)
        if result is not None:
            return result
        logins = self.logins
        password = request.password
        assert password is not None
        password_hash, algorithm, dummy = logins._stored(request.username)
        ok = await logins._in_pool(password, password_hash, algorithm, dummy or "")
        if ok is None:
            log.warning("login of user %r refused: %d password checks waiting already", request.username,
                        MAX_WAITING_CHECKS)
        if ok and dummy is None and logins.broker.config.rehash_bcrypt_on_login:
            logins._rehash(request.username, password, password_hash)
        return self._result(request, dummy is None, bool(ok))
