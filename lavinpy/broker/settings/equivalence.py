"""Redeclaring an existing queue or exchange: RabbitMQ's 406 "inequivalent arg" checks."""

from __future__ import annotations

from typing import Any

from ..errors import PRECONDITION_FAILED, BrokerChannelError


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


def inequivalent(arg: str, kind: str, name: str, vhost: str, received: Any, current: Any) -> BrokerChannelError:
    return BrokerChannelError(
        PRECONDITION_FAILED,
        f"inequivalent arg '{arg}' for {kind} '{name}' in vhost '{vhost}': "
        f"received '{_fmt(received)}' but current is '{_fmt(current)}'",
    )


def check_arguments(kind: str, name: str, vhost: str, received: dict, current: dict) -> None:
    for key in sorted(set(received) | set(current)):
        if received.get(key) != current.get(key):
            raise inequivalent(key, kind, name, vhost, received.get(key), current.get(key))
