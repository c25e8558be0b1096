"""A token's scopes as tags and permissions (RabbitMQ's OAuth 2 scope syntax), checked in process
through the same Actor and permission code as a stored user; how the resource server gathers scopes
(prefix, aliases, extra claims, Keycloak's permissions) and names the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavinpy.broker.access.actor import Actor
from lavinpy.broker.access.oauth2_settings import oauth2_settings
from lavinpy.broker.access.permissions import check_policy
from lavinpy.broker.access.token_grants import TokenGrants
from lavinpy.broker.access.users import UserStore
from lavinpy.broker.errors import BrokerChannelError
from lavinpy.config import Config


@pytest.fixture
def store(tmp_path: Path) -> UserStore:
    s = UserStore(tmp_path / "users.json", tmp_path / "vhosts.json")
    for vhost in ("/", "prod", "prod-eu", "test"):
        s.add_vhost(vhost)
    return s


def actor(store: UserStore, *scopes: str, claims: dict | None = None) -> Actor:
    return Actor(store, "app", TokenGrants(store, "app", scopes, claims or {}))


def test_wildcards_and_percent_encoding_give_vhosts_and_names(store: UserStore) -> None:
    a = actor(store, "read:%2F/orders-*", "configure:prod*/*", "write:test/x")
    assert [v for v in ("/", "prod", "prod-eu", "test", "missing") if a.can_access_vhost(v)] == \
        ["/", "prod", "prod-eu", "test"]
    assert a.allowed("read", "queue", "orders-1", "/")
    assert not a.allowed("read", "queue", "invoices", "/")
    assert not a.allowed("write", "queue", "orders-1", "/")  # a kind the scopes do not give
    assert a.allowed("configure", "queue", "anything", "prod-eu")
    assert a.allowed("write", "exchange", "x", "test") and not a.allowed("write", "exchange", "xy", "test")
    with pytest.raises(BrokerChannelError) as refused:
        a.check("read", "queue", "invoices", "/")
    assert refused.value.text == "ACCESS_REFUSED - read access to queue 'invoices' in vhost '/' refused for user 'app'"


def test_the_default_exchange_and_regex_characters_are_names_not_patterns(store: UserStore) -> None:
    a = actor(store, "write:%2F/amq.default", "read:%2F/a.b")
    assert a.allowed("write", "exchange", "", "/")  # the default exchange is checked as amq.default
    assert a.allowed("read", "queue", "a.b", "/") and not a.allowed("read", "queue", "aXb", "/")


def test_topic_scopes_give_routing_keys_and_two_part_scopes_none(store: UserStore) -> None:
    a = actor(store, "write:%2F/amq.topic/orders.*", "write:%2F/*", "read:%2F/amq.topic/{client_id}.*",
              claims={"client_id": "dev7"})
    a.check_topic("write", "/", "amq.topic", "topic", "orders.eu")
    with pytest.raises(BrokerChannelError) as refused:
        a.check_topic("write", "/", "amq.topic", "topic", "billing.eu")
    assert refused.value.text == ("ACCESS_REFUSED - write access to topic 'billing.eu' in exchange 'amq.topic' "
                                  "in vhost '/' refused for user 'app'")
    a.check_topic("read", "/", "amq.topic", "topic", "dev7.temp")  # {claim} expanded
    with pytest.raises(BrokerChannelError):
        a.check_topic("read", "/", "amq.topic", "topic", "dev8.temp")
    with pytest.raises(BrokerChannelError):  # a scope without a routing key pattern gives no topic access
        a.check_topic("write", "/", "other.topic", "topic", "k")
    a.check_topic("write", "/", "amq.direct", "direct", "anything")  # not a topic exchange: no check


def test_vhost_variable_and_tags(store: UserStore) -> None:
    a = actor(store, "configure:*/{vhost}-*", "tag:policymaker", "tag:management", "tag:superuser")
    assert a.allowed("configure", "queue", "prod-q", "prod") and not a.allowed("configure", "queue", "test-q", "prod")
    assert a.tags == {"policymaker", "management"}  # unknown tags are ignored
    assert a.can_manage() and not a.is_admin()
    check_policy(a.grants, a.name, "prod", {"max-length": 1})
    with pytest.raises(BrokerChannelError):
        check_policy(actor(store, "read:*/*").grants, "app", "prod", {})


def test_a_deleted_vhost_closes_access_and_drops_cached_answers(store: UserStore) -> None:
    a = actor(store, "read:*/*")
    assert a.allowed("read", "queue", "q", "test")
    store.delete_vhost("test")
    assert not a.can_access_vhost("test") and not a.allowed("read", "queue", "q", "test")


def _settings(**values: object) -> Config:
    config = Config(auth_backends=["oauth2"], auth_oauth2_resource_server_id="rabbitmq",
                    auth_oauth2_issuer="https://idp.example")
    for key, value in values.items():
        setattr(config, key, value)
    config.validate()
    return config


def test_scopes_are_gathered_aliased_and_filtered_by_prefix() -> None:
    settings = oauth2_settings(_settings(
        auth_oauth2_additional_scopes_key="roles realm_access.roles",
        auth_oauth2_scope_aliases={"admin-role": ["rabbitmq.tag:administrator", "rabbitmq.configure:*/*"]}))
    server = settings.resolve(["rabbitmq", "account"])
    assert not isinstance(server, str)
    claims = {"scope": "openid rabbitmq.read:*/* other.write:*/*", "roles": ["admin-role"],
              "realm_access": {"roles": {"rabbitmq": ["write:%2F/x"]}},  # a map keyed by resource server id
              "authorization": {"permissions": [{"scopes": ["rabbitmq.read:prod/*"]}]}}  # Keycloak's RPT
    assert server.scopes(claims) == ["configure:*/*", "read:*/*", "read:prod/*", "tag:administrator", "write:%2F/x"]
    assert server.username({"sub": "s-1", "client_id": "c"}) == "s-1"
    assert server.username({"client_id": "c"}) == "c"
    assert server.username({}) == "unknown"


def test_the_audience_names_one_resource_server() -> None:
    settings = oauth2_settings(_settings(auth_oauth2_resource_servers={"rs2": {"id": "reports", "scope_prefix": "r:"}}))
    found = settings.resolve("reports")
    assert not isinstance(found, str) and (found.id, found.scope_prefix) == ("reports", "r:")
    assert settings.resolve(["rabbitmq", "reports"]) == "the token's audience names more than one resource server"
    assert "names no resource server" in str(settings.resolve("elsewhere"))
    assert settings.resolve(None) == "the token has no audience (aud)"
    lax = oauth2_settings(_settings(auth_oauth2_verify_aud=False))
    assert not isinstance(lax.resolve("elsewhere"), str)


@pytest.mark.parametrize("values, error", [
    ({"auth_oauth2_resource_server_id": ""}, "auth_oauth2_resource_server_id"),
    ({"auth_oauth2_issuer": ""}, "auth_oauth2_issuer, auth_oauth2_jwks_url or auth_oauth2_signing_keys"),
    ({"auth_oauth2_resource_servers": {"x": {"oauth_provider_id": "nope"}}}, "no known provider 'nope'"),
    ({"auth_oauth2_leeway": -1}, "auth_oauth2_leeway"),
])
def test_bad_settings_are_named(values: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        _settings(**values)


def test_symmetric_algorithms_are_never_accepted() -> None:
    settings = oauth2_settings(_settings(auth_oauth2_algorithms=["HS256", "RS256", "none"]))
    assert settings.providers[""].algorithms == ("RS256",)
