"""Users, vhosts and permissions, persisted in ``users.json`` and ``vhosts.json``.

Permission checks follow RabbitMQ: each of configure/write/read is a regular expression searched
(unanchored) in the resource name; an empty expression grants nothing; the default exchange ``""``
is checked under the name ``amq.default``. Having a permission entry for a vhost, even one of three
empty expressions, is what lets a user open a connection to that vhost.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from lavinpy.store.jsonfile import read_json, write_json_atomic
from lavinpy.wire.passwords import (
    BCRYPT_ALGORITHM,
    DEFAULT_ALGORITHM,
    canonical_algorithm,
    hash_password,
    verify_password,
)

log = logging.getLogger(__name__)

PermissionKind = Literal["configure", "write", "read"]
PERMISSION_KINDS: tuple[str, ...] = ("configure", "write", "read")
DEFAULT_EXCHANGE_RESOURCE = "amq.default"
ADMINISTRATOR_TAG = "administrator"



def is_loopback_address(host: str | None) -> bool:
    """Whether a peer address is loopback: the rule behind ``loopback_users`` for every face."""
    if host is None:
        return True  # a unix socket
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    # An IPv4 client of a dual-stack listener shows up as ::ffff:127.0.0.1.
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def loopback_only_refused(loopback_users: Iterable[str], username: str, peer: str | None) -> bool:
    """Whether ``username`` is one of ``loopback_users`` (``guest`` by default) connecting from a peer
    that is not loopback: refused by every face."""
    return username in loopback_users and not is_loopback_address(peer)


class NotFound(LookupError):
    """The named user or vhost does not exist."""


class AlreadyExists(ValueError):
    """A user or vhost of that name exists already."""


@dataclass(frozen=True)
class Permissions:
    configure: str
    write: str
    read: str


@dataclass(frozen=True)
class TopicPermission:
    """RabbitMQ's topic permission: regexes the routing key of a publish (``write``) or the binding
    key of a bind (``read``) to a topic exchange must match."""

    exchange: str
    write: str
    read: str


@dataclass
class User:
    name: str
    password_hash: str
    hashing_algorithm: str = DEFAULT_ALGORITHM
    tags: list[str] = field(default_factory=list)
    permissions: dict[str, Permissions] = field(default_factory=dict)
    # vhost -> exchange -> topic permission
    topic_permissions: dict[str, dict[str, TopicPermission]] = field(default_factory=dict)

    def copy(self) -> User:
        return replace(self, tags=list(self.tags), permissions=dict(self.permissions),
                       topic_permissions={v: dict(t) for v, t in self.topic_permissions.items()})


@dataclass
class VHostRecord:
    name: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    default_queue_type: str | None = None  # RabbitMQ 3.11+'s vhost metadata: kept and exported

    def copy(self) -> VHostRecord:
        return replace(self, tags=list(self.tags))


class UserStore:
    """The broker's users, vhosts and permissions. Every change is written to disk at once."""

    def __init__(self, users_file: Path, vhosts_file: Path) -> None:
        self.users_file = Path(users_file)
        self.vhosts_file = Path(vhosts_file)
        self._users: dict[str, User] = {}
        self._vhosts: dict[str, VHostRecord] = {}
        self._regex_cache: dict[str, re.Pattern[str]] = {}
        # Bumped by every change to a user's password, tags or permissions (or a vhost's removal):
        # connections compare it before trusting their cached permission answers.
        self.generation = 0
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every change that bumps ``generation``."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        self.generation += 1
        for callback in list(self._listeners):
            callback()

    # -- persistence --------------------------------------------------------------------------

    def load(self) -> None:
        """Read both files (missing files mean no users / no vhosts)."""
        users_json = read_json(self.users_file, [])
        vhosts_json = read_json(self.vhosts_file, [])
        if not isinstance(users_json, list):
            raise ValueError(f"{self.users_file}: expected a JSON list of users")
        if not isinstance(vhosts_json, list):
            raise ValueError(f"{self.vhosts_file}: expected a JSON list of vhosts")
        try:
            self._users = {u.name: u for u in map(_user_from_json, users_json)}
            self._vhosts = {v.name: v for v in map(_vhost_from_json, vhosts_json)}
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{self.users_file} / {self.vhosts_file}: malformed entry ({exc!r})") from exc

    def _save_users(self) -> None:
        write_json_atomic(self.users_file, [_user_to_json(u) for u in self._users.values()])

    def _save_vhosts(self) -> None:
        write_json_atomic(self.vhosts_file, [_vhost_to_json(v) for v in self._vhosts.values()])

    def ensure_defaults(self, user: str, password: str) -> None:
        """On a fresh store: create vhost "/" and an administrator with full rights on it."""
        if not self._vhosts:
            self.add_vhost("/")
        if not self._users:
            self.add_user(user, password, tags=(ADMINISTRATOR_TAG,))
            if self.vhost_exists("/"):
                self.set_permissions(user, "/", ".*", ".*", ".*")

    # -- users --------------------------------------------------------------------------------

    def authenticate(self, username: str, password: str) -> User | None:
        """The user when the password is right, else None (unknown user, wrong password, no password)."""
        user = self._users.get(username)
        if user is None:
            return None
        try:
            ok = verify_password(password, user.password_hash, user.hashing_algorithm)
        except ValueError:
            log.warning("user %r has an unsupported hashing algorithm %r", username, user.hashing_algorithm)
            return None
        return user.copy() if ok else None

    def password_of(self, username: str) -> tuple[str, str] | None:
        """(password hash, hashing algorithm) of a user, or None when there is no such user."""
        user = self._users.get(username)
        return None if user is None else (user.password_hash, user.hashing_algorithm)

    def user_count(self) -> int:
        return len(self._users)

    def slowest_hash(self) -> tuple[str, str] | None:
        """(hash, algorithm) of a bcrypt user (the slowest kind, the highest cost), or None when
        no user has one: what an unknown user's password is checked against, to take as long."""
        slowest: tuple[str, str] | None = None
        for user in self._users.values():
            if user.hashing_algorithm == BCRYPT_ALGORITHM and user.password_hash[:7] > (slowest or ("",))[0][:7]:
                slowest = (user.password_hash, user.hashing_algorithm)
        return slowest

    def add_user(self, name: str, password: str, tags: Iterable[str] = ()) -> User:
        """Create a user with a salted SHA-256 password hash."""
        return self.add_user_with_hash(name, hash_password(password), DEFAULT_ALGORITHM, tags)

    def add_user_with_hash(
        self, name: str, password_hash: str, algorithm: str = DEFAULT_ALGORITHM, tags: Iterable[str] = ()
    ) -> User:
        """Create a user from an existing hash (definitions import). An empty hash means no password login."""
        if not name:
            raise ValueError("user name must not be empty")
        if name in self._users:
            raise AlreadyExists(f"user {name!r} already exists")
        algorithm = canonical_algorithm(algorithm)
        user = User(name, password_hash, algorithm, list(tags))
        self._users[name] = user
        self._save_users()
        return user.copy()

    def change_password(self, name: str, password: str) -> None:
        self.set_password_hash(name, hash_password(password), DEFAULT_ALGORITHM)

    def set_password_hash(self, name: str, password_hash: str, algorithm: str = DEFAULT_ALGORITHM) -> None:
        """Replace a user's password hash (an empty hash turns password login off)."""
        algorithm = canonical_algorithm(algorithm)
        user = self._get_user(name)
        previous = (user.password_hash, user.hashing_algorithm)
        user.password_hash, user.hashing_algorithm = password_hash, algorithm

        def undo() -> None:
            user.password_hash, user.hashing_algorithm = previous
        self._commit_users(undo)

    def set_tags(self, name: str, tags: Iterable[str]) -> None:
        user = self._get_user(name)
        previous, user.tags = user.tags, list(tags)
        self._commit_users(lambda: setattr(user, "tags", previous))

    def delete_user(self, name: str) -> None:
        user = self._get_user(name)
        del self._users[name]
        self._commit_users(lambda: self._users.__setitem__(name, user))

    def users(self) -> list[User]:
        return [u.copy() for u in self._users.values()]

    def tags_of(self, name: str) -> frozenset[str]:
        user = self._users.get(name)
        return frozenset(user.tags) if user is not None else frozenset()

    def user(self, name: str) -> User | None:
        user = self._users.get(name)
        return user.copy() if user is not None else None

    def _get_user(self, name: str) -> User:
        try:
            return self._users[name]
        except KeyError:
            raise NotFound(f"no user {name!r}") from None

    # -- vhosts -------------------------------------------------------------------------------

    def add_vhost(self, name: str, description: str = "", tags: Iterable[str] = (),
                  default_queue_type: str | None = None) -> VHostRecord:
        if not name:
            raise ValueError("vhost name must not be empty")
        if name in self._vhosts:
            raise AlreadyExists(f"vhost {name!r} already exists")
        vhost = VHostRecord(name, description, list(tags), default_queue_type)
        self._vhosts[name] = vhost
        self._save_vhosts()
        return vhost.copy()

    def set_vhost_metadata(self, name: str, description: str | None, tags: Iterable[str] | None,
                           default_queue_type: str | None) -> None:
        """RabbitMQ's PUT of an existing vhost: the description, tags and default queue type given
        (not None) replace the old ones."""
        vhost = self._vhosts.get(name)
        if vhost is None:
            raise NotFound(f"no vhost {name!r}")
        if description is not None:
            vhost.description = description
        if tags is not None:
            vhost.tags = list(tags)
        if default_queue_type is not None:
            vhost.default_queue_type = default_queue_type
        self._save_vhosts()

    def delete_vhost(self, name: str) -> None:
        """Remove the vhost and every user's permissions on it."""
        if name not in self._vhosts:
            raise NotFound(f"no vhost {name!r}")
        users_changed = False
        for user in self._users.values():
            if user.permissions.pop(name, None) is not None:
                users_changed = True
            if user.topic_permissions.pop(name, None) is not None:
                users_changed = True
        # Permissions first: a crash between the two writes then leaves an unused vhost, not
        # permissions that would silently apply to a later vhost of the same name.
        if users_changed:
            self._save_users()
        del self._vhosts[name]
        self._save_vhosts()
        self._changed()

    def vhosts(self) -> list[VHostRecord]:
        return [v.copy() for v in self._vhosts.values()]

    def vhost(self, name: str) -> VHostRecord | None:
        vhost = self._vhosts.get(name)
        return vhost.copy() if vhost is not None else None

    def vhost_exists(self, name: str) -> bool:
        return name in self._vhosts

    # -- permissions --------------------------------------------------------------------------

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        """Grant ``user`` the three regexes on ``vhost``; a regex that does not compile is a ValueError."""
        target = self._get_user(user)
        if vhost not in self._vhosts:
            raise NotFound(f"no vhost {vhost!r}")
        for kind, pattern in zip(PERMISSION_KINDS, (configure, write, read), strict=True):
            try:
                self._compiled(pattern)
            except re.error as exc:
                raise ValueError(f"invalid {kind} permission regex {pattern!r}: {exc}") from None
        previous = target.permissions.get(vhost)
        target.permissions[vhost] = Permissions(configure, write, read)
        self._commit_users(lambda: self._restore_permissions(target, vhost, previous))

    def clear_permissions(self, user: str, vhost: str) -> None:
        target = self._get_user(user)
        previous = target.permissions.pop(vhost, None)
        if previous is not None:
            self._commit_users(lambda: self._restore_permissions(target, vhost, previous))

    def _commit_users(self, undo: Callable[[], None]) -> None:
        """Write users.json after an in-memory change; if the write fails, undo the change and re-raise.
        Then tell open connections (the generation number) that a user changed."""
        try:
            self._save_users()
        except BaseException:
            undo()
            raise
        self._changed()

    @staticmethod
    def _restore_permissions(user: User, vhost: str, previous: Permissions | None) -> None:
        if previous is None:
            user.permissions.pop(vhost, None)
        else:
            user.permissions[vhost] = previous

    def permissions(self, user: str, vhost: str) -> Permissions | None:
        target = self._users.get(user)
        return target.permissions.get(vhost) if target is not None else None

    # -- topic permissions (RabbitMQ's: per user, vhost and topic exchange) ---------------------

    def set_topic_permission(self, user: str, vhost: str, exchange: str, write: str, read: str) -> None:
        """Set ``user``'s topic permission on ``exchange`` in ``vhost``; a bad regex is a ValueError."""
        target = self._get_user(user)
        if vhost not in self._vhosts:
            raise NotFound(f"no vhost {vhost!r}")
        for kind, pattern in (("write", write), ("read", read)):
            try:
                self._compiled(pattern)
            except re.error as exc:
                raise ValueError(f"invalid {kind} topic permission regex {pattern!r}: {exc}") from None
        previous = {v: dict(t) for v, t in target.topic_permissions.items()}
        target.topic_permissions.setdefault(vhost, {})[exchange] = TopicPermission(exchange, write, read)
        self._commit_users(lambda: setattr(target, "topic_permissions", previous))

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> bool:
        """Drop the user's topic permissions in ``vhost`` (only ``exchange``'s when named); False if none."""
        target = self._get_user(user)
        previous = {v: dict(t) for v, t in target.topic_permissions.items()}
        current = target.topic_permissions.get(vhost)
        if not current or (exchange is not None and exchange not in current):
            return False
        if exchange is None:
            del target.topic_permissions[vhost]
        else:
            del current[exchange]
            if not current:
                del target.topic_permissions[vhost]
        self._commit_users(lambda: setattr(target, "topic_permissions", previous))
        return True

    def topic_permission(self, user: str, vhost: str, exchange: str) -> TopicPermission | None:
        target = self._users.get(user)
        if target is None:
            return None
        per_vhost = target.topic_permissions.get(vhost)
        return per_vhost.get(exchange) if per_vhost else None

    def compiled(self, pattern: str) -> re.Pattern[str]:
        """A regex compiled once for every check that uses it."""
        return self._compiled(pattern)

    def can_access_vhost(self, user: str, vhost: str) -> bool:
        """A user may open a vhost when the vhost exists and the user has any permission entry on it."""
        return vhost in self._vhosts and self.permissions(user, vhost) is not None

    def check(self, user: str, vhost: str, kind: PermissionKind, resource: str, resource_type: str = "queue") -> bool:
        """May ``user`` do a ``kind`` operation on the exchange or queue named ``resource`` in ``vhost``?
        (The regexes do not depend on ``resource_type``.)"""
        return allowed_by(self.permissions(user, vhost), kind, resource, self._compiled)

    def _compiled(self, pattern: str) -> re.Pattern[str]:
        compiled = self._regex_cache.get(pattern)
        if compiled is None:
            compiled = self._regex_cache[pattern] = re.compile(pattern)
        return compiled


