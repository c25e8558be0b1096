"""How the ldap backend answers a permission check the cache misses, in process, against a directory
that is not there (a closed port): a query the check's own values decide (constant, equals, match,
and an or/and whose other branches would need the directory) is answered at once; one that needs the
directory answers no after the pool's attempt, is not cached, and while the directory is unreachable
further misses answer no at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lavinpy.broker.access.ldap_backend import LdapBackend, LdapGrants
from lavinpy.broker.access.users import UserStore
from lavinpy.config import Config
from tests.helpers import free_port

ADMINS = "cn=admins,ou=groups,dc=example,dc=com"


@pytest.fixture
def grants(tmp_path: Path) -> LdapGrants:
    store = UserStore(tmp_path / "users.json", tmp_path / "vhosts.json")
    store.add_vhost("/")
    resource = ["or", [["in_group", ADMINS], ["match", "${name}", "^${username}-"]]]
    topic = ["and", [["in_group", ADMINS], ["match", "${routing_key}", "^x"]]]
    config = Config(auth_backends=["ldap"], auth_ldap_servers=["127.0.0.1"], auth_ldap_port=free_port(),
                    auth_ldap_timeout=2.0, auth_ldap_check_wait=2.0, auth_ldap_resource_access_query=resource,
                    auth_ldap_topic_access_query=topic)
    config.validate()
    return LdapGrants(LdapBackend(config, lambda: store), "bob", "uid=bob,ou=people,dc=example,dc=com", "pw")


def test_queries_the_checks_values_decide_are_answered_without_the_directory(grants: LdapGrants) -> None:
    started = time.monotonic()
    assert grants.check("bob", "/", "configure", "bob-work")  # or: the match holds, in_group not asked
    assert not grants.topic_allowed("bob", "/", "amq.topic", "write", "y.key")  # and: the match fails
    assert time.monotonic() - started < 1.0  # a wait for the pool would be check_wait (2 s)
    assert not grants.backend.unreachable  # the directory was never asked


def test_a_miss_that_needs_the_directory_answers_no_and_is_not_cached(grants: LdapGrants) -> None:
    assert not grants.check("bob", "/", "configure", "shared")  # in_group asked in the pool: nobody listens
    assert grants.backend.unreachable
    assert not any(key[-1] == "shared" for key in grants.backend.answers)  # a failure is not remembered
    started = time.monotonic()
    assert not grants.check("bob", "/", "configure", "other")  # unreachable: no at once
    assert time.monotonic() - started < 1.0  # not check_wait (2 s): the bound leaves room for a loaded machine
