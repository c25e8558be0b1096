"""MQTT 3.1 / 3.1.1 packets: a bounded, strict reader (bytes in, packets out) and the encoders of what
the server sends. Pure: no sockets, no broker. Anything the spec calls malformed raises
``MQTTProtocolError`` (the connection closes); nothing here is lenient about reserved bits."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from ..wire.accel import cwire

if TYPE_CHECKING:
    from collections import deque

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
AUTH = 15  # MQTT 5 only
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14
PACKET_NAMES = {1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL", 7: "PUBCOMP",
                8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK", 12: "PINGREQ", 13: "PINGRESP",
                14: "DISCONNECT"}
# Fixed-header flags every packet but PUBLISH must carry exactly (MQTT 3.1.1 section 2.2.2).
REQUIRED_FLAGS = {CONNECT: 0, CONNACK: 0, PUBACK: 0, PUBREC: 0, PUBREL: 2, PUBCOMP: 0, SUBSCRIBE: 2, SUBACK: 0,
                  UNSUBSCRIBE: 2, UNSUBACK: 0, PINGREQ: 0, PINGRESP: 0, DISCONNECT: 0}
MAX_REMAINING_LENGTH = 268_435_455  # four length bytes

# CONNACK return codes.
ACCEPTED = 0
UNACCEPTABLE_PROTOCOL_VERSION = 1
IDENTIFIER_REJECTED = 2
SERVER_UNAVAILABLE = 3
BAD_USERNAME_OR_PASSWORD = 4
NOT_AUTHORIZED = 5
SUBACK_FAILURE = 0x80

# Protocol name -> level of the versions served (MQTT 5, level 5, is read by ``codec5``).
PROTOCOLS = {"MQTT": 4, "MQIsdp": 3}


class MQTTProtocolError(Exception):
    """Malformed input: the connection is closed (after a CONNACK when ``connack`` is set; an MQTT 5
    connection is told ``reason``, its reason code, first)."""

    def __init__(self, text: str, connack: int | None = None, reason: int = 0x81) -> None:
        super().__init__(text)
        self.connack = connack
        self.reason = reason


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool


@dataclass(slots=True)
class Connect:
    protocol: str
    level: int
    client_id: str
    clean_session: bool
    keepalive: int
    username: str | None
    password: bytes | None
    will: Will | None


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int


# First bytes of a packet whose type and flags are valid (not those of a reserved type or flags).
_PLAIN_FIRST_BYTES = frozenset(kind << 4 | flags for kind in PACKET_NAMES for flags in range(16)
                               if REQUIRED_FLAGS.get(kind, flags) == flags)
_PLAIN_TABLE = bytes(first in _PLAIN_FIRST_BYTES for first in range(256))  # the same, by first byte
# The compiled loop over whole short packets in a row (PacketReader.feed's common case), when built.
_SPLIT: Callable[[bytes, int, int, bytes, list[tuple[int, int, bytes]]], int] | None = (
    cwire.mqtt_split if cwire is not None else None)
# The compiled loop of publish_run_tail at QoS 1 and 2, when built.
_PUBLISH_TAIL: Callable[[deque[tuple[int, int, bytes]], int, bytes, int, list[bytes], list[int]], int] | None = (
    cwire.mqtt_publish_tail if cwire is not None else None)


class PacketReader:
    """Splits input into (type, flags, body) packets; at most ``max_packet_size`` bytes each (the
    whole packet, fixed header included), so a client cannot make the server buffer more."""

    __slots__ = ("_buf", "_need", "auth", "max_packet_size")

    def __init__(self, max_packet_size: int) -> None:
        self._buf = bytearray()
        # The size of the packet the kept input begins with, once its header is read and its body is
        # not all there (else 0): input that does not complete it is only appended. Joining and
        # re-parsing the kept input at each read copied a large packet once per read: a 60 MiB
        # PUBLISH took 30 s of the server's time, and every other client waited.
        self._need = 0
        self.max_packet_size = max_packet_size
        self.auth = False  # MQTT 5's AUTH (type 15, flags 0) is read: the connection speaks MQTT 5

    def feed(self, data: bytes, one: bool = False) -> list[tuple[int, int, bytes]]:
        """The whole packets of the input so far (``one``: at most one, the rest kept unread, as
        before CONNECT, when the packets after it are read with the size limit the login sets)."""
        buf = self._buf
        if self._need:
            if len(buf) + len(data) < self._need:
                buf += data
                return []
            self._need = 0
        if buf or type(data) is not bytes:  # the kept tail and the new input as one bytes: bodies slice it
            buf += data
            data = bytes(buf)
            buf.clear()
        packets: list[tuple[int, int, bytes]] = []
        pos = 0
        end = len(data)
        append, limit, plain, split = packets.append, self.max_packet_size, _PLAIN_FIRST_BYTES, _SPLIT
        while end - pos >= 2:
            first = data[pos]
            length = data[pos + 1]
            if length < 128 and first in plain and length + 2 <= limit:  # the common short packet, checked
                if end - pos - 2 < length:
                    break
                if split is not None and not one:  # it and the short packets after it, compiled
                    pos = split(data, pos, limit, _PLAIN_TABLE, packets)
                    continue
                append((first >> 4, first & 0x0F, data[pos + 2:pos + 2 + length]))
                pos += 2 + length
                if one:
                    break
                continue
            kind, flags = first >> 4, first & 0x0F
            if kind not in PACKET_NAMES and not (kind == AUTH and self.auth):  # AUTH: MQTT 5's alone
                raise MQTTProtocolError(f"reserved packet type {kind}", reason=0x82 if kind == AUTH else 0x81)
            required = REQUIRED_FLAGS.get(kind, 0 if kind == AUTH else None)
            if required is not None and flags != required:
                raise MQTTProtocolError(f"{PACKET_NAMES.get(kind, 'AUTH')} with reserved flags {flags:#x}")
            length, multiplier, i = 0, 1, pos + 1
            while True:
                if i >= end:
                    if i - pos - 1 >= 4:
                        raise MQTTProtocolError("remaining length over four bytes")
                    self._keep(data, pos)
                    return packets
                byte = data[i]
                length += (byte & 0x7F) * multiplier
                i += 1
                if not byte & 0x80:
                    break
                multiplier *= 128
                if i - pos - 1 >= 4:
                    raise MQTTProtocolError("remaining length over four bytes")
            total = i - pos + length
            if total > self.max_packet_size:
                raise MQTTProtocolError(f"packet of {total} bytes is larger than max_packet_size "
                                        f"{self.max_packet_size}", reason=0x95)
            if end - i < length:
                self._need = total
                break
            packets.append((kind, flags, data[i:i + length]))
            pos = i + length
            if one:
                break
        self._keep(data, pos)
        return packets

    def release(self) -> None:
        """Drop the kept input: its connection ended, and may wait in a reference cycle for a full
        collection (rare at the server's GC thresholds) with up to max_packet_size bytes of it."""
        self._buf = bytearray()
        self._need = 0

    @property
    def buffered(self) -> int:
        """Bytes read and not yet returned as packets."""
        return len(self._buf)

    def _keep(self, data: bytes, pos: int) -> None:
        """What follows the whole packets, kept for the next input."""
        if pos < len(data):
            self._buf += memoryview(data)[pos:]


class _Body:
    """A cursor over one packet's variable header and payload."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def u8(self) -> int:
        if self.left() < 1:
            raise MQTTProtocolError("packet ends early")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        if self.left() < 2:
            raise MQTTProtocolError("packet ends early")
        value = int.from_bytes(self.data[self.pos:self.pos + 2], "big")
        self.pos += 2
        return value

    def binary(self) -> bytes:
        size = self.u16()
        if self.left() < size:
            raise MQTTProtocolError("string longer than its packet")
        value = self.data[self.pos:self.pos + size]
        self.pos += size
        return value

    def string(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MQTTProtocolError("string is not UTF-8") from None
        if "\x00" in text:
            raise MQTTProtocolError("string contains U+0000")
        return text

    def rest(self) -> bytes:
        value = self.data[self.pos:]
        self.pos = len(self.data)
        return value

    def done(self, what: str) -> None:
        if self.left():
            raise MQTTProtocolError(f"{what} has {self.left()} bytes past its end")


def parse_connect(data: bytes) -> Connect:
    body = _Body(data)
    protocol = body.string()
    level = body.u8()
    if protocol not in PROTOCOLS:
        raise MQTTProtocolError(f"unknown protocol name {protocol!r}")
    if PROTOCOLS[protocol] != level:
        raise MQTTProtocolError(f"unsupported protocol level {level}", UNACCEPTABLE_PROTOCOL_VERSION)
    flags = body.u8()
    if flags & 0x01:
        raise MQTTProtocolError("CONNECT with the reserved flag set")
    keepalive = body.u16()
    client_id = body.string()
    will = None
    will_qos = (flags >> 3) & 0x03
    if flags & 0x04:
        if will_qos == 3:
            raise MQTTProtocolError("will QoS 3")
        topic = body.string()
        will = Will(topic, body.binary(), will_qos, bool(flags & 0x20))
    elif will_qos or flags & 0x20:
        raise MQTTProtocolError("will QoS or retain without a will")
    username = body.string() if flags & 0x80 else None
    if flags & 0x40 and username is None:
        raise MQTTProtocolError("password without a user name")
    password = body.binary() if flags & 0x40 else None
    body.done("CONNECT")
    return Connect(protocol, level, client_id, bool(flags & 0x02), keepalive, username, password, will)


def parse_publish(flags: int, data: bytes) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MQTTProtocolError("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MQTTProtocolError("PUBLISH QoS 0 with DUP set")
    body = _Body(data)
    topic = body.string()
    packet_id = 0
    if qos:
        packet_id = body.u16()
        if not packet_id:
            raise MQTTProtocolError("PUBLISH with packet identifier 0")
    return Publish(topic, body.rest(), qos, bool(flags & 0x01), dup, packet_id)


def publish_run_tail(backlog: deque[tuple[int, int, bytes]], flags: int, body: bytes, payload: bytes,
                     packet_id: int, max_payload: int) -> tuple[list[bytes], list[int]]:
    """The payloads and packet ids of a parsed PUBLISH (``flags``, ``body``) and of the PUBLISH
    packets at the head of ``backlog`` with the same topic and QoS, no retain, a payload of at most
    ``max_payload`` bytes (taken from the backlog). A packet that differs, or is bad, ends the run
    and is parsed on its own (so bad input fails as it would alone)."""
    payloads, packet_ids = [payload], [packet_id]
    qos = flags & 0x06
    prefix = body[:2 + int.from_bytes(body[:2], "big")]  # the topic as it is on the wire
    start = len(prefix)
    add_payload, add_id, take = payloads.append, packet_ids.append, backlog.popleft
    if qos:
        start += 2
        high, low = start - 2, start - 1  # the packet id's bytes
        longest = start + max_payload
        if _PUBLISH_TAIL is not None:  # the same loop, compiled
            _PUBLISH_TAIL(backlog, qos, prefix, longest, payloads, packet_ids)
            return payloads, packet_ids
        while backlog:
            kind, other, data = backlog[0]
            if (kind != PUBLISH or other & 0x07 != qos or not start <= len(data) <= longest
                    or not data.startswith(prefix)):
                break
            packet_id = data[high] << 8 | data[low]
            if not packet_id:
                break
            take()
            add_id(packet_id)
            add_payload(data[start:])
    else:
        while backlog:
            kind, other, data = backlog[0]
            if kind != PUBLISH or other != 0 or len(data) - start > max_payload or not data.startswith(prefix):
                break
            take()
            add_payload(data[start:])
    return payloads, packet_ids


def puback_run(backlog: deque[tuple[int, int, bytes]], body: bytes, kind: int = PUBACK) -> list[int]:
    """The packet id of a PUBACK (or PUBREC, PUBREL, PUBCOMP: ``kind``) and of the well-formed packets
    of its kind at the head of ``backlog`` (taken from it), in order."""
    packet_ids = [parse_packet_id(body, PACKET_NAMES[kind])]
    while backlog:
        other, _, data = backlog[0]
        if other != kind or len(data) != 2:
            break
        backlog.popleft()
        packet_ids.append(int.from_bytes(data, "big"))
    return packet_ids


# Parsers of n short PUBACKs in a row (each: 0x40, length 2, the id): their ids in one C call.
_PUBACK_IDS: dict[int, struct.Struct] = {}


def puback_ids(data: bytes) -> list[int] | None:
    """The packet ids of input that is whole short PUBACKs and nothing else (what a QoS 1 subscriber
    sends in a read), in order; None for any other input (read packet by packet)."""
    size = len(data)
    count = size >> 2
    if not count or size & 3 or data[0::4].count(0x40) != count or data[1::4].count(2) != count:
        return None
    parser = _PUBACK_IDS.get(count)
    if parser is None:
        parser = struct.Struct(">" + "2xH" * count)
        if count <= 1024:
            _PUBACK_IDS[count] = parser
    return list(parser.unpack(data))


def puback_tags_py(data: bytes, inflight: dict[int, Any]) -> list[Any] | None:
    """A read that is whole short PUBACKs and nothing else (``puback_ids``): each id popped from
    ``inflight``, the popped values that are not None in order (an unknown id is skipped). None, and
    nothing popped, for any other input."""
    ids = puback_ids(data)
    if ids is None:
        return None
    pop = inflight.pop
    return [tag for tag in map(pop, ids, repeat(None)) if tag is not None]


# The compiled twin when built, else the pure-Python one (tests/mqtt/test_mqtt_codec_agree.py).
puback_tags: Callable[[bytes, dict[int, Any]], list[Any] | None] = (
    cwire.mqtt_puback_tags if cwire is not None else puback_tags_py)


def parse_packet_id(data: bytes, what: str) -> int:
    body = _Body(data)
    packet_id = body.u16()
    body.done(what)
    return packet_id


def _nonzero_packet_id(body: _Body, what: str) -> int:
    """The packet id of a SUBSCRIBE or UNSUBSCRIBE, which must not be 0 (MQTT-2.3.1-1): the SUBACK
    or UNSUBACK answering it would name no request."""
    packet_id = body.u16()
    if not packet_id:
        raise MQTTProtocolError(f"{what} with packet identifier 0")
    return packet_id


def parse_subscribe(data: bytes) -> tuple[int, list[tuple[str, int]]]:
    body = _Body(data)
    packet_id = _nonzero_packet_id(body, "SUBSCRIBE")
    topics: list[tuple[str, int]] = []
    while body.left():
        topic = body.string()
        options = body.u8()
        if options & 0xFC or options == 3:
            raise MQTTProtocolError(f"SUBSCRIBE with requested QoS byte {options:#x}")
        topics.append((topic, options))
    if not topics:
        raise MQTTProtocolError("SUBSCRIBE without a topic filter")
    return packet_id, topics


def parse_unsubscribe(data: bytes) -> tuple[int, list[str]]:
    body = _Body(data)
    packet_id = _nonzero_packet_id(body, "UNSUBSCRIBE")
    topics: list[str] = []
    while body.left():
        topics.append(body.string())
    if not topics:
        raise MQTTProtocolError("UNSUBSCRIBE without a topic filter")
    return packet_id, topics


# --- encoders ------------------------------------------------------------------------------------

def remaining_length(length: int) -> bytes:
    out = bytearray()
    while True:
        byte, length = length % 128, length // 128
        out.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + remaining_length(len(body)) + body


def connack(session_present: bool, code: int) -> bytes:
    return bytes((CONNACK << 4, 2, 1 if session_present else 0, code))


def puback(packet_id: int) -> bytes:
    return bytes((PUBACK << 4, 2)) + packet_id.to_bytes(2, "big")


# A connection's replies after the disk are packet ids, the packet's kind in the bits above them.
PUBREC_REPLY, PUBCOMP_REPLY, PUBREL_REPLY = 1 << 16, 2 << 16, 3 << 16  # (a PUBACK: the id alone)
_REPLY_FIRST = {0: PUBACK << 4, 1: PUBREC << 4, 2: PUBCOMP << 4, 3: PUBREL << 4 | 2}
_REPLY_WORDS = [_REPLY_FIRST[kind] << 24 | 2 << 16 for kind in range(4)]
_PUBACK_WORD = _REPLY_WORDS[0]


def qos2_reply(kind: int, packet_id: int) -> bytes:
    """PUBACK, PUBREC, PUBCOMP or PUBREL (``kind`` 0 to 3) of a packet id."""
    return bytes((_REPLY_FIRST[kind], 2)) + packet_id.to_bytes(2, "big")


def replies(batch: list[int]) -> tuple[bytes, int]:
    """A batch of replies (packet ids | *_REPLY) as packets, and how many confirm a publish (PUBACKs
    and PUBRECs)."""
    count = len(batch)
    if max(batch) < PUBREC_REPLY:  # each packet one big-endian u32: first byte, length 2, the id
        return struct.pack(f">{count}I", *[_PUBACK_WORD | packet_id for packet_id in batch]), count
    words = _REPLY_WORDS
    return (struct.pack(f">{count}I", *[words[reply >> 16] | (reply & 0xFFFF) for reply in batch]),
            sum(reply < PUBCOMP_REPLY for reply in batch))


def suback(packet_id: int, codes: list[int]) -> bytes:
    return _packet(SUBACK << 4, packet_id.to_bytes(2, "big") + bytes(codes))


def unsuback(packet_id: int) -> bytes:
    return bytes((UNSUBACK << 4, 2)) + packet_id.to_bytes(2, "big")


PINGRESP_PACKET = bytes((PINGRESP << 4, 0))


def publish(topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int) -> bytes:
    name = topic.encode("utf-8")
    header = len(name).to_bytes(2, "big") + name
    if qos:
        header += packet_id.to_bytes(2, "big")
    first = (PUBLISH << 4) | (0x08 if dup else 0) | (qos << 1) | (1 if retain else 0)
    return bytes((first,)) + remaining_length(len(header) + len(payload)) + header + payload


def topic_field(topic: str) -> bytes:
    """A topic as a PUBLISH carries it (length-prefixed UTF-8)."""
    name = topic.encode("utf-8")
    return len(name).to_bytes(2, "big") + name


def publish_packet(header: bytes, payload: bytes | memoryview, first: int) -> bytes:
    """A PUBLISH from its first byte, its variable header (topic field, packet id) and payload."""
    length = len(header) + len(payload)
    if length < 128:
        return b"".join((bytes((first, length)), header, payload))
    return b"".join((bytes((first,)), remaining_length(length), header, payload))


def publish_run_packets_py(first: int, topic_field: bytes, block: bytes, first_id: int, bodies: list[bytes]) -> bytes:
    """QoS 1 or 2 PUBLISH packets of one topic, one per body, as one buffer: first byte ``first``,
    ``topic_field``, the packet ids from ``first_id`` on (65535 is followed by 1), ``block`` (MQTT 5's
    properties, else empty), the body. The pure-Python twin of the compiled ``mqtt_publish_run``."""
    parts: list[bytes] = []
    append = parts.append
    fixed = len(topic_field) + 2 + len(block)
    heads: dict[int, bytes] = {}  # first byte, remaining length and topic by body size
    packet_id = first_id
    for body in bodies:
        size = len(body)
        head = heads.get(size)
        if head is None:
            head = heads[size] = bytes((first,)) + remaining_length(fixed + size) + topic_field
        append(head)
        append(packet_id.to_bytes(2, "big"))
        if block:
            append(block)
        append(body)
        packet_id = packet_id % 65535 + 1
    return b"".join(parts)


# The compiled twin when built (lavinpy.wire.accel decides), else the pure-Python one.
publish_run_packets: Callable[[int, bytes, bytes, int, list[bytes]], bytes] = (
    cwire.mqtt_publish_run if cwire is not None else publish_run_packets_py)


_KEY, _PROPERTIES, _BODY = itemgetter(2), itemgetter(3), itemgetter(4)  # of a stored message (a tuple)


def publish_run_messages_py(first: int, topic_field: bytes, block: bytes, first_id: int, messages: list[Any],
                            key: str, properties: bytes) -> bytes | None:
    """``publish_run_packets`` of stored messages' bodies when every message has routing key ``key``
    and properties ``properties``; None otherwise (the caller's loop takes that run). The compiled
    twin also gives None for a body that is not bytes (a large one in place): the loop joins it."""
    if len(messages) > 1 and not ({key}.issuperset(map(_KEY, messages))
                                  and {properties}.issuperset(map(_PROPERTIES, messages))):
        return None
    return publish_run_packets_py(first, topic_field, block, first_id, list(map(_BODY, messages)))


publish_run_messages: Callable[[int, bytes, bytes, int, list[Any], str, bytes], bytes | None] = (
    cwire.mqtt_publish_messages if cwire is not None else publish_run_messages_py)


def publish_booked_py(first: int, topic_field: bytes, block: bytes, first_id: int, messages: list[Any], key: str,
                      properties: bytes, inflight: dict[int, int | None], first_tag: int) -> bytes | None:
    """``publish_run_messages``, and the run's packet ids booked: when ids ``first_id`` .. ``first_id +
    len(messages) - 1`` (none past 65535) are all free in ``inflight``, each is set there to its delivery
    tag (``first_tag``, then the next ones). None, and ``inflight`` unchanged, otherwise."""
    ids = range(first_id, first_id + len(messages))
    if first_id < 1 or ids.stop > 65536 or not inflight.keys().isdisjoint(ids):
        return None
    packets = publish_run_messages(first, topic_field, block, first_id, messages, key, properties)
    if packets is not None:
        inflight.update(zip(ids, range(first_tag, first_tag + len(messages)), strict=True))
    return packets


publish_booked: Callable[[int, bytes, bytes, int, list[Any], str, bytes, dict[int, int | None], int], bytes | None] = (
    cwire.mqtt_publish_booked if cwire is not None else publish_booked_py)


def encode_connect(client_id: str, *, clean_session: bool = True, keepalive: int = 60,
                   username: str | None = None, password: bytes | None = None,
                   protocol: str = "MQTT", level: int = 4) -> bytes:
    """A CONNECT as a client sends it (the tests' raw-socket cases write their own bad variants)."""
    def s(value: str | bytes) -> bytes:
        raw = value.encode() if isinstance(value, str) else value
        return len(raw).to_bytes(2, "big") + raw
    flags = ((0x02 if clean_session else 0) | (0x80 if username is not None else 0)
             | (0x40 if password is not None else 0))
    body = s(protocol) + bytes((level, flags)) + keepalive.to_bytes(2, "big") + s(client_id)
    if username is not None:
        body += s(username)
    if password is not None:
        body += s(password)
    return _packet(CONNECT << 4, body)
