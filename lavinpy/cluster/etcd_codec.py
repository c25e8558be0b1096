"""The etcd v3 JSON gateway's shapes: keys and values in base64, the answers' error forms, and which
errors say that a member cannot serve now (so that another may). Pure functions; etcd.py does the I/O."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from typing import Any

# Forwarded by the gateway as gRPC metadata: a member without a leader refuses requests at once and
# cancels watch streams (after ~3 election timeouts) instead of leaving them waiting.
_HEADERS = {"Grpc-Metadata-hasleader": "true"}

# gRPC codes that say "this member cannot serve now": Unavailable, DeadlineExceeded.
_MEMBER_CODES = {4, 14}
_MEMBER_MESSAGES = ("no leader", "not leader", "leader changed", "timed out", "deadline exceeded", "server stopped",
                    "unhealthy cluster", "too many requests")


class EtcdError(Exception):
    """etcd answered with an error, or no endpoint could be reached."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered (in time, or with a leader)."""


class EtcdAuthFailed(EtcdError):
    """etcd refused the client's user name or password."""


class EtcdCompacted(EtcdError):
    """A watch's start revision is gone from etcd's history: read the state again, then watch from there."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    @property
    def text(self) -> str:
        return self.value.decode()


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "PUT" or "DELETE"
    kv: KeyValue


@dataclass(frozen=True)
class Compare:
    """One txn condition: ``target`` is CREATE, MOD, VALUE or LEASE (compared for equality)."""

    key: str
    target: str
    value: int | str | bytes

    def encode(self) -> dict[str, Any]:
        field = {"CREATE": "create_revision", "MOD": "mod_revision", "VALUE": "value", "LEASE": "lease"}[self.target]
        value = self.value
        if self.target == "VALUE":
            value = _b64(value if isinstance(value, bytes) else str(value).encode())
        else:
            value = str(value)
        return {"key": _b64(self.key), "target": self.target, "result": "EQUAL", field: value}


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str) -> str:
    """The range_end covering every key that starts with ``prefix``."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    raw[-1] += 1
    return raw.decode("latin-1")


def _kv(item: dict[str, Any]) -> KeyValue:
    return KeyValue(key=_unb64(item.get("key")).decode(), value=_unb64(item.get("value")),
                    create_revision=int(item.get("create_revision", 0)),
                    mod_revision=int(item.get("mod_revision", 0)), lease=int(item.get("lease", 0)))


def put_op(key: str, value: str | bytes, lease: int = 0) -> dict[str, Any]:
    """A put, for a txn's success or failure branch."""
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete_op(key: str) -> dict[str, Any]:
    """A delete of one key, for a txn's success or failure branch (no error when it is absent)."""
    return {"request_delete_range": {"key": _b64(key)}}


def range_op(key: str) -> dict[str, Any]:
    """A read of one key, for a txn's success or failure branch."""
    return {"request_range": {"key": _b64(key)}}


def _error_of(data: dict[str, Any]) -> tuple[int | None, str] | None:
    """(gRPC code, message) of an error answer: unary calls put them at the top level, streamed calls
    (keepalive, watch) nest them in "error"."""
    error = data.get("error")
    if error is None:
        return None
    if isinstance(error, dict):
        return error.get("grpc_code"), str(error.get("message", ""))
    return data.get("code"), str(data.get("message") or error)


def _member_cannot_serve(status: int, error: tuple[int | None, str] | None) -> bool:
    """Whether an answer says this member cannot serve now, so another member may."""
    if status >= 500:
        return True
    if error is None:
        return False
    code, message = error
    return code in _MEMBER_CODES or any(m in message for m in _MEMBER_MESSAGES)


# What etcd answers to a request whose token it no longer takes: the client authenticates again.
_TOKEN_MESSAGES = ("invalid auth token", "revision in header is old", "user name is empty")


def _token_rejected(message: str) -> bool:
    return any(m in message for m in _TOKEN_MESSAGES)


def _parse(text: str) -> dict[str, Any] | None:
    """The first JSON object of an answer; None when it is not JSON (not etcd's gateway answering)."""
    first = text.strip().splitlines()[0] if text.strip() else "{}"
    try:
        data = json.loads(first)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _describe(e: BaseException, budget: float) -> str:
    return f"no answer within {budget:.2f} s" if isinstance(e, TimeoutError) else repr(e)


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
