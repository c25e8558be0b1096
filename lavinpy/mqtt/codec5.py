"""MQTT 5 packets: the reader of what a client sends (CONNECT with its and its will's properties,
PUBLISH, the acks with reason codes, SUBSCRIBE with subscription options, UNSUBSCRIBE, DISCONNECT)
and the encoders of what the server sends. Pure, strict as ``codec`` is for 3.1.1; what the spec
calls malformed or a protocol error raises ``MQTTProtocolError`` with the reason code to send."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import codec
from .codec import CONNACK, DISCONNECT, PUBLISH, SUBACK, UNSUBACK, Connect, Publish, Will
from .properties import encode_properties, malformed, protocol_error, read_properties

if TYPE_CHECKING:
    from collections import deque

LEVEL = 5
_EMPTY = b"\x00"  # an empty property block


@dataclass(slots=True)
class Connect5:
    connect: Connect
    properties: dict[str, Any]
    will_properties: dict[str, Any]


@dataclass(slots=True)
class SubscriptionRequest:
    topic_filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    subscription_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def is_v5_connect(data: bytes) -> bool:
    """Whether a CONNECT body names protocol ``MQTT`` at level 5."""
    return data[:6] == b"\x00\x04MQTT" and len(data) > 6 and data[6] == LEVEL


class _Body:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, size: int) -> bytes:
        if self.left() < size:
            raise malformed("packet ends early")
        value = self.data[self.pos:self.pos + size]
        self.pos += size
        return value

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def binary(self) -> bytes:
        return self.take(self.u16())

    def string(self, what: str = "string") -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise malformed(f"{what} is not UTF-8") from None
        if "\x00" in text:
            raise malformed(f"{what} contains U+0000")
        return text

    def properties(self, where: str) -> dict[str, Any]:
        found, self.pos = read_properties(self.data, self.pos, where)
        return found


def parse_connect(data: bytes) -> Connect5:
    body = _Body(data)
    protocol = body.string("protocol name")
    level = body.u8()
    flags = body.u8()
    if flags & 0x01:
        raise malformed("CONNECT with the reserved flag set")
    keepalive = body.u16()
    properties = body.properties("CONNECT")
    client_id = body.string("client identifier")
    will = None
    will_properties: dict[str, Any] = {}
    will_qos = (flags >> 3) & 0x03
    if flags & 0x04:
        if will_qos == 3:
            raise malformed("will QoS 3")
        will_properties = body.properties("WILL")
        topic = body.string("will topic")
        will = Will(topic, body.binary(), will_qos, bool(flags & 0x20))
    elif will_qos or flags & 0x20:
        raise malformed("will QoS or retain without a will")
    username = body.string("user name") if flags & 0x80 else None
    password = body.binary() if flags & 0x40 else None  # MQTT 5 allows a password without a user name
    if body.left():
        raise malformed(f"CONNECT has {body.left()} bytes past its end")
    connect = Connect(protocol, level, client_id, bool(flags & 0x02), keepalive, username, password, will)
    return Connect5(connect, properties, will_properties)


def parse_publish(flags: int, data: bytes) -> tuple[Publish, dict[str, Any]]:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise malformed("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise malformed("PUBLISH QoS 0 with DUP set")
    body = _Body(data)
    topic = body.string("topic name")
    packet_id = 0
    if qos:
        packet_id = body.u16()
        if not packet_id:
            raise malformed("PUBLISH with packet identifier 0")
    properties = body.properties("PUBLISH")
    return Publish(topic, data[body.pos:], qos, bool(flags & 0x01), dup, packet_id), properties


def publish_run_tail(backlog: deque[tuple[int, int, bytes]], flags: int, body: bytes, payload: bytes,
                     packet_id: int, max_payload: int) -> tuple[list[bytes], list[int]]:
    """As ``codec.publish_run_tail`` for MQTT 5 PUBLISH packets without properties (an empty property
    block after the packet id): the run of them at the head of ``backlog`` with the same topic, QoS
    and no retain, taken from it. A packet with properties, or any other, ends the run."""
    payloads, packet_ids = [payload], [packet_id]
    prefix = body[:2 + int.from_bytes(body[:2], "big")]  # the topic as it is on the wire
    start = len(prefix) + (2 if flags & 0x06 else 0)  # where the property block starts
    qos_bits = flags & 0x06
    while backlog:
        kind, other, data = backlog[0]
        if (kind != PUBLISH or other & 0x07 != qos_bits or (not qos_bits and other) or len(data) <= start
                or data[start] or len(data) - start - 1 > max_payload or not data.startswith(prefix)
                or (qos_bits and not (data[start - 2] or data[start - 1]))):
            break
        backlog.popleft()
        packet_ids.append(int.from_bytes(data[start - 2:start], "big") if qos_bits else 0)
        payloads.append(data[start + 1:])
    return payloads, packet_ids


def parse_ack(data: bytes, what: str) -> tuple[int, int, dict[str, Any]]:
    """PUBACK, PUBREC, PUBREL or PUBCOMP: (packet id, reason code, properties); the reason code and
    the properties may be left out (3.4.2.1)."""
    body = _Body(data)
    packet_id = body.u16()
    reason = body.u8() if body.left() else 0
    properties = body.properties("ACK") if body.left() else {}
    if body.left():
        raise malformed(f"{what} has {body.left()} bytes past its end")
    return packet_id, reason, properties


def parse_subscribe(data: bytes) -> tuple[int, list[SubscriptionRequest]]:
    body = _Body(data)
    packet_id = body.u16()
    if not packet_id:  # MQTT-2.2.1-3
        raise malformed("SUBSCRIBE with packet identifier 0")
    properties = body.properties("SUBSCRIBE")
    subscription_id = properties.get("subscription_identifier")
    requests: list[SubscriptionRequest] = []
    while body.left():
        topic_filter = body.string("topic filter")
        options = body.u8()
        if options & 0xC0:
            raise malformed(f"SUBSCRIBE options with reserved bits {options:#x}")
        qos, handling = options & 0x03, (options >> 4) & 0x03
        if qos == 3:
            raise malformed("SUBSCRIBE with maximum QoS 3")
        if handling == 3:
            raise protocol_error("SUBSCRIBE with retain handling 3")
        if options & 0x04 and topic_filter.startswith("$share/"):  # MQTT-3.8.3-4
            raise protocol_error(f"SUBSCRIBE with No Local on the shared subscription {topic_filter!r}")
        requests.append(SubscriptionRequest(topic_filter, qos, bool(options & 0x04), bool(options & 0x08),
                                            handling, subscription_id))
    if not requests:
        raise protocol_error("SUBSCRIBE without a topic filter")
    return packet_id, requests


def parse_unsubscribe(data: bytes) -> tuple[int, list[str]]:
    body = _Body(data)
    packet_id = body.u16()
    if not packet_id:  # MQTT-2.2.1-3
        raise malformed("UNSUBSCRIBE with packet identifier 0")
    body.properties("UNSUBSCRIBE")
    filters: list[str] = []
    while body.left():
        filters.append(body.string("topic filter"))
    if not filters:
        raise protocol_error("UNSUBSCRIBE without a topic filter")
    return packet_id, filters


def parse_disconnect(data: bytes) -> tuple[int, dict[str, Any]]:
    body = _Body(data)
    reason = body.u8() if body.left() else 0
    properties = body.properties("DISCONNECT") if body.left() else {}
    if body.left():
        raise malformed(f"DISCONNECT has {body.left()} bytes past its end")
    return reason, properties


def parse_auth(data: bytes) -> tuple[int, dict[str, Any]]:
    """AUTH: (reason code, properties); an empty body is success without properties (3.15.2.1)."""
    body = _Body(data)
    reason = body.u8() if body.left() else 0
    properties = body.properties("AUTH") if body.left() else {}
    if body.left():
        raise malformed(f"AUTH has {body.left()} bytes past its end")
    return reason, properties


# --- encoders ------------------------------------------------------------------------------------

def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + codec.remaining_length(len(body)) + body


def connack(session_present: bool, reason: int, properties: dict[str, Any] | None = None) -> bytes:
    return _packet(CONNACK << 4, bytes((1 if session_present else 0, reason)) + encode_properties(properties or {}))


def ack(kind: int, packet_id: int, reason: int = 0, properties: dict[str, Any] | None = None) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP; a success without properties is the short form."""
    first = kind << 4 | (2 if kind == codec.PUBREL else 0)
    if not reason and not properties:
        return bytes((first, 2)) + packet_id.to_bytes(2, "big")
    return _packet(first, packet_id.to_bytes(2, "big") + bytes((reason,)) + encode_properties(properties or {}))


