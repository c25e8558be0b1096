"""Links (shovels, federation upstreams) made by OAuth 2 token users, against the real OpenID Connect
provider of tests/e2e/oidc_provider.py: a token user's shovel runs with its token's scopes (recorded
when it set the shovel, never the token) until the token expires, then stops saying why, and runs
again once its creator sets it with a new token; a token whose scopes do not cover the link is refused
when it sets it. tests/broker/test_link_creators.py: the record kept over a restart, and a creator
whose rights cannot be established refused."""

from __future__ import annotations

import json
import time
import urllib.error
from typing import Any

import pika
import pytest

from tests.helpers import wait_until

from .conftest import lavinpy_only
from .oidc_provider import OAuthBroker, OIDCProvider, claims_of, wait_past
from .oidc_provider import ob as ob  # one provider and one broker for the module
from .oidc_provider import provider as provider

pytestmark = lavinpy_only("starts lavinpy with the oauth2 backend")

LINKER = ["rabbitmq.tag:policymaker", "rabbitmq.configure:%2F/*", "rabbitmq.read:%2F/*", "rabbitmq.write:%2F/*"]


def _refused(ob: OAuthBroker, path: str, body: Any, token: str) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as refused:
        ob.api("PUT", path, body, auth=f"Bearer {token}")
    return refused.value.code, json.loads(refused.value.read())["reason"]


def _status(ob: OAuthBroker, name: str) -> dict[str, Any]:
    rows = [row for row in ob.api("GET", "shovels/%2F") if row["name"] == name]
    return rows[0] if rows else {}


def test_a_token_users_shovel_runs_with_its_tokens_scopes_until_the_token_expires(
        ob: OAuthBroker, provider: OIDCProvider) -> None:
    client_id = f"shoveller-{time.monotonic_ns()}"
    src, dest, name = f"src-{client_id}", f"dest-{client_id}", f"move-{client_id}"
    provider.add_client(client_id, [*LINKER, "rabbitmq.read:%2F/other-*"], lifetime=6)
    token = provider.token(client_id, " ".join(LINKER))
    with pika.BlockingConnection(pika.URLParameters(ob.broker.url_for("guest", "guest"))) as conn:
        ch = conn.channel()
        for queue in (src, dest):
            ch.queue_declare(queue)
        ch.basic_publish("", src, b"moved by a token user's shovel")
    shovel = {"value": {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://", "dest-queue": dest,
                        "reconnect-delay": 1}}
    # A token that may not read the source queue cannot set it (its scopes are checked as a user's).
    narrow = provider.token(client_id, "rabbitmq.tag:policymaker rabbitmq.configure:%2F/* "
                                       "rabbitmq.write:%2F/* rabbitmq.read:%2F/other-*")
    code, text = _refused(ob, f"parameters/shovel/%2F/{name}", shovel, narrow)
    assert code == 400 and f"read access to queue '{src}' in vhost '/' refused for user '{client_id}'" in text
    ob.api("PUT", f"parameters/shovel/%2F/{name}", shovel, auth=f"Bearer {token}")
    assert ob.api("GET", f"parameters/shovel/%2F/{name}")["user"] == client_id
    wait_until(lambda: ob.api("GET", f"queues/%2F/{dest}")["messages"] == 1, 10, what="the message shovelled")
    assert _status(ob, name)["state"] == "running"
    connections = [c for c in ob.api("GET", "connections") if c["user"] == client_id]
    assert connections and {c["auth_backend"] for c in connections} == {"internal"}
    # At the token's exp the link's connections close (credential expired) and it does not start again.
    wait_past(claims_of(token)["exp"] + 0.5)
    expired = f'the token of user "{client_id}", who made this shovel, expired at'
    wait_until(lambda: expired in (_status(ob, name).get("reason") or ""), 15, what="the shovel stopped")
    assert _status(ob, name)["state"] != "running"
    assert "CONNECTION_FORCED - credential expired" in ob.broker.log  # its connections were closed at exp
    # The creator sets it again with a new token: it runs again.
    provider.clients[client_id].lifetime = 300
    ob.api("PUT", f"parameters/shovel/%2F/{name}", shovel, auth=f"Bearer {provider.token(client_id, ' '.join(LINKER))}")
    wait_until(lambda: _status(ob, name).get("state") == "running", 15, what="the shovel running again")
    ob.api("DELETE", f"parameters/shovel/%2F/{name}")
    for queue in (src, dest):
        ob.api("DELETE", f"queues/%2F/{queue}")


def test_a_token_users_federation_upstream_is_checked_against_its_scopes(
        ob: OAuthBroker, provider: OIDCProvider) -> None:
    client_id = f"federator-{time.monotonic_ns()}"
    provider.add_client(client_id, [*LINKER, "rabbitmq.read:v2/*"])
    upstream = {"value": {"uri": "amqp:///v2"}}
    code, text = _refused(ob, f"parameters/federation-upstream/%2F/up-{client_id}", upstream,
                          provider.token(client_id, " ".join(LINKER)))
    assert code == 400 and f'uri: user "{client_id}" may not connect to vhost "v2"' in text
    ob.api("PUT", f"parameters/federation-upstream/%2F/up-{client_id}", upstream,
           auth=f"Bearer {provider.token(client_id)}")
    assert ob.api("GET", f"parameters/federation-upstream/%2F/up-{client_id}")["user"] == client_id
    ob.api("DELETE", f"parameters/federation-upstream/%2F/up-{client_id}")
