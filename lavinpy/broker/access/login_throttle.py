"""Slows password guessing: after repeated failed logins from one address, its logins are answered later.

Per source address: the first ``FREE_FAILURES`` failures cost nothing (typos happen); after that each
login attempt from the address, right or wrong, is answered ``BASE_DELAY`` later, doubling with each
further failure up to ``MAX_DELAY``. Successes get the delay too, so a client cannot tell a right
password early by timing out. It counts attempts, not answers: an attempt still being checked
(``begin`` .. ``end``) counts as a failure for the delay of the next ones, so parallel connections
cannot all pass before the first is refused. A success forgets the address only when its failures
were all for the user that succeeded (a typo, then the right password): logging in to one's own
account does not wipe the count of guesses at another's. ``QUIET_PERIOD`` without failures forgets
it too. At most ``MAX_ADDRESSES`` addresses are tracked (the least recently failing goes first), so a
flood of addresses costs bounded memory.

Logging: the first failure after a quiet spell is logged at once (one WARNING); further failures
are counted and reported in one summary line per ``LOG_INTERVAL``, not one line per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

log = logging.getLogger("lavinpy.login")

FREE_FAILURES = 3
BASE_DELAY = 0.1
MAX_DELAY = 3.0
QUIET_PERIOD = 60.0
MAX_ADDRESSES = 10_000
LOG_INTERVAL = 10.0
# The summary names this many addresses and users at most (the rest are only counted).
SUMMARY_NAMES = 5
_SUMMARY_TRACKED = 100
LOCAL = "local"  # unix sockets and other peers without an address
# User names remembered per failing address (to tell a typo from guessing); past this many, "several".
_USERS_PER_ADDRESS = 4


class LoginThrottle:
    def __init__(self, clock: Callable[[], float] = time.monotonic, free_failures: int = FREE_FAILURES) -> None:
        self._clock = clock
        self._free_failures = free_failures
        # address -> [failures, time of the last failure, user names that failed (None: too many)];
        # oldest failing first
        self._failures: OrderedDict[str, list] = OrderedDict()
        self._pending: Counter[str] = Counter()  # address -> attempts begun and not yet ended
        self._summary_timer: asyncio.TimerHandle | None = None
        self._unlogged = 0
        self._by_address: Counter[str] = Counter()
        self._by_user: Counter[str] = Counter()

    def delay(self, address: str | None) -> float:
        """Seconds to wait before answering a login attempt from ``address`` (attempts in flight count
        as failures)."""
        key = address or LOCAL
        failures = self._pending.get(key, 0)
        entry = self._failures.get(key)
        if entry is not None:
            if self._clock() - entry[1] > QUIET_PERIOD:
                del self._failures[key]
            else:
                failures += int(entry[0])
        extra = failures - self._free_failures
        if extra < 0:
            return 0.0
        return min(BASE_DELAY * 2 ** min(extra, 16), MAX_DELAY)

    def begin(self, address: str | None) -> float:
        """A login attempt from ``address`` starts: its delay, and it counts from now until ``end``."""
        delay = self.delay(address)
        self._pending[address or LOCAL] += 1
        return delay

    def end(self, address: str | None, username: str, mechanism: str, ok: bool) -> None:
        """The attempt ``begin`` counted was decided (``ok``: the password was right)."""
        key = address or LOCAL
        left = self._pending.pop(key, 0) - 1
        if left > 0:
            self._pending[key] = left
        if ok:
            self.succeeded(address, username)
        else:
            self.failed(address, username, mechanism)

    def succeeded(self, address: str | None, username: str | None = None) -> None:
        """A right password: the address is forgotten if its failures were all for ``username``
        (None: whoever they were for)."""
        key = address or LOCAL
        entry = self._failures.get(key)
        if entry is not None and (username is None or entry[2] is not None and entry[2] <= {username}):
            del self._failures[key]

    def failed(self, address: str | None, username: str, mechanism: str) -> None:
        """Count a failed login and log it (at once, or in the next summary line)."""
        key = address or LOCAL
        now = self._clock()
        entry = self._failures.pop(key, None)
        if entry is None or now - entry[1] > QUIET_PERIOD:
            entry = [0, now, set()]
        entry[0] += 1
        entry[1] = now
        users = entry[2]
        if users is not None:
            users.add(username)
            if len(users) > _USERS_PER_ADDRESS:
                entry[2] = None
        self._failures[key] = entry  # most recent last
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)
        self._log_failure(key, username, mechanism)

    def tracked_addresses(self) -> int:
        return len(self._failures)

    # -- logging ----------------------------------------------------------------------------------

    def _log_failure(self, address: str, username: str, mechanism: str) -> None:
        if self._summary_timer is None:
            log.warning("login refused for user %r from %s (%s); further failures are summarised every %g s",
                        username, address, mechanism, LOG_INTERVAL)
            self._arm()
            return
        self._unlogged += 1
        if address in self._by_address or len(self._by_address) < _SUMMARY_TRACKED:
            self._by_address[address] += 1
        if username in self._by_user or len(self._by_user) < _SUMMARY_TRACKED:
            self._by_user[username] += 1

    def _arm(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a synchronous caller): log every failure
            return
        self._summary_timer = loop.call_later(LOG_INTERVAL, self._summarise)

    def _summarise(self) -> None:
        self._summary_timer = None
        if not self._unlogged:
            return  # a quiet interval: the next failure is logged at once
        addresses = ", ".join(f"{a} ({n})" for a, n in self._by_address.most_common(SUMMARY_NAMES))
        users = ", ".join(f"{u!r} ({n})" for u, n in self._by_user.most_common(SUMMARY_NAMES))
        log.warning("%d more failed logins in the last %g s from %d+ addresses [%s] for users [%s]",
                    self._unlogged, LOG_INTERVAL, len(self._by_address), addresses, users)
        self._unlogged = 0
        self._by_address.clear()
        self._by_user.clear()
        self._arm()

    def close(self) -> None:
        if self._summary_timer is not None:
            self._summary_timer.cancel()
            self._summary_timer = None