def suback(packet_id: int, codes: list[int]) -> bytes:
    return _packet(SUBACK << 4, packet_id.to_bytes(2, "big") + _EMPTY + bytes(codes))


def unsuback(packet_id: int, codes: list[int]) -> bytes:
    return _packet(UNSUBACK << 4, packet_id.to_bytes(2, "big") + _EMPTY + bytes(codes))


def disconnect(reason: int, properties: dict[str, Any] | None = None) -> bytes:
    if not reason and not properties:
        return bytes((DISCONNECT << 4, 0))
    return _packet(DISCONNECT << 4, bytes((reason,)) + encode_properties(properties or {}))


def auth(reason: int, properties: dict[str, Any] | None = None) -> bytes:
    return _packet(codec.AUTH << 4, bytes((reason,)) + encode_properties(properties or {}))


def publish(topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int,
            properties: bytes = _EMPTY) -> bytes:
    """A PUBLISH; ``properties`` is an encoded property block (``encode_properties``)."""
    header = codec.topic_field(topic)
    if qos:
        header += packet_id.to_bytes(2, "big")
    first = (PUBLISH << 4) | (0x08 if dup else 0) | (qos << 1) | (1 if retain else 0)
    return codec.publish_packet(header + properties, payload, first)


def encode_connect(client_id: str, *, clean_start: bool = True, keepalive: int = 60, username: str | None = None,
                   password: bytes | None = None, properties: dict[str, Any] | None = None,
                   will: Will | None = None, will_properties: dict[str, Any] | None = None) -> bytes:
    """A CONNECT as an MQTT 5 client sends it (for the tests)."""
    flags = ((0x02 if clean_start else 0) | (0x80 if username is not None else 0)
             | (0x40 if password is not None else 0))
    if will is not None:
        flags |= 0x04 | will.qos << 3 | (0x20 if will.retain else 0)
    body = (codec.topic_field("MQTT") + bytes((LEVEL, flags)) + keepalive.to_bytes(2, "big")
            + encode_properties(properties or {}) + codec.topic_field(client_id))
    if will is not None:
        body += encode_properties(will_properties or {}) + codec.topic_field(will.topic)
        body += len(will.payload).to_bytes(2, "big") + will.payload
    if username is not None:
        body += codec.topic_field(username)
    if password is not None:
        body += len(password).to_bytes(2, "big") + password
    return _packet(codec.CONNECT << 4, body)


def encode_subscribe(packet_id: int, requests: list[tuple[str, int]], subscription_id: int | None = None) -> bytes:
    """A SUBSCRIBE of (filter, options byte) pairs (for the tests)."""
    body = packet_id.to_bytes(2, "big") + encode_properties({"subscription_identifier": subscription_id})
    for topic_filter, options in requests:
        body += codec.topic_field(topic_filter) + bytes((options,))
    return _packet(codec.SUBSCRIBE << 4 | 2, body)
