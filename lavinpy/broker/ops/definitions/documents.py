"""Definitions export and import in RabbitMQ's JSON format (users, vhosts with their metadata,
permissions, topic permissions, policies, exchanges, queues, bindings), read from RabbitMQ's and
LavinMQ's exports alike.

An import checks the whole document first, against the file itself and the broker's current state,
and changes nothing when any object is wrong: the error names every bad object. What lavinpy's design
already gives (RabbitMQ-only policy keys such as ha-mode) is accepted, kept, exported back and listed
in the reply as not needed. Password hashes are kept as given (LavinMQ's older prefixed form made
RabbitMQ's), so users exported from RabbitMQ or LavinMQ log in with their passwords.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ...access.actor import Actor
from ...errors import BrokerError
from ...exchanges.base import Exchange
from .. import objects
from ..admin import AdminOperations, require_admin, user_json
from .checks import DefinitionsError as DefinitionsError  # re-exported: the faces catch it
from .checks import Plan, check_document, check_steps, drain
from .limits import ACTION_KINDS as LIMIT_ACTIONS
from .limits import apply_action as apply_limit_action
from .limits import export_limit_sections

if TYPE_CHECKING:
    from ...access.users import VHostRecord
    from ...broker import Broker
    from ...vhost import VHost as VHostModel

log = logging.getLogger("lavinpy.definitions")
RABBIT_VERSION = "3.10.0"  # the export format this follows


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
        doc["vhosts"] = [_vhost_export(v) for v in sorted(users.vhosts(), key=lambda v: v.name)]
        doc["permissions"] = ops.list_permissions(actor)
        doc["topic_permissions"] = ops.list_topic_permissions(actor)
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
    export_limit_sections(broker, doc, names, whole=vhost is None)
    if vhost is not None:  # a vhost's export leaves the vhost out of each object, as RabbitMQ's
        for section in ("policies", "queues", "exchanges", "bindings"):
            for item in doc[section]:
                item.pop("vhost", None)
    return doc


def _vhost_export(vhost: VHostRecord) -> dict[str, Any]:
    """A vhost as RabbitMQ 3.10+ exports it: its metadata (RabbitMQ 3.10 reads description and tags;
    default_queue_type is 3.11's, kept for a round trip)."""
    metadata: dict[str, Any] = {"description": vhost.description, "tags": list(vhost.tags)}
    if vhost.default_queue_type is not None:
        metadata["default_queue_type"] = vhost.default_queue_type
    return {"name": vhost.name, "limits": [], "metadata": metadata}


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("lavinpy")
    except Exception:  # noqa: BLE001 - not installed as a package (run from a checkout)
        return "0"


# -- import ---------------------------------------------------------------------------------------


def import_definitions(broker: Broker, actor: Actor | None, doc: Any, *, vhost: str | None = None,
                       dry_run: bool = False) -> Plan:
    """Check the whole document, then apply it (unless ``dry_run``); returns the plan: what changes
    (``changes``) and what was accepted as not needed (``ignored``). In one go: for the boot's
    ``load_definitions``; the API uses ``import_definitions_cooperatively``."""
    ops = _importer(broker, actor, doc, vhost)
    plan = check_document(broker, doc, vhost, _importer_name(broker, actor))
    if not dry_run:
        drain(_apply_steps(broker, ops, plan))
    return plan


# An import over the API gives the event loop a turn at least this often (seconds of work), so that
# other clients (deliveries, heartbeats, the cluster's keepalive) are served during a large import.
IMPORT_SLICE_SECONDS = 0.01
_import_locks: weakref.WeakKeyDictionary[Broker, asyncio.Lock] = weakref.WeakKeyDictionary()


async def import_definitions_cooperatively(broker: Broker, actor: Actor | None, doc: Any, *,
                                           vhost: str | None = None, dry_run: bool = False) -> Plan:
    """``import_definitions`` with a turn of the event loop every ``IMPORT_SLICE_SECONDS`` of work,
    while checking and while applying. Imports into one broker run one at a time. What other clients
    change meanwhile is not seen by the check: an object it needs that is deleted during the apply
    refuses the rest of the import (400 naming it), the objects already made stay."""
    lock = _import_locks.setdefault(broker, asyncio.Lock())
    async with lock:
        ops = _importer(broker, actor, doc, vhost)
        plan: Plan = await _cooperatively(check_steps(broker, doc, vhost, _importer_name(broker, actor)))
        if not dry_run:
            await _cooperatively(_apply_steps(broker, ops, plan))
        return plan


async def _cooperatively(steps: Iterator[None]) -> Any:
    slice_end = time.monotonic() + IMPORT_SLICE_SECONDS
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        if time.monotonic() >= slice_end:
            await asyncio.sleep(0)
            slice_end = time.monotonic() + IMPORT_SLICE_SECONDS


def _importer(broker: Broker, actor: Actor | None, doc: Any, vhost: str | None) -> AdminOperations:
    require_admin(actor)
    if not isinstance(doc, Mapping):
        raise DefinitionsError("definitions must be a JSON object")
    ops = AdminOperations(broker)
    if vhost is not None:
        ops.check_vhost_visible(actor, vhost)
    return ops


def _importer_name(broker: Broker, actor: Actor | None) -> str:
    """Whom links (shovels) without a recorded user run as: the importing administrator."""
    return actor.name if actor is not None else broker.config.default_user


def _model(broker: Broker, vhost: str) -> VHostModel:
    model = broker.vhosts.get(vhost)
    if model is None:  # deleted by another client while a cooperative import ran
        raise DefinitionsError(f"vhost '{vhost}' was deleted during the import")
    return model


def _apply_steps(broker: Broker, ops: AdminOperations, plan: Plan) -> Iterator[None]:
    users = ops.users
    for kind, vhost, name, payload in plan.actions:
        if kind == "vhost":
            ops.put_vhost(None, name, *payload)
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
        elif kind == "topic_permission":
            users.set_topic_permission(name, vhost, *payload)
        elif kind == "policy":
            _model(broker, vhost).set_policy(name, payload.pattern, dict(payload.definition),
                                             payload.priority, payload.apply_to)
        elif kind == "exchange":
            # The actor was checked as an administrator: the objects are declared as a trusted caller.
            type_name, durable, auto_delete, internal, arguments = payload
            model = _model(broker, vhost)
            if name not in model.exchanges:
                objects.declare_exchange(None, model, name, type_name, durable=durable,
                                         auto_delete=auto_delete, internal=internal, arguments=arguments)
        elif kind == "queue":
            durable, auto_delete, arguments = payload
            model = _model(broker, vhost)
            if name not in model.queues:
                objects.declare_queue(None, model, name, owner=None, durable=durable, auto_delete=auto_delete,
                                      arguments=arguments)
        elif kind in LIMIT_ACTIONS:
            apply_limit_action(broker, kind, vhost, name, payload)
        elif kind == "binding":
            source, destination, dest_type, routing_key, arguments = payload
            model = _model(broker, vhost)
            if dest_type == "queue":
                objects.bind_queue(None, model, destination, source, routing_key, arguments, owner=None)
            else:
                objects.bind_exchange(None, model, destination, source, routing_key, arguments)
        yield


class LoadDefinitionsError(Exception):
    """The load_definitions file cannot be read or is wrong: the broker does not start."""


def load_definitions_file(broker: Broker, path: str) -> list[dict[str, str]]:
    """Apply a definitions file at boot (setting ``load_definitions``), as a trusted caller."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise LoadDefinitionsError(f"load_definitions: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise LoadDefinitionsError(f"load_definitions: {path} is not valid JSON: {e}") from None
    try:
        plan = import_definitions(broker, None, doc)
    except BrokerError as e:
        raise LoadDefinitionsError(f"load_definitions: {path}: {e.detail}") from None
    for item in plan.ignored:
        log.info("load_definitions: %s '%s': %s accepted, %s", item["type"], item["name"], item["key"], item["reason"])
    return plan.changes
