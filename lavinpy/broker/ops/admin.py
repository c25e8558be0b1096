"""User, vhost, permission and policy operations, with RabbitMQ's tag rules, for every face.

Each operation takes the acting user (an ``Actor``; None = a trusted internal caller such as the
boot-time definitions import) and raises ``BrokerChannelError`` with RabbitMQ's reply code when the
actor may not do it (403), the object is missing (404) or the input is wrong (406). The HTTP face
only translates bodies to these calls and the errors to statuses.

Tag rules (RabbitMQ's): only administrators change or list users, vhosts and permissions;
policymakers (and administrators) change policies on vhosts they have permissions on; monitoring
users see every vhost and policy read-only; management users see the vhosts they have permissions on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...wire.passwords import (
    BCRYPT_ALGORITHM,
    DEFAULT_ALGORITHM,
    bcrypt_available,
    canonical_algorithm,
    hash_password,
    normalize_hash,
)
from ..access.actor import ADMINISTRATOR, POLICYMAKER, Actor
from ..access.permissions import check_policy
from ..access.users import PERMISSION_KINDS, AlreadyExists, NotFound, User, UserStore, VHostRecord
from ..errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, BrokerChannelError
from ..settings.names import check_name_length
from ..settings.policies import NOT_NEEDED_KEYS, Policy, PolicyError

if TYPE_CHECKING:
    from ..broker import Broker
    from ..vhost import VHost as VHostModel

log = logging.getLogger("lavinpy.admin")
# RabbitMQ's vhost default queue types (3.11+ metadata); kept and exported, declares keep their own rules.
DEFAULT_QUEUE_TYPES = ("classic", "quorum", "stream", "undefined")

def is_admin(actor: Actor | None) -> bool:
    return actor is None or actor.is_admin()


def sees_all_vhosts(actor: Actor | None) -> bool:
    """Administrators and monitoring users see every vhost (read-only for monitoring)."""
    return actor is None or actor.can_monitor()


def access_refused(detail: str) -> BrokerChannelError:
    """The error of a management operation the actor may not do (the HTTP face answers 401)."""
    return BrokerChannelError(ACCESS_REFUSED, detail)


def not_found(detail: str) -> BrokerChannelError:
    return BrokerChannelError(NOT_FOUND, detail)


def precondition_failed(detail: str) -> BrokerChannelError:
    return BrokerChannelError(PRECONDITION_FAILED, detail)


def require_admin(actor: Actor | None) -> None:
    if not is_admin(actor):
        assert actor is not None
        raise access_refused(f"user '{actor.name}' is not an administrator")


def parse_tags(value: Any) -> list[str]:
    """RabbitMQ accepts tags as a comma-separated string (3.8 and older exports) or a list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip() for t in value if t.strip()]
    raise precondition_failed(f"tags must be a comma-separated string or a list of strings, not {value!r}")


@dataclass(frozen=True)
class PasswordSpec:
    """How a user's password is given: a plain password, a hash, or neither (no password login)."""

    password_hash: str
    algorithm: str


def password_spec(body: Mapping[str, Any], user: str) -> PasswordSpec | None:
    """From a user body as RabbitMQ takes it; None when the body names no password at all."""
    try:  # RabbitMQ's names and LavinMQ's spellings (SHA256, sha512, Bcrypt...) are the same algorithms
        algorithm = canonical_algorithm(body.get("hashing_algorithm") or _algorithm_of(body.get("password_hash")))
        if "password" in body:
            password = body["password"]
            if not isinstance(password, str):
                raise precondition_failed(f"user '{user}': password must be a string")
            return PasswordSpec(hash_password(password, algorithm), algorithm)
        if "password_hash" in body:
            password_hash = body["password_hash"]
            if not isinstance(password_hash, str):
                raise precondition_failed(f"user '{user}': password_hash must be a string")
            if password_hash and algorithm == BCRYPT_ALGORITHM:
                bcrypt_check(password_hash)
            return PasswordSpec(normalize_hash(password_hash, algorithm), algorithm)
    except ValueError as e:
        raise precondition_failed(f"user '{user}': {e}") from None
    return None


def _algorithm_of(password_hash: Any) -> str:
    """A hash given without its algorithm: bcrypt's own form says it is bcrypt; else RabbitMQ's default."""
    if isinstance(password_hash, str) and password_hash.startswith(("$2a$", "$2b$", "$2y$")):
        return BCRYPT_ALGORITHM
    return DEFAULT_ALGORITHM


def bcrypt_check(password_hash: str) -> None:
    """A bcrypt hash is kept only in bcrypt's form and where it can be checked at login."""
    if not (password_hash.startswith(("$2a$", "$2b$", "$2y$")) and len(password_hash) == 60):
        raise ValueError("password_hash is not a bcrypt hash ($2a$...)")
    if not bcrypt_available():
        raise ValueError("bcrypt password hashes (lavinmq_bcrypt) need the 'bcrypt' Python package installed")


