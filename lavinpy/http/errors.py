"""RabbitMQ's error JSON, ``{"error": ..., "reason": ...}``, from one mapping of the model's errors.

Broker operations raise ``broker.errors.BrokerError`` with an error kind; the HTTP status and error
word are:

    kind                          HTTP  "error"
    ACCESS_REFUSED                401   not_authorised (as RabbitMQ, which answers refusals with 401)
    NOT_FOUND                     404   Object Not Found
    RESOURCE_LOCKED               405   resource_locked
    PRECONDITION_FAILED           400   bad_request
    NOT_ALLOWED                   400   bad_request
    NOT_IMPLEMENTED               501   not_implemented
    any other                     400   bad_request

The reason is the error's detail (its text without the kind's name), as RabbitMQ's API shows it.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..broker.errors import BrokerError, ErrorKind

BAD_REQUEST = (400, "bad_request")
KIND_TO_HTTP: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.ACCESS_REFUSED: (401, "not_authorised"),
    ErrorKind.NOT_FOUND: (404, "Object Not Found"),
    ErrorKind.RESOURCE_LOCKED: (405, "resource_locked"),
    ErrorKind.PRECONDITION_FAILED: BAD_REQUEST,
    ErrorKind.NOT_ALLOWED: BAD_REQUEST,
    ErrorKind.NOT_IMPLEMENTED: (501, "not_implemented"),
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


def from_broker_error(exc: BrokerError) -> web.Response:
    status, error = KIND_TO_HTTP.get(exc.kind, BAD_REQUEST)
    return error_response(status, error, exc.detail)


async def read_json(request: web.Request) -> Any:
    """The request body as JSON; an empty body is ``{}``; anything unparsable or over
    ``management_max_body_size`` is a 400 naming why (as RabbitMQ's)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise bad_request(f"Exceeded HTTP request body size limit of {request.client_max_size} bytes "
                          "(management_max_body_size)") from None
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"body is not valid JSON: {e}") from None
    except RecursionError:  # the decoder recurses once per level: a body of 10,000 '[' is not an internal error
        raise bad_request("body is not valid JSON: nested too deeply") from None


async def read_json_object(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("body must be a JSON object")
    return body
