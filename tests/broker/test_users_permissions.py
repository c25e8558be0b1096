"""The user store's change generation, the bounded per-connection permission cache, the login throttle."""

from __future__ import annotations

import pytest

from lavinpy.broker.access import login_throttle
from lavinpy.broker.access.login_throttle import LoginThrottle
from lavinpy.broker.access.permissions import CACHE_MAX_ENTRIES, UserPermissions
from lavinpy.broker.access.users import UserStore


@pytest.fixture
def store(tmp_path):
    s = UserStore(tmp_path / "users.json", tmp_path / "vhosts.json")
    s.load()
    s.add_vhost("/")
    s.add_user("u", "pw")
    s.set_permissions("u", "/", ".*", "^a", ".*")
    return s


def test_every_user_change_bumps_the_generation(store):
    seen = []
    store.subscribe(lambda: seen.append(store.generation))
    changes = [
        lambda: store.set_permissions("u", "/", ".*", ".*", ".*"),
        lambda: store.clear_permissions("u", "/"),
        lambda: store.set_tags("u", ["policymaker"]),
        lambda: store.change_password("u", "new"),
        lambda: store.set_password_hash("u", ""),
        lambda: store.delete_user("u"),
    ]
    for change in changes:
        before = store.generation
        change()
        assert store.generation == before + 1
    assert seen == list(range(seen[0], seen[0] + len(changes)))


def test_failed_save_leaves_the_user_unchanged(store, tmp_path):
    store.users_file = tmp_path / "missing-dir" / "users.json"
    before = store.generation
    with pytest.raises(OSError):
        store.set_permissions("u", "/", "", "", "")
    with pytest.raises(OSError):
        store.set_tags("u", ["administrator"])
    assert store.permissions("u", "/").write == "^a" and store.user("u").tags == []
    assert store.generation == before


def test_cached_answers_follow_changes(store):
    perms = UserPermissions(store, "u", "/")
    assert perms.allowed("write", "exchange", "ab")
    assert not perms.allowed("write", "exchange", "b")
    store.set_permissions("u", "/", ".*", "^b", ".*")
    assert not perms.allowed("write", "exchange", "ab")
    assert perms.allowed("write", "exchange", "b")
    assert not perms.allowed("write", "exchange", "")  # the default exchange is amq.default


def test_cache_is_bounded(store):
    perms = UserPermissions(store, "u", "/")
    for i in range(CACHE_MAX_ENTRIES * 4):
        assert perms.allowed("write", "exchange", f"a-{i}")
        assert perms.cache_size() <= CACHE_MAX_ENTRIES


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_throttle_doubles_up_to_the_cap_and_forgets():
    clock = Clock()
    t = LoginThrottle(clock)
    delays = []
    for _ in range(12):
        delays.append(t.delay("10.0.0.1"))
        t.failed("10.0.0.1", "u", "PLAIN")
    free = login_throttle.FREE_FAILURES
    assert delays[:free + 1] == [0.0] * free + [login_throttle.BASE_DELAY]
    assert delays[free + 1] == 2 * login_throttle.BASE_DELAY
    assert delays[-1] == login_throttle.MAX_DELAY
    assert t.delay("10.0.0.2") == 0.0  # per address
    clock.now += login_throttle.QUIET_PERIOD + 1
    assert t.delay("10.0.0.1") == 0.0
    for _ in range(free + 1):
        t.failed("10.0.0.1", "u", "PLAIN")
    assert t.delay("10.0.0.1") > 0
    t.succeeded("10.0.0.1")
    assert t.delay("10.0.0.1") == 0.0


def test_throttle_tracks_a_bounded_number_of_addresses():
    t = LoginThrottle(Clock())
    for i in range(login_throttle.MAX_ADDRESSES + 500):
        t.failed(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", "u", "PLAIN")
    assert t.tracked_addresses() == login_throttle.MAX_ADDRESSES
