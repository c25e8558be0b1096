"""``ldap``: users, tags and permissions from an LDAP directory, with RabbitMQ's LDAP backend semantics.

A login binds to the directory as the user: its DN is ``auth_ldap_user_dn_pattern`` with ``${username}``
filled in, or is looked up (``auth_ldap_dn_lookup_attribute`` = the user name under
``auth_ldap_dn_lookup_base``), before the user's bind when ``auth_ldap_dn_lookup_bind`` names an identity
to search with (or ``anon``), after it (as the user) when it is ``as_user``. A good bind is the user's
login; its tags are the ``auth_ldap_tag_queries`` that hold. The vhosts, queues, exchanges and topic keys
it may use are what ``auth_ldap_vhost_access_query``, ``auth_ldap_resource_access_query`` and
``auth_ldap_topic_access_query`` answer (``ldap_queries``), asked as ``auth_ldap_other_bind`` (the user by
default), each answer remembered for ``auth_ldap_cache_ttl`` seconds.

Who "knows" a login (the chain's rule): the user the directory has. A user name the lookup does not find,
or a bind refused for a DN that does not exist, is not this backend's (the next backend is asked); a
directory that cannot be reached is not either (logged), so ``[ldap, local]`` keeps local users working
while the directory is down. An empty password is refused (an unauthenticated bind proves nothing), as
RabbitMQ refuses it. A certificate login is not this backend's.

The directory is never asked on the event loop: logins and queries run in the backend's own bounded pool
of ``POOL_SIZE`` threads (at most ``MAX_WAITING`` waiting; past it a login is not this backend's and a
query answers no). Answers are cached per query and values for ``auth_ldap_cache_ttl`` seconds, shared
by every connection of the user. A permission check the cache cannot answer (the event loop asks it:
the model's checks are synchronous) waits for the pool's answer ``auth_ldap_check_wait`` seconds, then
answers no (the operation gets RabbitMQ's 403) while the query completes in the background and fills
the cache; an answer past its TTL is still used while its fresh one is fetched in the background; and
while the directory is known to be unreachable or slow (a query or login failed, or a wait ran out,
since the last answer), a miss answers no at once. So a slow or stopped directory holds the event loop
``auth_ldap_check_wait`` at most once, not ``auth_ldap_timeout`` a check, and other clients are
served meanwhile. A login, in its pool thread, also answers the vhost access query for the node's
vhosts (``PREPARED_VHOSTS`` at most) on the connection it bound, so opening a vhost rarely misses.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...wire.tls_keys import regular_file
from .auth_backends import AuthResult, AuthStatus, LoginRequest
from .ldap_queries import QueryError, escape_filter_value, evaluate, fill
from .users import PermissionKind, Permissions, TopicPermission

if TYPE_CHECKING:
    import re

    from ...config import Config
    from .users import UserStore

log = logging.getLogger("lavinpy.login")

CACHE_ENTRIES = 100_000  # remembered answers at most (all users)
POOL_SIZE = 4  # threads asking the directory (a stopped directory holds each for auth_ldap_timeout)
MAX_WAITING = 64  # logins and queries waiting for those threads at most
REFUSED_LOG_SECONDS = 10.0
PREPARED_VHOSTS = 32  # a login answers the vhost access query for this many of the node's vhosts


class DirectoryDown(Exception):
    """No server of auth_ldap_servers answered."""


@dataclass(frozen=True, slots=True)
class LdapSettings:
    servers: tuple[str, ...]
    port: int
    use_ssl: bool
    use_starttls: bool
    cacertfile: str
    timeout: float
    user_dn_pattern: str
    dn_lookup_attribute: str
    dn_lookup_base: str
    dn_lookup_bind: str  # as_user | anon | a DN
    dn_lookup_bind_password: str
    other_bind: str  # as_user | anon | a DN
    other_bind_password: str
    group_lookup_base: str
    tag_queries: dict[str, Any]
    vhost_access_query: Any
    resource_access_query: Any
    topic_access_query: Any
    cache_ttl: float
    check_wait: float

    @classmethod
    def of(cls, config: Config) -> LdapSettings:
        return cls(tuple(config.auth_ldap_servers), config.auth_ldap_port, config.auth_ldap_use_ssl,
                   config.auth_ldap_use_starttls, config.auth_ldap_ssl_cacertfile, config.auth_ldap_timeout,
                   config.auth_ldap_user_dn_pattern, config.auth_ldap_dn_lookup_attribute,
                   config.auth_ldap_dn_lookup_base, config.auth_ldap_dn_lookup_bind,
                   config.auth_ldap_dn_lookup_bind_password, config.auth_ldap_other_bind,
                   config.auth_ldap_other_bind_password, config.auth_ldap_group_lookup_base,
                   dict(config.auth_ldap_tag_queries), config.auth_ldap_vhost_access_query,
                   config.auth_ldap_resource_access_query, config.auth_ldap_topic_access_query,
                   config.auth_ldap_cache_ttl, min(config.auth_ldap_check_wait, config.auth_ldap_timeout))


def directory_tls(cacertfile: str) -> Any:
    """ldap3's TLS settings for a directory: its certificate checked against ``cacertfile`` (the system's
    CAs when empty) and against the server's name by Python's ssl module, which takes IP addresses.
    ldap3 checks the name itself after the handshake, and on Python 3.12 and later (no
    ssl.match_hostname) its fallback knows no IP addresses: a directory named by its address could
    never be reached over TLS."""
    import ldap3

    class HostCheckedTls(ldap3.Tls):
        def wrap_socket(self, connection: Any, do_handshake: bool = False) -> None:
            context = ssl.create_default_context(cafile=regular_file(cacertfile) or None)  # check_hostname on
            connection.socket = context.wrap_socket(connection.socket, do_handshake_on_connect=do_handshake,
                                                    server_hostname=connection.server.host)

    return HostCheckedTls(validate=ssl.CERT_REQUIRED, ca_certs_file=cacertfile or None)


class _Directory:
    """One ldap3 connection, bound as one identity (``ldap_queries.Directory``)."""

    def __init__(self, settings: LdapSettings, who: str, password: str | None) -> None:
        import ldap3
        from ldap3.core.exceptions import LDAPException

        tls = directory_tls(settings.cacertfile) if settings.use_ssl or settings.use_starttls else None
        pool = ldap3.ServerPool([ldap3.Server(host, port=settings.port, use_ssl=settings.use_ssl, tls=tls,
                                              connect_timeout=settings.timeout) for host in settings.servers],
                                ldap3.FIRST, active=1, exhaust=True)
        anonymous = who == "anon"
        self.connection = ldap3.Connection(pool, user=None if anonymous else who,
                                           password=None if anonymous else password,
                                           authentication=ldap3.ANONYMOUS if anonymous else ldap3.SIMPLE,
                                           receive_timeout=max(1, math.ceil(settings.timeout)),
                                           raise_exceptions=False)
        try:
            self.connection.open()
            if settings.use_starttls:
                self.connection.start_tls()
            self.bound = bool(self.connection.bind()) if not anonymous else True
        except LDAPException as e:
            raise DirectoryDown(str(e) or type(e).__name__) from None

    def close(self) -> None:
        try:
            self.connection.unbind()
        except Exception:  # already gone: nothing to release
            pass

    def _search(self, base: str, filter: str, scope: str, attributes: list[str]) -> list[Any]:
        from ldap3.core.exceptions import LDAPException

        try:
            self.connection.search(base, filter, search_scope=scope, attributes=attributes)
        except LDAPException as e:
            raise DirectoryDown(str(e) or type(e).__name__) from None
        return [entry for entry in self.connection.response or () if entry.get("type") == "searchResEntry"]

    def exists(self, dn: str, filter: str) -> bool:
        return bool(self._search(dn, filter, "BASE", []))

    def attribute(self, dn: str, name: str) -> list[str]:
        values: list[str] = []
        for entry in self._search(dn, "(objectClass=*)", "BASE", [name]):
            found = entry.get("attributes", {}).get(name, [])
            values += [str(v) for v in (found if isinstance(found, list) else [found])]
        return values

    def groups_with_member(self, base: str, attribute: str, member: str) -> list[str]:
        return [e["dn"] for e in self._search(base, f"({attribute}={escape_filter_value(member)})", "SUBTREE", [])]

    def lookup(self, base: str, attribute: str, username: str) -> str | None:
        found = self._search(base, f"({attribute}={escape_filter_value(username)})", "SUBTREE", [])
        return str(found[0]["dn"]) if len(found) == 1 else None


class LdapBackend:
    """The ``ldap`` auth backend (``auth_backends.AuthBackend``)."""

    name = "ldap"
    state_can_expire = False  # the directory is asked at login and per check, not per secret

    def __init__(self, config: Config, store: Callable[[], UserStore | None]) -> None:
        self.settings = LdapSettings.of(config)
        self.store = store
        self.answers: dict[tuple[Any, ...], tuple[bool, float]] = {}  # key -> (answer, fresh until)
        self.unreachable = False  # a query or login found the directory down; cleared by an answer
        self.refused_logged_at = -math.inf  # when a check was last logged as answered no unasked
        self._pool = ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="lavinpy-ldap")
        self._pending: dict[tuple[Any, ...], Future[bool]] = {}  # queries asked in the pool
        self._waiting = 0  # logins and queries submitted and not done
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], Any]) -> Future[Any] | None:
        """``work`` in the pool, or None when ``MAX_WAITING`` wait already."""
        with self._lock:
            if self._waiting >= MAX_WAITING:
                return None
            self._waiting += 1
        future = self._pool.submit(work)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._waiting -= 1

    def remember(self, key: tuple[Any, ...], answer: bool | None) -> bool:
        """``answer`` cached; None (the directory failed to answer) is no, not cached."""
        if answer is None:
            return False
        answers = self.answers
        if len(answers) >= CACHE_ENTRIES:
            answers.clear()
        answers[key] = (answer, time.monotonic() + self.settings.cache_ttl)
        return answer

    def probing(self) -> bool:
        """A query is out to a directory known to be unreachable: no more are sent until it answers."""
        return self.unreachable and bool(self._pending)

    def query(self, key: tuple[Any, ...], work: Callable[[], bool | None]) -> Future[bool] | None:
        """The pool's answer for ``key`` (one query per key at a time); remembered when it comes."""
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None and not pending.done():
                return pending
        future = self.submit(lambda: self.remember(key, work()))
        if future is not None:
            with self._lock:
                self._pending[key] = future
            future.add_done_callback(lambda done: self._forget(key, done))
        return future

    def _forget(self, key: tuple[Any, ...], done: Future[bool]) -> None:
        with self._lock:
            if self._pending.get(key) is done:
                del self._pending[key]

    def check_now(self, request: LoginRequest) -> AuthResult | None:
        if request.certified or request.password is None:
            return AuthResult(AuthStatus.UNKNOWN, self.name)
        if request.password == "":
            log.warning("LDAP login of %r refused: an empty password (unauthenticated bind) is not allowed",
                        request.username)
            return AuthResult(AuthStatus.REFUSED, self.name)
        return None  # the directory is asked off the event loop

    async def check(self, request: LoginRequest) -> AuthResult:
        result = self.check_now(request)
        if result is not None:
            return result
        assert request.password is not None
        username, password = request.username, request.password
        future = self.submit(lambda: self._login(username, password))
        if future is None:
            log.warning("LDAP login of %r: %d directory requests waiting already; the next backend decides",
                        username, MAX_WAITING)
            return AuthResult(AuthStatus.UNKNOWN, self.name)
        return await asyncio.wrap_future(future)

    def _login(self, username: str, password: str) -> AuthResult:
        """In a worker thread: the binds and the tag queries."""
        s = self.settings
        try:
            user_dn: str | None = fill(s.user_dn_pattern, {"username": username}, escape_dn=True)
            if s.dn_lookup_attribute and s.dn_lookup_bind != "as_user":  # looked up before the user's bind
                finder = _Directory(s, s.dn_lookup_bind, s.dn_lookup_bind_password)
                try:
                    user_dn = finder.lookup(s.dn_lookup_base, s.dn_lookup_attribute, username)
                finally:
                    finder.close()
                if user_dn is None:
                    return AuthResult(AuthStatus.UNKNOWN, self.name)
            assert user_dn is not None
            directory = _Directory(s, user_dn, password)
            try:
                if not directory.bound:
                    return self._bind_refused(username, user_dn)
                if s.dn_lookup_attribute and s.dn_lookup_bind == "as_user":  # looked up as the user
                    user_dn = directory.lookup(s.dn_lookup_base, s.dn_lookup_attribute, username) or user_dn
                grants = LdapGrants(self, username, user_dn, password)
                grants.tags = frozenset(tag for tag, query in s.tag_queries.items()
                                        if grants.ask(query, {"username": username, "user_dn": user_dn}, directory))
                store = self.store()
                if store is not None:  # the vhost an AMQP client opens next is asked here, off the loop
                    for vhost in store.vhosts()[:PREPARED_VHOSTS]:
                        grants.ask(s.vhost_access_query, grants._values(vhost=vhost.name), directory)
            finally:
                directory.close()
        except DirectoryDown as e:
            self.unreachable = True
            log.warning("LDAP login of %r: the directory could not be reached (%s); the next backend decides",
                        username, e)
            return AuthResult(AuthStatus.UNKNOWN, self.name)
        except QueryError as e:  # the DN pattern names a variable a login does not know
            log.warning("LDAP login of %r: %s", username, e)
            return AuthResult(AuthStatus.REFUSED, self.name)
        self.unreachable = False
        return AuthResult(AuthStatus.KNOWN, self.name, username=username, grants=grants)

    def _bind_refused(self, username: str, user_dn: str) -> AuthResult:
        """A refused bind: a wrong password for a user the directory has, or not this backend's user."""
        s = self.settings
        searcher = _Directory(s, "anon" if s.other_bind == "as_user" else s.other_bind, s.other_bind_password)
        try:
            known = searcher.bound and searcher.exists(user_dn, "(objectClass=*)")
        finally:
            searcher.close()
        if not known:
            return AuthResult(AuthStatus.UNKNOWN, self.name)
        log.warning("LDAP login of %r refused: the directory refused the bind as %s", username, user_dn)
        return AuthResult(AuthStatus.REFUSED, self.name)


