"""Definitions import in the model: every password hash form RabbitMQ and LavinMQ export logs in,
topic permissions and vhost metadata are applied and exported, RabbitMQ-only policy keys are kept and
reported as not needed, and one bad item refuses the whole document with nothing applied."""

from __future__ import annotations

import base64
import hashlib
import os

import pytest

from lavinpy.broker.access.actor import Actor
from lavinpy.broker.errors import BrokerChannelError
from lavinpy.broker.ops.definitions.documents import DefinitionsError, export_definitions, import_definitions
from tests.broker.model_harness import Model

bcrypt = pytest.importorskip("bcrypt")


def _rabbit_hash(password: str, algorithm: str, salt_size: int = 4) -> str:
    salt = os.urandom(salt_size)
    return base64.b64encode(salt + hashlib.new(algorithm, salt + password.encode()).digest()).decode()


@pytest.fixture
def model(tmp_path):
    m = Model(tmp_path)
    yield m
    m.close()


USERS = [  # (name, hashing_algorithm as exported, password_hash)
    ("r256", "rabbit_password_hashing_sha256", _rabbit_hash("pw-r256", "sha256")),
    ("r512", "rabbit_password_hashing_sha512", _rabbit_hash("pw-r512", "sha512")),
    ("rmd5", "rabbit_password_hashing_md5", _rabbit_hash("pw-rmd5", "md5")),
    ("l256", "SHA256", "$5$" + _rabbit_hash("pw-l256", "sha256")),  # LavinMQ's older prefixed form
    ("l512", "sha512", _rabbit_hash("pw-l512", "sha512", salt_size=8)),
    ("lmd5", "MD5", "$1$" + _rabbit_hash("pw-lmd5", "md5")),
    ("lbc", "lavinmq_bcrypt", bcrypt.hashpw(b"pw-lbc", bcrypt.gensalt(4, prefix=b"2a")).decode()),
    ("lbc2", "Bcrypt", bcrypt.hashpw(b"pw-lbc2", bcrypt.gensalt(4, prefix=b"2a")).decode()),
]


def test_every_hash_form_logs_in_and_exports(model):
    doc = {"users": [{"name": n, "password_hash": h, "hashing_algorithm": a, "tags": ""} for n, a, h in USERS]}
    import_definitions(model.broker, None, doc)
    users = model.broker.users
    for name, _, _ in USERS:
        assert users.authenticate(name, f"pw-{name}") is not None, name
        assert users.authenticate(name, "wrong") is None, name
    exported = {u["name"]: u for u in export_definitions(model.broker, None)["users"]}
    assert exported["l256"]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert not exported["l256"]["password_hash"].startswith("$5$")  # RabbitMQ's form, which it imports
    assert exported["lbc2"]["hashing_algorithm"] == "lavinmq_bcrypt"


def test_topic_permissions_vhost_metadata_and_policies(model):
    doc = {
        "vhosts": [{"name": "mv", "metadata": {"description": "orders", "tags": ["prod"],
                                               "default_queue_type": "classic"}}],
        "users": [{"name": "u", "password_hash": _rabbit_hash("p", "sha256"),
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}],
        "permissions": [{"user": "u", "vhost": "mv", "configure": ".*", "write": ".*", "read": ".*"}],
        "topic_permissions": [{"user": "u", "vhost": "mv", "exchange": "amq.topic", "write": "^a", "read": "^b"}],
        "policies": [{"vhost": "mv", "name": "ha", "pattern": ".*", "apply-to": "queues", "priority": 0,
                      "definition": {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic",
                                     "queue-master-locator": "min-masters", "max-length": 5}}],
    }
    plan = import_definitions(model.broker, None, doc)
    assert {(i["name"], i["key"]) for i in plan.ignored} == {
        ("ha", "ha-mode"), ("ha", "ha-params"), ("ha", "ha-sync-mode"), ("ha", "queue-master-locator")}
    out = export_definitions(model.broker, None)
    assert out["topic_permissions"] == [{"user": "u", "vhost": "mv", "exchange": "amq.topic", "write": "^a",
                                         "read": "^b"}]
    assert {"name": "mv", "limits": [], "metadata": {"description": "orders", "tags": ["prod"],
                                                     "default_queue_type": "classic"}} in out["vhosts"]
    (policy,) = [p for p in out["policies"] if p["name"] == "ha"]
    assert policy["definition"]["ha-mode"] == "exactly" and policy["definition"]["max-length"] == 5
    actor = Actor(model.broker.users, "u")
    actor.check_topic("write", "mv", "amq.topic", "topic", "a.b")
    with pytest.raises(BrokerChannelError, match="write access to topic 'b' in exchange 'amq.topic'"):
        actor.check_topic("write", "mv", "amq.topic", "topic", "b")
    actor.check_topic("write", "mv", "amq.direct", "direct", "b")  # only topic exchanges are checked


