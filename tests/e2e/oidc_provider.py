"""A real OpenID Connect provider for the oauth2 tests: Authlib's authorization server (its client
credentials grant and RFC 9068 JWT access token generator, signing through joserfc) on Flask, served by
Werkzeug on a free port in a thread. It publishes OpenID discovery and a JWKS, issues access tokens at
its token endpoint to registered clients (HTTP Basic client authentication, the scopes each client may
ask for, the audience of the broker's resource server, a lifetime per client), runs the authorization
code flow with PKCE for browser apps (its login form takes a user name), and rotates its signing
key (RS256, ES256, EdDSA) when a test asks. Authlib's token endpoint signs with RS256 and ES256 (joserfc's
recommended algorithms); ``sign`` signs any claims with the current key, EdDSA included."""

from __future__ import annotations

import base64
import html
import json
import logging
import secrets
import threading
import time
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pytest
from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2 import OAuth2Error
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from flask import Flask, jsonify, request
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, OKPKey, RSAKey
from werkzeug.serving import make_server

from tests.helpers import free_port, http_json

from .conftest import LocalBroker


@dataclass
class Client(ClientMixin):
    client_id: str
    secret: str  # "": a public client (a browser app: the authorization code flow with PKCE)
    scopes: set[str]  # what it may ask for
    audience: str | list[str]
    lifetime: int = 300  # seconds its tokens live
    claims: dict[str, Any] = field(default_factory=dict)  # extra claims in its tokens
    redirect_uris: list[str] = field(default_factory=list)
    refresh: bool = False  # a browser app that also gets refresh tokens (the refresh token grant)

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str:
        return self.redirect_uris[0] if self.redirect_uris else ""

    def get_allowed_scope(self, scope: str) -> str:
        return " ".join(s for s in scope.split() if s in self.scopes)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        return bool(self.secret) and client_secret == self.secret

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == ("client_secret_basic" if self.secret else "none")

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code" and not self.secret

    def check_grant_type(self, grant_type: str) -> bool:
        if self.secret:
            return grant_type == "client_credentials"
        return grant_type == "authorization_code" or (self.refresh and grant_type == "refresh_token")


@dataclass
class User:
    name: str

    def get_user_id(self) -> str:
        return self.name


@dataclass
class Code:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    user: User
    code_challenge: str
    code_challenge_method: str

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope


class _CodeGrant(grants.AuthorizationCodeGrant):
    """The authorization code grant for public clients (PKCE required: CodeChallenge below)."""

    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]
    codes: dict[str, Code] = {}

    def save_authorization_code(self, code: str, request: Any) -> None:
        self.codes[code] = Code(code, request.client.client_id, request.payload.redirect_uri, request.scope,
                                request.user, request.payload.data.get("code_challenge", ""),
                                request.payload.data.get("code_challenge_method", ""))

    def query_authorization_code(self, code: str, client: Client) -> Code | None:
        item = self.codes.get(code)
        return item if item is not None and item.client_id == client.client_id else None

    def delete_authorization_code(self, authorization_code: Code) -> None:
        self.codes.pop(authorization_code.code, None)

    def authenticate_user(self, authorization_code: Code) -> User:
        return authorization_code.user


@dataclass
class Refresh:
    """A refresh token the provider issued: whose, for which client and scope (used once)."""

    token: str
    client_id: str
    scope: str
    user: User

    def check_client(self, client: Client) -> bool:
        return client.client_id == self.client_id

    def get_scope(self) -> str:
        return self.scope


class _RefreshGrant(grants.RefreshTokenGrant):
    """The refresh token grant for public clients (a new refresh token each time, the old one revoked)."""

    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]
    INCLUDE_NEW_REFRESH_TOKEN = True
    tokens: dict[str, Refresh] = {}

    def authenticate_refresh_token(self, refresh_token: str) -> Refresh | None:
        return self.tokens.get(refresh_token)

    def authenticate_user(self, refresh_token: Refresh) -> User:
        return refresh_token.user

    def revoke_old_credential(self, refresh_token: Refresh) -> None:
        self.tokens.pop(refresh_token.token, None)


class _Tokens(JWTBearerTokenGenerator):
    def __init__(self, provider: OIDCProvider) -> None:
        super().__init__(issuer=provider.issuer, expires_generator=lambda client, grant: client.lifetime,
                         refresh_token_generator=lambda **kwargs: secrets.token_urlsafe(24))
        self.provider = provider

    def get_jwks(self) -> KeySet:
        return KeySet([self.provider.signing_key])

    @property  # type: ignore[override]
    def alg(self) -> str:  # the current key's
        return self.provider.signing_alg

    @alg.setter
    def alg(self, value: str) -> None:
        pass

    def get_audiences(self, client: Client, user: Any, scope: str) -> str | list[str]:  # type: ignore[override]
        return client.audience

    def get_extra_claims(self, client: Client, grant_type: str, user: Any, scope: str) -> dict[str, Any]:  # type: ignore[override]
        return dict(client.claims)


