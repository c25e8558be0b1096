"""The management API as a test reads it: vhosts, queue depths, messages taken off a queue.

Only the standard library (urllib): a test suite gets these helpers without another HTTP client.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote


class APIError(RuntimeError):
    """The management API answered with an error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


@dataclass(frozen=True)
class Message:
    """A message taken off a queue through the management API."""

    body: bytes
    exchange: str
    routing_key: str
    redelivered: bool
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)


class ManagementAPI:
    """Calls to one broker's HTTP API with one user's credentials."""

    def __init__(self, http_url: str, user: str, password: str, timeout: float = 30.0) -> None:
        self.http_url = http_url
        self._auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """The decoded JSON answer (None when empty); APIError on an error status."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.http_url + path, data=data, method=method,
                                         headers={"Authorization": self._auth, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            raise APIError(method, path, e.code, e.read().decode(errors="replace"))
        return json.loads(raw) if raw.strip() else None

    def create_vhost(self, name: str, user: str) -> None:
        """The vhost, with every permission on it for ``user``."""
        self.call("PUT", f"/api/vhosts/{quote(name, safe='')}", {})
        self.call("PUT", f"/api/permissions/{quote(name, safe='')}/{quote(user, safe='')}",
                  {"configure": ".*", "write": ".*", "read": ".*"})

    def delete_vhost(self, name: str) -> None:
        try:
            self.call("DELETE", f"/api/vhosts/{quote(name, safe='')}")
        except APIError as e:
            if e.status != 404:
                raise

    def queues(self, vhost: str) -> list[str]:
        return [q["name"] for q in self.call("GET", f"/api/queues/{quote(vhost, safe='')}")]

    def message_count(self, queue: str, vhost: str) -> int:
        """Messages in the queue, ready and unacknowledged."""
        info = self.call("GET", f"/api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}")
        return int(info.get("messages") or 0)

    def get(self, queue: str, vhost: str, count: int, requeue: bool) -> list[Message]:
        answer = self.call("POST", f"/api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}/get",
                           {"count": count, "ackmode": "ack_requeue_true" if requeue else "ack_requeue_false",
                            "encoding": "base64"})
        return [Message(base64.b64decode(m["payload"]) if m.get("payload_encoding") == "base64"
                        else str(m["payload"]).encode(),
                        m.get("exchange", ""), m.get("routing_key", ""), bool(m.get("redelivered")),
                        m.get("properties") or {})
                for m in answer]

    def wait_for_messages(self, queue: str, vhost: str, count: int, timeout: float) -> int:
        """Poll until the queue holds at least ``count`` messages; TimeoutError when it does not in time."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                have = self.message_count(queue, vhost)
            except APIError as e:
                if e.status != 404:  # a queue the code under test has not declared yet
                    raise
                have = -1
            if have >= count:
                return have
            if time.monotonic() >= deadline:
                raise TimeoutError(f"queue {queue!r} in vhost {vhost!r} holds {max(have, 0)} messages, "
                                   f"not {count}, after {timeout} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
