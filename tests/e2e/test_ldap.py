"""The ldap auth backend against Debian's slapd (tests/e2e/slapd.py): users bind with their directory
passwords (the DN from a pattern), tags from group queries (in_group, in_group_nested), vhost access,
resource access (for/permission, match on the name) and topic access (match on the routing key) as
RabbitMQ's LDAP backend answers them; answers cached for auth_ldap_cache_ttl; the chain [ldap, local]
keeps local users; a wrong password is refused with 403; a directory that does not answer refuses
its users and nobody else.

One slapd and one broker for the module; each test uses its own users or names."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.helpers import free_port, http_json, wait_until
from tests.mqtt.conftest import Paho

from .conftest import LocalBroker, lavinpy_only
from .slapd import ADMIN, ADMIN_PASSWORD, SUFFIX, Slapd
from .tls_certs import CA

pytestmark = lavinpy_only("starts lavinpy with the ldap backend")

PEOPLE, GROUPS = f"ou=people,{SUFFIX}", f"ou=groups,{SUFFIX}"
ADMINS = f"cn=admins,{GROUPS}"
ENTRIES = f"""dn: {SUFFIX}
objectClass: dcObject
objectClass: organization
o: Example
dc: example

dn: {PEOPLE}
objectClass: organizationalUnit
ou: people

dn: {GROUPS}
objectClass: organizationalUnit
ou: groups

dn: ou=vhosts,{SUFFIX}
objectClass: organizationalUnit
ou: vhosts
""" + "".join(f"""
dn: uid={name},{PEOPLE}
objectClass: inetOrgPerson
uid: {name}
cn: {name}
sn: {name}
userPassword: {name}-pw
description: {"policies" if name == "dave" else "staff"}
""" for name in ("alice", "bob", "carol", "dave")) + f"""
dn: {ADMINS}
objectClass: groupOfNames
cn: admins
member: uid=alice,{PEOPLE}

dn: cn=devs,{GROUPS}
objectClass: groupOfNames
cn: devs
member: uid=bob,{PEOPLE}

dn: cn=staff,{GROUPS}
objectClass: groupOfNames
cn: staff
member: cn=devs,{GROUPS}

