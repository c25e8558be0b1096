"""Vhost limits (max-connections, max-queues) and user limits (max-connections, max-channels).

As in RabbitMQ: a vhost's limits are the runtime parameter ``vhost-limits``/{vhost}/``limits``; a user's
limits are kept with the user (here ``user_limits.json``). A negative value or no value means no limit,
0 allows none. The books here count open connections per vhost and per user and open channels per
user; the session layer reports each open and close, and an open over a limit raises RabbitMQ's error
(530 NOT_ALLOWED for connections and channels, 406 PRECONDITION_FAILED for a queue declare).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lavinpy.store.jsonfile import read_json, write_json_atomic

from ..errors import NOT_ALLOWED, PRECONDITION_FAILED, BrokerChannelError, BrokerConnectionError
from ..settings.parameters import ParameterError

VHOST_LIMITS_COMPONENT = "vhost-limits"
VHOST_LIMITS_NAME = "limits"
VHOST_LIMIT_KEYS = ("max-connections", "max-queues")
USER_LIMIT_KEYS = ("max-connections", "max-channels")
USER_LIMITS_FILE = "user_limits.json"


def check_limits(value: Any, keys: tuple[str, ...], what: str) -> dict[str, int]:
    """A validated limits object ({key: integer}); ParameterError names the bad key."""
    if not isinstance(value, Mapping):
        raise ParameterError(f"{what}: value must be a JSON object, not {value!r}")
    for key in value:
        if key not in keys:
            raise ParameterError(f"{what}: '{key}' is not a recognised limit; should be one of: "
                                 + ", ".join(f"'{k}'" for k in keys))
        limit = value[key]
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise ParameterError(f"{what}: {key}: {limit!r} is not an integer")
    return {key: int(value[key]) for key in value}


def _reached(limit: int | None, count: int) -> bool:
    return limit is not None and limit >= 0 and count >= limit


class ClientLimits:
    """The limits in force and the counts they are checked against, for one broker."""

    name = VHOST_LIMITS_COMPONENT  # the vhost-limits parameter component

    def __init__(self, user_limits_path: Path) -> None:
        self.user_limits_path = Path(user_limits_path)
        self.vhost_limits: dict[str, dict[str, int]] = {}
        self.user_limits: dict[str, dict[str, int]] = {}
        self.connections_by_vhost: Counter[str] = Counter()
        self.connections_by_user: Counter[str] = Counter()
        self.channels_by_user: Counter[str] = Counter()
        # Told the vhost whose limits changed (the broker passes max-queues on to the vhost).
        self.vhost_limits_changed: Callable[[str], None] = lambda _vhost: None

    # -- the vhost-limits component --------------------------------------------------------------
    def validate(self, vhost: str, name: str, value: dict) -> None:
        if name != VHOST_LIMITS_NAME:
            raise ParameterError(f"vhost-limits: parameter name must be '{VHOST_LIMITS_NAME}', not '{name}'")
        check_limits(value, VHOST_LIMIT_KEYS, "vhost-limits")

    def apply(self, vhost: str, name: str, value: dict) -> None:
        self.vhost_limits[vhost] = check_limits(value, VHOST_LIMIT_KEYS, "vhost-limits")
        self.vhost_limits_changed(vhost)

    def remove(self, vhost: str, name: str) -> None:
        self.vhost_limits.pop(vhost, None)
        self.vhost_limits_changed(vhost)

    # -- user limits ---------------------------------------------------------------------------
    def load(self) -> None:
        stored = read_json(self.user_limits_path, {})
        self.user_limits = {}
        if isinstance(stored, dict):
            for user, limits in stored.items():
                try:
                    self.user_limits[str(user)] = check_limits(limits, USER_LIMIT_KEYS, f"user '{user}'")
                except ParameterError:
                    continue

    def set_user_limits(self, user: str, limits: Mapping[str, Any]) -> None:
        """Replace a user's limits (an empty object clears them), saved at once."""
        checked = check_limits(limits, USER_LIMIT_KEYS, "user-limits")
        updated = dict(self.user_limits)
        if checked:
            updated[user] = checked
        else:
            updated.pop(user, None)
        write_json_atomic(self.user_limits_path, updated)
        self.user_limits = updated

    def clear_user_limit(self, user: str, key: str) -> bool:
        """Remove one limit of a user (``all``: every one); False when it was not set."""
        current = dict(self.user_limits.get(user, {}))
        if key == "all":
            if not current:
                return False
            current = {}
        elif current.pop(key, None) is None:
            return False
        self.set_user_limits(user, current)
        return True

    def drop_user(self, user: str) -> None:
        if user in self.user_limits:
            self.set_user_limits(user, {})

    # -- checks and books ----------------------------------------------------------------------
    def check_connection(self, vhost: str, user: str) -> None:
        """Refuse a connection opening on ``vhost`` as ``user`` when a limit is reached, as RabbitMQ does."""
        limit = self.vhost_limits.get(vhost, {}).get("max-connections")
        if _reached(limit, self.connections_by_vhost[vhost]):
            raise BrokerConnectionError(NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{user}': "
                                                   f"connection limit ({limit}) is reached")
        limit = self.user_limits.get(user, {}).get("max-connections")
        if _reached(limit, self.connections_by_user[user]):
            raise BrokerConnectionError(NOT_ALLOWED, f"Connection refused for user '{user}': "
                                                   f"user connection limit ({limit}) is reached")

    def connection_opened(self, vhost: str, user: str) -> None:
        """Count a connection admitted on ``vhost`` as ``user``."""
        self.connections_by_vhost[vhost] += 1
        self.connections_by_user[user] += 1

    def connection_closed(self, vhost: str, user: str) -> None:
        _decrement(self.connections_by_vhost, vhost)
        _decrement(self.connections_by_user, user)

    def channel_opened(self, user: str) -> None:
        limit = self.user_limits.get(user, {}).get("max-channels")
        if _reached(limit, self.channels_by_user[user]):
            raise BrokerConnectionError(NOT_ALLOWED, f"number of channels opened for user '{user}' has reached "
                                                   f"the maximum allowed user limit of ({limit})")
        self.channels_by_user[user] += 1

    def channels_closed(self, user: str, count: int = 1) -> None:
        _decrement(self.channels_by_user, user, count)

    def max_queues(self, vhost: str) -> int | None:
        """The vhost's max-queues limit, None when it has none (the vhost checks it at declare)."""
        limit = self.vhost_limits.get(vhost, {}).get("max-queues")
        return limit if limit is not None and limit >= 0 else None

    # -- listings --------------------------------------------------------------------------------
    def vhost_limits_json(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return [{"vhost": name, "value": dict(limits)} for name, limits in sorted(self.vhost_limits.items())
                if limits and (vhost is None or name == vhost)]

    def user_limits_json(self, user: str | None = None) -> list[dict[str, Any]]:
        return [{"user": name, "value": dict(limits)} for name, limits in sorted(self.user_limits.items())
                if limits and (user is None or name == user)]


def queue_limit_error(queue: str, vhost: str, limit: int) -> BrokerChannelError:
    """RabbitMQ's refusal of a queue declare over the vhost's max-queues."""
    return BrokerChannelError(PRECONDITION_FAILED,
                              f"cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({limit}) is reached")


def _decrement(counter: Counter[str], key: str, count: int = 1) -> None:
    left = counter[key] - count
    if left > 0:
        counter[key] = left
    else:
        counter.pop(key, None)
