"""Who may start a replication handshake on the leader's port, before proving the shared secret.

Anyone who can reach ``clustering_port`` can open a connection. Until it has proved the secret it may
hold only a little of the leader: a few of its connections at a time from one address, a few dozen
from everywhere, and a steady rate of new attempts per address (a follower reconnects with a backoff
from 0.2 s, far below it). A connection over a bound is closed at once, before a byte is read. What
it may send is bounded by the protocol (``HANDSHAKE_MAX_FRAME``, the handshake deadline).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("lavinpy.cluster.replication")

MAX_PENDING_PER_ADDRESS = 4  # unauthenticated connections open at once from one address
MAX_PENDING = 32  # and from all addresses
ATTEMPT_BURST = 20  # new connections from one address in a burst ...
ATTEMPTS_PER_SECOND = 5.0  # ... and then this many a second
_MAX_TRACKED = 4096  # addresses whose attempt rate is remembered
REFUSAL_LOG_INTERVAL = 10.0  # refused connections are logged once per interval, with a count


class Ticket:
    """An admitted connection's place among the pending handshakes; ``release()`` gives it back (once)."""

    __slots__ = ("_admission", "address")

    def __init__(self, admission: HandshakeAdmission, address: str) -> None:
        self._admission: HandshakeAdmission | None = admission
        self.address = address

    def release(self) -> None:
        if self._admission is not None:
            self._admission._release(self.address)
            self._admission = None


class HandshakeAdmission:
    def __init__(self, per_address: int = MAX_PENDING_PER_ADDRESS, total: int = MAX_PENDING,
                 burst: int = ATTEMPT_BURST, rate: float = ATTEMPTS_PER_SECOND) -> None:
        self.per_address = per_address
        self.total = total
        self.burst = burst
        self.rate = rate
        self._pending: dict[str, int] = {}
        self._pending_total = 0
        self._attempts: dict[str, tuple[float, float]] = {}  # address -> (tokens, when counted)
        self._refused = 0
        self._refused_logged_at = 0.0

    def admit(self, address: str) -> Ticket | None:
        """A ticket when a new connection from ``address`` may start its handshake (release it once
        the peer has authenticated or the connection ended); None when it must be closed."""
        reason = self._refusal(address)
        if reason is None:
            self._pending[address] = self._pending.get(address, 0) + 1
            self._pending_total += 1
            return Ticket(self, address)
        self._refused += 1
        now = time.monotonic()
        if now - self._refused_logged_at >= REFUSAL_LOG_INTERVAL:
            log.warning("replication: refused %d unauthenticated connection(s), the last from %s: %s",
                        self._refused, address, reason)
            self._refused, self._refused_logged_at = 0, now
        return None

    def _release(self, address: str) -> None:
        count = self._pending.get(address, 0)
        if count <= 0:
            return
        self._pending_total -= 1
        if count == 1:
            del self._pending[address]
        else:
            self._pending[address] = count - 1

    @property
    def pending(self) -> int:
        return self._pending_total

    def _refusal(self, address: str) -> str | None:
        now = time.monotonic()
        tokens, counted = self._attempts.get(address, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - counted) * self.rate)
        if tokens < 1.0:
            self._attempts[address] = (tokens, now)
            return f"more than {self.rate:g} attempts a second"
        if len(self._attempts) >= _MAX_TRACKED and address not in self._attempts:
            self._forget_idle(now)
        self._attempts[address] = (tokens - 1.0, now)
        if self._pending.get(address, 0) >= self.per_address:
            return f"{self.per_address} handshakes already open from this address"
        if self._pending_total >= self.total:
            return f"{self.total} handshakes already open"
        return None

    def _forget_idle(self, now: float) -> None:
        """Forget the addresses whose allowance has refilled (they are as if never seen)."""
        full = [a for a, (tokens, counted) in self._attempts.items()
                if tokens + (now - counted) * self.rate >= self.burst]
        for address in full:
            del self._attempts[address]
        if len(self._attempts) >= _MAX_TRACKED:  # all of them busy: start over rather than grow
            self._attempts.clear()
