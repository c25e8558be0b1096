import json

import pytest

from lavinpy.broker.access.users import AlreadyExists, NotFound, Permissions, UserStore
from lavinpy.wire.passwords import hash_password, verify_password


@pytest.fixture
def files(tmp_path):
    return tmp_path / "users.json", tmp_path / "vhosts.json"


@pytest.fixture
def store(files):
    s = UserStore(*files)
    s.load()
    return s


def reopened(files):
    s = UserStore(*files)
    s.load()
    return s


def test_ensure_defaults_on_fresh_store(store, files):
    store.ensure_defaults("guest", "guest")
    assert [v.name for v in store.vhosts()] == ["/"]
    admin = store.user("guest")
    assert admin.tags == ["administrator"]
    assert admin.permissions == {"/": Permissions(".*", ".*", ".*")}
    assert admin.hashing_algorithm == "rabbit_password_hashing_sha256"
    assert verify_password("guest", admin.password_hash, admin.hashing_algorithm)
    users_json = json.loads(files[0].read_text())
    assert users_json == [{
        "name": "guest",
        "password_hash": admin.password_hash,
        "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": ["administrator"],
        "permissions": {"/": {"configure": ".*", "write": ".*", "read": ".*"}},
    }]
    assert json.loads(files[1].read_text()) == [{"name": "/", "description": "", "tags": []}]


def test_ensure_defaults_leaves_existing_users_and_vhosts_alone(store, files):
    store.add_vhost("prod")
    store.add_user("alice", "pw")
    store.ensure_defaults("guest", "guest")
    assert store.user("guest") is None
    assert [v.name for v in store.vhosts()] == ["prod"]


def test_ensure_defaults_creates_missing_vhost_only(store):
    store.ensure_defaults("guest", "guest")
    store.delete_vhost("/")
    store.ensure_defaults("other", "x")
    assert store.vhost_exists("/")
    assert store.user("other") is None
    assert store.permissions("guest", "/") is None  # deleting "/" removed the grant; it is not restored


def test_authenticate(store):
    store.add_user("alice", "s3cret", tags=["management"])
    user = store.authenticate("alice", "s3cret")
    assert user is not None and user.name == "alice" and user.tags == ["management"]
    assert store.authenticate("alice", "wrong") is None
    assert store.authenticate("bob", "s3cret") is None


def test_user_without_password_cannot_log_in(store):
    store.add_user_with_hash("svc", "", "rabbit_password_hashing_sha256", ["monitoring"])
    assert store.authenticate("svc", "") is None
    assert store.authenticate("svc", "anything") is None


def test_imported_hashes_authenticate(store, files):
    # As found in a RabbitMQ definitions export (the guide's worked example, and an md5 one).
    store.add_user_with_hash("imported", "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
                             "rabbit_password_hashing_sha256", ["administrator"])
    store.add_user_with_hash("old", hash_password("legacy", "rabbit_password_hashing_md5"),
                             "rabbit_password_hashing_md5", [])
    for s in (store, reopened(files)):
        assert s.authenticate("imported", "test12") is not None
        assert s.authenticate("old", "legacy") is not None
        assert s.user("old").hashing_algorithm == "rabbit_password_hashing_md5"


def test_import_with_unknown_algorithm_is_refused(store):
    with pytest.raises(ValueError, match="md4"):
        store.add_user_with_hash("x", "abc", "md4", [])
    assert store.user("x") is None


def test_change_password_and_tags(store, files):
    store.add_user_with_hash("old", hash_password("a", "rabbit_password_hashing_md5"),
                             "rabbit_password_hashing_md5", [])
    store.change_password("old", "b")
    store.set_tags("old", ["policymaker"])
    for s in (store, reopened(files)):
        assert s.authenticate("old", "a") is None
        assert s.authenticate("old", "b") is not None
        assert s.user("old").hashing_algorithm == "rabbit_password_hashing_sha256"
        assert s.user("old").tags == ["policymaker"]
    with pytest.raises(NotFound):
        store.change_password("nobody", "x")


def test_add_and_delete_user(store, files):
    store.add_user("alice", "pw")
    with pytest.raises(AlreadyExists):
        store.add_user("alice", "other")
    with pytest.raises(ValueError):
        store.add_user("", "pw")
    store.add_user("bob", "pw")
    store.delete_user("alice")
    with pytest.raises(NotFound):
        store.delete_user("alice")
    assert [u.name for u in store.users()] == ["bob"]
    assert [u.name for u in reopened(files).users()] == ["bob"]


def test_returned_users_are_copies(store):
    store.add_vhost("/")
    store.add_user("alice", "pw", tags=["a"])
    store.set_permissions("alice", "/", "", "", "")
    copy = store.user("alice")
    copy.tags.append("administrator")
    copy.permissions.clear()
    assert store.user("alice").tags == ["a"]
    assert store.can_access_vhost("alice", "/")


def test_vhosts(store, files):
    store.add_vhost("/")
    store.add_vhost("prod", description="production")
    with pytest.raises(AlreadyExists):
        store.add_vhost("prod")
    assert store.vhost_exists("prod") and not store.vhost_exists("dev")
    s = reopened(files)
    assert [(v.name, v.description) for v in s.vhosts()] == [("/", ""), ("prod", "production")]
    with pytest.raises(NotFound):
        s.delete_vhost("dev")


