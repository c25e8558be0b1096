"""The user on whose behalf a broker operation runs, as every face (AMQP, HTTP) sees it.

Broker operations take an ``Actor`` (or None for a trusted internal caller) and do every permission
and tag check themselves. Tags and permissions are read from the user store at each check, so a
change made at run time applies to the actor's next operation.

Tags follow RabbitMQ's management plugin: administrator includes monitoring and policymaker, each of
which includes management; monitoring does not include policymaker (a monitoring user sees every
vhost's objects, not its policies or parameters). A user with none of them has no HTTP access.
"""

from __future__ import annotations

from .permissions import Grants, TopicCheck, UserPermissions, access_refused, topic_check
from .users import UserStore

ADMINISTRATOR = "administrator"
MONITORING = "monitoring"
POLICYMAKER = "policymaker"
MANAGEMENT = "management"
MANAGEMENT_TAGS = frozenset({ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT})


class Actor:
    """One user's identity plus a permission cache per vhost (dropped when the user store changes).
    Tags and permissions come from ``grants``: the user store, or a token's scopes."""

    __slots__ = ("users", "grants", "name", "client_id", "_permissions")

    def __init__(self, users: UserStore, name: str, grants: Grants | None = None) -> None:
        self.users = users
        self.grants: Grants = users if grants is None else grants
        self.name = name
        self.client_id: str | None = None  # an MQTT client's id: ``{client_id}`` in its topic permissions
        self._permissions: dict[str, UserPermissions] = {}

    @property
    def tags(self) -> frozenset[str]:
        return self.grants.tags_of(self.name)

    # -- tag predicates ------------------------------------------------------------------------
    def is_admin(self) -> bool:
        return ADMINISTRATOR in self.tags

    def can_monitor(self) -> bool:
        """See every vhost's objects and connections (monitoring, administrator)."""
        return bool(self.tags & {ADMINISTRATOR, MONITORING})

    def can_manage(self) -> bool:
        """Any management tag: may use the HTTP API at all."""
        return bool(self.tags & MANAGEMENT_TAGS)

    # -- vhost permissions ----------------------------------------------------------------------
    def can_access_vhost(self, vhost: str) -> bool:
        return self.grants.can_access_vhost(self.name, vhost)

    def permissions(self, vhost: str) -> UserPermissions:
        perms = self._permissions.get(vhost)
        if perms is None:
            perms = self._permissions[vhost] = UserPermissions(self.grants, self.name, vhost)
        return perms

    def allowed(self, kind: str, resource_type: str, name: str, vhost: str) -> bool:
        return self.permissions(vhost).allowed(kind, resource_type, name)

    def check(self, kind: str, resource_type: str, name: str, vhost: str) -> None:
        """RabbitMQ's 403 unless the user has ``kind`` permission on the named queue or exchange."""
        if not self.allowed(kind, resource_type, name, vhost):
            raise access_refused(kind, resource_type, name, vhost, self.name)

    def topic_check(self, kind: str, vhost: str, exchange_name: str, exchange_type: str) -> TopicCheck | None:
        """The topic permission check for keys of a ``kind`` operation on that exchange (None: none applies)."""
        return topic_check(self.grants, self.name, vhost, kind, exchange_name, exchange_type, self.client_id)

    def check_topic(self, kind: str, vhost: str, exchange_name: str, exchange_type: str, key: str) -> None:
        """RabbitMQ's 403 unless a topic permission on the exchange (if any) allows ``key``."""
        check = self.topic_check(kind, vhost, exchange_name, exchange_type)
        if check is not None:
            check(key)
