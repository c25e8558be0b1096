"""Publishing with publisher confirms over one channel, with a bounded window of unconfirmed messages.

Messages are encoded into large byte chunks (MessageEncoder) and sent with one syscall per chunk;
confirms are read between chunks. The publisher fails (PublishError) as soon as the broker nacks
a message, returns one as unroutable (mandatory), closes the channel, or the connection drops
with messages unconfirmed -- so the Spark task fails and Spark retries it (at-least-once).
"""

from __future__ import annotations

import time

from pamqp import commands

from lavinpy.wire.client import (
    BASIC_ACK,
    BASIC_NACK,
    BASIC_RETURN,
    FRAME_END_BYTE,
    ContentPacker,
    method_id,
    parse_ack,
    parse_return,
    publish_method_frame,
    single_content_frames,
    split_content_frames,
)
from lavinpy.wire.constants import FRAME_METHOD

from .client import AMQPClientError, BrokerClosed, Connection


class PublishError(AMQPClientError):
    """Some messages were not safely accepted by the broker."""


class MessageEncoder:
    """Encodes messages into the frames of basic.publish + content header + body frames.

    Method frames are cached per (exchange, routing key) and header packers per property list, so
    a message with a body that fits one frame costs one struct pack and three appends.
    """

    def __init__(self, channel: int, frame_max: int, mandatory: bool) -> None:
        self.channel = channel
        self.frame_max = frame_max
        self.mandatory = mandatory
        self.max_inline_body = frame_max - 8  # the largest body sent in one frame
        self._methods: dict[tuple[str, str], bytes] = {}
        self._packers: dict[bytes, ContentPacker] = {}

    def method_frame(self, exchange: str, routing_key: str) -> bytes:
        key = (exchange, routing_key)
        frame = self._methods.get(key)
        if frame is None:
            if len(self._methods) > 10000:  # many distinct routing keys: don't grow without bound
                self._methods.clear()
            frame = publish_method_frame(self.channel, exchange, routing_key, self.mandatory)
            self._methods[key] = frame
        return frame

    def packer(self, properties: bytes) -> ContentPacker:
        packer = self._packers.get(properties)
        if packer is None:
            if len(self._packers) > 10000:
                self._packers.clear()
            packer = ContentPacker(self.channel, properties)
            self._packers[properties] = packer
        return packer

    def append(self, out: bytearray, method_frame: bytes, packer: ContentPacker, properties: bytes,
               body: bytes) -> None:
        """Append one message to out (properties must be the packer's property list)."""
        out += method_frame
        if 0 < len(body) <= self.max_inline_body:
            out += packer.pack(len(body))
            out += body
            out += FRAME_END_BYTE
        elif body:
            out += split_content_frames(self.channel, properties, body, self.frame_max)
        else:
            out += single_content_frames(self.channel, properties, body)

    def append_any(self, out: bytearray, method_frame: bytes, properties: bytes, body: bytes) -> None:
        """Append one message whose property list changes from message to message."""
        out += method_frame
        if len(body) <= self.max_inline_body:
            out += single_content_frames(self.channel, properties, body)
        else:
            out += split_content_frames(self.channel, properties, body, self.frame_max)


