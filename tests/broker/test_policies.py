"""PolicyStore on a real policies.json: validation, matching, precedence, persistence, listeners."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lavinpy.broker.settings.arguments import QueueSettings
from lavinpy.broker.settings.policies import POLICIES_FILE, PolicyError, PolicyStore


@pytest.fixture
def store(tmp_path: Path) -> PolicyStore:
    s = PolicyStore(tmp_path / POLICIES_FILE)
    s.load()
    return s


def test_missing_file_means_no_policies(store: PolicyStore) -> None:
    assert store.list() == [] and store.match("q", "queue") is None


def test_set_persists_in_rabbitmq_shape(store: PolicyStore, tmp_path: Path) -> None:
    store.set("ttl", "^orders\\.", {"message-ttl": 1000}, priority=5, apply_to="queues")
    saved = json.loads((tmp_path / POLICIES_FILE).read_text())
    assert saved == [{"name": "ttl", "pattern": "^orders\\.", "apply-to": "queues", "priority": 5,
                      "definition": {"message-ttl": 1000}}]
    again = PolicyStore(tmp_path / POLICIES_FILE)
    again.load()
    assert again.get("ttl") == store.get("ttl")
    assert again.match("orders.eu", "queue").name == "ttl"


def test_pattern_is_a_search_and_apply_to_filters(store: PolicyStore) -> None:
    store.set("q", "eu", {"max-length": 10}, apply_to="queues")
    store.set("x", "eu", {"alternate-exchange": "ae"}, apply_to="exchanges")
    assert store.match("orders.eu.1", "queue").name == "q"
    assert store.match("orders.eu.1", "exchange").name == "x"
    assert store.match("orders.us", "queue") is None


def test_queue_type_specific_apply_to(store: PolicyStore) -> None:
    store.set("streams", ".*", {"max-age": "1D"}, apply_to="streams")
    assert store.match("s", "queue", "stream").name == "streams"
    assert store.match("c", "queue", "classic") is None
    assert store.match("c", "exchange") is None


def test_highest_priority_wins_and_ties_break_by_name(store: PolicyStore) -> None:
    store.set("b-low", ".*", {"max-length": 1}, priority=1)
    store.set("z-high", ".*", {"max-length": 2}, priority=7)
    store.set("a-high", ".*", {"max-length": 3}, priority=7)
    assert store.match("q", "queue").name == "a-high"
    store.delete("a-high")
    assert store.match("q", "queue").name == "z-high"
    assert [p.name for p in store.list()] == ["z-high", "b-low"]


def test_replace_and_delete(store: PolicyStore, tmp_path: Path) -> None:
    store.set("p", ".*", {"max-length": 1})
    store.set("p", "^x", {"max-length": 2})
    assert len(store) == 1 and store.get("p").definition == {"max-length": 2}
    assert store.delete("p") is True
    assert store.delete("p") is False
    assert json.loads((tmp_path / POLICIES_FILE).read_text()) == []


@pytest.mark.parametrize("kwargs, text", [
    ({"definition": {"message-ttl": -1}}, "message-ttl: -1 is not a valid message TTL"),
    ({"definition": {"expires": 0}}, "expires: 0 is not a valid queue expiry"),
    ({"definition": {"max-length": "10"}}, "max-length: '10' is not a valid maximum length"),
    ({"definition": {"overflow": "drop"}}, "overflow: 'drop' is not a valid overflow value"),
    ({"definition": {"dead-letter-exchange": 1}}, "dead-letter-exchange: 1 is not a valid dead letter exchange name"),
    ({"definition": {"max-age": "3w"}}, "max-age: '3w' is not a valid max age"),
    ({"definition": {"max-priority": 5}}, "'max-priority' is not a recognised policy setting"),
    ({"definition": {"foo": 1, "bar": 2}}, "'bar', 'foo' are not recognised policy settings"),
    ({"definition": {}}, "no policy provided"),
    ({"definition": {"max-length": 1}, "pattern": "("}, "is not a valid regular expression"),
    ({"definition": {"max-length": 1}, "apply_to": "topics"}, "apply-to 'topics' unrecognised"),
    ({"definition": {"max-length": 1}, "priority": "high"}, "'high' priority must be a number"),
])
def test_invalid_policies_are_refused_and_not_saved(store: PolicyStore, tmp_path: Path, kwargs: dict,
                                                    text: str) -> None:
    args = {"pattern": ".*", **kwargs}
    with pytest.raises(PolicyError) as info:
        store.set("bad", args.pop("pattern"), args.pop("definition"), **args)
    assert text in str(info.value) and "policy 'bad'" in str(info.value)
    assert store.get("bad") is None
    assert not (tmp_path / POLICIES_FILE).exists()


def test_compatibility_keys_are_accepted(store: PolicyStore) -> None:
    store.set("compat", ".*", {"queue-mode": "lazy", "queue-version": 2, "delivery-limit": -1,
                               "consumer-timeout": 60000, "stream-max-segment-size-bytes": 1000})


def test_load_skips_bad_entries(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / POLICIES_FILE
    path.write_text(json.dumps([
        {"name": "ok", "pattern": ".*", "definition": {"max-length": 3}},
        {"name": "bad", "pattern": ".*", "definition": {"max-length": -3}},
        {"pattern": "no name"},
    ]))
    store = PolicyStore(path)
    store.load()
    assert [p.name for p in store.list()] == ["ok"]
    assert store.get("ok").apply_to == "all" and store.get("ok").priority == 0
    assert "ignoring policy entry" in caplog.text


def test_listeners_hear_changes_and_can_unsubscribe(store: PolicyStore) -> None:
    heard: list[str] = []
    unsubscribe = store.subscribe(heard.append)
    store.set("a", ".*", {"max-length": 1})
    store.delete("a")
    store.delete("a")  # no change, no call
    unsubscribe()
    store.set("b", ".*", {"max-length": 1})
    assert heard == ["a", "a"]


def test_failing_listener_does_not_undo_the_change(store: PolicyStore) -> None:
    def boom(name: str) -> None:
        raise RuntimeError("listener bug")
    store.subscribe(boom)
    store.set("a", ".*", {"max-length": 1})
    assert store.get("a") is not None


def test_matched_policy_feeds_queue_settings(store: PolicyStore) -> None:
    store.set("limits", "^work$", {"max-length": 100, "dead-letter-exchange": "dlx", "message-ttl": 500},
              apply_to="queues")
    policy = store.match("work", "queue")
    settings = QueueSettings.resolve({"x-max-length": 10, "x-message-ttl": 1000}, policy.definition, policy.name)
    assert (settings.max_length, settings.message_ttl, settings.dead_letter_exchange, settings.policy) == (
        10, 500, "dlx", "limits")
