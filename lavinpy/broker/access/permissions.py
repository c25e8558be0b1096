"""Permission checks for broker operations, shared by every face (AMQP today, HTTP later).

Texts are RabbitMQ's: "ACCESS_REFUSED - write access to exchange 'x' in vhost '/' refused for user 'u'".
Each connection holds one ``UserPermissions``: a small cache of answers that is dropped whenever the
user store changes (one int compare per check), so a change made at run time applies to the
connection's next operation, and that never grows past ``CACHE_MAX_ENTRIES``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ..errors import ACCESS_REFUSED, BrokerChannelError
from .users import DEFAULT_EXCHANGE_RESOURCE, PermissionKind, Permissions, TopicPermission

# About 200 bytes an entry: a connection caches at most ~100 KiB of answers, however many names it uses.
CACHE_MAX_ENTRIES = 512
# Declare arguments / policy keys that name an exchange messages will later be published to.
DEAD_LETTER_EXCHANGE_ARG = "x-dead-letter-exchange"
ALTERNATE_EXCHANGE_ARG = "alternate-exchange"
POLICY_TARGET_KEYS = ("dead-letter-exchange", "alternate-exchange")
POLICY_TAGS = frozenset({"administrator", "policymaker"})


class Grants(Protocol):
    """Where a user's tags and permissions come from: the user store (``users.UserStore``), or a
    token's scopes (``token_grants.TokenGrants``). Every check below reads them through this, so a
    user of any backend is checked by the same code."""

    @property
    def generation(self) -> int:
        """Bumped by any change that may change an answer (cached answers are dropped)."""

    def tags_of(self, user: str) -> frozenset[str]: ...

    def can_access_vhost(self, user: str, vhost: str) -> bool: ...

    def permissions(self, user: str, vhost: str) -> Permissions | None: ...

    def check(self, user: str, vhost: str, kind: PermissionKind, resource: str, resource_type: str = "queue") -> bool:
        ...

    def topic_permission(self, user: str, vhost: str, exchange: str) -> TopicPermission | None:
        """None: no topic permission applies (then every key is allowed, unless ``TopicQueries``)."""

    def compiled(self, pattern: str) -> re.Pattern[str]: ...


@runtime_checkable
class TopicQueries(Protocol):
    """Grants whose topic permissions are asked key by key (a directory's query), not regexes."""

    def topic_allowed(self, user: str, vhost: str, exchange: str, kind: str, key: str) -> bool: ...


class _AskedKeys:
    """A ``TopicQueries``' answer in the shape of a compiled regex (``TopicCheck`` searches it)."""

    __slots__ = ("grants", "user", "vhost", "exchange", "kind")

    def __init__(self, grants: TopicQueries, user: str, vhost: str, exchange: str, kind: str) -> None:
        self.grants, self.user, self.vhost, self.exchange, self.kind = grants, user, vhost, exchange, kind

    def search(self, key: str) -> bool | None:
        return True if self.grants.topic_allowed(self.user, self.vhost, self.exchange, self.kind, key) else None


def access_refused(kind: str, resource_type: str, name: str, vhost: str, user: str) -> BrokerChannelError:
    """RabbitMQ's 403 for ``user`` lacking ``kind`` permission on the named queue or exchange."""
    if resource_type == "exchange" and name == "":
        name = DEFAULT_EXCHANGE_RESOURCE
    return BrokerChannelError(ACCESS_REFUSED, f"{kind} access to {resource_type} '{name}' in vhost '{vhost}' "
                                            f"refused for user '{user}'")


def topic_access_refused(kind: str, routing_key: str, exchange: str, vhost: str, user: str) -> BrokerChannelError:
    """RabbitMQ's 403 for a routing or binding key a topic permission does not allow."""
    return BrokerChannelError(ACCESS_REFUSED, f"{kind} access to topic '{routing_key}' in exchange '{exchange}' "
                                            f"in vhost '{vhost}' refused for user '{user}'")


def expand_topic_pattern(pattern: str, user: str, vhost: str, client_id: str | None = None) -> str:
    """RabbitMQ's variable expansion: ``{username}``, ``{vhost}`` and, for an MQTT client, ``{client_id}``
    replaced as they are (not escaped); an empty pattern allows only the empty key, as RabbitMQ's ``^$``."""
    if pattern == "":
        return "^$"
    expanded = pattern.replace("{username}", user).replace("{vhost}", vhost)
    return expanded if client_id is None else expanded.replace("{client_id}", client_id)


class TopicCheck:
    """One user's topic permission of one kind on one topic exchange: called with each routing (or
    binding) key. Made only when a topic permission applies, so a user without any pays nothing; the
    last allowed key is remembered (a publisher usually repeats it)."""

    __slots__ = ("kind", "regex", "exchange", "vhost", "user", "_last")

    def __init__(self, kind: str, regex: re.Pattern[str] | _AskedKeys, exchange: str, vhost: str, user: str) -> None:
        self.kind = kind
        self.regex = regex
        self.exchange = exchange
        self.vhost = vhost
        self.user = user
        self._last: str | None = None

    def __call__(self, key: str) -> None:
        if key == self._last:
            return
        if self.regex.search(key) is None:
            raise topic_access_refused(self.kind, key, self.exchange, self.vhost, self.user)
        self._last = key


def topic_check(users: Grants, user: str, vhost: str, kind: str, exchange_name: str,
                exchange_type: str, client_id: str | None = None) -> TopicCheck | None:
    """The check a ``kind`` ("write" or "read") key on that exchange needs, or None when no topic
    permission applies (not a topic exchange, or the user has none on it: RabbitMQ then allows all)."""
    if exchange_type != "topic":
        return None
    if isinstance(users, TopicQueries):
        return TopicCheck(kind, _AskedKeys(users, user, vhost, exchange_name, kind), exchange_name, vhost, user)
    permission = users.topic_permission(user, vhost, exchange_name)
    if permission is None:
        return None
    pattern = expand_topic_pattern(permission.write if kind == "write" else permission.read, user, vhost, client_id)
    try:
        regex = users.compiled(pattern)
    except re.error:  # a variable expanded into a broken regex: nothing matches, as RabbitMQ's
        regex = users.compiled("(?!)")
    return TopicCheck(kind, regex, exchange_name, vhost, user)


class UserPermissions:
    """What one user may do in one vhost, answered from a bounded cache kept current with the store."""

    __slots__ = ("users", "username", "vhost", "_cache", "_generation")

    def __init__(self, users: Grants, username: str, vhost: str) -> None:
        self.users = users
        self.username = username
        self.vhost = vhost
        self._cache: dict[tuple[str, str, str], bool] = {}
        self._generation = users.generation

    def allowed(self, kind: str, resource_type: str, name: str) -> bool:
        if self._generation != self.users.generation:
            self._cache.clear()
            self._generation = self.users.generation
        if resource_type == "exchange" and name == "":
            name = DEFAULT_EXCHANGE_RESOURCE
        key = (kind, resource_type, name)  # a directory's query may answer queues and exchanges apart
        allowed = self._cache.get(key)
        if allowed is None:
            allowed = self.users.check(self.username, self.vhost, kind, name, resource_type)  # type: ignore[arg-type]
            if len(self._cache) >= CACHE_MAX_ENTRIES:
                self._cache.clear()  # cheaper than LRU bookkeeping; a refill costs one regex search each
            self._cache[key] = allowed
        return allowed

    def check(self, kind: str, resource_type: str, name: str) -> None:
        """Raise RabbitMQ's 403 unless the user has ``kind`` permission on the resource."""
        if not self.allowed(kind, resource_type, name):
            raise access_refused(kind, resource_type, name, self.vhost, self.username)

    def cache_size(self) -> int:
        return len(self._cache)

    # -- declares that name a target exchange ---------------------------------------------------

    def check_queue_declare(self, queue: str, arguments: Mapping[str, Any]) -> None:
        """A dead-letter exchange argument needs read on the queue and write on that exchange.

        Otherwise a user could route its rejected or expired messages into exchanges (and so queues)
        it may not publish to. A value of the wrong type is left to argument validation (406).
        """
        target = arguments.get(DEAD_LETTER_EXCHANGE_ARG)
        if isinstance(target, str):
            self.check("read", "queue", queue)
            self.check("write", "exchange", target)

    def check_exchange_declare(self, exchange: str, arguments: Mapping[str, Any]) -> None:
        """An alternate exchange argument needs read on the exchange and write on the alternate."""
        target = arguments.get(ALTERNATE_EXCHANGE_ARG)
        if isinstance(target, str):
            self.check("read", "exchange", exchange)
            self.check("write", "exchange", target)


def check_policy(users: Grants, username: str, vhost: str, definition: Mapping[str, Any]) -> None:
    """May ``username`` set a policy with this definition on ``vhost``?

    As RabbitMQ: only users tagged policymaker or administrator with access to the vhost may set
    policies. In addition (RabbitMQ checks this only for declare arguments) the user must be allowed to
    write to every exchange the policy names as a dead-letter or alternate exchange: queues that match
    the policy later dead-letter there whoever declared them, so the policy's author answers for it.
    """
    if not users.can_access_vhost(username, vhost):
        raise BrokerChannelError(ACCESS_REFUSED, f"access to vhost '{vhost}' refused for user '{username}'")
    if not POLICY_TAGS.intersection(users.tags_of(username)):
        raise BrokerChannelError(ACCESS_REFUSED, f"user '{username}' may not set policies in vhost '{vhost}' "
                                               "(needs the policymaker or administrator tag)")
    permissions = UserPermissions(users, username, vhost)
    for key in POLICY_TARGET_KEYS:
        target = definition.get(key)
        if isinstance(target, str):
            permissions.check("write", "exchange", target)
