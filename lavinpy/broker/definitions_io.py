"""Definitions export and import in RabbitMQ's JSON format (users, vhosts, permissions, policies,
exchanges, queues, bindings; parameters empty).

An import checks the whole document first, against the file itself and the broker's current state,
and changes nothing when any object is wrong: the error names the first bad object. Password hashes
are kept as given, so users exported from RabbitMQ 3.x log in with their passwords.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..wire.constants import PRECONDITION_FAILED
from ..wire.errors import AMQPChannelError, AMQPError
from . import operations_objects as objects
from .actor import Actor
from .admin_operations import AdminOperations, parse_tags, password_spec, require_admin, user_json
from .arguments import ArgumentError, queue_type_of, validate_queue_arguments
from .exchanges.base import Exchange
from .exchanges.registry import EXCHANGE_TYPES, UnknownExchangeType, make_exchange
from .policies import PolicyError, make_policy
from .stream_arguments import validate_stream_declare
from .users import PERMISSION_KINDS

if TYPE_CHECKING:
    from .broker import Broker

RABBIT_VERSION = "3.10.0"  # the export format this follows
SECTIONS = ("users", "vhosts", "permissions", "topic_permissions", "parameters", "global_parameters",
            "policies", "queues", "exchanges", "bindings")


class DefinitionsError(AMQPChannelError):
    """One object of a definitions document is wrong (406; 400 over HTTP)."""

    def __init__(self, detail: str) -> None:
        super().__init__(PRECONDITION_FAILED, detail)


def _exportable_exchange(exchange: Exchange) -> bool:
    return bool(exchange.name) and not exchange.name.startswith("amq.")


def export_definitions(broker: Broker, actor: Actor | None, vhost: str | None = None) -> dict[str, Any]:
    """The broker's (or one vhost's) definitions, as RabbitMQ's GET /api/definitions[/{vhost}]."""
    require_admin(actor)
    ops = AdminOperations(broker)
    users = ops.users
    if vhost is not None:
        ops.check_vhost_visible(actor, vhost)
    names = [vhost] if vhost is not None else sorted(v.name for v in users.vhosts())
    doc: dict[str, Any] = {"rabbit_version": RABBIT_VERSION, "rabbitmq_version": RABBIT_VERSION,
                           "product_name": "lavinpy", "product_version": _version()}
    if vhost is None:
        doc["users"] = [user_json(u) for u in sorted(users.users(), key=lambda u: u.name)]
        doc["vhosts"] = [{"name": v.name, "limits": [],
                          "metadata": {"description": v.description, "tags": list(v.tags)}}
                         for v in sorted(users.vhosts(), key=lambda v: v.name)]
        doc["permissions"] = ops.list_permissions(actor)
        doc["topic_permissions"] = []
    doc["parameters"] = []
    doc["global_parameters"] = []
    policies, queues, exchanges, bindings = [], [], [], []
    for name in names:
        model = broker.vhosts.get(name)
        if model is None:
            continue
        for policy in sorted(model.policies.list(), key=lambda p: p.name):
            policies.append({"vhost": name, "name": policy.name, "pattern": policy.pattern,
                             "apply-to": policy.apply_to, "definition": dict(policy.definition),
                             "priority": policy.priority})
        for queue in sorted(model.queues.values(), key=lambda q: q.name):
            if not queue.exclusive:
                queues.append({"name": queue.name, "vhost": name, "durable": queue.durable,
                               "auto_delete": queue.auto_delete, "arguments": dict(queue.arguments)})
        for exchange in sorted(model.exchanges.values(), key=lambda e: e.name):
            if _exportable_exchange(exchange):
                exchanges.append({"name": exchange.name, "vhost": name, "type": exchange.type,
                                  "durable": exchange.durable, "auto_delete": exchange.auto_delete,
                                  "internal": exchange.internal, "arguments": dict(exchange.arguments)})
            if not exchange.name:
                continue  # default-exchange bindings are implicit
            for binding in exchange.bindings():
                dest = binding.destination
                if isinstance(dest, Exchange):
                    dest_name, dest_type = dest.name, "exchange"
                else:
                    if getattr(dest, "exclusive", False):
                        continue
                    dest_name, dest_type = dest.name, "queue"  # type: ignore[attr-defined]
                bindings.append({"source": exchange.name, "vhost": name, "destination": dest_name,
                                 "destination_type": dest_type, "routing_key": binding.routing_key,
                                 "arguments": dict(binding.arguments)})
    doc.update(policies=policies, queues=queues, exchanges=exchanges, bindings=bindings)
    if vhost is not None:  # a vhost's export leaves the vhost out of each object, as RabbitMQ's
        for section in ("policies", "queues", "exchanges", "bindings"):
            for item in doc[section]:
                item.pop("vhost", None)
    return doc


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("lavinpy")
    except Exception:  # noqa: BLE001 - not installed as a package (run from a checkout)
        return "0"