class _NeedsDirectory(Exception):
    """The query asks the directory (evaluated in the pool, not at once)."""


class _NoDirectory:
    """A directory any question to which means the query needs the real one."""

    def _ask(self, *args: Any) -> Any:
        raise _NeedsDirectory

    exists = attribute = groups_with_member = lookup = _ask


_NO_DIRECTORY = _NoDirectory()


def _without_directory(query: Any, values: dict[str, str]) -> bool:
    """The query's answer when the directory is not needed for it, else ``_NeedsDirectory``: ``or`` is
    true when any branch is without asking (``and`` false when any is), whatever order they come in."""
    if isinstance(query, list) and len(query) == 2 and query[0] in ("or", "and") and isinstance(query[1], list):
        deciding = query[0] == "or"  # the branch value that decides the whole
        needs = False
        for branch in query[1]:
            try:
                if _without_directory(branch, values) is deciding:
                    return deciding
            except _NeedsDirectory:
                needs = True
        if needs:
            raise _NeedsDirectory
        return not deciding
    if isinstance(query, list) and len(query) == 2 and query[0] == "not":
        return not _without_directory(query[1], values)
    if isinstance(query, list) and len(query) == 2 and query[0] == "for" and isinstance(query[1], list):
        for entry in query[1]:
            if not (isinstance(entry, list) and len(entry) == 3 and entry[0] in values):
                break  # evaluate names the fault
            if values[entry[0]] == str(entry[1]):
                return _without_directory(entry[2], values)
    return evaluate(query, values, _NO_DIRECTORY, "")


