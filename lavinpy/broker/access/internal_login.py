"""The login of a node's own links (its shovels) to itself, as the user who made them.

A local shovel (``amqp://`` without a host) logs in to this node's AMQP port over loopback as the user
recorded on its parameter, with the internal SASL mechanism and a token only this process knows: an
HMAC of the user name under a secret drawn at start and never written anywhere. So a local shovel
needs no password (a changed password of the default user, or of its creator, does not stop it), and
the token is worth nothing off this host or after a restart. The user's own tags and permissions apply
to everything the shovel then does, as to any client of that user.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

from .users import UserStore, is_loopback_address


class InternalLogins:
    """This process's secret and the tokens derived from it; the AMQP face asks ``verify``."""

    def __init__(self) -> None:
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
        token matches, the peer is this host and the user exists."""
        if not (is_loopback_address(peer_host) or peer_host in self.own_hosts):
            return False
        return hmac.compare_digest(self.token(user), token) and users.user(user) is not None
