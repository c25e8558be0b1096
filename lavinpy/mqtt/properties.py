"""MQTT 5 properties (section 2.2.2): variable byte integers, every property identifier with its type
and the packets it may appear in, and a strict reader that says what is wrong with the MQTT 5 reason
code the spec asks for (malformed packet, protocol error, topic alias invalid). Pure: no broker."""

from __future__ import annotations

from typing import Any

from .codec import MQTTProtocolError

# Reason codes (MQTT 5, section 2.4) the server sends.
SUCCESS = 0x00
GRANTED_QOS_1, GRANTED_QOS_2 = 0x01, 0x02
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_SHUTTING_DOWN = 0x8B
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_IDENTIFIER_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E

# Property types.
BYTE, TWO, FOUR, VARINT, UTF8, BINARY, PAIR = range(7)

# Packets (and the will) by the names the reader is given.
_C, _CA, _P, _W, _ACK, _S, _SA, _U, _UA, _D, _A = ("CONNECT", "CONNACK", "PUBLISH", "WILL", "ACK", "SUBSCRIBE",
                                                   "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "DISCONNECT", "AUTH")
# identifier -> (name, type, where it may appear); ACK stands for PUBACK, PUBREC, PUBREL and PUBCOMP.
PROPERTIES: dict[int, tuple[str, int, frozenset[str]]] = {
    0x01: ("payload_format_indicator", BYTE, frozenset({_P, _W})),
    0x02: ("message_expiry_interval", FOUR, frozenset({_P, _W})),
    0x03: ("content_type", UTF8, frozenset({_P, _W})),
    0x08: ("response_topic", UTF8, frozenset({_P, _W})),
    0x09: ("correlation_data", BINARY, frozenset({_P, _W})),
    0x0B: ("subscription_identifier", VARINT, frozenset({_P, _S})),
    0x11: ("session_expiry_interval", FOUR, frozenset({_C, _CA, _D})),
    0x12: ("assigned_client_identifier", UTF8, frozenset({_CA})),
    0x13: ("server_keep_alive", TWO, frozenset({_CA})),
    0x15: ("authentication_method", UTF8, frozenset({_C, _CA, _A})),
    0x16: ("authentication_data", BINARY, frozenset({_C, _CA, _A})),
    0x17: ("request_problem_information", BYTE, frozenset({_C})),
    0x18: ("will_delay_interval", FOUR, frozenset({_W})),
    0x19: ("request_response_information", BYTE, frozenset({_C})),
    0x1A: ("response_information", UTF8, frozenset({_CA})),
    0x1C: ("server_reference", UTF8, frozenset({_CA, _D})),
    0x1F: ("reason_string", UTF8, frozenset({_CA, _ACK, _SA, _UA, _D, _A})),
    0x21: ("receive_maximum", TWO, frozenset({_C, _CA})),
    0x22: ("topic_alias_maximum", TWO, frozenset({_C, _CA})),
    0x23: ("topic_alias", TWO, frozenset({_P})),
    0x24: ("maximum_qos", BYTE, frozenset({_CA})),
    0x25: ("retain_available", BYTE, frozenset({_CA})),
    0x26: ("user_property", PAIR, frozenset({_C, _CA, _P, _W, _ACK, _S, _SA, _U, _UA, _D, _A})),
    0x27: ("maximum_packet_size", FOUR, frozenset({_C, _CA})),
    0x28: ("wildcard_subscription_available", BYTE, frozenset({_CA})),
    0x29: ("subscription_identifier_available", BYTE, frozenset({_CA})),
    0x2A: ("shared_subscription_available", BYTE, frozenset({_CA})),
}
IDS = {name: (ident, kind) for ident, (name, kind, _) in PROPERTIES.items()}
_BOOLEAN_BYTES = {"payload_format_indicator", "request_problem_information", "request_response_information"}
_NOT_ZERO = {"receive_maximum", "maximum_packet_size", "subscription_identifier"}
MAX_VARINT = 268_435_455


def malformed(text: str) -> MQTTProtocolError:
    return MQTTProtocolError(text, reason=MALFORMED_PACKET)


def protocol_error(text: str) -> MQTTProtocolError:
    return MQTTProtocolError(text, reason=PROTOCOL_ERROR)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A variable byte integer at ``pos``: (value, position after it); at most four bytes, the
    shortest encoding (a longer one is malformed, 1.5.5)."""
    value, shift, start = 0, 0, pos
    while True:
        if pos >= len(data):
            raise malformed("variable byte integer ends early")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if pos - start >= 4:
            raise malformed("variable byte integer over four bytes")
    if pos - start > 1 and byte == 0:
        raise malformed("variable byte integer not in its shortest form")
    return value, pos


def encode_varint(value: int) -> bytes:
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _utf8(raw: bytes, what: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed(f"{what} is not UTF-8") from None
    if "\x00" in text:
        raise malformed(f"{what} contains U+0000")
    return text


def read_properties(data: bytes, pos: int, where: str) -> tuple[dict[str, Any], int]:
    """The property block at ``pos`` of a packet's body (its length, then the properties) as a dict by
    name (``user_property``: a list of pairs; ``subscription_identifier`` of a PUBLISH: a list), and the
    position after it. An identifier the packet may not carry, or a value not of its type, is a
    malformed packet; a repeated property or a value out of its range a protocol error (2.2.2)."""
    length, pos = read_varint(data, pos)
    end = pos + length
    if end > len(data):
        raise malformed(f"{where} properties longer than the packet")
    found: dict[str, Any] = {}
    while pos < end:
        ident, pos = read_varint(data, pos)
        spec = PROPERTIES.get(ident)
        if spec is None or where not in spec[2]:
            raise malformed(f"property {ident:#04x} is not valid in {where}")
        name, kind, _ = spec
        value: Any
        if kind == BYTE:
            if pos + 1 > end:
                raise malformed(f"{name} ends early")
            value, pos = data[pos], pos + 1
        elif kind in (TWO, FOUR):
            size = 2 if kind == TWO else 4
            if pos + size > end:
                raise malformed(f"{name} ends early")
            value, pos = int.from_bytes(data[pos:pos + size], "big"), pos + size
        elif kind == VARINT:
            value, pos = read_varint(data[:end], pos)
        else:
            first, pos = _binary(data, pos, end, name)
            if kind == BINARY:
                value = first
            elif kind == UTF8:
                value = _utf8(first, name)
            else:
                second, pos = _binary(data, pos, end, name)
                value = (_utf8(first, f"{name} name"), _utf8(second, f"{name} value"))
        if name == "user_property":
            found.setdefault(name, []).append(value)
            continue
        if name in found:
            raise protocol_error(f"{name} more than once in {where}")
        if name in _BOOLEAN_BYTES and value > 1:
            raise protocol_error(f"{name} {value} (0 or 1)")
        if name in _NOT_ZERO and value == 0:
            raise protocol_error(f"{name} 0")
        if name == "topic_alias" and value == 0:
            raise MQTTProtocolError("topic alias 0", reason=TOPIC_ALIAS_INVALID)
        if name == "response_topic" and ("+" in value or "#" in value):  # MQTT-3.3.2-14: a topic name
            raise protocol_error(f"response topic {value!r} contains a wildcard")
        found[name] = value
    if pos != end:
        raise malformed(f"{where} property runs past its properties")
    return found, end


def _binary(data: bytes, pos: int, end: int, name: str) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise malformed(f"{name} ends early")
    size = int.from_bytes(data[pos:pos + 2], "big")
    stop = pos + 2 + size
    if stop > end:
        raise malformed(f"{name} longer than its properties")
    return data[pos + 2:stop], stop


def _field(raw: bytes) -> bytes:
    return len(raw).to_bytes(2, "big") + raw


def encode_properties(values: dict[str, Any]) -> bytes:
    """A property block (its length first) of the given properties by name; None values are left out,
    ``user_property`` is a list of pairs and ``subscription_identifier`` may be a list."""
    parts: list[bytes] = []
    for name, value in values.items():
        if value is None:
            continue
        ident, kind = IDS[name]
        head = encode_varint(ident)
        items = value if name in ("user_property", "subscription_identifier") and isinstance(value, list) else [value]
        for item in items:
            if kind == BYTE:
                parts.append(head + bytes((item,)))
            elif kind == TWO:
                parts.append(head + item.to_bytes(2, "big"))
            elif kind == FOUR:
                parts.append(head + item.to_bytes(4, "big"))
            elif kind == VARINT:
                parts.append(head + encode_varint(item))
            elif kind == BINARY:
                parts.append(head + _field(item))
            elif kind == UTF8:
                parts.append(head + _field(item.encode("utf-8")))
            else:
                parts.append(head + _field(item[0].encode("utf-8")) + _field(item[1].encode("utf-8")))
    body = b"".join(parts)
    return encode_varint(len(body)) + body