dn: cn=v2,ou=vhosts,{SUFFIX}
objectClass: groupOfNames
cn: v2
member: uid=alice,{PEOPLE}
"""

SETTINGS: dict[str, Any] = {
    "auth_backends": ["ldap", "local"],
    "auth_ldap_servers": ["127.0.0.1"],
    "auth_ldap_user_dn_pattern": f"uid=${{username}},{PEOPLE}",
    "auth_ldap_group_lookup_base": GROUPS,
    "auth_ldap_timeout": 2.0,
    "auth_ldap_check_wait": 0.5,
    "auth_ldap_cache_ttl": 1.0,
    "auth_ldap_tag_queries": {"administrator": ["in_group", ADMINS],
                              "management": ["in_group_nested", f"cn=staff,{GROUPS}"],
                              "policymaker": ["equals", ["attribute", "${user_dn}", "description"], "policies"]},
    "auth_ldap_vhost_access_query": ["or", [["equals", "${vhost}", "/"], ["and", [
        ["exists", f"cn=${{vhost}},ou=vhosts,{SUFFIX}"], ["in_group", f"cn=${{vhost}},ou=vhosts,{SUFFIX}"],
        ["not", ["equals", "${username}", "carol"]]]]]],
    "auth_ldap_resource_access_query": ["for", [
        ["permission", "configure", ["or", [["in_group", ADMINS], ["match", "${name}", "^${username}-"],
                                            ["match", "${name}", "^mqtt-subscription-${username}-"]]]],
        ["permission", "write", ["constant", True]],
        ["permission", "read", ["constant", True]]]],
    "auth_ldap_topic_access_query": ["for", [
        ["permission", "write", ["match", ["string", "${routing_key}"], ["string", "^${username}\\."]]],
        ["permission", "read", ["constant", True]]]],
}
REFUSED = "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."


class LdapBroker:
    def __init__(self, tmp: Path) -> None:
        self.ca = CA(tmp / "pki")
        cert, key, _ = self.ca.issue("ldap", server=True)
        self.slapd = Slapd(tmp / "slapd", tls=(cert, key))
        self.broker = LocalBroker(tmp / "broker")
        try:
            self.slapd.add(ENTRIES)
            conf = tmp / "ldap.yaml"
            conf.write_text(json.dumps({**SETTINGS, "auth_ldap_port": self.slapd.port}))
            self.mqtt_port = free_port()
            self.broker.extra_args = ["--config", str(conf), "--mqtt-port", str(self.mqtt_port)]
            self.broker.start()
            self.api("PUT", "vhosts/v2", user="guest", password="guest")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.broker.close()
        self.slapd.stop()

    def api(self, method: str, path: str, body: Any = None, *, user: str, password: str) -> Any:
        auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        return http_json(f"{self.broker.http_url}/api/{path}", method, body, authorization=auth)

    def connect(self, user: str, password: str | None = None, vhost: str = "/") -> pika.BlockingConnection:
        credentials = pika.PlainCredentials(user, f"{user}-pw" if password is None else password)
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.broker.port, vhost, credentials, connection_attempts=1, socket_timeout=10))

    def modify(self, ldif: str) -> None:
        subprocess.run(["ldapmodify", "-x", "-H", self.slapd.url, "-D", ADMIN, "-w", ADMIN_PASSWORD],
                       input=ldif.encode(), check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def lb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LdapBroker]:
    b = LdapBroker(tmp_path_factory.mktemp("ldap"))
    yield b
    b.close()


def test_directory_users_log_in_with_their_tags_and_local_users_still_do(lb: LdapBroker) -> None:
    assert lb.api("GET", "whoami", user="alice", password="alice-pw") == {"name": "alice", "tags": ["administrator"]}
    assert lb.api("GET", "whoami", user="bob", password="bob-pw") == {"name": "bob", "tags": ["management"]}
    assert lb.api("GET", "whoami", user="dave", password="dave-pw") == {"name": "dave", "tags": ["policymaker"]}
    with pytest.raises(urllib.error.HTTPError) as no_tag:  # carol is in no group: no management tag
        lb.api("GET", "whoami", user="carol", password="carol-pw")
    assert no_tag.value.code == 401
    with lb.connect("alice") as conn:
        ch = conn.channel()
        ch.queue_declare("ldap-admin-queue", auto_delete=True)
        rows = wait_until(lambda: [c for c in lb.api("GET", "connections", user="guest", password="guest")
                                   if c["user"] == "alice"], 5)
        assert [r["auth_backend"] for r in rows] == ["ldap"]
    with lb.connect("guest", "guest") as conn:  # not in the directory: the local store decides
        conn.channel().queue_declare("", exclusive=True)


def test_wrong_passwords_and_unknown_users_are_refused_with_403(lb: LdapBroker) -> None:
    for user, password in (("dave", "wrong"), ("nobody", "nobody-pw"), ("dave", "")):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
            lb.connect(user, password)
        assert REFUSED in str(refused.value), (user, password)
    with lb.connect("dave") as conn:  # the right one still works
        conn.channel()
    assert "LDAP login of 'dave' refused: the directory refused the bind" in lb.broker.log


def test_queries_decide_vhosts_names_and_routing_keys(lb: LdapBroker) -> None:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as no_vhost:
        lb.connect("bob", vhost="v2")
    assert "(530) \"NOT_ALLOWED - access to vhost 'v2' refused for user 'bob'\"" in str(no_vhost.value)
    with lb.connect("alice", vhost="v2") as conn:
        conn.channel()
    with lb.connect("bob") as conn:
        ch = conn.channel()
        ch.queue_declare("bob-work", auto_delete=True)
        ch.basic_publish("amq.topic", "bob.jobs", b"x")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as topic:
            ch.confirm_delivery()
            ch.basic_publish("amq.topic", "alice.jobs", b"x")
        assert (topic.value.reply_code, topic.value.reply_text) == (
            403, "ACCESS_REFUSED - write access to topic 'alice.jobs' in exchange 'amq.topic' in vhost '/' "
                 "refused for user 'bob'")
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as configure:
            ch.queue_declare("shared-work", auto_delete=True)
        assert (configure.value.reply_code, configure.value.reply_text) == (
            403, "ACCESS_REFUSED - configure access to queue 'shared-work' in vhost '/' refused for user 'bob'")


def test_mqtt_clients_log_in_and_publish_where_the_topic_query_allows(lb: LdapBroker) -> None:
    paho = Paho(lb.mqtt_port, f"dave-{time.monotonic_ns()}", username="dave", password="dave-pw")
    try:
        assert paho.connect()[1] == "Success"
        assert paho.subscribe("dave/#", qos=1) == [1]
        paho.publish("dave/status", b"up", qos=1)
        assert paho.message().payload == b"up"
    finally:
        paho.disconnect()


def test_a_directory_change_applies_after_the_cache_ttl(lb: LdapBroker) -> None:
    with lb.connect("carol") as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            conn.channel().queue_declare("team-queue", auto_delete=True)
        lb.modify(f"dn: {ADMINS}\nchangetype: modify\nadd: member\nmember: uid=carol,{PEOPLE}\n")
        try:
            def declared() -> bool:
                try:
                    conn.channel().queue_declare("team-queue", auto_delete=True)
                    return True
                except pika.exceptions.ChannelClosedByBroker:
                    return False
            wait_until(declared, 5, 0.3, "carol's new group to apply")
        finally:
            lb.modify(f"dn: {ADMINS}\nchangetype: modify\ndelete: member\nmember: uid=carol,{PEOPLE}\n")


def test_a_directory_that_does_not_answer_refuses_its_users_only(lb: LdapBroker) -> None:
    lb.slapd.pause()
    try:
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            lb.connect("alice")
        with lb.connect("guest", "guest") as conn:  # the next backend still decides for its users
            conn.channel()
    finally:
        lb.slapd.resume()
    assert "the directory could not be reached" in lb.broker.log
    with lb.connect("alice") as conn:
        conn.channel()


def test_a_stopped_directory_holds_up_no_one_else(lb: LdapBroker) -> None:
    """slapd stopped (SIGSTOP): a local user's confirmed publishes keep flowing while a directory user's
    permission checks miss the cache and a directory login waits; the misses answer no (403) at once or
    after auth_ldap_check_wait (0.5 s), the login is refused after auth_ldap_timeout (2 s here)."""
    bob = lb.connect("bob")
    bob_ch = bob.channel()
    latencies: list[float] = []
    paused, stop = threading.Event(), threading.Event()

    def publish() -> None:
        with lb.connect("guest", "guest") as conn:
            ch = conn.channel()
            queue = ch.queue_declare("", exclusive=True).method.queue
            ch.confirm_delivery()
            while not stop.is_set():
                started = time.perf_counter()
                ch.basic_publish("", queue, b"confirmed")  # returns once the broker confirmed it
                if paused.is_set():
                    latencies.append(time.perf_counter() - started)
                if len(latencies) % 500 == 499:
                    ch.queue_purge(queue)
    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    time.sleep(0.5)
    lb.slapd.pause()
    paused.set()
    refused = 0
    try:
        for i in range(20):  # names bob never used, outside his prefix: each a miss the directory must answer
            try:
                bob_ch.queue_declare(f"miss-{i}-{time.monotonic_ns()}", auto_delete=True)
            except pika.exceptions.ChannelClosedByBroker as e:
                assert e.reply_code == 403
                refused += 1
                bob_ch = bob.channel()
        started = time.monotonic()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as login:
            lb.connect("dave")
        took = time.monotonic() - started
        time.sleep(0.3)
    finally:
        paused.clear()
        lb.slapd.resume()
        stop.set()
        publisher.join(15)
    bob.close()
    assert REFUSED in str(login.value) and 1.9 <= took < 10, took
    assert refused == 20  # no directory: no permission
    latencies.sort()
    assert len(latencies) >= 20, len(latencies)
    p99 = latencies[int(len(latencies) * 0.99)]
    assert p99 < 1.0, (p99, latencies[-5:])  # a blocked loop would hold them auth_ldap_timeout (2 s) a miss
    assert "the directory did not answer within 500 ms" in lb.broker.log
    with lb.connect("alice") as conn:  # the directory answers again: so do the checks that need it
        conn.channel().queue_declare(f"back-{time.monotonic_ns()}", auto_delete=True)  # alice: in_group admins


def _backend(lb: LdapBroker, **settings: Any) -> Any:
    """The broker's ldap backend in this process, on the module's directory, with other settings."""
    from lavinpy.broker.access.auth_backends import LoginRequest
    from lavinpy.broker.access.ldap_backend import LdapBackend
    from lavinpy.config import Config

    config = Config(auth_backends=["ldap"], auth_ldap_servers=["127.0.0.1"], auth_ldap_port=lb.slapd.port,
                    auth_ldap_timeout=2.0, **settings)
    config.validate()
    backend = LdapBackend(config, lambda: None)
    return lambda user, password: backend._login(LoginRequest("AMQP 0-9-1", "PLAIN", user, password, None).username,
                                                 password)


@pytest.mark.parametrize("bind", ["anon", ADMIN, "as_user"])
def test_the_users_dn_is_looked_up_before_or_after_the_bind(lb: LdapBroker, bind: str) -> None:
    login = _backend(lb, auth_ldap_user_dn_pattern=f"uid=${{username}},{PEOPLE}" if bind == "as_user" else "unused",
                     auth_ldap_dn_lookup_attribute="cn", auth_ldap_dn_lookup_base=PEOPLE, auth_ldap_dn_lookup_bind=bind,
                     auth_ldap_dn_lookup_bind_password=ADMIN_PASSWORD if bind == ADMIN else "",
                     auth_ldap_tag_queries={"administrator": ["in_group", ADMINS]})
    if bind == "as_user":  # the pattern gives the bind DN; the lookup after the bind, as the user, finds it
        found = login("alice", "alice-pw")
        assert (found.status.value, found.grants.user_dn) == ("known", f"uid=alice,{PEOPLE}")
        return
    alice = login("alice", "alice-pw")
    assert (alice.status.value, alice.grants.user_dn, alice.grants.tags) == (
        "known", f"uid=alice,{PEOPLE}", frozenset({"administrator"}))
    assert login("alice", "wrong").status.value == "refused"
    assert login("nobody", "x").status.value == "unknown"  # not in the directory: the next backend decides


def test_queries_asked_anonymously_and_unknown_forms_answer_no(lb: LdapBroker,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    login = _backend(lb, auth_ldap_user_dn_pattern=f"uid=${{username}},{PEOPLE}", auth_ldap_other_bind="anon",
                     auth_ldap_tag_queries={"monitoring": ["in_group", ADMINS], "management": ["no_such_form"]})
    result = login("bob", "bob-pw")
    assert (result.status.value, result.grants.tags) == ("known", frozenset())  # a broken query answers no
    assert "LDAP query for user 'bob'" in "".join(caplog.messages)
    login = _backend(lb, auth_ldap_user_dn_pattern=f"uid=${{username}},{PEOPLE}", auth_ldap_other_bind="anon",
                     auth_ldap_tag_queries={"monitoring": ["in_group", ADMINS]},
                     auth_ldap_resource_access_query=["match", "${name}", "^${no_such_variable}"])
    alice = login("alice", "alice-pw")
    assert alice.grants.tags == frozenset({"monitoring"})  # asked anonymously: the groups are readable
    assert not alice.grants.ask(["match", "${name}", "^${no_such_variable}"], {"name": "q"})


def test_starttls_with_the_directorys_ca_and_not_with_another(lb: LdapBroker, tmp_path: Path) -> None:
    settings = {"auth_ldap_user_dn_pattern": f"uid=${{username}},{PEOPLE}", "auth_ldap_use_starttls": True}
    trusted = _backend(lb, auth_ldap_ssl_cacertfile=str(lb.ca.cert_path), **settings)
    assert trusted("dave", "dave-pw").status.value == "known"
    stranger = _backend(lb, auth_ldap_ssl_cacertfile=str(CA(tmp_path / "other").cert_path), **settings)
    assert stranger("dave", "dave-pw").status.value == "unknown"  # the directory's certificate is not trusted
