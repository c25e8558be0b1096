"""An MQTT 5 message's properties as AMQP 0-9-1 properties and back, as RabbitMQ maps them: Content
Type is ``content_type``; Correlation Data is ``correlation_id`` (else, when it is not a short
string, the header ``x-correlation-id``); Response Topic is the header ``x-reply-to-topic`` (as a
routing key); User Properties are headers; Message Expiry Interval is ``expiration`` (ms), and a
delivery carries what is left of it. The Payload Format Indicator, which RabbitMQ's AMQP 0-9-1 mapping
drops, is kept in the header ``x-mqtt-payload-format-indicator``; a retained publish is marked for
subscribers asking Retain As Published, and a publisher with a No Local subscription marks its own."""

from __future__ import annotations

from typing import Any

from ..wire.properties import encode_property_values, property_values
from . import topics
from .properties import encode_properties

PUBLISH_QOS_HEADER = "x-mqtt-publish-qos"
FORMAT_HEADER = "x-mqtt-payload-format-indicator"
RETAIN_HEADER = "x-mqtt-retain"
PUBLISHER_HEADER = "x-mqtt-publisher"
REPLY_TO_TOPIC_HEADER = "x-reply-to-topic"
CORRELATION_HEADER = "x-correlation-id"
_INTERNAL = {PUBLISH_QOS_HEADER, FORMAT_HEADER, RETAIN_HEADER, PUBLISHER_HEADER, REPLY_TO_TOPIC_HEADER,
             CORRELATION_HEADER}
_CONTENT_TYPE, _HEADERS, _CORRELATION_ID, _EXPIRATION = 0, 2, 5, 7  # indexes in PROPERTY_NAMES


def _short(text: str) -> bool:
    return len(text.encode("utf-8")) <= 255


def amqp_properties(qos: int, props: dict[str, Any], *, retain: bool = False, publisher: str | None = None) -> bytes:
    """The AMQP properties of an MQTT 5 publish with these PUBLISH (or will) properties."""
    headers: dict[str, Any] = {PUBLISH_QOS_HEADER: qos}
    for name, value in props.get("user_property", ()):
        if _short(name) and name not in headers:  # the first of a repeated name, as RabbitMQ keeps one
            headers[name] = value
    values: dict[str, Any] = {"delivery_mode": 2 if qos else 1}
    content_type = props.get("content_type")
    if content_type is not None and content_type.isascii() and len(content_type) <= 255:
        values["content_type"] = content_type
    correlation = props.get("correlation_data")
    if correlation is not None:
        try:
            text = correlation.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and len(correlation) <= 255:
            values["correlation_id"] = text
        else:
            headers[CORRELATION_HEADER] = correlation
    response_topic = props.get("response_topic")
    if response_topic is not None:
        headers[REPLY_TO_TOPIC_HEADER] = topics.routing_key(response_topic)
    if props.get("payload_format_indicator"):
        headers[FORMAT_HEADER] = 1
    expiry = props.get("message_expiry_interval")
    if expiry is not None:
        values["expiration"] = str(expiry * 1000)
    if retain:
        headers[RETAIN_HEADER] = 1
    if publisher is not None:
        headers[PUBLISHER_HEADER] = publisher
    return encode_property_values(headers=headers, **values)


def _user_value(value: object) -> str | None:
    """A header value as a User Property's string (None: not convertible, as a table or raw bytes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if "\x00" not in value else None
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return ""
    return None


class Outbound:
    """The parts of a delivery's MQTT 5 properties that depend only on its AMQP properties (read once
    per distinct properties value), and the expiry interval left."""

    __slots__ = ("expiration_ms", "headers", "static")

    def __init__(self, raw: bytes) -> None:
        values = property_values(raw, typed=False)
        table = values[_HEADERS]
        headers: dict[str, Any] = table if isinstance(table, dict) else {}
        self.headers = headers
        static: dict[str, Any] = {}
        if headers.get(FORMAT_HEADER):
            static["payload_format_indicator"] = 1
        if values[_CONTENT_TYPE] is not None:
            static["content_type"] = values[_CONTENT_TYPE]
        reply_to = headers.get(REPLY_TO_TOPIC_HEADER)
        if isinstance(reply_to, str):
            static["response_topic"] = topics.topic_name(reply_to)
        correlation = values[_CORRELATION_ID]
        if isinstance(correlation, str):
            static["correlation_data"] = correlation.encode("utf-8", "surrogateescape")
        else:
            header = headers.get(CORRELATION_HEADER)
            if isinstance(header, bytes | str):
                static["correlation_data"] = header.encode() if isinstance(header, str) else header
        pairs = []
        for name, value in headers.items():
            if name in _INTERNAL or "\x00" in name:
                continue
            text = _user_value(value)
            if text is not None:
                pairs.append((name, text))
        if pairs:
            static["user_property"] = pairs
        self.static = static
        expiration = values[_EXPIRATION]
        self.expiration_ms = int(expiration) if isinstance(expiration, str) and expiration.isdigit() else None

    def retained(self) -> bool:
        return bool(self.headers.get(RETAIN_HEADER))

    def publisher(self) -> object:
        return self.headers.get(PUBLISHER_HEADER)

    def block(self, timestamp_ms: int, now_ms: int, extra: dict[str, Any]) -> bytes:
        """The encoded property block of one delivery: the expiry left (MQTT 5, 3.3.2.3.3), then ``extra``
        (topic alias, subscription identifiers)."""
        if self.expiration_ms is None and not self.static and not extra:
            return b"\x00"
        values: dict[str, Any] = dict(self.static)
        if self.expiration_ms is not None:
            values["message_expiry_interval"] = max(0, self.expiration_ms - (now_ms - timestamp_ms)) // 1000
        values.update(extra)
        return encode_properties(values)
