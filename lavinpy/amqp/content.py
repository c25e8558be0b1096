"""Content assembly for a channel: header and body frames into one message.

A body that arrives in one frame is published from that frame (the fast path). A larger body that
arrives in several frames is written frame by frame straight into its record's place in the vhost's
message store (reserved when its header arrives, see the store's reserved_record), so a slow or large
message costs disk, not heap, and its bytes are copied once, from the frame into the segment; at
completion the record is sealed and published from there. Where the channel takes no reservation
(properties checked or rewritten on publish, a direct reply, a transaction) the body goes to the
connection's spool (an unlinked file in the data dir) frame by frame instead, mapped read-only at
completion and published from the mapping; uncommitted transactional publishes are spooled the
same way and read back at tx.commit. Nothing here opens files: the spool and the reservations come
from the channel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..broker.ops import publish as publish_ops
from ..wire.constants import FRAME_ERROR, PRECONDITION_FAILED, RESOURCE_ERROR, UNEXPECTED_FRAME
from ..wire.errors import AMQPChannelError, AMQPConnectionError
from ..wire.reader import HeaderFrame, Publish
from .spool import SPOOL_MIN_BODY, BodySpool, SpooledBody

if TYPE_CHECKING:
    from ..broker.ops import Exchange, VHost
    from ..config import Config


class InPlaceBody(Protocol):
    """A record reserved in the message store for a body written as it arrives (the model's
    ``publish_ops.reserve``; the store's ReservedRecord)."""

    @property
    def complete_body(self) -> bool: ...
    @property
    def position(self) -> int: ...
    def write(self, data: bytes | memoryview) -> None: ...
    def seal(self) -> int: ...
    def body(self) -> memoryview: ...
    def release(self) -> None: ...


# reserve(method, exchange, properties, body size): a record for a large body, or None (spool it)
Reserve = Callable[["Publish", "Exchange", bytes, int], "InPlaceBody | None"]


def in_place(vhost: VHost, channel: TransactionHolder) -> Reserve:
    """The channel's reservations: a record for a large body unless the message is not stored as it
    came (properties checked or rewritten on publish) or waits for a tx.commit; the spool takes those
    bodies. (A direct reply's body is copied out of its record, which then goes with its segment.)"""
    def reserve(method: Publish, exchange: Exchange, properties: bytes, body_size: int) -> InPlaceBody | None:
        if channel.tx is not None or properties[0] & 0x03 or properties[1] & 0x10:
            return None  # reply_to, expiration or user_id present: see check_special_properties
        return publish_ops.reserve(vhost, exchange, method.routing_key, properties, body_size)
    return reserve


class TransactionHolder(Protocol):
    @property
    def tx(self) -> object | None: ...


class PendingPublish(NamedTuple):
    """A publish inside a transaction, its body on disk until tx.commit."""

    exchange: str
    routing_key: str
    mandatory: bool
    properties: bytes
    body: SpooledBody


class Content(NamedTuple):
    """A complete message: its basic.publish, the exchange resolved for it, properties and body.
    ``spooled``, when set, holds the body's mapping: release it once the message is published.
    ``stored``, when set, is the body's sealed record in the message store (``body`` a view of it):
    publish it at its position, then release it."""

    method: Publish
    exchange: Exchange
    properties: bytes
    body: bytes | memoryview
    spooled: SpooledBody | None
    stored: InPlaceBody | None = None

    def release(self) -> None:
        """Nothing to give up: the body was in the frame."""


class ContentAssembly:
    """The content header and body frames that follow one basic.publish."""

    __slots__ = ("channel_id", "config", "_spool", "_reserve", "method", "exchange", "header_seen", "properties",
                 "body_size", "parts", "received", "spooled", "stored")

    def __init__(self, channel_id: int, config: Config, spool: Callable[[], BodySpool],
                 reserve: Reserve | None = None) -> None:
        self.channel_id = channel_id
        self.config = config  # max_message_size
        self._spool = spool
        self._reserve = reserve
        self.method: Publish | None = None
        self.exchange: Exchange | None = None
        self.header_seen = False
        self.properties = b""
        self.body_size = 0
        # The frames so far of a small body (up to SPOOL_MIN_BODY) in several frames, joined as they come:
        # a list of them held a 1-byte frame in a 34-byte object and its slot (a client sending 32 KiB
        # bodies in 1-byte frames on 2,047 channels had a connection hold 0.5 GiB).
        self.parts = bytearray()
        self.received = 0
        self.spooled: SpooledBody | None = None  # a large body being written to the spool
        self.stored: InPlaceBody | None = None  # a large body being written into its record

    def begin(self, method: Publish, exchange: Exchange) -> None:
        self.method = method
        self.exchange = exchange

    def reset(self) -> None:
        self.header_seen = False
        self.method = None
        if self.parts:
            self.parts = bytearray()
        self.received = 0
        if self.spooled is not None:
            self.spooled.release()
            self.spooled = None
        if self.stored is not None:  # the body did not complete: its record stays incomplete, unreferenced
            self.stored.release()
            self.stored = None

    def _complete(self, body: bytes | memoryview, spooled: SpooledBody | None,
                  stored: InPlaceBody | None = None) -> Content:
        method, exchange, properties = self.method, self.exchange, self.properties
        assert method is not None and exchange is not None
        self.reset()
        return Content(method, exchange, properties, body, spooled, stored)

    def on_header(self, frame: HeaderFrame) -> Content | None:
        """The content header: the message when its body is empty. A body over the size limit is a
        channel error (AMQPChannelError, the content already dropped)."""
        if self.header_seen:
            raise AMQPConnectionError(UNEXPECTED_FRAME, f"unexpected content header on channel {self.channel_id}")
        if frame.class_id != 60:
            raise AMQPConnectionError(FRAME_ERROR, f"content header for class {frame.class_id}, "
                                                   "expected class 60 (basic)")
        body_size = frame.body_size
        max_size = self.config.max_message_size
        if body_size > max_size:
            self.reset()
            raise AMQPChannelError(PRECONDITION_FAILED, f"message size {body_size} is larger than configured "
                                                        f"max size {max_size}", 60, 40)
        self.header_seen = True
        self.properties = frame.properties
        self.body_size = body_size
        if body_size == 0:
            return self._complete(b"", None)
        if body_size > SPOOL_MIN_BODY and self._reserve is not None:
            assert self.method is not None and self.exchange is not None
            try:
                self.stored = self._reserve(self.method, self.exchange, frame.properties, body_size)
            except (OSError, ValueError) as e:  # disk full; a record too large for a segment file
                self.reset()
                raise AMQPChannelError(RESOURCE_ERROR, f"cannot store the message body: {e}", 60, 40)
        return None

    def on_body(self, data: bytes | memoryview) -> Content | None:
        """A content body frame: the message once its body is complete. A body the spool cannot
        take is a channel error (AMQPChannelError, the content already dropped)."""
        if not self.header_seen:
            raise AMQPConnectionError(UNEXPECTED_FRAME, f"expected content header on channel {self.channel_id}, "
                                                        "got a content body frame")
        received = self.received + len(data)
        if received > self.body_size:
            raise AMQPConnectionError(
                FRAME_ERROR, f"content body on channel {self.channel_id} is longer than the "
                             f"{self.body_size} bytes announced in its header")
        stored = self.stored
        if stored is not None:
            self.received = received
            stored.write(data)
            if received < self.body_size:
                return None
            stored.seal()
            self.stored = None  # the record stays with the caller, who releases it once published
            return self._complete(stored.body(), None, stored)
        spooled = self.spooled
        if spooled is None and received == self.body_size:
            if self.parts:
                self.parts += data
                data = bytes(self.parts)
                self.parts = bytearray()
            return self._complete(data, None)
        self.received = received
        if spooled is None and self.body_size <= SPOOL_MIN_BODY:
            self.parts += data
            return None
        try:
            if spooled is None:
                spooled = self.spooled = self._spool().reserve(self.body_size)
                if self.parts:
                    spooled.write(memoryview(self.parts))
                    self.parts = bytearray()
            spooled.write(data)
            if received < self.body_size:
                return None
            body = spooled.read()
        except OSError as e:
            self.reset()
            raise AMQPChannelError(RESOURCE_ERROR, f"cannot store the message body: {e}", 60, 40)
        self.spooled = None  # the body stays with the caller, who releases it once published
        return self._complete(body, spooled)

    def hold(self, method: Publish, properties: bytes, body: bytes | memoryview) -> PendingPublish:
        """A transactional publish, its body written to the spool until tx.commit."""
        spooled = self._spool().reserve(len(body))
        try:
            spooled.write(body)
        except OSError as e:
            spooled.release()
            raise AMQPChannelError(RESOURCE_ERROR, f"cannot store the message body: {e}", 60, 40)
        return PendingPublish(method.exchange, method.routing_key, method.mandatory, properties, spooled)


def release_bodies(publishes: list[PendingPublish]) -> None:
    for publish in publishes:
        publish.body.release()
