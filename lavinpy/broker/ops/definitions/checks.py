"""Checking a definitions document before anything is imported: the plan of an import.

The whole document is checked against itself and the broker's current state first; an import then
changes nothing when any object is wrong, and the error names every bad object. Objects are
judged by the model's own rules (``declarations``, ``arguments``, ``policies``, ``ops.admin``):
an import refuses what a declaration would refuse, with the same text.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ....wire.field_table import FieldTableError, check_nesting
from ...access.users import PERMISSION_KINDS
from ...declarations import (
    check_exchange_equivalent,
    check_exchange_name,
    check_queue_equivalent,
    check_queue_name,
    new_exchange,
    validate_queue_declare,
)
from ...errors import PRECONDITION_FAILED, BrokerChannelError, BrokerError
from ...settings.names import name_too_long
from ...settings.policies import NOT_NEEDED_KEYS, PolicyError, make_policy
from ..admin import check_vhost_metadata, parse_tags, password_spec
from .limits import check_limit_sections

if TYPE_CHECKING:
    from ...broker import Broker
    from ...exchanges.base import Exchange

# Sections in the order an import applies them (a whole-node import; a vhost's takes the last four).
NODE_SECTIONS = ("vhosts", "users", "permissions", "topic_permissions", "policies", "exchanges", "queues",
                 "bindings")
VHOST_SECTIONS = ("policies", "exchanges", "queues", "bindings")
IGNORED_SECTIONS = ("parameters", "global_parameters", "operator_policies")  # definitions.limits checks them
# Policy keys accepted, kept and exported, reported as not needed: RabbitMQ-only ones, and the queue
# mode and version (lavinpy keeps messages on disk and pages them in on demand).
REPORTED_POLICY_KEYS = NOT_NEEDED_KEYS | {"queue-mode", "queue-version"}
# Top-level keys that describe the export itself (RabbitMQ's and LavinMQ's), nothing to apply.
EXPORT_INFO_KEYS = frozenset({"rabbit_version", "rabbitmq_version", "product_name", "product_version",
                              "lavinmq_version"})


class DefinitionsError(BrokerChannelError):
    """One object of a definitions document is wrong (406; 400 over HTTP)."""

    def __init__(self, detail: str) -> None:
        super().__init__(PRECONDITION_FAILED, detail)


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
    try:
        check_nesting(value)
    except FieldTableError as e:
        raise DefinitionsError(f"{what}: arguments: {e}") from None
    return dict(value)


def _fits(what: str, kind: str, name: str) -> None:
    """DefinitionsError when ``name`` is longer than 255 bytes (AMQP's short string)."""
    reason = name_too_long(kind, name)
    if reason is not None:
        raise DefinitionsError(f"{what}: {reason}")


def _refused(what: str, vhost: str, error: BrokerError) -> DefinitionsError:
    """A model rule's refusal as an import error; ``what`` names the object unless the text does."""
    detail = error.detail
    return DefinitionsError(detail if f"in vhost '{vhost}'" in detail else f"{what}: {detail}")


class Plan:
    """A checked document: the actions an import will take, in order, and what each changes."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, str, str, Any]] = []  # (kind, vhost, name, payload)
        self.changes: list[dict[str, str]] = []
        self.ignored: list[dict[str, str]] = []  # accepted, not needed by lavinpy's design

    def ignore(self, kind: str, vhost: str, name: str, key: str, reason: str) -> None:
        entry = {"type": kind, "name": name, "key": key, "reason": reason}
        if vhost:
            entry["vhost"] = vhost
        self.ignored.append(entry)

    def add(self, kind: str, vhost: str, name: str, payload: Any, change: str | None) -> None:
        self.actions.append((kind, vhost, name, payload))
        if change is not None:
            entry = {"type": kind, "name": name, "change": change}
            if vhost:
                entry["vhost"] = vhost
            self.changes.append(entry)


def drain(steps: Iterator[None]) -> Any:
    """Run a generator of steps (``check_steps``, an import's apply) to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def check_document(broker: Broker, doc: Mapping[str, Any], only_vhost: str | None, importer: str) -> Plan:
    """The plan of importing ``doc`` (into ``only_vhost``, or the whole node); DefinitionsError if wrong.
    ``importer``: whom a link (shovel) parameter without a recorded ``user`` runs as."""
    plan: Plan = drain(check_steps(broker, doc, only_vhost, importer))
    return plan


def check_steps(broker: Broker, doc: Mapping[str, Any], only_vhost: str | None,
                importer: str) -> Generator[None, None, Plan]:
    """``check_document`` one object at a time: yields after each, returns the plan (a caller may give
    the event loop a turn between objects)."""
    checker = _Checker(broker, only_vhost)
    parameters = doc.get("parameters")
    checker.vhost_limit_parameters = {
        p.get("vhost"): p.get("value") for p in (parameters if isinstance(parameters, list) else [])
        if isinstance(p, Mapping) and p.get("component") == "vhost-limits"}
    known = set(NODE_SECTIONS) | set(IGNORED_SECTIONS) | EXPORT_INFO_KEYS
    for key in sorted(k for k in doc if k not in known):  # said, never silently dropped
        checker.plan.ignore("section", "", str(key), str(key), "not a definitions section lavinpy knows")
    if only_vhost is not None:
        for section in sorted(set(NODE_SECTIONS) - set(VHOST_SECTIONS)):
            if doc.get(section):  # as RabbitMQ's vhost import, which reads only the vhost's objects
                checker.plan.ignore("section", only_vhost, section, section,
                                    "a vhost's import takes only policies, exchanges, queues and bindings")
    for section in IGNORED_SECTIONS:
        for i, item in enumerate(_list(doc, section)):
            _obj(item, section, i)  # accepted and ignored
    refused: list[str] = []  # every bad item is named, not only the first
    for section in VHOST_SECTIONS if only_vhost else NODE_SECTIONS:
        check_item = getattr(checker, section)
        for i, item in enumerate(_list(doc, section)):
            try:
                check_item(i, _obj(item, section, i))
            except DefinitionsError as e:
                refused.append(e.detail)
            yield
    try:
        check_limit_sections(broker, doc, only_vhost, checker.plan, importer)
    except BrokerChannelError as e:  # the parameters, limits and operator policies: the first refused one
        refused.append(e.detail)
    if refused:
        count = f"{len(refused)} items refused, nothing imported: " if len(refused) > 1 else ""
        raise DefinitionsError(count + "; ".join(refused))
    return checker.plan


def not_needed_reason(key: str) -> str:
    """Why lavinpy needs no RabbitMQ-only policy key: what in its design gives what the key asks."""
    if key.startswith("ha-") or key in ("queue-master-locator", "queue-leader-locator", "initial-cluster-size",
                                        "target-group-size"):
        return "a lavinpy cluster replicates every durable queue to all in-sync replicas"
    return "lavinpy keeps messages on disk and pages them in on demand (lazy by design)"


class _Checker:
    """One method per section, each checking one item and adding its action to the plan. Objects
    declared earlier in the document count as existing for the later ones (bindings, permissions)."""

    def __init__(self, broker: Broker, only_vhost: str | None) -> None:
        users = broker.users
        assert users is not None
        self.broker = broker
        self.only_vhost = only_vhost
        self.vhost_limit_parameters: dict[Any, Any] = {}  # vhost -> the document's vhost-limits value
        self.plan = Plan()
        self.vhost_names = {v.name for v in users.vhosts()}
        self.user_names = {u.name for u in users.users()}
        # (vhost, name) -> the exchange as the import leaves it (its bindings are checked against its type)
        self.new_exchanges: dict[tuple[str, str], Exchange] = {}
        self.new_queues: set[tuple[str, str]] = set()

    def vhost_of(self, item: Mapping[str, Any], what: str) -> str:
        if self.only_vhost is not None:
            return self.only_vhost
        name = _name(item, what, "vhost")
        if name not in self.vhost_names:
            raise DefinitionsError(f"{what}: no vhost '{name}'")
        return name

    def vhosts(self, i: int, item: Mapping[str, Any]) -> None:
        name = _name(item, f"vhost #{i}")
        if not name:
            raise DefinitionsError(f"vhost #{i}: name must not be empty")
        metadata = item.get("metadata") if isinstance(item.get("metadata"), Mapping) else {}
        assert metadata is not None
        description = item.get("description", metadata.get("description", ""))
        if not isinstance(description, str):
            raise DefinitionsError(f"vhost '{name}': description must be a string")
        default_queue_type = item.get("default_queue_type", metadata.get("default_queue_type"))
        try:
            tags = parse_tags(item.get("tags", metadata.get("tags")))
            check_vhost_metadata(name, description, default_queue_type)
        except BrokerError as e:
            detail = e.detail if e.detail.startswith("vhost") else f"vhost '{name}': {e.detail}"
            raise DefinitionsError(detail) from None
        limits = item.get("limits")
        # RabbitMQ writes a vhost's limits twice: here and as a vhost-limits parameter, which is what
        # applies them. Said only when this copy is not the same as the parameter's.
        if limits and limits != self.vhost_limit_parameters.get(name):
            self.plan.ignore("vhost", "", name, "limits", "vhost limits are imported from the parameters section")
        self.plan.add("vhost", "", name, (description, tags, default_queue_type),
                      None if name in self.vhost_names else "create")
        self.vhost_names.add(name)

    def users(self, i: int, item: Mapping[str, Any]) -> None:
        name = _name(item, f"user #{i}")
        if not name:
            raise DefinitionsError(f"user #{i}: name must not be empty")
        _fits(f"user #{i}", "user name", name)
        try:
            spec = password_spec(item, name)
            tags = parse_tags(item.get("tags"))
        except BrokerError as e:
            raise DefinitionsError(e.detail) from None
        self.plan.add("user", "", name, (spec, tags), "update" if name in self.user_names else "create")
        self.user_names.add(name)

    def permissions(self, i: int, item: Mapping[str, Any]) -> None:
        user = _name(item, f"permission #{i}", "user")
        vhost = self.vhost_of(item, f"permission of user '{user}'")
        what = f"permission of user '{user}' in vhost '{vhost}'"
        if user not in self.user_names:
            raise DefinitionsError(f"{what}: no user '{user}'")
        patterns = []
        for kind in PERMISSION_KINDS:
            pattern = _name(item, what, kind)
            try:
                re.compile(pattern)
            except re.error as e:
                raise DefinitionsError(f"{what}: {kind} {pattern!r} is not a valid regular expression: {e}")
            patterns.append(pattern)
        self.plan.add("permission", vhost, user, patterns, "set")

    def topic_permissions(self, i: int, item: Mapping[str, Any]) -> None:
        user = _name(item, f"topic permission #{i}", "user")
        vhost = self.vhost_of(item, f"topic permission of user '{user}'")
        exchange = _name(item, f"topic permission of user '{user}' in vhost '{vhost}'", "exchange")
        _fits(f"topic permission of user '{user}' in vhost '{vhost}'", "exchange name", exchange)
        what = f"topic permission of user '{user}' on exchange '{exchange}' in vhost '{vhost}'"
        if user not in self.user_names:
            raise DefinitionsError(f"{what}: no user '{user}'")
        patterns = []
        for kind in ("write", "read"):
            pattern = _name(item, what, kind)
            try:
                re.compile(pattern)
            except re.error as e:
                raise DefinitionsError(f"{what}: {kind} {pattern!r} is not a valid regular expression: {e}")
            patterns.append(pattern)
        self.plan.add("topic_permission", vhost, user, (exchange, *patterns), "set")

    def policies(self, i: int, item: Mapping[str, Any]) -> None:
        name = _name(item, f"policy #{i}")
        vhost = self.vhost_of(item, f"policy '{name}'")
        try:
            policy = make_policy(name, item.get("pattern"), item.get("definition"),  # type: ignore[arg-type]
                                 item.get("priority", 0), item.get("apply-to", "all"))
        except PolicyError as e:
            raise DefinitionsError(f"vhost '{vhost}': {e}") from None
        for key in sorted(REPORTED_POLICY_KEYS.intersection(policy.definition)):
            self.plan.ignore("policy", vhost, name, key, "not needed: " + not_needed_reason(key))
        self.plan.add("policy", vhost, name, policy, "set")

    def exchanges(self, i: int, item: Mapping[str, Any]) -> None:
        name = _name(item, f"exchange #{i}")
        vhost = self.vhost_of(item, f"exchange '{name}'")
        what = f"exchange '{name}' in vhost '{vhost}'" if name else f"exchange #{i} in vhost '{vhost}'"
        type_name = _name(item, what, "type")
        durable = _flag(item, "durable", what, True)
        auto_delete = _flag(item, "auto_delete", what, False)
        internal = _flag(item, "internal", what, False)
        arguments = _args(item, what)
        model = self.broker.vhosts.get(vhost)
        existing = model.exchanges.get(name) if model is not None else None
        try:
            check_exchange_name(name, exists=existing is not None)
            made = new_exchange(type_name, name, durable=durable, auto_delete=auto_delete, internal=internal,
                                arguments=arguments)
            if existing is not None:
                # An import leaves an existing exchange's flags and arguments as they are: its type must match.
                check_exchange_equivalent(existing, vhost, type_name, existing.durable, existing.auto_delete,
                                          existing.internal, existing.arguments)
        except BrokerError as e:
            raise _refused(what, vhost, e) from None
        self.new_exchanges[(vhost, name)] = existing if existing is not None else made
        self.plan.add("exchange", vhost, name, (type_name, durable, auto_delete, internal, arguments),
                      None if existing is not None else "create")

    def queues(self, i: int, item: Mapping[str, Any]) -> None:
        name = _name(item, f"queue #{i}")
        vhost = self.vhost_of(item, f"queue '{name}'")
        what = f"queue '{name}' in vhost '{vhost}'"
        durable = _flag(item, "durable", what, True)
        auto_delete = _flag(item, "auto_delete", what, False)
        arguments = _args(item, what)
        if not name:
            raise DefinitionsError(f"{what}: a queue name must not be empty")
        model = self.broker.vhosts.get(vhost)
        existing = model.queues.get(name) if model is not None else None
        try:
            check_queue_name(name, exists=False)  # an import names no queue amq.*, even an existing one
            validate_queue_declare(name, vhost, durable=durable, exclusive=False, auto_delete=auto_delete,
                                   arguments=arguments)
            if existing is not None:
                # An import leaves an existing queue's arguments as they are: its flags must match.
                check_queue_equivalent(existing.durable, existing.auto_delete, existing.arguments, name, vhost,
                                       durable, auto_delete, existing.arguments)
        except BrokerError as e:
            raise _refused(what, vhost, e) from None
        self.new_queues.add((vhost, name))
        self.plan.add("queue", vhost, name, (durable, auto_delete, arguments), None if existing else "create")

    def bindings(self, i: int, item: Mapping[str, Any]) -> None:
        source = _name(item, f"binding #{i}", "source")
        destination = _name(item, f"binding #{i}", "destination")
        dest_type = _name(item, f"binding #{i}", "destination_type")
        routing_key = _name(item, f"binding #{i}", "routing_key") if "routing_key" in item else ""
        vhost = self.vhost_of(item, f"binding #{i}")
        what = f"binding of {dest_type} '{destination}' to exchange '{source}' in vhost '{vhost}'"
        arguments = _args(item, what)
        if dest_type not in ("queue", "exchange"):
            raise DefinitionsError(f"{what}: destination_type must be 'queue' or 'exchange'")
        _fits(what, "routing key", routing_key)
        if source == "":
            return  # default-exchange bindings are implicit (RabbitMQ exports none)
        if not self._exists("exchange", vhost, source):
            raise DefinitionsError(f"{what}: no exchange '{source}' in vhost '{vhost}'")
        if not self._exists(dest_type, vhost, destination):
            raise DefinitionsError(f"{what}: no {dest_type} '{destination}' in vhost '{vhost}'")
        model = self.broker.vhosts.get(vhost)
        exchange = self.new_exchanges.get((vhost, source))
        if exchange is None and model is not None:
            exchange = model.exchanges.get(source)
        if exchange is not None:
            try:  # the exchange type's own rule (a weight, an x-match), as queue.bind would apply it
                exchange.validate_binding(routing_key, arguments)
            except BrokerError as e:
                raise DefinitionsError(f"{what}: {e.detail}") from None
        self.plan.add("binding", vhost, f"{source}->{dest_type}:{destination}",
                      (source, destination, dest_type, routing_key, arguments), "bind")

    def _exists(self, kind: str, vhost: str, name: str) -> bool:
        """An exchange or queue declared earlier in the document or present in the vhost."""
        if (vhost, name) in (self.new_queues if kind == "queue" else self.new_exchanges):
            return True
        model = self.broker.vhosts.get(vhost)
        return model is not None and name in (model.queues if kind == "queue" else model.exchanges)
