"""RabbitMQ's error JSON, ``{"error": ..., "reason": ...}``, from one mapping of the model's errors.

Broker operations raise ``AMQPError`` with AMQP reply codes; the HTTP status and error word are:

    AMQP reply code               HTTP  "error"
    403 ACCESS_REFUSED            401   not_authorised (as RabbitMQ, which answers refusals with 401)
    404 NOT_FOUND                 404   Object Not Found
    405 RESOURCE_LOCKED           405   resource_locked
    406 PRECONDITION_FAILED       400   bad_request
    530 NOT_ALLOWED               400   bad_request
    540 NOT_IMPLEMENTED           501   not_implemented
    541 INTERNAL_ERROR            500   internal_error
    any other                     400   bad_request

The reason is the AMQP text without its reply-code name, as RabbitMQ's API shows it.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..wire.constants import (
    ACCESS_REFUSED,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
)
from ..wire.errors import AMQPError

BAD_REQUEST = (400, "bad_request")
REPLY_CODE_TO_HTTP: dict[int, tuple[int, str]] = {
    ACCESS_REFUSED: (401, "not_authorised"),
    NOT_FOUND: (404, "Object Not Found"),
    RESOURCE_LOCKED: (405, "resource_locked"),
    PRECONDITION_FAILED: BAD_REQUEST,
    NOT_ALLOWED: BAD_REQUEST,
    NOT_IMPLEMENTED: (501, "not_implemented"),
    INTERNAL_ERROR: (500, "internal_error"),
}


class ApiError(Exception):
    """An HTTP-level error (bad JSON, bad query parameter, missing object) with RabbitMQ's JSON."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


def not_found(reason: str = "Not Found") -> ApiError:
    return ApiError(404, "Object Not Found", reason)


def error_response(status: int, error: str, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": error, "reason": reason}, status=status, headers=headers)


def from_amqp_error(exc: AMQPError) -> web.Response:
    status, error = REPLY_CODE_TO_HTTP.get(exc.reply_code, BAD_REQUEST)
    return error_response(status, error, exc.detail)


async def read_json(request: web.Request) -> Any:
    """The request body as JSON; an empty body is ``{}``; anything unparsable is a 400 naming why."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"body is not valid JSON: {e}") from None


async def read_json_object(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("body must be a JSON object")
    return body
