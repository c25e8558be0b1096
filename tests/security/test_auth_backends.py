"""The auth backends chain inside the one login operation: the first backend that knows the user
decides, a user no backend knows is refused, an unknown backend name stops the start; certificate
logins (no password) go through the same chain, throttle and loopback rule."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from lavinpy.broker.access import login_throttle
from lavinpy.broker.access.auth_backends import AuthResult, AuthStatus, ChainLink
from lavinpy.broker.access.cert_login import distinguished_name
from lavinpy.broker.broker import Broker
from lavinpy.broker.login import LoginOutcome, LoginRequest, Refusal
from lavinpy.config import Config, ConfigError


class Directory:
    """A second backend as oauth2 or ldap will be one: it knows its own users and their secrets; its
    answer may need waiting (``slow``)."""

    name = "directory"

    def __init__(self, users: dict[str, str], *, slow: bool = False) -> None:
        self.users = users
        self.slow = slow
        self.asked: list[str] = []

    def _answer(self, request: LoginRequest) -> AuthResult:
        self.asked.append(request.username)
        if request.username not in self.users:
            return AuthResult(AuthStatus.UNKNOWN, self.name)
        ok = request.password == self.users[request.username]
        return AuthResult(AuthStatus.KNOWN if ok else AuthStatus.REFUSED, self.name)

    def check_now(self, request: LoginRequest) -> AuthResult | None:
        return None if self.slow else self._answer(request)

    async def check(self, request: LoginRequest) -> AuthResult:
        await asyncio.sleep(0.01)
        return self._answer(request)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(Config(data_dir=str(tmp_path)))
    b.open()
    users = b.users
    assert users is not None
    users.add_user("alice", "local-secret")
    users.add_user("bob", "bob-secret")
    users.set_permissions("alice", "/", ".*", ".*", ".*")
    yield b
    b.close()


def _login(broker: Broker, user: str, password: str | None, *, certified: bool = False,
           peer: str = "127.0.0.1") -> LoginOutcome:
    request = LoginRequest("AMQP 0-9-1", "EXTERNAL" if certified else "PLAIN", user, password, peer, certified)
    return asyncio.run(broker.logins.attempt(request).run())


def test_the_default_chain_is_the_local_user_store(broker: Broker) -> None:
    assert [link.authn.name for link in broker.logins.chain] == ["local"]
    outcome = _login(broker, "alice", "local-secret")
    assert outcome.ok and outcome.backend == "local"
    assert _login(broker, "alice", "wrong").refusal is Refusal.CREDENTIALS
    assert _login(broker, "nobody", "x").refusal is Refusal.CREDENTIALS


def test_an_unknown_backend_name_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="unknown backend 'ldapp'"):
        Config(auth_backends=["local", "ldapp"]).validate()
    with pytest.raises(ConfigError, match="unknown backend 'oauth'"):
        Config(auth_backends=["local:oauth"]).validate()
    with pytest.raises(ConfigError, match="at least one"):
        Config(auth_backends=[]).validate()
    Config(auth_backends=["local:local"]).validate()


@pytest.mark.parametrize("slow", [False, True])
def test_the_first_backend_that_knows_the_user_decides(broker: Broker, slow: bool) -> None:
    directory = Directory({"alice": "directory-secret"}, slow=slow)
    local = broker.logins.chain[0]
    broker.logins.chain = [ChainLink(directory, "directory"), local]
    outcome = _login(broker, "alice", "directory-secret")
    assert outcome.ok and outcome.backend == "directory"
    # Known to the first backend, refused by it: the local password is not tried.
    assert _login(broker, "alice", "local-secret").refusal is Refusal.CREDENTIALS
    # Unknown to the first: the next decides.
    outcome = _login(broker, "bob", "bob-secret")
    assert outcome.ok and outcome.backend == "local"
    assert directory.asked == ["alice", "alice", "bob"]
    # In the other order the local store decides alice.
    broker.logins.chain = [local, ChainLink(directory, "directory")]
    assert _login(broker, "alice", "local-secret").ok
    assert _login(broker, "alice", "directory-secret").refusal is Refusal.CREDENTIALS


def test_a_certificate_login_needs_a_known_user_and_no_password(broker: Broker) -> None:
    outcome = _login(broker, "alice", None, certified=True)
    assert outcome.ok and outcome.backend == "local"
    assert _login(broker, "nobody", None, certified=True).refusal is Refusal.CREDENTIALS
    assert _login(broker, "alice", None).refusal is Refusal.CREDENTIALS  # no password, no certificate
    # The loopback rule applies: guest's certificate from a remote address is refused.
    assert _login(broker, "guest", None, certified=True, peer="10.1.2.3").refusal is Refusal.LOOPBACK
    # The vhost access check as for any login.
    assert broker.logins.admit(_login(broker, "bob", None, certified=True), "/").refusal is Refusal.NOT_ALLOWED


def test_failed_certificate_logins_count_for_the_throttle(broker: Broker) -> None:
    for _ in range(login_throttle.FREE_FAILURES):
        _login(broker, "nobody", None, certified=True, peer="10.9.9.9")
    assert broker.logins.attempt(LoginRequest("MQTT", "PLAIN", "alice", "local-secret", "10.9.9.9")).delay > 0


def test_distinguished_names_in_rabbitmqs_rfc_4514_form() -> None:
    subject = ((("countryName", "SE"),), (("organizationName", "Example, Inc"),),
               (("organizationalUnitName", "ops"), ("commonName", "#app+1 ")), (("domainComponent", "é"),))
    assert distinguished_name(subject) == r"DC=\C3\A9,OU=ops+CN=\#app\+1\ ,O=Example\, Inc,C=SE"


def test_certificate_logins_need_verified_peers() -> None:
    for settings in ({"auth_mechanisms": ["PLAIN", "EXTERNAL"]}, {"mqtt_ssl_cert_login": True},
                     {"management_ssl_cert_login": True}):
        with pytest.raises(ConfigError, match="needs tls_verify_peer: true"):
            Config(**settings).validate()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown mechanism 'GSSAPI'"):
        Config(auth_mechanisms=["GSSAPI"]).validate()
    with pytest.raises(ConfigError, match="ssl_cert_login_from must be one of"):
        Config(ssl_cert_login_from="serial").validate()
    with pytest.raises(ConfigError, match="ssl_cert_login_san_type must be one of"):
        Config(ssl_cert_login_san_type="rid").validate()
