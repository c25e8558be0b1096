"""The oauth2 auth backend against a real OpenID Connect provider (Authlib's authorization server,
tests/e2e/oidc_provider.py): tokens from its token endpoint log pika, aio-pika, paho-mqtt and the HTTP
API in; the broker finds the keys by OpenID discovery and refetches them when the provider rotates
its key; scopes are the user's permissions and tags (RabbitMQ's syntax: wildcards, topic scopes,
aliases, a second resource server); a token expiring mid-connection closes it (320 credential
expired) unless update-secret brought a new one; bad tokens are refused with RabbitMQ's 403, each
logged once with its reason, and nothing else is affected.

One provider and one broker for the module. The refused logins come from their own loopback address
each (127.0.0.N) so that the login throttle of the others' address stays quiet."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pika.exceptions
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey
from pamqp import commands, frame, header

from tests.helpers import connect_from, wait_until
from tests.mqtt.conftest import Paho

from .conftest import lavinpy_only
from .oidc_provider import OAuthBroker, OIDCProvider, claims_of, wait_past
from .oidc_provider import ob as ob  # one provider and one broker for the module
from .oidc_provider import provider as provider
from .test_dashboard import CHROMEDRIVER, CHROMIUM, _click, _fill, _text, _wait
from .test_dashboard import browser as browser  # the headless Chromium fixture

pytestmark = lavinpy_only("starts lavinpy with the oauth2 backend")

ALL = ["rabbitmq.configure:*/*", "rabbitmq.read:*/*/*", "rabbitmq.write:*/*/*"]
REFUSED = "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
_sources = itertools.count(2)


def client(provider: OIDCProvider, scopes: list[str], lifetime: int = 300, **kwargs: Any) -> str:
    """A new client of the provider (its own id: the user name) and a token for it."""
    client_id = f"app-{next(_sources)}-{time.monotonic_ns() % 10**6}"
    provider.add_client(client_id, scopes, lifetime=lifetime, **kwargs)
    return provider.token(client_id)


def round_trip(conn: pika.BlockingConnection, queue: str | None = None) -> None:
    ch = conn.channel()
    name = ch.queue_declare(queue or "", exclusive=True).method.queue
    ch.basic_publish("", name, b"hello")
    wait_until(lambda: ch.basic_get(name, auto_ack=True)[2] == b"hello", 5)
    ch.close()


def raw_login(port: int, password: str, user: str = "x", vhost: str = "/") -> Any:
    """An AMQP handshake from a fresh loopback address: the broker's answer to StartOk (Tune, or the
    Close refusing the login) or to Open."""
    sock = connect_from(f"127.0.0.{next(_sources)}", port)
    sock.settimeout(10)
    reader = _Frames(sock)
    try:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        assert isinstance(reader.next(), commands.Connection.Start)
        response = f"\0{user}\0{password}"
        sock.sendall(frame.marshal(commands.Connection.StartOk(mechanism="PLAIN", response=response), 0))
        answer = reader.next()
        if not isinstance(answer, commands.Connection.Tune):
            return answer
        sock.sendall(frame.marshal(commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0), 0))
        sock.sendall(frame.marshal(commands.Connection.Open(virtual_host=vhost), 0))
        return reader.next()
    finally:
        sock.close()


class _Frames:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.data = sock, b""

    def next(self) -> Any:
        while True:
            if self.data:
                try:
                    used, _, value = frame.unmarshal(self.data)
                    self.data = self.data[used:]
                    if not isinstance(value, header.ProtocolHeader):
                        return value
                    continue
                except Exception:  # an incomplete frame: read more
                    pass
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.data += chunk


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _resigned(token: str, header_changes: dict[str, Any], signature: bytes | None = None) -> str:
    head = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    head.update(header_changes)
    signing_input = f"{_b64(json.dumps(head).encode())}.{token.split('.')[1]}"
    return f"{signing_input}.{_b64(signature) if signature else ''}"


# --- logins with real clients ---------------------------------------------------------------------

def test_pika_logs_in_with_a_token_and_is_shown_as_the_tokens_user(ob: OAuthBroker, provider: OIDCProvider) -> None:
    token = client(provider, ALL)
    user = claims_of(token)["client_id"]
    with pika.BlockingConnection(ob.params(token)) as conn:
        round_trip(conn)
        rows = wait_until(lambda: [c for c in ob.api("GET", "connections") if c["user"] == user], 5)
        assert [(r["auth_mechanism"], r["auth_backend"], r["vhost"]) for r in rows] == [("PLAIN", "oauth2", "/")]
    with pika.BlockingConnection(pika.URLParameters(ob.broker.url_for("guest", "guest"))) as conn:
        round_trip(conn)  # a local user as before
        rows = wait_until(lambda: [c for c in ob.api("GET", "connections") if c["user"] == "guest"], 5)
        assert {r["auth_backend"] for r in rows} == {"local"}


def test_scopes_limit_names_vhosts_and_routing_keys(ob: OAuthBroker, provider: OIDCProvider) -> None:
    token = client(provider, ["rabbitmq.configure:%2F/orders-*", "rabbitmq.read:%2F/orders-*",
                              "rabbitmq.write:%2F/amq.topic/orders.*", "rabbitmq.write:%2F/orders-*"])
    user = claims_of(token)["client_id"]
    with pika.BlockingConnection(ob.params(token)) as conn:
        ch = conn.channel()
        ch.queue_declare("orders-eu", auto_delete=True)
        ch.basic_publish("amq.topic", "orders.eu", b"x")
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_publish("amq.topic", "billing.eu", b"x")
        assert (refused.value.reply_code, refused.value.reply_text) == (
            403, f"ACCESS_REFUSED - write access to topic 'billing.eu' in exchange 'amq.topic' in vhost '/' "
                 f"refused for user '{user}'")
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("invoices", auto_delete=True)
        assert (refused.value.reply_code, refused.value.reply_text) == (
            403, f"ACCESS_REFUSED - configure access to queue 'invoices' in vhost '/' refused for user '{user}'")
        round_trip_allowed = conn.channel()
        round_trip_allowed.queue_delete("orders-eu")
    # No scope for vhost v2: refused at connection.open with RabbitMQ's 530.
    answer = raw_login(ob.broker.port, token, vhost="v2")
    assert isinstance(answer, commands.Connection.Close)
    assert (answer.reply_code, answer.reply_text) == (
        530, f"NOT_ALLOWED - access to vhost 'v2' refused for user '{user}'")


def test_aio_pika_publishes_and_consumes_with_a_token(ob: OAuthBroker, provider: OIDCProvider) -> None:
    token = client(provider, ALL)

    async def run() -> bytes:
        conn = await aio_pika.connect(ob.broker.url_for("ignored", token), timeout=10)
        async with conn:
            channel = await conn.channel()
            queue = await channel.declare_queue("", exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"via aio-pika"), routing_key=queue.name)
            message = await queue.get(timeout=5)
            await message.ack()
            return message.body

    assert asyncio.run(run()) == b"via aio-pika"


def test_paho_mqtt_logs_in_with_a_token_and_topic_scopes_apply(ob: OAuthBroker, provider: OIDCProvider) -> None:
    token = client(provider, ["rabbitmq.configure:%2F/mqtt-subscription-*", "rabbitmq.read:%2F/*/sensors.*",
                              "rabbitmq.write:%2F/*/sensors.*"])
    paho = Paho(ob.mqtt_port, f"dev-{time.monotonic_ns()}", username="device", password=token)
    try:
        assert paho.connect()[1] == "Success"
        assert paho.subscribe("sensors/+", qos=1) == [1]
        paho.publish("sensors/t1", b"21.5", qos=1)
        assert paho.message().payload == b"21.5"
        assert paho.subscribe("alarms/#", qos=1)[0] >= 128  # no read scope for that key: refused
    finally:
        paho.disconnect()
    bad = Paho(ob.mqtt_port, f"dev-{time.monotonic_ns()}", username="device", password="not-a-token")
    try:
        assert bad.connect()[1] == "Bad user name or password"  # 4: no backend knows the user
    finally:
        bad.disconnect()


def test_http_api_takes_a_bearer_token_and_lavinpyctl_its_token(ob: OAuthBroker, provider: OIDCProvider) -> None:
    admin = client(provider, [], claims={"roles": ["rabbitmq.tag:administrator", "rabbitmq.read:*/*"]})
    assert ob.api("GET", "whoami", auth=f"Bearer {admin}") == {"name": claims_of(admin)["client_id"],
                                                                "tags": ["administrator"]}
    aliased = client(provider, ["ops"])  # scope_aliases: ops = monitoring + read everywhere
    assert ob.api("GET", "whoami", auth=f"Bearer {aliased}")["tags"] == ["monitoring"]
    no_tag = client(provider, ALL)
    with pytest.raises(urllib.error.HTTPError) as refused:
        ob.api("GET", "whoami", auth=f"Bearer {no_tag}")
    assert refused.value.code == 401
    out = subprocess.run([sys.executable, "-m", "lavinpy.cli.ctl", "--uri", ob.broker.http_url, "--token", admin,
                          "list_vhosts"], capture_output=True, text=True, timeout=30, check=True)
    assert "v2" in out.stdout.split()


def test_a_second_resource_server_has_its_own_prefix(ob: OAuthBroker, provider: OIDCProvider) -> None:
    token = client(provider, ["reports/configure:*/*", "reports/read:*/*", "reports/write:*/*",
                              "rabbitmq.configure:*/*"], audience="reports")
    with pika.BlockingConnection(ob.params(token)) as conn:
        round_trip(conn)
    both = client(provider, ALL, audience=["rabbitmq", "reports"])  # one audience must name one server
    assert isinstance(raw_login(ob.broker.port, both), commands.Connection.Close)


# --- keys -------------------------------------------------------------------------------------------

def test_rotated_keys_are_fetched_once_for_the_new_key_id(ob: OAuthBroker, provider: OIDCProvider) -> None:
    old = client(provider, ALL)
    with pika.BlockingConnection(ob.params(old)):
        pass
    fetched = provider.jwks_requests
    provider.rotate("ES256")
    new = client(provider, ALL)
    with pika.BlockingConnection(ob.params(new)) as conn:
        round_trip(conn)
    with pika.BlockingConnection(ob.params(new)):
        pass
    assert provider.jwks_requests == fetched + 1  # once for the new kid; a known token is not checked again
    provider.rotate("EdDSA")
    user = f"edge-{time.monotonic_ns()}"
    eddsa = provider.sign({"aud": "rabbitmq", "client_id": user, "exp": int(time.time()) + 300,
                           "scope": " ".join(ALL)})
    with pika.BlockingConnection(ob.params(eddsa)) as conn:
        round_trip(conn)
    with pika.BlockingConnection(ob.params(old)):  # the old key is still published: its tokens still work
        pass
    provider.rotate("RS256", retire_old=True)
    retired = _resigned(provider.sign({"aud": "rabbitmq", "exp": int(time.time()) + 300}), {"kid": "key-1-rs256"})
    assert isinstance(raw_login(ob.broker.port, retired), commands.Connection.Close)


def test_static_signing_keys_verify_tokens_without_a_jwks_and_unknown_key_ids_are_refused(
        ob: OAuthBroker, provider: OIDCProvider) -> None:
    now = int(time.time())

    def signed(kid: str | None, audience: str, key: Any, user: str) -> str:
        header = {"alg": "RS256", **({"kid": kid} if kid else {})}
        scopes = " ".join(s.replace("rabbitmq.", f"{audience}.") for s in ALL)
        return jwt.encode(header, {"aud": audience, "sub": user, "exp": now + 300, "scope": scopes}, key)

    fetched = provider.jwks_requests
    beside_jwks = signed("static-root", "rabbitmq", ob.static_keys["static-root"], "static-a")
    only = signed("static-only", "keyed", ob.static_keys["static-only"], "static-b")
    without_kid = signed(None, "keyed", ob.static_keys["static-only"], "static-c")  # default_key
    for token, user in ((beside_jwks, "static-a"), (only, "static-b"), (without_kid, "static-c")):
        with pika.BlockingConnection(ob.params(token)) as conn:
            round_trip(conn)
            wait_until(lambda user=user: [c for c in ob.api("GET", "connections") if c["user"] == user], 5)
    assert provider.jwks_requests == fetched  # a static key needs no fetch
    stranger = RSAKey.generate_key(2048, parameters={"kid": "nobody"}, private=True)
    for token, reason in ((signed("nobody", "keyed", stranger, "static-d"), "not among the static keys"),
                          (signed("static-only", "keyed", stranger, "static-e"), "the signature does not verify")):
        logged = len(ob.broker.log)
        answer = raw_login(ob.broker.port, token)
        assert isinstance(answer, commands.Connection.Close)
        assert (answer.reply_code, answer.reply_text) == (403, REFUSED)
        assert reason in ob.broker.log[logged:]
    assert provider.jwks_requests == fetched  # no JWKS to ask for the unknown key id


# --- expiry and update-secret -------------------------------------------------------------------------

def test_an_expiring_token_closes_the_connection_unless_update_secret_renews_it(
        ob: OAuthBroker, provider: OIDCProvider) -> None:
    client_id = f"renewing-{time.monotonic_ns()}"
    provider.add_client(client_id, ALL, lifetime=3)
    short = provider.token(client_id)
    expiring = pika.BlockingConnection(ob.params(provider.token(client_id)))
    renewed = pika.BlockingConnection(ob.params(short))
    provider.clients[client_id].lifetime = 300
    renewed.update_secret(provider.token(client_id), "refreshed")
    other = client(provider, ALL)
    refused_renewal = pika.BlockingConnection(ob.params(short))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as changed_user:
        refused_renewal.update_secret(other, "another user's token")
    assert (changed_user.value.reply_code, changed_user.value.reply_text) == (
        530, "NOT_ALLOWED - New secret was refused by one of the backends")
    wait_past(claims_of(short)["exp"] + 0.5)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        for _ in range(100):
            expiring.process_data_events(0.1)
    assert (closed.value.reply_code, closed.value.reply_text) == (320, "CONNECTION_FORCED - credential expired")
    round_trip(renewed)  # past the first token's exp: the new token holds the session
    renewed.close()
    assert isinstance(raw_login(ob.broker.port, short), commands.Connection.Close)  # expired: refused


def test_mqtt_client_is_disconnected_when_its_token_expires(ob: OAuthBroker, provider: OIDCProvider) -> None:
    token = client(provider, ALL, lifetime=2)
    paho = Paho(ob.mqtt_port, f"exp-{time.monotonic_ns()}", username="device", password=token)
    paho.client.reconnect_delay_set(30, 30)  # re-authentication is the client's new CONNECT, not paho's retry
    try:
        assert paho.connect()[1] == "Success"
        paho.disconnects.get(timeout=10)
        assert time.time() >= claims_of(token)["exp"]
    finally:
        paho.disconnect()


def test_update_secret_replaces_the_scopes(ob: OAuthBroker, provider: OIDCProvider) -> None:
    client_id = f"narrowing-{time.monotonic_ns()}"
    provider.add_client(client_id, [*ALL, "rabbitmq.read:%2F/*", "rabbitmq.read:v2/*"])
    conn = pika.BlockingConnection(ob.params(provider.token(client_id, " ".join(ALL))))
    conn.update_secret(provider.token(client_id, "rabbitmq.read:%2F/*"), "fewer rights")
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.queue_declare(f"q-{client_id}", auto_delete=True)
    assert (refused.value.reply_code, refused.value.reply_text) == (
        403, f"ACCESS_REFUSED - configure access to queue 'q-{client_id}' in vhost '/' refused for user '{client_id}'")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.update_secret(provider.token(client_id, "rabbitmq.read:v2/*"), "another vhost only")
    assert (closed.value.reply_code, closed.value.reply_text) == (
        530, f"NOT_ALLOWED - access to vhost '/' refused for user '{client_id}'")


def test_update_secret_that_narrows_read_scopes_cancels_the_consumers_it_no_longer_covers(
        ob: OAuthBroker, provider: OIDCProvider) -> None:
    client_id = f"narrowing-consumer-{time.monotonic_ns()}"
    keep, lose = f"keep-{client_id}", f"lose-{client_id}"
    narrow = ["rabbitmq.configure:%2F/*", "rabbitmq.write:%2F/*", "rabbitmq.read:%2F/keep-*"]
    provider.add_client(client_id, [*ALL, *narrow])
    conn = pika.BlockingConnection(ob.params(provider.token(client_id, " ".join(ALL))))
    ch = conn.channel()
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    got: dict[str, list[bytes]] = {keep: [], lose: []}
    for queue in (keep, lose):
        ch.queue_declare(queue)
        ch.basic_consume(queue, lambda c, m, p, body, queue=queue: got[queue].append(body), auto_ack=True,
                         consumer_tag=f"tag-{queue}")
    logged = len(ob.broker.log)
    conn.update_secret(provider.token(client_id, " ".join(narrow)), "read fewer queues")
    wait_until(lambda: conn.process_data_events(0.05) or cancelled, 5)
    assert cancelled == [f"tag-{lose}"]  # pika advertises consumer_cancel_notify: told by basic.cancel
    assert f"consumer 'tag-{lose}' of queue '{lose}' cancelled: user '{client_id}' may no longer read it" \
        in ob.broker.log[logged:]
    ch.basic_publish("", keep, b"still read")
    ch.basic_publish("", lose, b"not read")
    wait_until(lambda: conn.process_data_events(0.05) or got[keep], 5)
    conn.process_data_events(0.3)
    assert got == {keep: [b"still read"], lose: []}
    assert [ob.api("GET", f"queues/%2F/{queue}")["consumers"] for queue in (keep, lose)] == [1, 0]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:  # and it may not consume it again
        conn.channel().basic_consume(lose, lambda *args: None)
    assert refused.value.reply_code == 403
    conn.close()
    for queue in (keep, lose):
        ob.api("DELETE", f"queues/%2F/{queue}")


# --- bad tokens --------------------------------------------------------------------------------------

def _bad_tokens(provider: OIDCProvider) -> dict[str, tuple[str, str]]:
    """name -> (token, the reason the log gives)."""
    good = client(provider, ALL)
    public = provider.published[-1]
    now = int(time.time())
    hs_input = _resigned(good, {"alg": "HS256"}).rsplit(".", 1)[0]
    forged_hs = hmac.new(public.as_pem(private=False), hs_input.encode(), hashlib.sha256).digest()
    return {
        "malformed": ("eyJhbGciOi.eyJzdWIiOi.c2ln", "malformed token"),
        "alg none": (_resigned(good, {"alg": "none"}), "signing algorithm 'none' is not accepted"),
        "HS256 with the public key": (f"{hs_input}.{_b64(forged_hs)}", "signing algorithm 'HS256' is not accepted"),
        "bad signature": (good[:-8] + ("AAAAAAAA" if not good.endswith("AAAAAAAA") else "BBBBBBBB"),
                          "the signature does not verify"),
        "wrong audience": (client(provider, ALL, audience="elsewhere"), "names no resource server"),
        "expired": (provider.sign({"aud": "rabbitmq", "exp": now - 60, "scope": " ".join(ALL)}), "expired at"),
        "not yet valid": (provider.sign({"aud": "rabbitmq", "exp": now + 600, "nbf": now + 300}), "not valid before"),
        "no exp": (provider.sign({"aud": "rabbitmq", "scope": " ".join(ALL)}), "no exp claim"),
        "unknown key id": (provider.sign({"aud": "rabbitmq", "exp": now + 300}, {"kid": "nobody"}),
                           "unknown signing key id 'nobody'"),
        "another issuer": (provider.sign({"aud": "rabbitmq", "exp": now + 300, "iss": "https://evil.example"}),
                           "issued by 'https://evil.example'"),
        "its provider's keys unreachable": (provider.sign({"aud": "offline", "exp": now + 300}),
                                            "the signing keys could not be fetched"),
    }


def test_bad_tokens_are_refused_with_403_and_logged_once_each(ob: OAuthBroker, provider: OIDCProvider) -> None:
    bystander = pika.BlockingConnection(ob.params(client(provider, ALL)))
    for name, (token, reason) in _bad_tokens(provider).items():
        logged = len(ob.broker.log)
        for _ in range(2):  # refused again without a second log line
            answer = raw_login(ob.broker.port, token)
            assert isinstance(answer, commands.Connection.Close), name
            assert (answer.reply_code, answer.reply_text) == (403, REFUSED), name
        lines = [line for line in ob.broker.log[logged:].splitlines() if "OAuth 2 token refused" in line]
        assert len(lines) == 1 and reason in lines[0], (name, lines)
    round_trip(bystander)  # nothing else is affected
    bystander.close()
    metrics = urllib.request.urlopen(f"{ob.broker.metrics_url}/metrics", timeout=10).read().decode()
    assert 'auth_logins_total{backend="oauth2",outcome="refused"}' in metrics
    assert 'auth_logins_total{backend="oauth2",outcome="ok"}' in metrics


# --- the dashboard's single sign-on -------------------------------------------------------------------

@pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                    reason="chromium and chromium-driver are not installed")
def test_the_dashboard_signs_in_with_the_authorization_code_flow_and_pkce(
        ob: OAuthBroker, provider: OIDCProvider, browser: Any) -> None:
    provider.add_client("dashboard", ["openid", "rabbitmq.tag:administrator", "rabbitmq.read:*/*"],
                        redirect_uris=[f"{ob.broker.http_url}/"])
    assert ob.api("GET", "auth") == {"oauth_enabled": True, "oauth_client_id": "dashboard",
                                     "oauth_provider_url": provider.issuer, "oauth_resource_id": "rabbitmq",
                                     "oauth_scopes": "openid rabbitmq.tag:administrator rabbitmq.read:*/*"}
    browser.get(f"{ob.broker.http_url}/")
    _click(browser, "#sso-login")
    _wait(lambda: browser.current_url.startswith(f"{provider.issuer}/authorize?"), "the provider's login page")
    assert "code_challenge_method=S256" in browser.current_url
    _fill(browser, "#username", "sso-admin")
    _click(browser, "#sign-in")
    _wait(lambda: _text(browser, "#whoami") == "sso-admin (administrator)", "the dashboard signed in by SSO")
    assert "code=" not in browser.current_url  # the code is used once and leaves the address bar
    _wait(lambda: browser.find_elements("css selector", "#nav a[href='#/overview'].active"), "the overview")
