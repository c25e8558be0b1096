"""A token's scopes as a user's tags and permissions, in RabbitMQ's OAuth 2 scope syntax.

After the resource server's prefix is taken off (``<resource_server_id>.`` by default), a scope is

- ``tag:<tag>``: a user tag (administrator, monitoring, policymaker, management, impersonator);
- ``<configure|write|read>:<vhost pattern>/<name pattern>``: that permission on the queues and
  exchanges whose names match, in the vhosts that match;
- ``<write|read>:<vhost pattern>/<exchange pattern>/<routing key pattern>``: also a topic permission
  (RabbitMQ's): on a topic exchange, the routing keys of publishes (write) and the binding keys of
  binds (read) must match a scope with a routing key pattern, or they are refused.

Patterns are wildcards: ``*`` matches any run of characters, the rest is percent-decoded and matched
literally (so the default vhost is ``%2F``). ``{vhost}`` in a scope stands for the vhost being
checked, ``{<claim>}`` for a string claim of the token (RabbitMQ's variable expansion).

``TokenGrants`` answers the questions ``permissions.Grants`` asks, so a token's user goes through the
same permission and tag checks (``actor.Actor``, ``permissions.UserPermissions``) as a stored user:
the scopes become, per vhost, the same three regexes a stored user has.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from .users import PermissionKind, Permissions, TopicPermission, allowed_by

if TYPE_CHECKING:
    from .users import UserStore

KNOWN_TAGS = frozenset({"administrator", "monitoring", "policymaker", "management", "impersonator"})
NOTHING = "(?!)"  # a regex no key matches: a topic exchange with no scope for it
_KINDS = ("configure", "write", "read")
_VARIABLE = re.compile(r"\{([^{}]*)\}")
_VHOST_CACHE_MAX = 64  # vhosts whose parsed scopes one token keeps


def tags_of(scopes: Iterable[str]) -> frozenset[str]:
    """The known tags among ``tag:<name>`` scopes (unknown ones are ignored, as RabbitMQ's)."""
    return frozenset(s[4:] for s in scopes if s.startswith("tag:") and s[4:] in KNOWN_TAGS)


@lru_cache(maxsize=4096)
def wildcard_regex(pattern: str) -> str:
    """A wildcard pattern as an anchored regex (the literal parts percent-decoded)."""
    return ".*".join(re.escape(unquote(part)) for part in pattern.split("*"))


def _union(patterns: list[str]) -> str:
    """One regex matching what any of the wildcard ``patterns`` matches ("" when there are none)."""
    if not patterns:
        return ""
    return r"\A(?:" + "|".join(sorted({wildcard_regex(p) for p in patterns})) + r")\Z"


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.DOTALL)


def _matches(pattern: str, subject: str) -> bool:
    return _compiled(r"\A(?:" + wildcard_regex(pattern) + r")\Z").search(subject) is not None


class TokenGrants:
    """The tags and permissions of one token's user (``permissions.Grants``)."""

    __slots__ = ("store", "username", "tags", "scopes", "claims", "expires_at", "_per_vhost")

    def __init__(self, store: UserStore, username: str, scopes: Iterable[str], claims: Mapping[str, Any]) -> None:
        self.store = store  # for the vhosts that exist (and its generation: a vhost deleted)
        self.username = username
        self.scopes = tuple(s for s in scopes if s.partition(":")[0] in _KINDS)
        self.tags = tags_of(scopes)
        self.claims = claims
        self.expires_at: float | None = None  # the token's exp (epoch seconds), when known
        # vhost -> [(kind, vhost pattern, name pattern, routing key pattern or None)] of the matching scopes
        self._per_vhost: dict[str, list[tuple[str, str, str | None]]] = {}

    @property
    def generation(self) -> int:
        return self.store.generation

    def _expand(self, scope: str, vhost: str) -> str:
        def value(match: re.Match[str]) -> str:
            name = match.group(1)
            if name == "vhost":
                return vhost
            claim = self.claims.get(name)
            return claim if isinstance(claim, str) else name
        return _VARIABLE.sub(value, scope) if "{" in scope else scope

    def _grants(self, vhost: str) -> list[tuple[str, str, str | None]]:
        """(kind, name pattern, routing key pattern) of the scopes whose vhost pattern matches."""
        grants = self._per_vhost.get(vhost)
        if grants is None:
            grants = []
            for scope in self.scopes:
                kind, _, resource = self._expand(scope, vhost).partition(":")
                parts = resource.split("/")
                if len(parts) not in (2, 3) or not _matches(parts[0], vhost):
                    continue
                grants.append((kind, parts[1], parts[2] if len(parts) == 3 else None))
            if len(self._per_vhost) >= _VHOST_CACHE_MAX:
                self._per_vhost.clear()
            self._per_vhost[vhost] = grants
        return grants

    # --- permissions.Grants -----------------------------------------------------------------------
    def tags_of(self, user: str) -> frozenset[str]:
        return self.tags

    def can_access_vhost(self, user: str, vhost: str) -> bool:
        """Any permission scope for the vhost opens it (RabbitMQ's vhost access of a token)."""
        return self.store.vhost_exists(vhost) and bool(self._grants(vhost))

    def permissions(self, user: str, vhost: str) -> Permissions | None:
        grants = self._grants(vhost)
        if not grants or not self.store.vhost_exists(vhost):
            return None
        return Permissions(*(_union([name for k, name, _ in grants if k == kind]) for kind in _KINDS))

    def check(self, user: str, vhost: str, kind: PermissionKind, resource: str, resource_type: str = "queue") -> bool:
        return allowed_by(self.permissions(user, vhost), kind, resource, self.compiled)

    def topic_permission(self, user: str, vhost: str, exchange: str) -> TopicPermission | None:
        """Always one: a key no scope with a routing key pattern allows is refused (RabbitMQ's)."""
        keys: dict[str, list[str]] = {"write": [], "read": []}
        for kind, name, routing_key in self._grants(vhost):
            if routing_key is not None and kind in keys and _matches(name, exchange):
                keys[kind].append(routing_key)
        return TopicPermission(exchange, _union(keys["write"]) or NOTHING, _union(keys["read"]) or NOTHING)

    def compiled(self, pattern: str) -> re.Pattern[str]:
        return _compiled(pattern)
