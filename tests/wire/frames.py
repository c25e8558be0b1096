"""Hand-built AMQP frames and comparable forms of the reader's events, shared by the reader's tests."""

from __future__ import annotations

import struct

from lavinpy.wire.constants import PROTOCOL_HEADER
from lavinpy.wire.reader import (
    BodyFrame,
    ContentMessage,
    ContentRun,
    FrameReader,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
)


def flatten(events: list) -> list:
    """Frame events with fused publishes (ContentMessage) expanded into their three frames."""
    out: list = []
    for event in events:
        out.extend(event.frames() if isinstance(event, (ContentMessage, ContentRun)) else [event])
    return out


def frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes((end,))


def shortstr(text: str) -> bytes:
    data = text.encode()
    return bytes((len(data),)) + data


def method(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    return frame(1, channel, struct.pack(">HH", class_id, method_id) + args)


def publish(channel: int, exchange: str, key: str, bits: int = 0) -> bytes:
    return method(channel, 60, 40, b"\x00\x00" + shortstr(exchange) + shortstr(key) + bytes((bits,)))


def header(channel: int, body_size: int, props: bytes = b"\x00\x00", class_id: int = 60) -> bytes:
    return frame(2, channel, struct.pack(">HHQ", class_id, 0, body_size) + props)


HEARTBEAT = frame(8, 0, b"")


def opened(frame_max: int = 131072) -> FrameReader:
    reader = FrameReader(frame_max)
    assert reader.feed(PROTOCOL_HEADER) == []
    assert reader.expect_protocol_header is False
    return reader


def describe(event: object) -> tuple:
    """A comparable form of a frame event."""
    if isinstance(event, MethodFrame):
        m = event.method
        attrs = tuple((name, getattr(m, name)) for name in type(m).__slots__)
        return ("method", event.channel, m.name, attrs)
    if isinstance(event, HeaderFrame):
        return ("header", event.channel, event.class_id, event.body_size, event.properties)
    if isinstance(event, BodyFrame):
        return ("body", event.channel, event.data)
    assert isinstance(event, HeartbeatFrame)
    return ("heartbeat",)


def mutate(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    """data with the byte at each flip's index (wrapped to its length) set to the flip's value: frames
    damaged where a draw says, for the parsers' fuzz tests."""
    out = bytearray(data)
    for at, value in flips:
        if out:
            out[at % len(out)] = value
    return bytes(out)

