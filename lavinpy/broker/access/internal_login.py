"""The login of a node's own links (its shovels) to itself, as the user who made them.

A local shovel (``amqp://`` without a host) logs in to this node's AMQP port over loopback as the user
recorded on its parameter, with the internal SASL mechanism and a token only this process knows: an
HMAC of the user name under a secret drawn at start and never written anywhere. So a local shovel
needs no password (a changed password of the default user, or of its creator, does not stop it), and
the token is worth nothing off this host or after a restart. The user's own tags and permissions apply
to everything the shovel then does, as to any client of that user.

A link made by a user the store does not have, logged in with an OAuth 2 token, runs as that user
with the rights its token had (``record_token_creator``): the token's scopes, the claims they name and
its expiry are recorded when the link is set (not the token: it is never stored) and kept in a file of
the data directory, so the link runs after a restart too, until the token's ``exp``. Its internal
login then carries those scopes and that expiry: at ``exp`` the link's connection is closed (320
credential expired) and the link does not start again until its creator sets it with a new token.
Setting a link with another token of the same user replaces the record (the latest token's rights
hold for all of that user's links). Any other user the store does not have (an LDAP user: its rights
are the directory's, asked with its password) cannot run links: they are refused when set.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lavinpy.store.jsonfile import read_json, write_json_atomic

from .token_grants import TokenGrants
from .users import UserStore, is_loopback_address

log = logging.getLogger("lavinpy.login")

LINK_CREATORS_FILE = "link_creators.json"
_VARIABLE = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True, slots=True)
class TokenCreator:
    """The rights of a link's creator logged in with a token, as recorded when it set the link."""

    username: str
    scopes: tuple[str, ...]  # permission and tag scopes, prefix taken off
    claims: dict[str, str]  # the string claims the scopes name ({claim})
    expires_at: float | None  # the token's exp (epoch seconds)

    def grants(self, store: UserStore) -> TokenGrants:
        grants = TokenGrants(store, self.username, self.scopes, self.claims)
        grants.expires_at = self.expires_at
        return grants

    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= time.time()


class InternalLogins:
    """This process's secret and the tokens derived from it; the AMQP face asks ``verify``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path  # the token creators' record (None: kept in memory only)
        self.token_creators: dict[str, TokenCreator] = {}
        self._secret = secrets.token_bytes(32)
        # Addresses of this host besides loopback (a listener bound to one address only): a shovel
        # connects to the node's first bound address, so its connection comes from there.
        self.own_hosts: frozenset[str] = frozenset()

    def set_own_hosts(self, hosts: Iterable[str]) -> None:
        self.own_hosts = frozenset(hosts)

    def token(self, user: str) -> str:
        """The password a local link of ``user`` logs in with (this process only)."""
        return hmac.new(self._secret, user.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()

    def verify(self, user: str, token: str, peer_host: str | None, users: UserStore) -> bool:
        """An internal login (the user and its token, as a PLAIN response carries them) is right: the
        token matches, the peer is this host and the user exists (in the store, or as a token creator
        whose token has not expired)."""
        if not (is_loopback_address(peer_host) or peer_host in self.own_hosts):
            return False
        if not hmac.compare_digest(self.token(user), token):
            return False
        if users.user(user) is not None:
            return True
        creator = self.token_creators.get(user)
        return creator is not None and not creator.expired()

    # --- links of token users -------------------------------------------------------------------
    def load(self) -> None:
        if self.path is None:
            return
        entries = read_json(self.path, [])
        for entry in entries if isinstance(entries, list) else []:
            try:
                creator = TokenCreator(str(entry["user"]), tuple(map(str, entry["scopes"])),
                                       {str(k): str(v) for k, v in dict(entry.get("claims", {})).items()},
                                       None if entry.get("expires_at") is None else float(entry["expires_at"]))
            except (KeyError, TypeError, ValueError):
                log.error("%s: ignoring entry %r", self.path, entry)
                continue
            self.token_creators[creator.username] = creator

    def record_token_creator(self, username: str, grants: Any) -> None:
        """A token user sets a link: its token's rights are what the link runs with, until its exp."""
        scopes = (*grants.scopes, *sorted(f"tag:{t}" for t in grants.tags))
        named = {name for scope in scopes for name in _VARIABLE.findall(scope)}
        claims = {k: v for k, v in grants.claims.items() if k in named and isinstance(v, str)}
        self.token_creators[username] = TokenCreator(username, scopes, claims, grants.expires_at)
        self._save()

    def creator_refusal(self, username: str, users: UserStore, link: str) -> str | None:
        """Why links of ``username`` (a "shovel" or "upstream") cannot run now, or None."""
        if users.user(username) is not None:
            return None
        creator = self.token_creators.get(username)
        if creator is None:
            return (f"user \"{username}\", who made this {link}, no longer exists (not in the user store, and "
                    "no OAuth 2 token of theirs is recorded: only stored users and token users may make links)")
        if creator.expired():
            assert creator.expires_at is not None
            at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(creator.expires_at))
            return (f"the token of user \"{username}\", who made this {link}, expired at {at}: set the "
                    f"{link} again with a valid token")
        return None

    def creator_grants(self, username: str, users: UserStore) -> Any:
        """The grants a link of ``username`` runs with: None for a stored user (the store's), else its
        recorded token's (``creator_refusal`` said it may run)."""
        if users.user(username) is not None:
            return None
        creator = self.token_creators.get(username)
        return creator.grants(users) if creator is not None else None

    def creator_expiry(self, username: str, users: UserStore) -> float | None:
        creator = self.token_creators.get(username)
        return creator.expires_at if creator is not None and users.user(username) is None else None

    def _save(self) -> None:
        if self.path is None:
            return
        write_json_atomic(self.path, [{"user": c.username, "scopes": list(c.scopes), "claims": c.claims,
                                       "expires_at": c.expires_at} for c in self.token_creators.values()])