_KEY_MAKERS = {"RS256": lambda kid: RSAKey.generate_key(2048, parameters={"kid": kid}, private=True),
               "ES256": lambda kid: ECKey.generate_key("P-256", parameters={"kid": kid}, private=True),
               "EdDSA": lambda kid: OKPKey.generate_key("Ed25519", parameters={"kid": kid}, private=True)}


class OIDCProvider:
    def __init__(self) -> None:
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.clients: dict[str, Client] = {}
        self.published: list[Any] = []  # the keys in the JWKS
        self.jwks_requests = 0
        self.refreshes = 0  # tokens issued by the refresh token grant
        self._serial = 0
        self.signing_alg = "RS256"
        self.signing_key: Any = None
        self.rotate("RS256")
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
        app = Flask("oidc-provider")
        server = AuthorizationServer(app, query_client=self.clients.get, save_token=self._save_token)
        server.register_grant(grants.ClientCredentialsGrant)
        server.register_grant(_CodeGrant, [CodeChallenge(required=True)])
        server.register_grant(_RefreshGrant)
        server.register_token_generator("default", _Tokens(self))

        @app.get("/.well-known/openid-configuration")
        def discovery() -> Any:
            return jsonify({"issuer": self.issuer, "jwks_uri": f"{self.issuer}/jwks",
                            "token_endpoint": f"{self.issuer}/token",
                            "authorization_endpoint": f"{self.issuer}/authorize",
                            "response_types_supported": ["code"], "subject_types_supported": ["public"],
                            "id_token_signing_alg_values_supported": ["RS256", "ES256", "EdDSA"],
                            "grant_types_supported": ["client_credentials", "authorization_code",
                                                      "refresh_token"],
                            "token_endpoint_auth_methods_supported": ["client_secret_basic"]})

        @app.get("/jwks")
        def jwks() -> Any:
            self.jwks_requests += 1
            return jsonify(KeySet(list(self.published)).as_dict(private=False))

        @app.post("/token")
        def token() -> Any:
            return server.create_token_response()

        @app.get("/authorize")
        def authorize_form() -> Any:  # the provider's login page: a user name is enough here
            try:
                server.get_consent_grant(end_user=None)
            except OAuth2Error as e:
                return jsonify(dict(e.get_body())), 400
            hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                             for k, v in request.args.items())
            return (f'<form method="post" action="/authorize">{hidden}<input id="username" name="username">'
                    '<button id="sign-in" type="submit">Sign in</button></form>')

        @app.post("/authorize")
        def authorize() -> Any:
            user = User(request.form["username"])
            return server.create_authorization_response(grant=server.get_consent_grant(end_user=user), grant_user=user)

        @app.after_request
        def cors(response: Any) -> Any:  # browser apps on other origins read discovery and the token endpoint
            response.headers["Access-Control-Allow-Origin"] = "*"
            return response

        self._server = make_server("127.0.0.1", self.port, app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="oidc-provider", daemon=True)
        self._thread.start()

    def _save_token(self, token: dict[str, Any], request: Any) -> None:
        if request.payload.grant_type == "refresh_token":
            self.refreshes += 1
        if "refresh_token" in token:
            _RefreshGrant.tokens[token["refresh_token"]] = Refresh(token["refresh_token"], request.client.client_id,
                                                                   token.get("scope", ""), request.user)

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(5)

    def rotate(self, alg: str = "RS256", retire_old: bool = False) -> str:
        """A new signing key (published in the JWKS); the old ones stay published unless ``retire_old``."""
        self._serial += 1
        kid = f"key-{self._serial}-{alg.lower()}"
        key = _KEY_MAKERS[alg](kid)
        self.published = [key] if retire_old else [*self.published, key]
        self.signing_key, self.signing_alg = key, alg
        return kid

    def add_client(self, client_id: str, scopes: list[str], audience: str | list[str] = "rabbitmq",
                   lifetime: int = 300, claims: dict[str, Any] | None = None,
                   redirect_uris: list[str] | None = None, refresh: bool = False) -> Client:
        """A client with a secret (client credentials), or with ``redirect_uris`` a public one (code + PKCE;
        with ``refresh`` its tokens come with refresh tokens)."""
        secret = "" if redirect_uris else f"{client_id}-secret"
        client = Client(client_id, secret, set(scopes), audience, lifetime, claims or {}, redirect_uris or [], refresh)
        self.clients[client_id] = client
        return client

    def sign(self, claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
        """Claims signed with the current signing key (as the token endpoint signs, any algorithm)."""
        header = {"alg": self.signing_alg, "typ": "at+jwt", "kid": self.signing_key.kid, **(header or {})}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # joserfc: EdDSA is deprecated by RFC 9864 (still in use)
            return jwt.encode(header, {"iss": self.issuer, **claims}, self.signing_key, algorithms=[header["alg"]])

    def token(self, client_id: str, scope: str | None = None) -> str:
        """An access token from the token endpoint (client credentials, the client's secret by Basic)."""
        client = self.clients[client_id]
        body = urllib.parse.urlencode({"grant_type": "client_credentials",
                                       "scope": scope if scope is not None else " ".join(sorted(client.scopes))})
        basic = base64.b64encode(f"{client.client_id}:{client.secret}".encode()).decode()
        request = urllib.request.Request(f"{self.issuer}/token", data=body.encode(), method="POST",
                                         headers={"Authorization": f"Basic {basic}",
                                                  "Content-Type": "application/x-www-form-urlencoded"})
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["token_type"].lower() == "bearer", answer
        return str(answer["access_token"])


def claims_of(token: str) -> dict[str, Any]:
    """A token's claims, unverified (what the test asked for)."""
    part = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))))


