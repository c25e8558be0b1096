"""Runtime parameters, global parameters, vhost and user limits and operator policies, with RabbitMQ's
tag rules, for every face (HTTP, ctl, definitions import).

As RabbitMQ: administrators change limits, operator policies and global parameters; policymakers
(and administrators) change the parameters of vhosts they may access. Parameters, global parameters and
operator policies are read by administrators and by policymakers (of the vhosts they may access), not by
monitoring users (monitoring does not imply policymaker); a policymaker sees URI passwords masked.
A shovel's parameter records the user who set it and is checked against that user's rights (links.py).
Errors are ``BrokerChannelError``s whose kinds the HTTP face maps (access refused -> 401, not found -> 404,
precondition failed -> 400).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..access.actor import ADMINISTRATOR, MONITORING, POLICYMAKER, Actor
from ..access.client_limits import USER_LIMIT_KEYS, VHOST_LIMIT_KEYS, VHOST_LIMITS_COMPONENT, VHOST_LIMITS_NAME
from ..access.links import LINK_COMPONENTS, link_kind, link_refusal, masked
from ..access.token_grants import TokenGrants
from ..settings.operator_policies import operator_policy_json
from ..settings.parameters import ParameterError, UnknownComponent
from .admin import access_refused, not_found, precondition_failed, require_admin

if TYPE_CHECKING:
    from ..broker import Broker
    from ..vhost import VHost


def _reader(actor: Actor | None, what: str = "parameters") -> None:
    if actor is not None and not ({ADMINISTRATOR, POLICYMAKER} & actor.tags):
        raise access_refused(f"user '{actor.name}' may not see {what} "
                             "(needs the policymaker or administrator tag)")


def _shown(actor: Actor | None, item: dict[str, Any]) -> dict[str, Any]:
    """A parameter as ``actor`` may see it: URI passwords masked unless an administrator (or internal)."""
    if actor is None or actor.is_admin():
        return item
    return {**item, "value": masked(item["value"])}


class LimitsOperations:
    """The operations of one broker; ``actor`` None is a trusted internal caller."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        assert broker.users is not None
        self.users = broker.users

    def _vhost(self, name: str) -> VHost:
        vhost = self.broker.vhosts.get(name)
        if vhost is None or not self.users.vhost_exists(name):
            raise not_found(f"no vhost '{name}'")
        return vhost

    def _visible(self, actor: Actor | None, vhost: str) -> bool:
        return actor is None or actor.can_monitor() or actor.can_access_vhost(vhost)

    def _policy_visible(self, actor: Actor | None, vhost: str) -> bool:
        """Parameters and operator policies: administrators see all, policymakers their vhosts'."""
        return actor is None or actor.is_admin() or actor.can_access_vhost(vhost)

    def _check_policy_visible(self, actor: Actor | None, vhost: str) -> None:
        if not self._policy_visible(actor, vhost):
            assert actor is not None
            raise access_refused(f"access to vhost '{vhost}' refused for user '{actor.name}'")

    # -- parameters ----------------------------------------------------------------------------
    def list_parameters(self, actor: Actor | None, component: str | None = None,
                        vhost: str | None = None) -> list[dict[str, Any]]:
        _reader(actor)
        if vhost is not None:
            self._vhost(vhost)
            self._check_policy_visible(actor, vhost)
        return [_shown(actor, p) for p in self.broker.parameters.listing(component, vhost)
                if self._policy_visible(actor, p["vhost"])]

    def get_parameter(self, actor: Actor | None, component: str, vhost: str, name: str) -> dict[str, Any]:
        for item in self.list_parameters(actor, component, vhost):
            if item["name"] == name:
                return item
        raise not_found(f"no parameter '{name}' of component '{component}' in vhost '{vhost}'")

    def set_parameter(self, actor: Actor | None, component: str, vhost: str, name: str, value: Any,
                      user: str | None = None) -> bool:
        """Validate, store and apply; True when new. Unknown components are refused by name.

        A link (a shovel) is recorded as made by the actor (an administrator, or an internal caller,
        may name another ``user``) and refused unless that user has the rights it needs (links.py)."""
        self._may_change(actor, vhost, component)
        self._vhost(vhost)
        creator = None
        if component in LINK_COMPONENTS:
            creator = self.link_creator(actor, user)
            grants = self._creator_grants(actor, creator, component)
            refusal = link_refusal(self.users, creator, vhost, value, component, grants=grants)
            if refusal is not None:
                raise precondition_failed(refusal)
            if isinstance(grants, TokenGrants) and actor is not None and actor.grants is grants:
                # The link runs with this token's rights until its exp (internal_login.py).
                self.broker.internal_logins.record_token_creator(creator, grants)
        try:
            return self.broker.parameters.set(component, vhost, name, value, creator)
        except UnknownComponent as e:
            raise not_found(str(e)) from None
        except ValueError as e:  # ParameterError, or a component's own ValueError: a 400 naming the key
            raise precondition_failed(str(e)) from None

    def clear_parameter(self, actor: Actor | None, component: str, vhost: str, name: str) -> None:
        self._may_change(actor, vhost, component)
        if not self.broker.parameters.delete(component, vhost, name):
            raise not_found(f"no parameter '{name}' of component '{component}' in vhost '{vhost}'")

    def link_creator(self, actor: Actor | None, user: str | None) -> str:
        """Whom a link set by ``actor`` runs as: the actor itself, unless an administrator or an internal
        caller names a ``user``; an internal caller naming nobody (a definitions file at boot) makes it
        the configured default user's."""
        if actor is not None and not actor.is_admin():
            return actor.name
        if user is not None:
            return user
        return actor.name if actor is not None else self.broker.config.default_user

    def _creator_grants(self, actor: Actor | None, creator: str, component: str) -> Any:
        """The rights a link of ``creator`` is checked against: None for a stored user (the store's);
        the actor's token's when a token user sets its own link; else a token creator's recorded
        rights. A creator whose rights cannot be established is refused (400, saying why)."""
        if self.users.user(creator) is not None:
            return None
        if actor is not None and actor.name == creator and isinstance(actor.grants, TokenGrants):
            return actor.grants
        internal = self.broker.internal_logins
        refusal = internal.creator_refusal(creator, self.users, link_kind(component))
        if refusal is not None:
            raise precondition_failed(refusal)
        return internal.creator_grants(creator, self.users)

    def link_refusal(self, component: str, vhost: str, name: str,
                     resource: tuple[str, str] | None = None) -> str | None:
        """Why a stored link may not start now (its creator's rights are checked again: a token
        creator's recorded ones, while its token is valid), or None; ``resource``: ("exchange" or
        "queue", name) a federation link feeds."""
        value = self.broker.parameters.get(component, vhost, name)
        creator = self.broker.parameters.user_of(component, vhost, name) or self.broker.config.default_user
        internal = self.broker.internal_logins
        refusal = internal.creator_refusal(creator, self.users, link_kind(component))
        if refusal is not None:
            return refusal
        return link_refusal(self.users, creator, vhost, value, component, resource,
                            internal.creator_grants(creator, self.users))

    def _may_change(self, actor: Actor | None, vhost: str, component: str) -> None:
        """The one check of every change of a parameter, on every face (HTTP, ctl, import)."""
        if actor is None or actor.is_admin():
            return
        if component == VHOST_LIMITS_COMPONENT:  # RabbitMQ: vhost limits are administrators' only
            raise access_refused(f"user '{actor.name}' may not change the limits of vhost '{vhost}' "
                                 "(needs the administrator tag)")
        if POLICYMAKER not in actor.tags or not actor.can_access_vhost(vhost):
            raise access_refused(f"user '{actor.name}' may not change parameters of component '{component}' "
                                 f"in vhost '{vhost}' (needs the policymaker tag and access to the vhost)")

    # -- global parameters ---------------------------------------------------------------------
    def list_global_parameters(self, actor: Actor | None) -> list[dict[str, Any]]:
        _reader(actor, "global parameters")
        return [_shown(actor, item) for item in self.broker.parameters.list_globals()]

    def get_global_parameter(self, actor: Actor | None, name: str) -> dict[str, Any]:
        for item in self.list_global_parameters(actor):
            if item["name"] == name:
                return item
        raise not_found(f"no global parameter '{name}'")

    def set_global_parameter(self, actor: Actor | None, name: str, value: Any) -> bool:
        require_admin(actor)
        try:
            return self.broker.parameters.set_global(name, value)
        except ParameterError as e:
            raise precondition_failed(str(e)) from None

    def clear_global_parameter(self, actor: Actor | None, name: str) -> None:
        require_admin(actor)
        if not self.broker.parameters.delete_global(name):
            raise not_found(f"no global parameter '{name}'")

    # -- vhost limits --------------------------------------------------------------------------
    def list_vhost_limits(self, actor: Actor | None, vhost: str | None = None) -> list[dict[str, Any]]:
        if vhost is not None:
            self._vhost(vhost)
        return [item for item in self.broker.client_limits.vhost_limits_json(vhost)
                if self._visible(actor, item["vhost"])]

    def set_vhost_limit(self, actor: Actor | None, vhost: str, key: str, value: Any) -> None:
        """One limit (PUT /api/vhost-limits/{vhost}/{name}); the others are kept."""
        if key not in VHOST_LIMIT_KEYS:
            raise precondition_failed(f"vhost-limits: '{key}' is not a recognised limit; should be one of: "
                       + ", ".join(f"'{k}'" for k in VHOST_LIMIT_KEYS))
        current = dict(self.broker.client_limits.vhost_limits.get(vhost, {}))
        current[key] = value
        self.set_parameter(actor, VHOST_LIMITS_COMPONENT, vhost, VHOST_LIMITS_NAME, current)

    def set_vhost_limits(self, actor: Actor | None, vhost: str, limits: Any) -> None:
        """All of a vhost's limits at once (rabbitmqctl set_vhost_limits); an empty object clears them."""
        if isinstance(limits, Mapping) and not limits:
            self.clear_vhost_limit(actor, vhost, "all", missing_ok=True)
            return
        self.set_parameter(actor, VHOST_LIMITS_COMPONENT, vhost, VHOST_LIMITS_NAME, limits)

    def clear_vhost_limit(self, actor: Actor | None, vhost: str, key: str, missing_ok: bool = False) -> None:
        self._may_change(actor, vhost, VHOST_LIMITS_COMPONENT)
        self._vhost(vhost)
        current = dict(self.broker.client_limits.vhost_limits.get(vhost, {}))
        if key == "all" or (key in current and len(current) == 1):
            if current or not missing_ok:
                self.clear_parameter(actor, VHOST_LIMITS_COMPONENT, vhost, VHOST_LIMITS_NAME)
            return
        if key not in current:
            if missing_ok:
                return
            raise not_found(f"no limit '{key}' on vhost '{vhost}'")
        del current[key]
        self.set_parameter(actor, VHOST_LIMITS_COMPONENT, vhost, VHOST_LIMITS_NAME, current)

    # -- user limits ---------------------------------------------------------------------------
    def list_user_limits(self, actor: Actor | None, user: str | None = None) -> list[dict[str, Any]]:
        if (actor is not None and not actor.is_admin() and user != actor.name
                and not ({MONITORING, POLICYMAKER} & actor.tags)):
            raise access_refused(f"user '{actor.name}' may not see user limits "
                                 "(needs the policymaker, monitoring or administrator tag)")
        if user is not None and self.users.user(user) is None:
            raise not_found(f"no user '{user}'")
        return self.broker.client_limits.user_limits_json(user)

    def set_user_limit(self, actor: Actor | None, user: str, key: str, value: Any) -> None:
        if key not in USER_LIMIT_KEYS:
            raise precondition_failed(f"user-limits: '{key}' is not a recognised limit; should be one of: "
                       + ", ".join(f"'{k}'" for k in USER_LIMIT_KEYS))
        current = dict(self.broker.client_limits.user_limits.get(user, {}))
        current[key] = value
        self.set_user_limits(actor, user, current)

    def set_user_limits(self, actor: Actor | None, user: str, limits: Any) -> None:
        require_admin(actor)
        if self.users.user(user) is None:
            raise not_found(f"no user '{user}'")
        try:
            self.broker.client_limits.set_user_limits(user, limits)
        except ParameterError as e:
            raise precondition_failed(str(e)) from None

    def clear_user_limit(self, actor: Actor | None, user: str, key: str) -> None:
        require_admin(actor)
        if self.users.user(user) is None:
            raise not_found(f"no user '{user}'")
        if not self.broker.client_limits.clear_user_limit(user, key) and key != "all":
            raise not_found(f"no limit '{key}' on user '{user}'")

    # -- operator policies ---------------------------------------------------------------------
    def list_operator_policies(self, actor: Actor | None, vhost: str | None = None) -> list[dict[str, Any]]:
        _reader(actor, "operator policies")
        names = [vhost] if vhost is not None else sorted(self.broker.vhosts)
        result: list[dict[str, Any]] = []
        for name in names:
            model = self._vhost(name)
            if vhost is not None:
                self._check_policy_visible(actor, vhost)
            if self._policy_visible(actor, name):
                result.extend(operator_policy_json(name, p)
                              for p in sorted(model.operator_policies.list(), key=lambda p: p.name))
        return result

    def get_operator_policy(self, actor: Actor | None, vhost: str, name: str) -> dict[str, Any]:
        for item in self.list_operator_policies(actor, vhost):
            if item["name"] == name:
                return item
        raise not_found(f"no operator policy '{name}' in vhost '{vhost}'")

    def set_operator_policy(self, actor: Actor | None, vhost: str, name: str, body: Mapping[str, Any]) -> bool:
        require_admin(actor)
        model = self._vhost(vhost)
        for key in ("pattern", "definition"):
            if key not in body:
                raise precondition_failed(f"operator policy '{name}': {key} is missing")
        created = model.operator_policies.get(name) is None
        try:
            model.operator_policies.set(name, body["pattern"], body["definition"], body.get("priority", 0),
                                        body.get("apply-to", "all"))
        except ValueError as e:
            raise precondition_failed(str(e).replace("policy '", "operator policy '", 1)) from None
        return created

    def clear_operator_policy(self, actor: Actor | None, vhost: str, name: str) -> None:
        require_admin(actor)
        if not self._vhost(vhost).operator_policies.delete(name):
            raise not_found(f"no operator policy '{name}' in vhost '{vhost}'")