def _shown(values: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


class LdapGrants:
    """An LDAP user's tags and permissions (``permissions.Grants``): its queries' answers, cached."""

    def __init__(self, backend: LdapBackend, username: str, user_dn: str, password: str) -> None:
        self.backend = backend
        self.settings = backend.settings
        self.username = username
        self.user_dn = user_dn
        self._password = password  # the queries bind as the user (RabbitMQ's other_bind as_user)
        self.tags: frozenset[str] = frozenset()

    @property
    def generation(self) -> int:
        """Changes with the user store and every cache_ttl: the connections' own caches follow."""
        store = self.backend.store()
        ttl = max(self.settings.cache_ttl, 0.001)
        return (store.generation if store is not None else 0) * 1_000_003 + int(time.monotonic() // ttl)

    def ask(self, query: Any, values: dict[str, str], directory: Any = None) -> bool:
        """A query's answer for ``values``: from the cache, else from the directory (no on any
        failure). With ``directory`` (a login's, in a pool thread) it is asked here; without, the
        caller is the event loop: the pool asks, and the answer is waited for ``check_wait`` at most."""
        backend = self.backend
        # The user's DN and name are among the values: one cache for every login of every user.
        key = (id(query), *values.values())
        cached = backend.answers.get(key)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        if directory is not None:
            return backend.remember(key, self._evaluate(query, values, directory))
        try:  # a query that needs no directory (constant, equals, match on the check's values): at once
            return backend.remember(key, _without_directory(query, values))
        except _NeedsDirectory:
            pass
        except QueryError as e:
            log.warning("LDAP query for user %r (%s) answered no: %s", self.username, _shown(values), e)
            return backend.remember(key, False)
        future = None if backend.probing() else backend.query(key, lambda: self._evaluate(query, values, None))
        if cached is not None:  # past its TTL: used until the fresh answer is in
            return cached[0]
        if future is None or backend.unreachable:
            now = time.monotonic()
            if now - backend.refused_logged_at > REFUSED_LOG_SECONDS:  # one line a while, not one per check
                backend.refused_logged_at = now
                log.warning("LDAP query for user %r (%s) answered no: the directory is unreachable or busy "
                            "(further such answers are not logged for %.0f s)", self.username, _shown(values),
                            REFUSED_LOG_SECONDS)
            return False
        try:
            return future.result(timeout=self.settings.check_wait)
        except FutureTimeout:
            backend.unreachable = True  # until an answer comes: the next misses do not wait
            log.warning("LDAP query for user %r (%s) answered no: the directory did not answer within %.0f ms "
                        "(its answer is cached when it comes)", self.username, _shown(values),
                        self.settings.check_wait * 1000)
            return False

    def _evaluate(self, query: Any, values: dict[str, str], directory: Any) -> bool | None:
        """The query asked of the directory (a connection of its own when ``directory`` is None); None
        when the directory could not answer (not cached: asked again at the next check)."""
        own = directory is None
        s = self.settings
        try:
            if own:
                who = self.user_dn if s.other_bind == "as_user" else s.other_bind
                directory = _Directory(s, who, self._password if s.other_bind == "as_user" else s.other_bind_password)
            answer = evaluate(query, values, directory, s.group_lookup_base or s.dn_lookup_base)
            self.backend.unreachable = False
            return answer
        except (QueryError, DirectoryDown) as e:
            log.warning("LDAP query for user %r (%s) answered no: %s", self.username, _shown(values), e)
            if isinstance(e, DirectoryDown):
                self.backend.unreachable = True
                return None
            return False
        finally:
            if own and directory is not None:
                directory.close()

    def _values(self, **more: str) -> dict[str, str]:
        return {"username": self.username, "user_dn": self.user_dn, **more}

    # --- permissions.Grants -----------------------------------------------------------------------
    def tags_of(self, user: str) -> frozenset[str]:
        return self.tags

    def can_access_vhost(self, user: str, vhost: str) -> bool:
        store = self.backend.store()
        return store is not None and store.vhost_exists(vhost) and \
            self.ask(self.settings.vhost_access_query, self._values(vhost=vhost))

    def permissions(self, user: str, vhost: str) -> Permissions | None:
        return None  # answered per name by check (a query, not regexes)

    def check(self, user: str, vhost: str, kind: PermissionKind, resource: str, resource_type: str = "queue") -> bool:
        store = self.backend.store()
        if store is None or not store.vhost_exists(vhost):
            return False
        return self.ask(self.settings.resource_access_query,
                        self._values(vhost=vhost, resource=resource_type, name=resource, permission=kind))

    def topic_permission(self, user: str, vhost: str, exchange: str) -> TopicPermission | None:
        return None  # topic keys are asked one by one (topic_allowed)

    def topic_allowed(self, user: str, vhost: str, exchange: str, kind: str, key: str) -> bool:
        return self.ask(self.settings.topic_access_query,
                        self._values(vhost=vhost, resource="topic", name=exchange, permission=kind, routing_key=key))

    def compiled(self, pattern: str) -> re.Pattern[str]:
        import re

        return re.compile(pattern)
