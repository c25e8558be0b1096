"""What keeps another web site from changing the broker through a logged-in browser (cross-site request
forgery): a page elsewhere can make the browser send a form or a "simple" fetch to the API, and the
browser adds the Basic credentials it has cached for this origin.

Two rules, on every request that changes something (PUT, POST, DELETE, PATCH) under ``/api/``:

- **JSON bodies only**: a request with a body, or with any ``Content-Type``, must say
  ``application/json`` (or a ``+json`` type); anything else is 415 ``unsupported_media_type``, as
  RabbitMQ's API (its handlers accept ``application/json``). A cross-site page can send
  ``text/plain``, a form or multipart without asking, but ``application/json`` only after a CORS
  preflight, which this server never grants.
- **Same origin**: a request carrying an ``Origin`` header (browsers add it to every POST, PUT and
  DELETE) whose scheme-less host and port differ from the request's ``Host`` (or ``X-Forwarded-Host``,
  which a browser cannot set on a cross-site request) is 403 ``forbidden``. Tools (curl,
  rabbitmqadmin, lavinpyctl, client libraries) send no ``Origin`` and are not affected.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from .errors import ApiError

API_PREFIX = "/api/"
CHANGING = frozenset({"PUT", "POST", "DELETE", "PATCH"})
DEFAULT_PORTS = {"http": 80, "https": 443}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _host_port(authority: str, scheme: str) -> tuple[str, int | None] | None:
    """(host, port) of a ``host[:port]`` text, the scheme's default port when it names none."""
    try:
        parts = urlsplit(f"//{authority.strip()}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower(), port if port is not None else DEFAULT_PORTS.get(scheme)


def same_origin(origin: str, hosts: list[str], scheme: str) -> bool:
    """Whether ``origin`` (an Origin header) names one of ``hosts`` (Host header values)."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or not parts.netloc:
        return False  # "null" (a sandboxed frame, a file) or something that is no web origin
    mine = _host_port(parts.netloc, parts.scheme)
    if mine is None:
        return False
    for host in hosts:
        # The Host header carries no scheme: its port defaults to the origin's scheme's (a TLS
        # terminator in front may serve https for a plain listener).
        theirs = _host_port(host, parts.scheme) if host else None
        if theirs is not None and theirs == mine:
            return True
    return False


def _json_type(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def check_request(request: web.Request) -> None:
    """ApiError 403 or 415 when a state-changing API request could have come from another site."""
    if request.method not in CHANGING or not request.path.startswith(API_PREFIX):
        return
    origin = request.headers.get("Origin")
    if origin is not None:
        hosts = [request.headers.get("Host", ""), request.headers.get("X-Forwarded-Host", "").split(",")[0]]
        if not same_origin(origin, hosts, request.scheme):
            raise ApiError(403, "forbidden",
                           f"cross-origin request refused: Origin {origin[:200]!r} is not this server")
    content_type = request.headers.get("Content-Type")
    has_body = request.body_exists or bool(request.content_length)
    if (has_body or content_type is not None) and not _json_type(content_type or ""):
        shown = (content_type or "none")[:100]
        raise ApiError(415, "unsupported_media_type",
                       f"a request that changes something takes a JSON body with Content-Type "
                       f"application/json, not {shown!r}")


@web.middleware
async def same_origin_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    check_request(request)
    return await handler(request)