class ConfirmPublisher:
    """One channel in confirm mode (or not, if confirm=False) on an open Connection."""

    def __init__(self, conn: Connection, *, confirm: bool = True, mandatory: bool = True,
                 max_in_flight: int = 20000, confirm_timeout: float = 120.0) -> None:
        self.conn = conn
        self.confirm = confirm
        self.mandatory = mandatory
        self.max_in_flight = max(1, max_in_flight)
        self.confirm_timeout = confirm_timeout
        self.channel = conn.open_channel()
        if confirm:
            conn.call(self.channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.encoder = MessageEncoder(self.channel, conn.frame_max, mandatory)
        self.published = 0          # delivery tags 1..published have been sent
        self._acked_upto = 0        # every tag <= this is confirmed
        self._acked_above: set[int] = set()  # single confirms beyond _acked_upto (out of order)
        self.nacked = 0
        self.returned = 0
        self._first_return: tuple[int, str, str, str] | None = None
        self._first_nack: int | None = None

    # --- state ------------------------------------------------------------------------------------
    @property
    def unconfirmed(self) -> int:
        return self.published - self._acked_upto - len(self._acked_above)

    # --- publishing -------------------------------------------------------------------------------
    def send_encoded(self, data: bytes | bytearray, count: int) -> None:
        """Send `count` messages already encoded by self.encoder, respecting the confirm window."""
        if self.confirm:
            while self.unconfirmed > 0 and self.unconfirmed + count > self.max_in_flight:
                self._pump(self.confirm_timeout, waiting_for="confirms within the in-flight window")
        try:
            self.conn.send(data)
        except AMQPClientError as exc:
            raise self._lost(exc) from exc
        self.published += count
        self._pump(0.0)

    def publish(self, exchange: str, routing_key: str, body: bytes, properties: bytes = b"\x00\x00") -> None:
        """Publish one message (convenience; the Spark writer encodes whole batches instead)."""
        out = bytearray()
        enc = self.encoder
        enc.append(out, enc.method_frame(exchange, routing_key), enc.packer(properties), properties, body)
        self.send_encoded(out, 1)

    def wait_for_confirms(self) -> None:
        """Block until every published message is confirmed; raise PublishError on any failure."""
        if not self.confirm:
            return
        deadline = time.monotonic() + self.confirm_timeout
        while self.unconfirmed > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishError(f"{self.unconfirmed} of {self.published} messages still unconfirmed after "
                                   f"{self.confirm_timeout:.0f}s (broker {self.conn.params.safe_url()})")
            self._pump(remaining, waiting_for="the last confirms")
        self._check()

    def close(self) -> None:
        """Flush and close the channel (returns that arrive before close-ok still count)."""
        try:
            self.conn.close_channel(self.channel)
        except BrokerClosed as exc:
            raise PublishError(self._closed_text(exc)) from exc
        except AMQPClientError as exc:
            raise self._lost(exc) from exc
        self._check()

    # --- incoming frames --------------------------------------------------------------------------
    def _pump(self, timeout: float, waiting_for: str = "") -> None:
        try:
            frames = self.conn.read_frames(timeout)
        except BrokerClosed as exc:
            raise PublishError(self._closed_text(exc)) from exc
        except AMQPClientError as exc:
            raise self._lost(exc) from exc
        if not frames and timeout > 0 and waiting_for:
            raise PublishError(f"timed out after {timeout:.0f}s waiting for {waiting_for}: "
                               f"{self.unconfirmed} of {self.published} messages unconfirmed "
                               f"(broker {self.conn.params.safe_url()})")
        ch = self.channel
        for ftype, fch, payload in frames:
            if ftype != FRAME_METHOD or fch != ch:
                continue  # content of a basic.return, or frames of another channel
            mid = method_id(payload)
            if mid == BASIC_ACK:
                self._on_ack(*parse_ack(payload))
            elif mid == BASIC_NACK:
                tag, multiple = parse_ack(payload)
                first = self._acked_upto + 1 if multiple else tag
                self.nacked += self._on_ack(tag, multiple)
                if self._first_nack is None:
                    self._first_nack = first
            elif mid == BASIC_RETURN:
                self.returned += 1
                if self._first_return is None:
                    self._first_return = parse_return(payload)
        self._check()

    def _on_ack(self, tag: int, multiple: bool) -> int:
        """Mark tag (and all below if multiple) confirmed; returns how many became confirmed."""
        before = self.unconfirmed
        if multiple:
            if tag > self._acked_upto:
                self._acked_upto = tag
                if self._acked_above:
                    self._acked_above = {t for t in self._acked_above if t > tag}
        elif tag > self._acked_upto:
            self._acked_above.add(tag)
        above = self._acked_above
        while above and (self._acked_upto + 1) in above:
            self._acked_upto += 1
            above.discard(self._acked_upto)
        return before - self.unconfirmed

    def _check(self) -> None:
        if self.nacked:
            raise PublishError(f"the broker nacked {self.nacked} of {self.published} messages (first delivery "
                               f"tag {self._first_nack}); they were not stored")
        if self.returned and self._first_return is not None:
            code, text, exchange, routing_key = self._first_return
            raise PublishError(f"{self.returned} of {self.published} messages were returned as unroutable "
                               f"({code} {text}: exchange {exchange!r}, routing key {routing_key!r}); bind a "
                               f"queue that matches, or set mandatory=false to let the broker drop them")

    def _closed_text(self, exc: BrokerClosed) -> str:
        return (f"the broker closed the {exc.scope} while publishing: {exc.reply_code} {exc.reply_text} "
                f"({self.unconfirmed} of {self.published} messages unconfirmed)")

    def _lost(self, exc: Exception) -> PublishError:
        return PublishError(f"{exc}; {self.unconfirmed} of {self.published} messages were left unconfirmed "
                            f"(the Spark task fails so that Spark retries it: delivery is at-least-once)")