def wait_past(timestamp: float) -> None:
    while time.time() <= timestamp:
        time.sleep(0.05)


# ---- the broker the oauth2 tests log in to -----------------------------------------------------

class OAuthBroker:
    """lavinpy with the local and oauth2 backends trusting ``provider`` (plus static keys, a second resource
    server, a provider that cannot be reached, SSO for the dashboard), and a vhost v2 guest may use."""

    def __init__(self, tmp: Path, provider: OIDCProvider) -> None:
        self.mqtt_port = free_port()
        # Static signing keys (RabbitMQ's signing_keys): one beside the issuer's JWKS, one for a provider
        # with no JWKS at all (its default_key also signs tokens without kid).
        self.static_keys = {kid: RSAKey.generate_key(2048, parameters={"kid": kid}, private=True)
                            for kid in ("static-root", "static-only")}
        (tmp / "static-root.pem").write_bytes(self.static_keys["static-root"].as_pem(private=False))
        settings = {
            "auth_backends": ["local", "oauth2"],
            "auth_oauth2_resource_server_id": "rabbitmq",
            "auth_oauth2_issuer": provider.issuer,
            "auth_oauth2_preferred_username_claims": ["user_name", "sub"],  # sub: the client, or the user
            "auth_oauth2_additional_scopes_key": "roles",
            "auth_oauth2_scope_aliases": {"ops": ["rabbitmq.tag:monitoring", "rabbitmq.read:*/*"]},
            "auth_oauth2_resource_servers": {"reports": {"id": "reports", "scope_prefix": "reports/"},
                                             "offline": {"id": "offline", "oauth_provider_id": "down"},
                                             "keyed": {"id": "keyed", "oauth_provider_id": "static"}},
            # A second provider whose key set cannot be fetched (nothing listens there), a third with
            # static keys only (a JWK map here; a PEM file for the issuer's).
            "auth_oauth2_oauth_providers": {
                "down": {"jwks_url": f"http://127.0.0.1:{free_port()}/jwks"},
                "static": {"signing_keys": {"static-only": self.static_keys["static-only"].as_dict(private=False)},
                           "default_key": "static-only"}},
            "auth_oauth2_signing_keys": {"static-root": str(tmp / "static-root.pem")},
            "management_oauth_enabled": True, "management_oauth_client_id": "dashboard",
            "management_oauth_scopes": "openid rabbitmq.tag:administrator rabbitmq.read:*/*",
        }
        conf = tmp / "oauth2.yaml"
        conf.write_text(json.dumps(settings))  # JSON is YAML
        self.broker = LocalBroker(tmp / "broker")
        self.broker.extra_args = ["--config", str(conf), "--mqtt-port", str(self.mqtt_port)]
        try:
            self.broker.start()
            self.api("PUT", "vhosts/v2")
            self.api("PUT", "permissions/v2/guest", {"configure": ".*", "write": ".*", "read": ".*"})
        except BaseException:
            self.broker.close()
            raise

    def api(self, method: str, path: str, body: Any = None, auth: str | None = None) -> Any:
        auth = auth or "Basic " + base64.b64encode(b"guest:guest").decode()
        return http_json(f"{self.broker.http_url}/api/{path}", method, body, authorization=auth)

    def params(self, token: str, vhost: str = "/", user: str = "any-name") -> pika.ConnectionParameters:
        return pika.ConnectionParameters("127.0.0.1", self.broker.port, vhost, pika.PlainCredentials(user, token),
                                         connection_attempts=1, socket_timeout=10, blocked_connection_timeout=10)


@pytest.fixture(scope="module")
def provider() -> Iterator[OIDCProvider]:
    """One provider per test module (import it there: ``from .oidc_provider import provider as provider``)."""
    p = OIDCProvider()
    yield p
    p.close()


@pytest.fixture(scope="module")
def ob(provider: OIDCProvider, request: pytest.FixtureRequest,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthBroker]:
    """One broker with the oauth2 backend per test module, its data under the module's name."""
    b = OAuthBroker(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]), provider)
    yield b
    b.broker.close()