def test_delete_vhost_removes_everyones_permissions(store, files):
    store.add_vhost("/")
    store.add_vhost("prod")
    for name in ("alice", "bob"):
        store.add_user(name, "pw")
        store.set_permissions(name, "prod", ".*", ".*", ".*")
    store.set_permissions("alice", "/", ".*", "", "")
    store.delete_vhost("prod")
    for s in (store, reopened(files)):
        assert not s.vhost_exists("prod")
        assert s.user("alice").permissions == {"/": Permissions(".*", "", "")}
        assert s.user("bob").permissions == {}
    # A new vhost of the same name starts with no grants.
    store.add_vhost("prod")
    assert not store.can_access_vhost("alice", "prod")


def test_set_permissions_validates(store):
    store.add_vhost("/")
    store.add_user("alice", "pw")
    with pytest.raises(ValueError, match=r"write.*'\[unclosed'"):
        store.set_permissions("alice", "/", ".*", "[unclosed", ".*")
    assert store.permissions("alice", "/") is None  # nothing half-applied
    with pytest.raises(NotFound):
        store.set_permissions("alice", "nope", ".*", ".*", ".*")
    with pytest.raises(NotFound):
        store.set_permissions("nobody", "/", ".*", ".*", ".*")


def test_permissions_persist_and_clear(store, files):
    store.add_vhost("/")
    store.add_user("alice", "pw")
    store.set_permissions("alice", "/", "^cfg-", "^w-", "^r-")
    s = reopened(files)
    assert s.permissions("alice", "/") == Permissions("^cfg-", "^w-", "^r-")
    assert s.check("alice", "/", "configure", "cfg-1")
    s.clear_permissions("alice", "/")
    assert s.permissions("alice", "/") is None
    assert reopened(files).permissions("alice", "/") is None
    assert s.permissions("nobody", "/") is None


def test_can_access_vhost(store):
    store.add_vhost("/")
    store.add_vhost("other")
    store.add_user("alice", "pw")
    assert not store.can_access_vhost("alice", "/")
    store.set_permissions("alice", "/", "", "", "")  # empty grants still allow connecting
    assert store.can_access_vhost("alice", "/")
    assert not store.can_access_vhost("alice", "other")
    assert not store.can_access_vhost("nobody", "/")
    assert not store.can_access_vhost("alice", "missing")


@pytest.fixture
def checked(store):
    store.add_vhost("/")
    store.add_user("u", "pw")
    return store


@pytest.mark.parametrize(
    ("pattern", "resource", "allowed"),
    [
        (".*", "anything", True),
        (".*", "", True),  # the default exchange, as amq.default
        ("^amq\\.default$", "", True),
        ("^$", "", False),  # "" is checked as "amq.default", so ^$ does not grant it
        ("^$", "q", False),
        ("", "", False),  # an empty regex grants nothing
        ("", "q", False),
        ("orders", "my-orders-queue", True),  # unanchored search, as re:run
        ("^orders", "my-orders-queue", False),
        ("^orders", "orders.eu", True),
        ("^(a|b)$", "b", True),
        ("^(a|b)$", "ab", False),
        ("^amq\\.gen-", "amq.gen-XYZ", True),
        ("ü", "zoë-ü", True),
    ],
)
def test_check_regex_semantics(checked, pattern, resource, allowed):
    checked.set_permissions("u", "/", pattern, pattern, pattern)
    for kind in ("configure", "write", "read"):
        assert checked.check("u", "/", kind, resource) is allowed


def test_check_uses_the_right_kind(checked):
    checked.set_permissions("u", "/", "^c$", "^w$", "^r$")
    assert checked.check("u", "/", "configure", "c")
    assert not checked.check("u", "/", "configure", "w")
    assert checked.check("u", "/", "write", "w")
    assert not checked.check("u", "/", "write", "r")
    assert checked.check("u", "/", "read", "r")
    assert not checked.check("u", "/", "read", "c")
    with pytest.raises(ValueError):
        checked.check("u", "/", "delete", "c")


def test_check_without_permissions_or_user(checked):
    assert not checked.check("u", "/", "read", "q")
    assert not checked.check("ghost", "/", "read", "q")
    checked.set_permissions("u", "/", ".*", ".*", ".*")
    assert not checked.check("u", "other", "read", "q")


def test_changed_permissions_take_effect(checked):
    checked.set_permissions("u", "/", "^a", "^a", "^a")
    assert checked.check("u", "/", "read", "abc")
    checked.set_permissions("u", "/", "^b", "^b", "^b")
    assert not checked.check("u", "/", "read", "abc")
    assert checked.check("u", "/", "read", "bcd")


def test_corrupt_users_file_is_a_clear_error(files):
    files[0].write_text("{not json")
    with pytest.raises(ValueError, match="users.json"):
        UserStore(*files).load()
    files[0].write_text('{"name": "x"}')
    with pytest.raises(ValueError, match="users.json"):
        UserStore(*files).load()


def test_no_tmp_files_left(store, files):
    store.ensure_defaults("guest", "guest")
    store.add_user("a", "b")
    assert sorted(p.name for p in files[0].parent.iterdir()) == ["users.json", "vhosts.json"]