# -- import ---------------------------------------------------------------------------------------


def _list(doc: Mapping[str, Any], section: str) -> list[Any]:
    value = doc.get(section, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise DefinitionsError(f"definitions: '{section}' must be a list")
    return value


def _obj(item: Any, section: str, index: int) -> Mapping[str, Any]:
    if not isinstance(item, Mapping):
        raise DefinitionsError(f"definitions: {section}[{index}] must be an object")
    return item


def _name(item: Mapping[str, Any], what: str, key: str = "name") -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise DefinitionsError(f"{what}: '{key}' must be a string, not {value!r}")
    return value


def _flag(item: Mapping[str, Any], key: str, what: str, default: bool) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise DefinitionsError(f"{what}: '{key}' must be true or false, not {value!r}")
    return value


def _args(item: Mapping[str, Any], what: str) -> dict[str, Any]:
    value = item.get("arguments") or {}
    if not isinstance(value, Mapping):
        raise DefinitionsError(f"{what}: 'arguments' must be an object")
    return dict(value)


class _Plan:
    """A checked document: the actions an import will take, in order, and what each changes."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, str, str, Any]] = []  # (kind, vhost, name, payload)
        self.changes: list[dict[str, str]] = []

    def add(self, kind: str, vhost: str, name: str, payload: Any, change: str | None) -> None:
        self.actions.append((kind, vhost, name, payload))
        if change is not None:
            entry = {"type": kind, "name": name, "change": change}
            if vhost:
                entry["vhost"] = vhost
            self.changes.append(entry)


def import_definitions(broker: Broker, actor: Actor | None, doc: Any, *, vhost: str | None = None,
                       dry_run: bool = False) -> list[dict[str, str]]:
    """Check the whole document, then apply it (unless ``dry_run``); returns what changes."""
    require_admin(actor)
    if not isinstance(doc, Mapping):
        raise DefinitionsError("definitions must be a JSON object")
    ops = AdminOperations(broker)
    if vhost is not None:
        ops.check_vhost_visible(actor, vhost)
    plan = _check(broker, doc, vhost)
    if not dry_run:
        _apply(broker, ops, plan)
    return plan.changes


def _check(broker: Broker, doc: Mapping[str, Any], only_vhost: str | None) -> _Plan:
    users = broker.users
    assert users is not None
    plan = _Plan()
    vhosts = {v.name for v in users.vhosts()}
    user_names = {u.name for u in users.users()}
    sections = ("policies", "exchanges", "queues", "bindings") if only_vhost else \
        ("vhosts", "users", "permissions", "policies", "exchanges", "queues", "bindings")
    for section in ("topic_permissions", "parameters", "global_parameters"):
        for i, item in enumerate(_list(doc, section)):
            _obj(item, section, i)  # accepted and ignored: lavinpy has no runtime parameters

    def vhost_of(item: Mapping[str, Any], what: str) -> str:
        if only_vhost is not None:
            return only_vhost
        name = _name(item, what, "vhost")
        if name not in vhosts:
            raise DefinitionsError(f"{what}: no vhost '{name}'")
        return name

    if "vhosts" in sections:
        for i, item in enumerate(_list(doc, "vhosts")):
            item = _obj(item, "vhosts", i)
            name = _name(item, f"vhost #{i}")
            if not name:
                raise DefinitionsError(f"vhost #{i}: name must not be empty")
            metadata = item.get("metadata") if isinstance(item.get("metadata"), Mapping) else {}
            description = item.get("description", metadata.get("description", ""))
            if not isinstance(description, str):
                raise DefinitionsError(f"vhost '{name}': description must be a string")
            try:
                tags = parse_tags(item.get("tags", metadata.get("tags")))
            except AMQPError as e:
                raise DefinitionsError(f"vhost '{name}': {e.detail}") from None
            plan.add("vhost", "", name, (description, tags), None if name in vhosts else "create")
            vhosts.add(name)
    if "users" in sections:
        for i, item in enumerate(_list(doc, "users")):
            item = _obj(item, "users", i)
            name = _name(item, f"user #{i}")
            if not name:
                raise DefinitionsError(f"user #{i}: name must not be empty")
            try:
                spec = password_spec(item, name)
                tags = parse_tags(item.get("tags"))
            except AMQPError as e:
                raise DefinitionsError(e.detail) from None
            plan.add("user", "", name, (spec, tags), "update" if name in user_names else "create")
            user_names.add(name)
    if "permissions" in sections:
        for i, item in enumerate(_list(doc, "permissions")):
            item = _obj(item, "permissions", i)
            user = _name(item, f"permission #{i}", "user")
            what = f"permission of user '{user}'"
            vhost = vhost_of(item, what)
            what = f"permission of user '{user}' in vhost '{vhost}'"
            if user not in user_names:
                raise DefinitionsError(f"{what}: no user '{user}'")
            patterns = []
            for kind in PERMISSION_KINDS:
                pattern = _name(item, what, kind)
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise DefinitionsError(f"{what}: {kind} {pattern!r} is not a valid regular expression: {e}")
                patterns.append(pattern)
            plan.add("permission", vhost, user, patterns, "set")
    for i, item in enumerate(_list(doc, "policies")):
        item = _obj(item, "policies", i)
        name = _name(item, f"policy #{i}")
        vhost = vhost_of(item, f"policy '{name}'")
        try:
            policy = make_policy(name, item.get("pattern"), item.get("definition"),  # type: ignore[arg-type]
                                 item.get("priority", 0), item.get("apply-to", "all"))
        except PolicyError as e:
            raise DefinitionsError(f"vhost '{vhost}': {e}") from None
        plan.add("policy", vhost, name, policy, "set")
    new_exchanges: dict[tuple[str, str], str] = {}
    for i, item in enumerate(_list(doc, "exchanges")):
        item = _obj(item, "exchanges", i)
        name = _name(item, f"exchange #{i}")
        what = f"exchange '{name}'"
        vhost = vhost_of(item, what)
        what = f"exchange '{name}' in vhost '{vhost}'"
        type_name = _name(item, what, "type")
        durable = _flag(item, "durable", what, True)
        auto_delete = _flag(item, "auto_delete", what, False)
        internal = _flag(item, "internal", what, False)
        arguments = _args(item, what)
        if not name:
            raise DefinitionsError(f"exchange #{i} in vhost '{vhost}': the default exchange cannot be declared")
        if type_name not in EXCHANGE_TYPES:
            raise DefinitionsError(f"{what}: unknown exchange type '{type_name}'")
        try:
            make_exchange(type_name, name, durable=durable, auto_delete=auto_delete, internal=internal,
                          arguments=arguments)
        except (ArgumentError, UnknownExchangeType) as e:
            raise DefinitionsError(f"{what}: {getattr(e, 'text', e)}") from None
        model = broker.vhosts.get(vhost)
        existing = model.exchanges.get(name) if model is not None else None
        if existing is not None:
            if existing.type != type_name:
                raise DefinitionsError(f"{what}: exists with type '{existing.type}', not '{type_name}'")
            change = None
        elif name.startswith("amq."):
            raise DefinitionsError(f"{what}: name contains reserved prefix 'amq.*'")
        else:
            change = "create"
        new_exchanges[(vhost, name)] = type_name
        plan.add("exchange", vhost, name, (type_name, durable, auto_delete, internal, arguments), change)
    new_queues: set[tuple[str, str]] = set()
    for i, item in enumerate(_list(doc, "queues")):
        item = _obj(item, "queues", i)
        name = _name(item, f"queue #{i}")
        what = f"queue '{name}'"
        vhost = vhost_of(item, what)
        what = f"queue '{name}' in vhost '{vhost}'"
        durable = _flag(item, "durable", what, True)
        auto_delete = _flag(item, "auto_delete", what, False)
        arguments = _args(item, what)
        if not name or name.startswith("amq."):
            raise DefinitionsError(f"{what}: a queue name must not be empty or start with 'amq.'")
        try:
            if queue_type_of(arguments) == "stream":
                validate_stream_declare(name, vhost, durable=durable, exclusive=False,
                                        auto_delete=auto_delete, arguments=arguments)
            else:
                validate_queue_arguments(arguments, queue=name, vhost=vhost, durable=durable,
                                         auto_delete=auto_delete)
        except ArgumentError as e:
            raise DefinitionsError(e.text) from None
        except AMQPError as e:
            raise DefinitionsError(e.detail) from None
        model = broker.vhosts.get(vhost)
        existing = model.queues.get(name) if model is not None else None
        if existing is not None and (existing.durable != durable or existing.auto_delete != auto_delete):
            raise DefinitionsError(f"{what}: exists with different durable/auto_delete flags")
        new_queues.add((vhost, name))
        plan.add("queue", vhost, name, (durable, auto_delete, arguments), None if existing else "create")
    for i, item in enumerate(_list(doc, "bindings")):
        item = _obj(item, "bindings", i)
        source = _name(item, f"binding #{i}", "source")
        destination = _name(item, f"binding #{i}", "destination")
        dest_type = _name(item, f"binding #{i}", "destination_type")
        routing_key = _name(item, f"binding #{i}", "routing_key") if "routing_key" in item else ""
        vhost = vhost_of(item, f"binding #{i}")
        what = f"binding of {dest_type} '{destination}' to exchange '{source}' in vhost '{vhost}'"
        arguments = _args(item, what)
        if dest_type not in ("queue", "exchange"):
            raise DefinitionsError(f"{what}: destination_type must be 'queue' or 'exchange'")
        if source == "":
            continue  # default-exchange bindings are implicit (RabbitMQ exports none)
        model = broker.vhosts.get(vhost)
        if (vhost, source) not in new_exchanges and (model is None or source not in model.exchanges):
            raise DefinitionsError(f"{what}: no exchange '{source}' in vhost '{vhost}'")
        if dest_type == "queue":
            known = (vhost, destination) in new_queues or (model is not None and destination in model.queues)
        else:
            known = (vhost, destination) in new_exchanges or (model is not None and destination in model.exchanges)
        if not known:
            raise DefinitionsError(f"{what}: no {dest_type} '{destination}' in vhost '{vhost}'")
        plan.add("binding", vhost, f"{source}->{dest_type}:{destination}",
                 (source, destination, dest_type, routing_key, arguments), "bind")
    return plan


def _apply(broker: Broker, ops: AdminOperations, plan: _Plan) -> None:
    users = ops.users
    for kind, vhost, name, payload in plan.actions:
        if kind == "vhost":
            if not users.vhost_exists(name):
                ops.put_vhost(None, name, payload[0], payload[1])
        elif kind == "user":
            spec, tags = payload
            if users.user(name) is None:
                users.add_user_with_hash(name, spec.password_hash if spec else "",
                                         spec.algorithm if spec else "rabbit_password_hashing_sha256", tags)
            else:
                if spec is not None:
                    users.set_password_hash(name, spec.password_hash, spec.algorithm)
                users.set_tags(name, tags)
        elif kind == "permission":
            users.set_permissions(name, vhost, *payload)
        elif kind == "policy":
            broker.vhosts[vhost].set_policy(name, payload.pattern, dict(payload.definition),
                                            payload.priority, payload.apply_to)
        elif kind == "exchange":
            # The actor was checked as an administrator: the objects are declared as a trusted caller.
            type_name, durable, auto_delete, internal, arguments = payload
            model = broker.vhosts[vhost]
            if name not in model.exchanges:
                objects.declare_exchange(None, model, name, type_name, durable=durable,
                                         auto_delete=auto_delete, internal=internal, arguments=arguments)
        elif kind == "queue":
            durable, auto_delete, arguments = payload
            model = broker.vhosts[vhost]
            if name not in model.queues:
                objects.declare_queue(None, model, name, owner=None, durable=durable, auto_delete=auto_delete,
                                      arguments=arguments)
        elif kind == "binding":
            source, destination, dest_type, routing_key, arguments = payload
            model = broker.vhosts[vhost]
            if dest_type == "queue":
                objects.bind_queue(None, model, destination, source, routing_key, arguments, owner=None)
            else:
                objects.bind_exchange(None, model, destination, source, routing_key, arguments)

class DefinitionsFileError(Exception):
    """The load_definitions file cannot be read or is wrong: the broker does not start."""


def load_definitions_file(broker: Broker, path: str) -> list[dict[str, str]]:
    """Apply a definitions file at boot (setting ``load_definitions``), as a trusted caller."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise DefinitionsFileError(f"load_definitions: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise DefinitionsFileError(f"load_definitions: {path} is not valid JSON: {e}") from None
    try:
        return import_definitions(broker, None, doc)
    except AMQPError as e:
        raise DefinitionsFileError(f"load_definitions: {path}: {e.detail}") from None
