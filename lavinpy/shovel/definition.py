"""A dynamic shovel's definition: RabbitMQ's ``shovel`` parameter keys, checked and parsed.

The keys and their defaults are RabbitMQ's (rabbitmq_shovel, AMQP 0-9-1 on both sides); the older
names RabbitMQ still accepts (``prefetch-count``, ``delete-after``, ``add-forward-headers``, ...) are
read as the new ones. Every problem raises ShovelDefinitionError with a text naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from lavinpy.wire.properties import PROPERTY_NAMES, encode_property_values
from lavinpy.wire.uri import parse_url, shown_uri

ACK_MODES = ("on-confirm", "on-publish", "no-ack")
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5.0
# RabbitMQ's older spellings, still accepted by its validation.
ALIASES = {
    "prefetch-count": "src-prefetch-count",
    "delete-after": "src-delete-after",
    "add-forward-headers": "dest-add-forward-headers",
    "add-timestamp-header": "dest-add-timestamp-header",
    "publish-properties": "dest-publish-properties",
}
KNOWN_KEYS = frozenset({
    "src-uri", "src-protocol", "src-queue", "src-queue-args", "src-exchange", "src-exchange-key",
    "src-prefetch-count", "src-delete-after", "src-consumer-args",
    "dest-uri", "dest-protocol", "dest-queue", "dest-queue-args", "dest-exchange", "dest-exchange-key",
    "dest-add-forward-headers", "dest-add-timestamp-header", "dest-publish-properties",
    "ack-mode", "reconnect-delay",
})


class ShovelDefinitionError(ValueError):
    """A shovel parameter that cannot run; the text names the key."""


@dataclass(frozen=True)
class ShovelDefinition:
    src_uris: tuple[str, ...]
    dest_uris: tuple[str, ...]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = "#"
    src_queue_args: dict[str, Any] | None = None
    src_consumer_args: dict[str, Any] = field(default_factory=dict)
    prefetch_count: int = DEFAULT_PREFETCH
    delete_after: str | int = "never"  # "never", "queue-length" or a count of messages
    ack_mode: str = "on-confirm"
    dest_queue: str | None = None
    dest_queue_args: dict[str, Any] | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    publish_properties: dict[str, Any] = field(default_factory=dict)
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ShovelDefinitionError(f"{key} should be a string, not {value!r}")
    if len(value.encode()) > 255:
        raise ShovelDefinitionError(f"{key} is longer than 255 bytes")
    return value


def _table(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ShovelDefinitionError(f"{key} should be a table (a JSON object), not {value!r}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ShovelDefinitionError(f"{key} should be true or false, not {value!r}")
    return value


def _uris(value: Any, key: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ShovelDefinitionError(f"{key} should name at least one URI")
    for uri in items:
        if not isinstance(uri, str):
            raise ShovelDefinitionError(f"{key} should be a URI or a list of URIs, not {uri!r}")
        try:
            parse_url(uri)
        except ValueError as e:
            raise ShovelDefinitionError(f"{key}: {str(e).replace(uri, shown_uri(uri))}") from None  # logged at boot
    return tuple(items)


def parse_definition(value: Any) -> ShovelDefinition:
    """The definition of a ``shovel`` parameter's value (a JSON object), or ShovelDefinitionError."""
    if not isinstance(value, dict):
        raise ShovelDefinitionError(f"a shovel definition should be a JSON object, not {value!r}")
    value = {ALIASES.get(k, k): v for k, v in value.items()}
    unknown = sorted(k for k in value if k not in KNOWN_KEYS)
    if unknown:
        raise ShovelDefinitionError(f"unrecognised shovel keys: {', '.join(unknown)}")
    for key in ("src-protocol", "dest-protocol"):
        if value.get(key, "amqp091") != "amqp091":
            raise ShovelDefinitionError(f"{key}: only amqp091 is supported, not {value[key]!r}")
    for key in ("src-uri", "dest-uri"):
        if key not in value:
            raise ShovelDefinitionError(f"{key} is required")
    kw: dict[str, Any] = {"src_uris": _uris(value["src-uri"], "src-uri"),
                          "dest_uris": _uris(value["dest-uri"], "dest-uri")}
    if ("src-queue" in value) == ("src-exchange" in value):
        raise ShovelDefinitionError("src-queue or src-exchange is required (one of them, not both)")
    if "src-queue" in value:
        kw["src_queue"] = _string(value["src-queue"], "src-queue")
        if "src-exchange-key" in value:
            raise ShovelDefinitionError("src-exchange-key goes with src-exchange, not src-queue")
    else:
        kw["src_exchange"] = _string(value["src-exchange"], "src-exchange")
        if "src-exchange-key" in value:
            kw["src_exchange_key"] = _string(value["src-exchange-key"], "src-exchange-key")
    if "dest-queue" in value and "dest-exchange" in value:
        raise ShovelDefinitionError("dest-queue and dest-exchange: give one of them, not both")
    if "dest-queue" in value:
        kw["dest_queue"] = _string(value["dest-queue"], "dest-queue")
    if "dest-exchange" in value:
        kw["dest_exchange"] = _string(value["dest-exchange"], "dest-exchange")
    if "dest-exchange-key" in value:
        if "dest-queue" in value:
            raise ShovelDefinitionError("dest-exchange-key goes with dest-exchange, not dest-queue")
        kw["dest_exchange_key"] = _string(value["dest-exchange-key"], "dest-exchange-key")
    for key, name in (("src-queue-args", "src_queue_args"), ("dest-queue-args", "dest_queue_args"),
                      ("src-consumer-args", "src_consumer_args")):
        if key in value:
            kw[name] = _table(value[key], key)
    if "src-prefetch-count" in value:
        count = value["src-prefetch-count"]
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= 65535:
            raise ShovelDefinitionError(f"src-prefetch-count should be an integer from 1 to 65535, not {count!r}")
        kw["prefetch_count"] = count
    if "src-delete-after" in value:
        after = value["src-delete-after"]
        if not (after in ("never", "queue-length")
                or (isinstance(after, int) and not isinstance(after, bool) and after >= 0)):
            raise ShovelDefinitionError(
                f"src-delete-after should be \"never\", \"queue-length\" or a number of messages, not {after!r}")
        if after == "queue-length" and "src-queue" not in value:
            raise ShovelDefinitionError("src-delete-after queue-length needs src-queue")
        kw["delete_after"] = after
    if "ack-mode" in value:
        if value["ack-mode"] not in ACK_MODES:
            raise ShovelDefinitionError(f"ack-mode should be one of {', '.join(ACK_MODES)}, not {value['ack-mode']!r}")
        kw["ack_mode"] = value["ack-mode"]
    if "dest-add-forward-headers" in value:
        kw["add_forward_headers"] = _bool(value["dest-add-forward-headers"], "dest-add-forward-headers")
    if "dest-add-timestamp-header" in value:
        kw["add_timestamp_header"] = _bool(value["dest-add-timestamp-header"], "dest-add-timestamp-header")
    if "dest-publish-properties" in value:
        props = _table(value["dest-publish-properties"], "dest-publish-properties")
        bad = sorted(k for k in props if k.replace("-", "_") not in PROPERTY_NAMES)
        if bad:
            raise ShovelDefinitionError(f"dest-publish-properties: unknown properties {', '.join(bad)}")
        kw["publish_properties"] = {k.replace("-", "_"): v for k, v in props.items()}
        try:
            encode_property_values(**kw["publish_properties"])
        except (ValueError, TypeError, OverflowError, AttributeError) as e:  # the encoder's complaint
            raise ShovelDefinitionError(f"dest-publish-properties: {e}") from None
    if "reconnect-delay" in value:
        delay = value["reconnect-delay"]
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise ShovelDefinitionError(f"reconnect-delay should be a number of seconds (0 or more), not {delay!r}")
        kw["reconnect_delay"] = float(delay)
    return ShovelDefinition(**kw)


def is_local(uri: str) -> bool:
    """RabbitMQ's ``amqp://`` (no host): the node the shovel runs on."""
    return not urlsplit(uri).hostname
