"""The definitions sections of runtime parameters, global parameters, operator policies and limits.

Import (checked with the rest of the document before anything is applied):
- ``parameters``: ``vhost-limits`` and every registered component (``shovel``, ``federation-upstream`` and
  ``federation-upstream-set`` once the server has registered them) are validated by their component and
  applied; a link (shovel, federation upstream) keeps the ``user`` recorded with it (else it becomes the
  importer's) and is refused unless that user has the rights it needs (links.py; a user the same
  document creates or gives permissions is checked when the link starts);
  ``operator_policy`` (how RabbitMQ exports operator policies) becomes an operator policy; any other
  component (``mqtt-port-to-vhost-mapping``, ...) is refused by name.
- ``global_parameters``: stored; ``cluster_name`` is shown in the overview, ``internal_cluster_id`` kept.
- ``operator_policies`` (a section of its own, as lavinpy and LavinMQ may write it) and users' ``limits``.
- RabbitMQ's queue-limit check: queues the import adds to a vhost must fit its max-queues.
Export writes the same back in RabbitMQ's form (operator policies as ``operator_policy`` parameters).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...access.client_limits import USER_LIMIT_KEYS, VHOST_LIMITS_COMPONENT, check_limits
from ...access.links import LINK_COMPONENTS, link_refusal
from ...errors import PRECONDITION_FAILED, BrokerChannelError
from ...settings.operator_policies import OPERATOR_VALIDATORS
from ...settings.parameters import ParameterError, check_parameter_name
from ...settings.policies import PolicyError, make_policy

if TYPE_CHECKING:
    from ...broker import Broker

OPERATOR_POLICY_COMPONENT = "operator_policy"
# The plan's action kinds this module applies (definitions.documents hands them to ``apply_action``).
ACTION_KINDS = ("parameter", "global_parameter", "operator_policy", "user_limits")


class _Refused(BrokerChannelError):
    def __init__(self, detail: str) -> None:
        super().__init__(PRECONDITION_FAILED, detail)


def _items(doc: Mapping[str, Any], section: str) -> list[Mapping[str, Any]]:
    value = doc.get(section) or []
    if not isinstance(value, list):
        raise _Refused(f"definitions: '{section}' must be a list")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise _Refused(f"definitions: {section}[{i}] must be an object")
    return value


def _text(item: Mapping[str, Any], key: str, what: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _Refused(f"{what}: '{key}' must be a string, not {value!r}")
    return value


def check_limit_sections(broker: Broker, doc: Mapping[str, Any], only_vhost: str | None, plan: Any,
                         importer: str) -> None:
    """Check the sections and add their actions to ``plan`` (a definitions.checks.Plan); refuse by name.
    ``importer``: whom a link parameter without a recorded ``user`` runs as."""
    users = broker.users
    assert users is not None
    # A link's user the document creates or gives permissions is checked when the link starts (its
    # rights are not there yet); any other is checked now.
    deferred = ({item.get("name") for item in _items(doc, "users")} - {u.name for u in users.users()}
                | {item.get("user") for item in _items(doc, "permissions")})
    vhosts = {v.name for v in users.vhosts()} | {v.get("name") for v in _items(doc, "vhosts")}
    queue_limits: dict[str, int] = {}
    for i, item in enumerate(_items(doc, "parameters")):
        component = _text(item, "component", f"parameter #{i}")
        name = _text(item, "name", f"parameter #{i}")
        vhost = only_vhost if only_vhost is not None else _text(item, "vhost", f"parameter '{name}'")
        what = f"parameter '{name}' of component '{component}' in vhost '{vhost}'"
        if vhost not in vhosts:
            raise _Refused(f"{what}: no vhost '{vhost}'")
        value = item.get("value")
        try:
            check_parameter_name("parameter name", name)
        except ParameterError as e:
            raise _Refused(f"{what}: {e}") from None
        if component == OPERATOR_POLICY_COMPONENT:
            _operator_policy(plan, vhost, name, value if isinstance(value, Mapping) else {}, what)
            continue
        try:
            broker.parameters.component(component).validate(vhost, name, value)  # type: ignore[arg-type]
        except ValueError as e:  # ParameterError (an unknown component too) or a component's ValueError
            raise _Refused(f"{what}: {e}") from None
        if component == VHOST_LIMITS_COMPONENT and isinstance(value, Mapping) and "max-queues" in value:
            queue_limits[vhost] = value["max-queues"]
        user = None
        if component in LINK_COMPONENTS:
            recorded = item.get("user")
            user = recorded if isinstance(recorded, str) else importer
            refusal = None if user in deferred else link_refusal(users, user, vhost, value, component)
            if refusal is not None:
                raise _Refused(f"{what}: {refusal}")
        plan.add("parameter", vhost, name, (component, value, user), "set")
    for item in _items(doc, "operator_policies"):
        name = _text(item, "name", "operator policy")
        vhost = only_vhost if only_vhost is not None else _text(item, "vhost", f"operator policy '{name}'")
        if vhost not in vhosts:
            raise _Refused(f"operator policy '{name}': no vhost '{vhost}'")
        _operator_policy(plan, vhost, name, item, f"operator policy '{name}' in vhost '{vhost}'")
    if only_vhost is None:
        for item in _items(doc, "global_parameters"):
            name = _text(item, "name", "global parameter")
            try:
                check_parameter_name("global parameter name", name)
            except ParameterError as e:
                raise _Refused(str(e)) from None
            if name == "cluster_name" and (not isinstance(item.get("value"), str) or not item.get("value")):
                raise _Refused("global parameter 'cluster_name': value must be a non-empty string")
            plan.add("global_parameter", "", name, item.get("value"), "set")
        for item in _items(doc, "users"):
            limits = item.get("limits")
            if limits:  # RabbitMQ exports {} (or [] from old versions) for a user without limits
                name = str(item.get("name"))
                try:
                    checked = check_limits(limits, USER_LIMIT_KEYS, f"user '{name}': limits")
                except ParameterError as e:
                    raise _Refused(str(e)) from None
                plan.add("user_limits", "", name, checked, "set")
    _check_queue_limits(broker, doc, only_vhost, queue_limits)


def _operator_policy(plan: Any, vhost: str, name: str, value: Mapping[str, Any], what: str) -> None:
    try:
        policy = make_policy(name, value.get("pattern"), value.get("definition"),  # type: ignore[arg-type]
                             value.get("priority", 0), value.get("apply-to", "all"), OPERATOR_VALIDATORS)
    except PolicyError as e:
        raise _Refused(f"{what}: {str(e).replace('policy ', 'operator policy ', 1)}") from None
    plan.add("operator_policy", vhost, name, policy, "set")


def _check_queue_limits(broker: Broker, doc: Mapping[str, Any], only_vhost: str | None,
                        imported: dict[str, int]) -> None:
    """RabbitMQ's check: the queues an import adds must fit the vhost's max-queues."""
    added: dict[str, set[str]] = {}
    for item in _items(doc, "queues"):
        vhost = only_vhost if only_vhost is not None else item.get("vhost")
        model = broker.vhosts.get(vhost) if isinstance(vhost, str) else None
        if isinstance(vhost, str) and (model is None or item.get("name") not in model.queues):
            added.setdefault(vhost, set()).add(str(item.get("name")))
    for vhost, names in sorted(added.items()):
        limit = imported.get(vhost, broker.client_limits.max_queues(vhost))
        model = broker.vhosts.get(vhost)
        current = len(model.queues) if model is not None else 0
        if limit is not None and limit >= 0 and current + len(names) > limit:
            raise _Refused(f'Adding {len(names)} queue(s) to virtual host "{vhost}" would exceed the limit of '
                           f"{limit} queue(s).\n\nThis virtual host currently has {current} queue(s) defined.\n\n"
                           "Import aborted!")


def apply_action(broker: Broker, kind: str, vhost: str, name: str, payload: Any) -> None:
    """Apply one checked action (as a trusted caller)."""
    if kind == "parameter":
        component, value, user = payload
        broker.parameters.set(component, vhost, name, value, user)
    elif kind == "global_parameter":
        broker.parameters.set_global(name, payload)
    elif kind == "operator_policy":
        broker.vhosts[vhost].operator_policies.set(name, payload.pattern, dict(payload.definition),
                                                   payload.priority, payload.apply_to)
    elif kind == "user_limits":
        broker.client_limits.set_user_limits(name, payload)


def export_limit_sections(broker: Broker, doc: dict[str, Any], vhosts: list[str], whole: bool) -> None:
    """Fill ``doc``'s parameters (with operator policies as RabbitMQ exports them), global parameters
    (not the internal ones, as RabbitMQ), and users' and vhosts' limits."""
    parameters: list[dict[str, Any]] = []
    for vhost in vhosts:
        parameters.extend(broker.parameters.listing(vhost=vhost))
        model = broker.vhosts.get(vhost)
        if model is not None:
            for policy in sorted(model.operator_policies.list(), key=lambda p: p.name):
                value = {k: v for k, v in policy.to_json().items() if k != "name"}
                parameters.append({"value": value, "vhost": vhost, "component": OPERATOR_POLICY_COMPONENT,
                                   "name": policy.name})
    if not whole:
        for item in parameters:
            item.pop("vhost", None)
    doc["parameters"] = parameters
    doc["global_parameters"] = [p for p in broker.parameters.list_globals()
                                if whole and not str(p["name"]).startswith("internal")]
    if whole:
        limits = broker.client_limits
        for user in doc.get("users", []):
            user["limits"] = dict(limits.user_limits.get(user.get("name"), {}))
        for vhost_item in doc.get("vhosts", []):
            vhost_limits = limits.vhost_limits.get(vhost_item.get("name"))
            if vhost_limits:
                vhost_item["limits"] = dict(vhost_limits)