def allowed_by(perms: Permissions | None, kind: str, resource: str,
               compiled: Callable[[str], re.Pattern[str]]) -> bool:
    """RabbitMQ's rule for a user of any backend: the ``kind`` regex of the user's permissions in the
    vhost is searched in the resource's name; none, or an empty regex, grants nothing."""
    if kind not in PERMISSION_KINDS:
        raise ValueError(f"permission kind must be one of {PERMISSION_KINDS}, not {kind!r}")
    if perms is None:
        return False
    pattern = getattr(perms, kind)
    if pattern == "":
        return False
    if resource == "":
        resource = DEFAULT_EXCHANGE_RESOURCE
    return compiled(pattern).search(resource) is not None


# -- JSON shapes ------------------------------------------------------------------------------


def _user_to_json(user: User) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": user.hashing_algorithm,
        "tags": list(user.tags),
        "permissions": {
            vhost: {"configure": p.configure, "write": p.write, "read": p.read}
            for vhost, p in user.permissions.items()
        },
    }
    if user.topic_permissions:
        out["topic_permissions"] = {
            vhost: {t.exchange: {"write": t.write, "read": t.read} for t in per_vhost.values()}
            for vhost, per_vhost in user.topic_permissions.items()
        }
    return out


def _user_from_json(obj: dict[str, Any]) -> User:
    return User(
        name=obj["name"],
        password_hash=obj.get("password_hash", ""),
        hashing_algorithm=obj.get("hashing_algorithm", DEFAULT_ALGORITHM),
        tags=list(obj.get("tags", [])),
        permissions={
            vhost: Permissions(p["configure"], p["write"], p["read"])
            for vhost, p in obj.get("permissions", {}).items()
        },
        topic_permissions={
            vhost: {ex: TopicPermission(ex, t["write"], t["read"]) for ex, t in per_vhost.items()}
            for vhost, per_vhost in obj.get("topic_permissions", {}).items()
        },
    )


def _vhost_to_json(vhost: VHostRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"name": vhost.name, "description": vhost.description, "tags": list(vhost.tags)}
    if vhost.default_queue_type is not None:
        out["default_queue_type"] = vhost.default_queue_type
    return out


def _vhost_from_json(obj: dict[str, Any]) -> VHostRecord:
    return VHostRecord(obj["name"], obj.get("description", ""), list(obj.get("tags", [])),
                       obj.get("default_queue_type"))
