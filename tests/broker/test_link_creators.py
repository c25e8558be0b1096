"""The rights a token user's links run with (broker/access/internal_login.py), in process: recorded
from the token's grants when the user sets a link (scopes, the claims they name, the expiry; no token),
kept over a restart, checked by the link checks (links.py) as a stored user's are, refused clearly once
the token expired or when nothing establishes the creator's rights."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lavinpy.broker.access.internal_login import InternalLogins
from lavinpy.broker.access.links import link_refusal
from lavinpy.broker.access.token_grants import TokenGrants
from lavinpy.broker.access.users import UserStore

SHOVEL = {"src-uri": "amqp://", "src-queue": "in-app", "dest-uri": "amqp://", "dest-queue": "out-app"}


@pytest.fixture
def store(tmp_path: Path) -> UserStore:
    s = UserStore(tmp_path / "users.json", tmp_path / "vhosts.json")
    s.add_vhost("/")
    return s


def grants(store: UserStore, expires_at: float, *scopes: str) -> TokenGrants:
    g = TokenGrants(store, "app", scopes, {"team": "app", "email": "app@example.com"})
    g.expires_at = expires_at
    return g


def test_a_recorded_token_creator_runs_its_links_with_the_tokens_scopes_after_a_restart(
        store: UserStore, tmp_path: Path) -> None:
    path = tmp_path / "link_creators.json"
    logins = InternalLogins(path)
    exp = time.time() + 300
    logins.record_token_creator("app", grants(store, exp, "configure:%2F/*-{team}", "read:%2F/*-{team}",
                                              "write:%2F/*-{team}", "tag:policymaker"))
    stored = json.loads(path.read_text())
    assert stored == [{"user": "app", "scopes": ["configure:%2F/*-{team}", "read:%2F/*-{team}", "write:%2F/*-{team}",
                                                 "tag:policymaker"], "claims": {"team": "app"}, "expires_at": exp}]
    again = InternalLogins(path)  # a restart: a new process secret, the record read back
    again.load()
    assert again.creator_refusal("app", store, "shovel") is None
    rights = again.creator_grants("app", store)
    assert rights.tags == frozenset({"policymaker"}) and again.creator_expiry("app", store) == exp
    assert link_refusal(store, "app", "/", SHOVEL, grants=rights) is None
    assert link_refusal(store, "app", "/", {**SHOVEL, "src-queue": "in-other"}, grants=rights) == (
        "src-queue: read access to queue 'in-other' in vhost '/' refused for user 'app'")
    assert again.verify("app", again.token("app"), "127.0.0.1", store)
    assert not again.verify("app", logins.token("app"), "127.0.0.1", store)  # the old process's token


def test_an_expired_or_unknown_creator_is_refused_saying_why(store: UserStore) -> None:
    logins = InternalLogins()
    logins.record_token_creator("app", grants(store, time.time() - 1, "read:%2F/*"))
    refusal = logins.creator_refusal("app", store, "shovel")
    assert refusal is not None and refusal.startswith('the token of user "app", who made this shovel, expired at ')
    assert refusal.endswith("set the shovel again with a valid token")
    assert not logins.verify("app", logins.token("app"), "127.0.0.1", store)
    assert logins.creator_refusal("ldap-user", store, "upstream") == (
        'user "ldap-user", who made this upstream, no longer exists (not in the user store, and no OAuth 2 token '
        "of theirs is recorded: only stored users and token users may make links)")
    store.add_user("stored", "pw")
    assert logins.creator_refusal("stored", store, "shovel") is None and logins.creator_grants("stored", store) is None
