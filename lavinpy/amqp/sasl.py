"""The user and password of a client's connection.start-ok, by its SASL mechanism (PLAIN, AMQPLAIN)."""

from __future__ import annotations

from typing import Any

from pamqp import decode

from ..wire.constants import ACCESS_REFUSED, INTERNAL_MECHANISM, SYNTAX_ERROR
from ..wire.errors import AMQPConnectionError


def sasl_credentials(mechanism: str, response: Any) -> tuple[str, str]:
    """(user, password) of a start-ok's ``response``; AMQPConnectionError for a malformed one or an
    unsupported mechanism."""
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response)
    if mechanism in ("PLAIN", INTERNAL_MECHANISM):  # the internal one: user and the node's token
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise AMQPConnectionError(ACCESS_REFUSED, "malformed PLAIN response")
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        try:
            _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
        except Exception:
            raise AMQPConnectionError(SYNTAX_ERROR, "malformed AMQPLAIN response") from None
        login, password = table.get("LOGIN", ""), table.get("PASSWORD", "")
        if isinstance(login, bytes):
            login = login.decode("utf-8", "replace")
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        return str(login), str(password)
    raise AMQPConnectionError(ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'")