def check_vhost_metadata(name: str, description: Any, default_queue_type: Any) -> None:
    check_name_length("vhost name", name)
    if not isinstance(description, str):
        raise precondition_failed(f"vhost '{name}': description must be a string")
    if default_queue_type is not None and default_queue_type not in DEFAULT_QUEUE_TYPES:
        raise precondition_failed(f"vhost '{name}': default_queue_type must be one of "
                                  f"{', '.join(DEFAULT_QUEUE_TYPES)}, not {default_queue_type!r}")


class AdminOperations:
    """Users, vhosts, permissions and policies of one broker, checked against the acting user."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @property
    def users(self) -> UserStore:
        assert self.broker.users is not None
        return self.broker.users

    # -- visibility ----------------------------------------------------------------------------

    def visible_vhosts(self, actor: Actor | None) -> list[VHostRecord]:
        vhosts = self.users.vhosts()
        if sees_all_vhosts(actor):
            return vhosts
        assert actor is not None
        return [v for v in vhosts if actor.can_access_vhost(v.name)]

    def check_vhost_visible(self, actor: Actor | None, vhost: str) -> None:
        """404 for a missing vhost; 403 when the actor has no permissions on it (and is no monitor)."""
        if not self.users.vhost_exists(vhost):
            raise not_found(f"no vhost '{vhost}'")
        if not sees_all_vhosts(actor):
            assert actor is not None
            if not actor.can_access_vhost(vhost):
                raise access_refused(f"access to vhost '{vhost}' refused for user '{actor.name}'")

    # -- users ---------------------------------------------------------------------------------

    def list_users(self, actor: Actor | None) -> list[User]:
        require_admin(actor)
        return sorted(self.users.users(), key=lambda u: u.name)

    def get_user(self, actor: Actor | None, name: str) -> User:
        require_admin(actor)
        user = self.users.user(name)
        if user is None:
            raise not_found(f"no user '{name}'")
        return user

    def put_user(self, actor: Actor | None, name: str, body: Mapping[str, Any]) -> bool:
        """Create or update a user (RabbitMQ's PUT /api/users/{name} body); True when created."""
        require_admin(actor)
        if not name:
            raise precondition_failed("user name must not be empty")
        check_name_length("user name", name)
        spec = password_spec(body, name)
        tags = parse_tags(body.get("tags"))
        existing = self.users.user(name)
        if existing is None:
            spec = spec or PasswordSpec("", DEFAULT_ALGORITHM)
            self.users.add_user_with_hash(name, spec.password_hash, spec.algorithm, tags)
            return True
        if spec is not None:
            self.users.set_password_hash(name, spec.password_hash, spec.algorithm)
        if "tags" in body and sorted(tags) != sorted(existing.tags):
            self.users.set_tags(name, tags)
        return False

    def change_password(self, actor: Actor | None, name: str, password: str) -> None:
        require_admin(actor)
        self._existing_user(name)
        self.users.change_password(name, password)

    def set_tags(self, actor: Actor | None, name: str, tags: Iterable[str]) -> None:
        require_admin(actor)
        self._existing_user(name)
        self.users.set_tags(name, list(tags))

    def delete_user(self, actor: Actor | None, name: str) -> None:
        require_admin(actor)
        try:
            self.users.delete_user(name)
        except NotFound:
            raise not_found(f"no user '{name}'") from None

    def _existing_user(self, name: str) -> User:
        user = self.users.user(name)
        if user is None:
            raise not_found(f"no user '{name}'")
        return user

    # -- vhosts --------------------------------------------------------------------------------

    def get_vhost(self, actor: Actor | None, name: str) -> VHostRecord:
        self.check_vhost_visible(actor, name)
        vhost = self.users.vhost(name)
        assert vhost is not None
        return vhost

    def put_vhost(self, actor: Actor | None, name: str, description: str | None = None,
                  tags: Iterable[str] | None = None, default_queue_type: str | None = None) -> bool:
        """Create a vhost (opened at once) or update the metadata given for an existing one (None:
        unchanged); True when created."""
        require_admin(actor)
        if not name:
            raise precondition_failed("vhost name must not be empty")
        check_vhost_metadata(name, description if description is not None else "", default_queue_type)
        if self.users.vhost_exists(name):
            if description is not None or tags is not None or default_queue_type is not None:
                self.users.set_vhost_metadata(name, description, tags, default_queue_type)
            return False
        try:
            self.users.add_vhost(name, description or "", tags or (), default_queue_type)
        except AlreadyExists:
            return False
        self.broker.open_vhost(name)
        vhost = self.broker.vhosts[name]
        if getattr(self.broker, "_alarm_task", None) is not None:  # started: give it its flusher
            vhost.start_flusher()
        # As RabbitMQ does, the creator may use what they made at once (an administrator without
        # permissions on a new vhost could not even declare a queue in it).
        if actor is not None and self.users.user(actor.name) is not None:
            self.users.set_permissions(actor.name, name, ".*", ".*", ".*")
        return True

    def delete_vhost(self, actor: Actor | None, name: str) -> None:
        """Close the vhost's connections (320), then drop its queues, messages and permissions."""
        require_admin(actor)
        if not self.users.vhost_exists(name):
            raise not_found(f"no vhost '{name}'")
        self.broker.sessions.close_vhost_connections(name, f"vhost '{name}' is deleted")
        vhost = self.broker.vhosts.pop(name, None)
        self.users.delete_vhost(name)
        if vhost is not None:
            vhost.close()
        self.broker.datadir.remove_vhost(name)
        log.info("vhost %r deleted", name)

    # -- permissions ---------------------------------------------------------------------------

    def _grants(self, actor: Actor | None, vhost: str | None, user: str | None,
                field: str) -> Iterator[tuple[str, str, Any]]:
        """(user, vhost, grant) of each user's ``field`` (permissions or topic_permissions, keyed by
        vhost), in name order, kept to ``vhost`` and ``user`` when given (404 when they do not exist)."""
        require_admin(actor)
        if vhost is not None and not self.users.vhost_exists(vhost):
            raise not_found(f"no vhost '{vhost}'")
        if user is not None:
            self._existing_user(user)
        for u in sorted(self.users.users(), key=lambda u: u.name):
            if user is None or u.name == user:
                for vhost_name, grant in sorted(getattr(u, field).items()):
                    if vhost is None or vhost_name == vhost:
                        yield u.name, vhost_name, grant

    def list_permissions(self, actor: Actor | None, *, vhost: str | None = None,
                         user: str | None = None) -> list[dict[str, str]]:
        return [{"user": u, "vhost": v, "configure": p.configure, "write": p.write, "read": p.read}
                for u, v, p in self._grants(actor, vhost, user, "permissions")]

    def get_permissions(self, actor: Actor | None, vhost: str, user: str) -> dict[str, str]:
        found = self.list_permissions(actor, vhost=vhost, user=user)
        if not found:
            raise not_found(f"no permissions for user '{user}' in vhost '{vhost}'")
        return found[0]

    def set_permissions(self, actor: Actor | None, vhost: str, user: str,
                        body: Mapping[str, Any]) -> bool:
        """Grant configure/write/read regexes; True when the user had none on the vhost before."""
        require_admin(actor)
        patterns = []
        for kind in PERMISSION_KINDS:
            value = body.get(kind)
            if not isinstance(value, str):
                raise precondition_failed(f"permissions of user '{user}' in vhost '{vhost}': "
                                          f"'{kind}' must be a string (a regular expression)")
            patterns.append(value)
        self._existing_user(user)
        if not self.users.vhost_exists(vhost):
            raise not_found(f"no vhost '{vhost}'")
        created = self.users.permissions(user, vhost) is None
        try:
            self.users.set_permissions(user, vhost, *patterns)
        except ValueError as e:
            raise precondition_failed(f"permissions of user '{user}' in vhost '{vhost}': {e}") from None
        return created

    def clear_permissions(self, actor: Actor | None, vhost: str, user: str) -> None:
        require_admin(actor)
        if self.users.permissions(user, vhost) is None:
            raise not_found(f"no permissions for user '{user}' in vhost '{vhost}'")
        self.users.clear_permissions(user, vhost)

    # -- topic permissions (RabbitMQ's /api/topic-permissions) ------------------------------------

    def list_topic_permissions(self, actor: Actor | None, *, vhost: str | None = None,
                               user: str | None = None) -> list[dict[str, str]]:
        return [{"user": u, "vhost": v, "exchange": t.exchange, "write": t.write, "read": t.read}
                for u, v, per_exchange in self._grants(actor, vhost, user, "topic_permissions")
                for t in sorted(per_exchange.values(), key=lambda t: t.exchange)]

    def set_topic_permission(self, actor: Actor | None, vhost: str, user: str, body: Mapping[str, Any]) -> bool:
        """RabbitMQ's PUT /api/topic-permissions/{vhost}/{user} ({"exchange", "write", "read"});
        True when the user had no topic permission on that exchange before."""
        require_admin(actor)
        what = f"topic permission of user '{user}' in vhost '{vhost}'"
        values = []
        for key in ("exchange", "write", "read"):
            value = body.get(key)
            if not isinstance(value, str):
                raise precondition_failed(f"{what}: '{key}' must be a string")
            values.append(value)
        check_name_length("exchange name", values[0])
        self._existing_user(user)
        if not self.users.vhost_exists(vhost):
            raise not_found(f"no vhost '{vhost}'")
        created = self.users.topic_permission(user, vhost, values[0]) is None
        try:
            self.users.set_topic_permission(user, vhost, *values)
        except ValueError as e:
            raise precondition_failed(f"{what}: {e}") from None
        return created

    def clear_topic_permissions(self, actor: Actor | None, vhost: str, user: str,
                                exchange: str | None = None) -> None:
        require_admin(actor)
        self._existing_user(user)
        if not self.users.clear_topic_permissions(user, vhost, exchange):
            raise not_found(f"no topic permissions for user '{user}' in vhost '{vhost}'")

    # -- policies ------------------------------------------------------------------------------

    def _may_read_policies(self, actor: Actor | None) -> None:
        # As RabbitMQ: policymakers and administrators; monitoring does not imply policymaker.
        if actor is not None and not ({ADMINISTRATOR, POLICYMAKER} & actor.tags):
            raise access_refused(f"user '{actor.name}' may not see policies "
                                 "(needs the policymaker or administrator tag)")

    def list_policies(self, actor: Actor | None, vhost: str | None = None) -> list[dict[str, Any]]:
        self._may_read_policies(actor)
        if vhost is not None:
            self.check_vhost_visible(actor, vhost)
            names = [vhost]
        else:
            names = [v.name for v in self.visible_vhosts(actor)]
        result: list[dict[str, Any]] = []
        for name in sorted(names):
            model = self.broker.vhosts.get(name)
            if model is not None:
                result.extend(policy_json(name, p) for p in sorted(model.policies.list(), key=lambda p: p.name))
        return result

    def get_policy(self, actor: Actor | None, vhost: str, name: str) -> dict[str, Any]:
        self._may_read_policies(actor)
        self.check_vhost_visible(actor, vhost)
        policy = self.broker.vhosts[vhost].policies.get(name)
        if policy is None:
            raise not_found(f"no policy '{name}' in vhost '{vhost}'")
        return policy_json(vhost, policy)

    def set_policy(self, actor: Actor | None, vhost: str, name: str, body: Mapping[str, Any]) -> bool:
        """Add or replace a policy (applied at once to existing queues and exchanges); True when new."""
        model = self._policy_vhost(actor, vhost, body.get("definition"))
        if "pattern" not in body:
            raise precondition_failed(f"policy '{name}': pattern is missing")
        if "definition" not in body:
            raise precondition_failed(f"policy '{name}': definition is missing")
        created = model.policies.get(name) is None
        try:
            model.set_policy(name, body["pattern"], body["definition"], body.get("priority", 0),
                             body.get("apply-to", "all"))
        except PolicyError as e:
            raise precondition_failed(str(e)) from None
        return created

    def clear_policy(self, actor: Actor | None, vhost: str, name: str) -> None:
        model = self._policy_vhost(actor, vhost, None)
        if not model.delete_policy(name):
            raise not_found(f"no policy '{name}' in vhost '{vhost}'")

    def _policy_vhost(self, actor: Actor | None, vhost: str, definition: Any) -> VHostModel:
        if not self.users.vhost_exists(vhost):
            raise not_found(f"no vhost '{vhost}'")
        if actor is not None and not actor.is_admin():  # administrators see and change every vhost
            check_policy(actor.grants, actor.name, vhost,
                         definition if isinstance(definition, Mapping) else {})
        return self.broker.vhosts[vhost]


def user_json(user: User) -> dict[str, Any]:
    """A user as RabbitMQ 3.10 shows it (GET /api/users, definitions export)."""
    return {"name": user.name, "password_hash": user.password_hash,
            "hashing_algorithm": user.hashing_algorithm, "tags": list(user.tags), "limits": {}}


def vhost_json(vhost: VHostRecord) -> dict[str, Any]:
    metadata: dict[str, Any] = {"description": vhost.description, "tags": list(vhost.tags)}
    if vhost.default_queue_type is not None:
        metadata["default_queue_type"] = vhost.default_queue_type
    out = {"name": vhost.name, "description": vhost.description, "tags": list(vhost.tags),
           "metadata": metadata, "tracing": False}
    if vhost.default_queue_type is not None:
        out["default_queue_type"] = vhost.default_queue_type
    return out


def policy_json(vhost: str, policy: Policy) -> dict[str, Any]:
    out = {"vhost": vhost, "name": policy.name, "pattern": policy.pattern, "apply-to": policy.apply_to,
           "definition": dict(policy.definition), "priority": policy.priority}
    not_needed = sorted(NOT_NEEDED_KEYS.intersection(policy.definition))
    if not_needed:  # RabbitMQ-only keys: kept and exported, not needed by lavinpy's design
        out["not_needed"] = not_needed
    return out
