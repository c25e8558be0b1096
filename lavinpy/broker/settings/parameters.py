"""Runtime parameters (RabbitMQ's ``/api/parameters``) and global parameters, with a component registry.

A parameter is (component, vhost, name) -> a JSON value. What a parameter means is the business of its
component: an object registered with ``Parameters.register`` that validates a value (raising
``ParameterError`` with a text naming the bad key), applies it and removes it. ``vhost-limits`` is one
component (limits.py); the server registers ``shovel``, ``federation-upstream`` and
``federation-upstream-set``. Parameters of a component nobody has
registered are refused by name, so nothing in a definitions import is silently dropped.

Every parameter is kept in ``parameters.json`` and every global parameter in ``global_parameters.json``
at the top of the data directory (atomic JSON writes, replicated in a cluster as users.json is). At
start the stored parameters of each component are applied when the component registers. A parameter may
be marked paused (a paused shovel): the mark is stored with it (``"paused": true`` in its entry of the
file), so it outlives a restart and a change of leader, but is not part of the parameter's value, its
listing or an export (RabbitMQ's definitions have no such field).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from lavinpy.store.jsonfile import read_json, write_json_atomic

from .names import name_too_long

log = logging.getLogger("lavinpy.parameters")

PARAMETERS_FILE = "parameters.json"
GLOBAL_PARAMETERS_FILE = "global_parameters.json"
# Components RabbitMQ has that lavinpy does not (yet): refused by name on import and on PUT.
KNOWN_UNSUPPORTED = ("federation", "mqtt-port-to-vhost-mapping")


class ParameterError(ValueError):
    """A parameter cannot be set: the text names the component, parameter and key at fault."""


class UnknownComponent(ParameterError):
    """No component of that name is registered."""


class Component(Protocol):
    """What the registry asks of a parameter component."""

    name: str

    def validate(self, vhost: str, name: str, value: dict) -> None:
        """Raise ParameterError (naming the bad key) when ``value`` cannot be applied."""

    def apply(self, vhost: str, name: str, value: dict) -> None:
        """Make ``value`` effective (called after it is stored, and at start for stored values)."""

    def remove(self, vhost: str, name: str) -> None:
        """The parameter is gone: undo what apply did."""


Key = tuple[str, str, str]  # component, vhost, name


def check_parameter_name(what: str, name: str) -> None:
    """ParameterError when ``name`` is longer than 255 bytes (the limit of every name in the model)."""
    reason = name_too_long(what, name)
    if reason is not None:
        raise ParameterError(reason)


def unknown_component_text(component: str) -> str:
    if component in KNOWN_UNSUPPORTED:
        return f"component '{component}' is not supported by lavinpy"
    return f"component '{component}' not found"


class Parameters:
    """The broker's runtime parameters and their components; the stored file is the source of truth."""

    def __init__(self, path: Path, global_path: Path) -> None:
        self.path = Path(path)
        self.global_path = Path(global_path)
        self._components: dict[str, Component] = {}
        self._values: dict[Key, Any] = {}
        self._users: dict[Key, str] = {}  # who set a parameter, where it matters (a shovel runs as its creator)
        self._paused: set[Key] = set()  # parameters whose component is to hold them stopped (a paused shovel)
        self._globals: dict[str, Any] = {}
        self.vhost_exists: Callable[[str], bool] = lambda _vhost: True

    # -- components ----------------------------------------------------------------------------
    def register(self, component: Component) -> None:
        """Add a component; its stored parameters are applied now (a bad one is logged and kept)."""
        self._components[component.name] = component
        for (comp, vhost, name), value in sorted(self._values.items()):
            if comp == component.name:
                self._apply_stored(component, vhost, name, value)

    def component(self, name: str) -> Component:
        found = self._components.get(name)
        if found is None:
            raise UnknownComponent(unknown_component_text(name))
        return found

    def components(self) -> list[str]:
        return sorted(self._components)

    # -- load / save ---------------------------------------------------------------------------
    def load(self) -> None:
        entries = read_json(self.path, [])
        self._values.clear()
        self._users.clear()
        self._paused.clear()
        for entry in entries if isinstance(entries, list) else []:
            try:
                key = (str(entry["component"]), str(entry["vhost"]), str(entry["name"]))
                self._values[key] = entry["value"]
                if isinstance(entry.get("user"), str):
                    self._users[key] = entry["user"]
                if entry.get("paused") is True:
                    self._paused.add(key)
            except (KeyError, TypeError):
                log.error("%s: ignoring parameter entry %r", self.path, entry)
        stored = read_json(self.global_path, {})
        self._globals = dict(stored) if isinstance(stored, dict) else {}
        for (comp, vhost, name), value in sorted(self._values.items()):
            if comp in self._components:
                self._apply_stored(self._components[comp], vhost, name, value)

    def _apply_stored(self, component: Component, vhost: str, name: str, value: Any) -> None:
        try:
            component.validate(vhost, name, value)
            component.apply(vhost, name, value)
        except Exception as exc:  # one bad stored value must not stop the broker
            log.error("parameter %s/%s/%s not applied: %s", component.name, vhost, name, exc)

    def _save(self) -> None:
        entries = []
        for key, value in sorted(self._values.items()):
            entry = self._entry(key, value)
            if key in self._paused:
                entry["paused"] = True
            entries.append(entry)
        write_json_atomic(self.path, entries)

    def _entry(self, key: Key, value: Any) -> dict[str, Any]:
        """RabbitMQ's parameter object, with the user who set it when recorded."""
        c, v, n = key
        entry = {"name": n, "vhost": v, "component": c, "value": value}
        if key in self._users:
            entry["user"] = self._users[key]
        return entry

    # -- parameters ----------------------------------------------------------------------------
    def set(self, component: str, vhost: str, name: str, value: Any, user: str | None = None) -> bool:
        """Validate, store and apply a parameter; True when it is new. ParameterError names the fault.
        ``user``: who set it (recorded with it, exported and replicated with it)."""
        comp = self.component(component)
        if not isinstance(name, str) or not name:
            raise ParameterError("parameter name must be a non-empty string")
        check_parameter_name("parameter name", name)
        if not self.vhost_exists(vhost):
            raise ParameterError(f"no vhost '{vhost}'")
        comp.validate(vhost, name, value)
        key = (component, vhost, name)
        created = key not in self._values
        previous, previous_user = self._values.get(key), self._users.get(key)
        self._values[key] = value
        self._set_user(key, user)
        try:
            self._save()
        except BaseException:
            if created:
                del self._values[key]
            else:
                self._values[key] = previous
            self._set_user(key, previous_user)
            raise
        comp.apply(vhost, name, value)
        return created

    def delete(self, component: str, vhost: str, name: str) -> bool:
        """Remove a parameter; False when there is none."""
        key = (component, vhost, name)
        if key not in self._values:
            return False
        value = self._values.pop(key)
        user = self._users.pop(key, None)
        paused = key in self._paused
        self._paused.discard(key)
        try:
            self._save()
        except BaseException:
            self._values[key] = value
            self._set_user(key, user)
            if paused:
                self._paused.add(key)
            raise
        comp = self._components.get(component)
        if comp is not None:
            comp.remove(vhost, name)
        return True

    def _set_user(self, key: Key, user: str | None) -> None:
        if user is None:
            self._users.pop(key, None)
        else:
            self._users[key] = user

    def set_paused(self, component: str, vhost: str, name: str, paused: bool) -> None:
        """Mark a parameter paused or not, durably (KeyError when there is no such parameter). A new value
        set for it keeps the mark; deleting it drops the mark."""
        key = (component, vhost, name)
        if key not in self._values:
            raise KeyError(f"no parameter {component}/{vhost}/{name}")
        if (key in self._paused) == paused:
            return
        if paused:
            self._paused.add(key)
        else:
            self._paused.discard(key)
        try:
            self._save()
        except BaseException:
            if paused:
                self._paused.discard(key)
            else:
                self._paused.add(key)
            raise

    def is_paused(self, component: str, vhost: str, name: str) -> bool:
        return (component, vhost, name) in self._paused

    def get(self, component: str, vhost: str, name: str) -> Any:
        return self._values.get((component, vhost, name))

    def user_of(self, component: str, vhost: str, name: str) -> str | None:
        """The user who set the parameter (None: not recorded, e.g. stored before users were)."""
        return self._users.get((component, vhost, name))

    def listing(self, component: str | None = None, vhost: str | None = None) -> list[dict[str, Any]]:
        """RabbitMQ's parameter objects (with ``user`` when recorded), sorted by component, vhost and name."""
        return [self._entry(key, value) for key, value in sorted(self._values.items())
                if (component is None or key[0] == component) and (vhost is None or key[1] == vhost)]

    def drop_vhost(self, vhost: str) -> None:
        """A vhost is gone: its parameters go with it (each component told)."""
        gone = [key for key in self._values if key[1] == vhost]
        if not gone:
            return
        for key in gone:
            del self._values[key]
            self._users.pop(key, None)
            self._paused.discard(key)
        self._save()
        for comp, v, name in gone:
            if comp in self._components:
                self._components[comp].remove(v, name)

    # -- global parameters ---------------------------------------------------------------------
    def set_global(self, name: str, value: Any) -> bool:
        if not isinstance(name, str) or not name:
            raise ParameterError("global parameter name must be a non-empty string")
        check_parameter_name("global parameter name", name)
        if name == "cluster_name" and (not isinstance(value, str) or not value):
            raise ParameterError("cluster_name: value must be a non-empty string")
        created = name not in self._globals
        updated = dict(self._globals)
        updated[name] = value
        write_json_atomic(self.global_path, updated)
        self._globals = updated
        return created

    def delete_global(self, name: str) -> bool:
        if name not in self._globals:
            return False
        updated = dict(self._globals)
        del updated[name]
        write_json_atomic(self.global_path, updated)
        self._globals = updated
        return True

    def get_global(self, name: str) -> Any:
        return self._globals.get(name)

    def list_globals(self) -> list[dict[str, Any]]:
        return [{"name": name, "value": value} for name, value in sorted(self._globals.items())]
