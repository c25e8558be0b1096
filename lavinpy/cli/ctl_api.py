"""lavinpyctl's client of the management API (standard library only) and its exit codes.

Exit codes are rabbitmqctl's, so scripts written for it read lavinpy's the same way: 0 done, 1 the
broker refused or failed the request, 64 bad usage (EX_USAGE: an unknown command, option or
column), 65 a named vhost does not exist (EX_DATAERR), 69 the broker is unreachable (EX_UNAVAILABLE),
75 a wait timed out (EX_TEMPFAIL).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from lavinpy.progress import Progress

DEFAULT_URI = "http://guest:guest@127.0.0.1:15672"
EXIT_OK, EXIT_BROKER_ERROR, EXIT_USAGE, EXIT_DATAERR, EXIT_UNAVAILABLE, EXIT_TEMPFAIL = 0, 1, 64, 65, 69, 75


class CtlError(Exception):
    def __init__(self, message: str, code: int, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status  # the API's HTTP status, when it answered with an error


class Api:
    """A tiny client of the management API."""

    def __init__(self, uri: str, timeout: float = 30.0, token: str = "") -> None:
        parts = urlsplit(uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(f"--uri must look like http://user:password@host:15672, not {uri!r}", EXIT_USAGE)
        port = f":{parts.port}" if parts.port else ""
        self.base = f"{parts.scheme}://{parts.hostname}{port}{parts.path.rstrip('/')}"
        user = unquote(parts.username or "guest")
        password = unquote(parts.password or "guest")
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        if token:  # an OAuth 2 access token (the broker's oauth2 backend): it names the user
            self.auth = f"Bearer {token}"
        self.timeout = timeout

    def as_user(self, user: str, password: str) -> Api:
        """The same broker, reached with other credentials."""
        other = Api(self.base, self.timeout)
        other.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        return other

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
             accept: tuple[int, ...] = (), progress: str | None = None) -> Any:
        """The decoded JSON reply; an error status not in ``accept`` raises CtlError. ``progress``
        names the transfer for a progress report on stderr when the body or the reply is large."""
        data = json.dumps(body).encode() if body is not None else None
        sent: Any = data
        if data is not None and progress is not None:
            sent = _chunks_with_progress(data, f"{progress}: sending")
        request = urllib.request.Request(self.base + path, data=sent, method=method)
        if data is not None:
            request.add_header("Content-Length", str(len(data)))
        request.add_header("Authorization", self.auth)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                if progress is None:
                    payload = response.read()
                else:
                    payload = _read_with_progress(response, f"{progress}: receiving")
        except urllib.error.HTTPError as e:
            if e.code in accept:
                payload = e.read()
            else:
                raise CtlError(_error_text(e), EXIT_BROKER_ERROR, e.code) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise CtlError(f"cannot reach the broker at {self.base}: {reason}", EXIT_UNAVAILABLE) from None
        return json.loads(payload) if payload.strip() else None


PROGRESS_MIN_BYTES = 1 << 20  # smaller transfers take no time worth reporting
_CHUNK = 1 << 16


def _chunks_with_progress(data: bytes, what: str) -> Iterator[bytes]:
    with Progress(what, len(data), unit="bytes", min_total=PROGRESS_MIN_BYTES) as progress:
        for at in range(0, len(data), _CHUNK):
            yield data[at:at + _CHUNK]
            progress.advance(min(_CHUNK, len(data) - at))


def _read_with_progress(response: Any, what: str) -> bytes:
    try:
        total = int(response.headers.get("Content-Length") or 0)
    except ValueError:
        total = 0
    parts = []
    with Progress(what, total, unit="bytes", min_total=PROGRESS_MIN_BYTES) as progress:
        while chunk := response.read(_CHUNK):
            parts.append(chunk)
            progress.advance(len(chunk))
    return b"".join(parts)


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read() or b"{}")
    except ValueError:
        body = {}
    reason = body.get("reason") or body.get("error") or e.reason
    return f"Error: {e.code} {reason}"


def q(name: str) -> str:
    """A name as one path segment."""
    return quote(name, safe="")