@pytest.mark.parametrize("bad, needle", [
    ({"users": [{"name": "x", "password_hash": "abc", "hashing_algorithm": "md4"}]}, "md4"),
    ({"users": [{"name": "x", "password_hash": "not-bcrypt", "hashing_algorithm": "lavinmq_bcrypt"}]}, "bcrypt"),
    ({"topic_permissions": [{"user": "ghost", "vhost": "/", "exchange": "amq.topic", "write": "", "read": ""}]},
     "no user 'ghost'"),
    ({"topic_permissions": [{"user": "guest", "vhost": "/", "exchange": "amq.topic", "write": "(", "read": ""}]},
     "'amq.topic'"),
    ({"vhosts": [{"name": "v2", "default_queue_type": "fancy"}]}, "default_queue_type"),
    ({"policies": [{"vhost": "/", "name": "fed", "pattern": ".*",
                    "definition": {"federation-upstream-set": "all", "federation-upstream": "u"}}]},
     "federation-upstream and federation-upstream-set together"),
])
def test_one_bad_item_refuses_all(model, bad, needle):
    users = model.broker.users
    doc = {"vhosts": [{"name": "new-vhost"}], **bad}
    doc.setdefault("vhosts", []).append({"name": "new-vhost"})
    with pytest.raises(DefinitionsError, match=needle.replace("(", r"\(")):
        import_definitions(model.broker, None, doc)
    assert users.vhost("new-vhost") is None and users.user("x") is None


def test_every_bad_item_is_named(model):
    doc = {"vhosts": [{"name": "nv"}],
           "users": [{"name": "a", "password_hash": "x", "hashing_algorithm": "md4"}],
           "queues": [{"name": "q", "vhost": "nowhere"}],
           "policies": [{"vhost": "nv", "name": "p", "pattern": ".*", "definition": {"federation-upstreams": "u"}}]}
    with pytest.raises(DefinitionsError) as e:
        import_definitions(model.broker, None, doc)
    assert e.value.detail.startswith("3 items refused, nothing imported: ")
    for needle in ("md4", "nowhere", "federation-upstreams"):
        assert needle in e.value.detail
    assert model.broker.users.vhost("nv") is None


def test_a_binding_its_exchange_type_refuses_refuses_the_import(model):
    """The exchange type's own binding rule (a consistent-hash weight, a headers x-match) is checked
    before anything is applied, for an exchange new in the document and for one already there."""
    model.broker.vhosts["/"].declare_exchange("existing.headers", "headers", durable=True)
    doc = {"exchanges": [{"name": "chx", "vhost": "/", "type": "x-consistent-hash", "durable": True}],
           "queues": [{"name": "chq", "vhost": "/", "durable": True}],
           "bindings": [
               {"source": "chx", "vhost": "/", "destination": "chq", "destination_type": "queue",
                "routing_key": "heavy", "arguments": {}},
               {"source": "existing.headers", "vhost": "/", "destination": "chq", "destination_type": "queue",
                "routing_key": "", "arguments": {"x-match": "some"}}]}
    with pytest.raises(DefinitionsError) as e:
        import_definitions(model.broker, None, doc)
    assert e.value.detail.startswith("2 items refused, nothing imported: ")
    assert "The binding key must be an integer" in e.value.detail and "x-match" in e.value.detail
    vhost = model.broker.vhosts["/"]
    assert "chx" not in vhost.exchanges and "chq" not in vhost.queues
    doc["bindings"][0]["routing_key"] = "3"
    doc["bindings"].pop()
    import_definitions(model.broker, None, doc)
    assert "chx" in vhost.exchanges and "chq" in vhost.queues
