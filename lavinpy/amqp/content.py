"""Content assembly for a channel: header and body frames into one message.

A body that arrives in one frame is published from that frame (the fast path). A larger body that
arrives in several frames is written to the connection's spool (an unlinked file in the data dir)
frame by frame, so a slow or large message costs disk, not heap; at completion it is mapped
read-only and published from the mapping. Uncommitted transactional publishes are spooled the same
way and read back at tx.commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ..wire.constants import FRAME_ERROR, PRECONDITION_FAILED, RESOURCE_ERROR, UNEXPECTED_FRAME
from ..wire.errors import AMQPChannelError, AMQPConnectionError
from ..wire.reader import HeaderFrame
from .spool import SPOOL_MIN_BODY, SpooledBody

if TYPE_CHECKING:
    from .connection import AMQPConnection

class PendingPublish(NamedTuple):
    """A publish inside a transaction, its body on disk until tx.commit."""

    exchange: str
    routing_key: str
    mandatory: bool
    properties: bytes
    body: SpooledBody


class ContentAssembly:
    """Mixin for Channel: content header and body frames."""

    id: int
    conn: AMQPConnection
    in_content: bool
    _header_seen: bool
    _publish: Any
    _properties: bytes
    _body_size: int
    _body_parts: list[bytes]
    _body_received: int
    _spooled: SpooledBody | None
    _tx_publishes: list[PendingPublish]

    def _reset_content(self) -> None:
        self.in_content = False
        self._header_seen = False
        self._publish = None
        self._body_parts = []
        self._body_received = 0
        if self._spooled is not None:
            self._spooled.release()
            self._spooled = None

    def on_header(self, frame: HeaderFrame) -> None:
        if self._header_seen:
            raise AMQPConnectionError(UNEXPECTED_FRAME, f"unexpected content header on channel {self.id}")
        if frame.class_id != 60:
            raise AMQPConnectionError(FRAME_ERROR, f"content header for class {frame.class_id}, "
                                                   "expected class 60 (basic)")
        body_size = frame.body_size
        if body_size > self.conn.config.max_message_size:
            self._reset_content()
            self.close_with_error(AMQPChannelError(
                PRECONDITION_FAILED, f"message size {body_size} is larger than configured max size "
                                     f"{self.conn.config.max_message_size}", 60, 40), None)
            return
        self._header_seen = True
        self._properties = frame.properties
        self._body_size = body_size
        if body_size == 0:
            self._complete_publish(b"")

    def on_body(self, data: bytes) -> None:
        if not self._header_seen:
            raise AMQPConnectionError(UNEXPECTED_FRAME, f"expected content header on channel {self.id}, "
                                                        "got a content body frame")
        received = self._body_received + len(data)
        if received > self._body_size:
            raise AMQPConnectionError(
                FRAME_ERROR, f"content body on channel {self.id} is longer than the "
                             f"{self._body_size} bytes announced in its header")
        spooled = self._spooled
        if spooled is None and received == self._body_size:
            if self._body_parts:
                self._body_parts.append(data)
                data = b"".join(self._body_parts)
            self._complete_publish(data)
            return
        self._body_received = received
        if spooled is None and self._body_size <= SPOOL_MIN_BODY:
            self._body_parts.append(data)
            return
        try:
            if spooled is None:
                spooled = self._spooled = self.conn.body_spool().reserve(self._body_size)
                for part in self._body_parts:
                    spooled.write(part)
                self._body_parts = []
            spooled.write(data)
            if received < self._body_size:
                return
            body = spooled.read()
        except OSError as e:
            self._reset_content()
            self.close_with_error(AMQPChannelError(RESOURCE_ERROR, f"cannot store the message body: {e}",
                                                   60, 40), None)
            return
        self._spooled = None  # _complete_publish resets the content: the body stays with us
        try:
            self._complete_publish(body)
        finally:
            spooled.release()

    def _tx_publish(self, method: Any, properties: bytes, body: bytes | memoryview) -> None:
        """Hold a transactional publish until tx.commit, its body on disk."""
        spooled = self.conn.body_spool().reserve(len(body))
        try:
            spooled.write(body)
        except OSError as e:
            spooled.release()
            raise AMQPChannelError(RESOURCE_ERROR, f"cannot store the message body: {e}", 60, 40)
        self._tx_publishes.append(
            PendingPublish(method.exchange, method.routing_key, method.mandatory, properties, spooled))

    def _complete_publish(self, body: bytes | memoryview) -> None:
        raise NotImplementedError

    def close_with_error(self, error: AMQPChannelError, method: Any | None) -> None:
        raise NotImplementedError


def release_bodies(publishes: list[PendingPublish]) -> None:
    for publish in publishes:
        publish.body.release()
