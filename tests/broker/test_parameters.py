"""The runtime parameter registry: what a component (the shovel's, say) can count on."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavinpy.broker.access.client_limits import ClientLimits
from lavinpy.broker.settings.operator_policies import merge_definitions
from lavinpy.broker.settings.parameters import ParameterError, Parameters, UnknownComponent


class Recorder:
    """A component that records its calls and refuses a value without 'src-uri'."""

    name = "shovel"

    def __init__(self) -> None:
        self.applied: dict[tuple[str, str], dict] = {}
        self.removed: list[tuple[str, str]] = []

    def validate(self, vhost: str, name: str, value: dict) -> None:
        if not isinstance(value, dict) or "src-uri" not in value:
            raise ParameterError(f"shovel '{name}': src-uri is missing")

    def apply(self, vhost: str, name: str, value: dict) -> None:
        self.applied[(vhost, name)] = value

    def remove(self, vhost: str, name: str) -> None:
        self.removed.append((vhost, name))
        self.applied.pop((vhost, name), None)


def _parameters(path: Path) -> Parameters:
    return Parameters(path / "parameters.json", path / "global_parameters.json")


def test_a_component_validates_applies_and_removes(tmp_path: Path) -> None:
    params = _parameters(tmp_path)
    shovel = Recorder()
    params.register(shovel)
    with pytest.raises(ParameterError, match="src-uri"):
        params.set("shovel", "/", "s1", {"dest-uri": "amqp://"})
    assert params.listing() == []
    assert params.set("shovel", "/", "s1", {"src-uri": "amqp://"}) is True
    assert params.set("shovel", "/", "s1", {"src-uri": "amqp://x"}) is False
    assert shovel.applied == {("/", "s1"): {"src-uri": "amqp://x"}}
    assert params.listing("shovel") == [{"name": "s1", "vhost": "/", "component": "shovel",
                                         "value": {"src-uri": "amqp://x"}}]
    assert params.delete("shovel", "/", "s1") is True
    assert shovel.removed == [("/", "s1")] and params.delete("shovel", "/", "s1") is False


def test_stored_parameters_are_applied_when_their_component_registers(tmp_path: Path) -> None:
    first = _parameters(tmp_path)
    first.register(Recorder())
    first.set("shovel", "/", "s1", {"src-uri": "amqp://"})
    first.set_global("cluster_name", "c1")
    again = _parameters(tmp_path)
    again.load()  # before the component registers: kept, applied at registration
    shovel = Recorder()
    again.register(shovel)
    assert shovel.applied == {("/", "s1"): {"src-uri": "amqp://"}}
    assert again.get_global("cluster_name") == "c1"


def test_a_pause_mark_is_stored_with_the_parameter_and_not_listed(tmp_path: Path) -> None:
    """A paused shovel's mark: kept in the file (read back by a new registry: a restart, a new leader),
    kept when the value changes, dropped with the parameter; never in the listing (exports)."""
    params = _parameters(tmp_path)
    params.register(Recorder())
    params.set("shovel", "/", "s", {"src-uri": "amqp://"}, "guest")
    params.set_paused("shovel", "/", "s", True)
    again = _parameters(tmp_path)
    again.register(Recorder())
    again.load()
    assert again.is_paused("shovel", "/", "s")
    assert all("paused" not in entry for entry in again.listing())
    again.set("shovel", "/", "s", {"src-uri": "amqp://other"})
    assert again.is_paused("shovel", "/", "s")
    again.set_paused("shovel", "/", "s", False)
    third = _parameters(tmp_path)
    third.register(Recorder())
    third.load()
    assert not third.is_paused("shovel", "/", "s")
    third.set_paused("shovel", "/", "s", True)
    assert third.delete("shovel", "/", "s")
    third.set("shovel", "/", "s", {"src-uri": "amqp://"})
    assert not third.is_paused("shovel", "/", "s")
    with pytest.raises(KeyError):
        third.set_paused("shovel", "/", "nope", True)


def test_unknown_components_are_refused_by_name(tmp_path: Path) -> None:
    params = _parameters(tmp_path)
    with pytest.raises(UnknownComponent, match="'mqtt-port-to-vhost-mapping' is not supported"):
        params.set("mqtt-port-to-vhost-mapping", "/", "m", {"1883": "/"})
    with pytest.raises(UnknownComponent, match="component 'bananas' not found"):
        params.set("bananas", "/", "b", {})


def test_vhost_limits_component(tmp_path: Path) -> None:
    params = _parameters(tmp_path)
    limits = ClientLimits(tmp_path / "user_limits.json")
    params.register(limits)
    with pytest.raises(ParameterError, match="max-queue"):
        params.set("vhost-limits", "/", "limits", {"max-queue": 1})
    params.set("vhost-limits", "/", "limits", {"max-queues": 1, "max-connections": -1})
    assert limits.max_queues("/") == 1
    limits.connection_opened("/", "guest")  # -1: no limit
    params.delete("vhost-limits", "/", "limits")
    assert limits.max_queues("/") is None


def test_operator_policy_merge_takes_the_smaller_value() -> None:
    merged = merge_definitions({"max-length": 10, "dead-letter-exchange": "dlx", "message-ttl": 5},
                               {"max-length": 3, "message-ttl": 50, "expires": 1000})
    assert merged == {"max-length": 3, "dead-letter-exchange": "dlx", "message-ttl": 5, "expires": 1000}
