"""Frame events the reader hands out, and the light classes of the hot methods (no parsing here)."""

from __future__ import annotations

from typing import Any, TypeVar

from pamqp import base, encode

from lavinpy.wire.errors import AMQPChannelError

_Method = TypeVar("_Method", bound=base.Frame)


def build_method(kind: type[_Method], **fields: Any) -> _Method:
    """A pamqp method of ``kind`` holding ``fields``, for any exchange or queue name AMQP allows.

    pamqp's constructors check names against a narrower pattern than AMQP's (ASCII letters, digits,
    ``-_.:@#,/+`` and space; exchanges up to 127 characters), so a durable ``ünï`` or
    ``federation: x -> rabbit@h`` could be neither stored nor answered although RabbitMQ takes it.
    The method is made with its defaults, which pass that check, and then given the fields; encoding
    only needs each name to fit a short string (255 bytes of UTF-8), which the reader already holds
    every client's name to.
    """
    method = kind()
    for name, value in fields.items():
        if name not in kind.__slots__:
            raise TypeError(f"{kind.__name__} has no field {name!r}")
        setattr(method, name, {} if name == "arguments" and value is None else value)
    return method


def method_fields(method: base.Frame) -> bytes:
    """The encoded fields of a pamqp method, as pamqp's marshal gives them but without its name check
    (see ``build_method``): a name the broker accepted can be answered and stored."""
    parts: list[bytes] = []
    bits: list[bool] = []
    for name in method.__slots__:
        kind = method.amqp_type(name)
        value = getattr(method, name)
        if kind == "bit":
            bits.append(bool(value))
            continue
        if bits:
            parts.append(_pack_bits(bits))
            bits = []
        parts.append(encode.by_type(value, kind))
    if bits:
        parts.append(_pack_bits(bits))
    return b"".join(parts)


def _pack_bits(bits: list[bool]) -> bytes:
    # Consecutive AMQP bit fields share octets, least significant bit first, 8 per octet.
    out = bytearray()
    for start in range(0, len(bits), 8):
        out.append(sum(1 << i for i, bit in enumerate(bits[start:start + 8]) if bit))
    return bytes(out)

# --- Frame events --------------------------------------------------------------------------------


class MethodFrame:
    """A method frame; ``method`` is a pamqp command instance or one of the light hot-path classes."""

    __slots__ = ("channel", "method")

    def __init__(self, channel: int, method: Any) -> None:
        self.channel = channel
        self.method = method

    def __repr__(self) -> str:
        return f"MethodFrame({self.channel}, {self.method!r})"


class HeaderFrame:
    """A content header; ``properties`` is the raw property block (flags + fields), not decoded."""

    __slots__ = ("channel", "class_id", "body_size", "properties")

    def __init__(self, channel: int, class_id: int, body_size: int, properties: bytes) -> None:
        self.channel = channel
        self.class_id = class_id
        self.body_size = body_size
        self.properties = properties

    def __repr__(self) -> str:
        return f"HeaderFrame({self.channel}, {self.class_id}, {self.body_size}, {self.properties!r})"


class BodyFrame:
    """A content body frame."""

    __slots__ = ("channel", "data")

    def __init__(self, channel: int, data: bytes | memoryview) -> None:
        self.channel = channel
        self.data = data

    def __repr__(self) -> str:
        return f"BodyFrame({self.channel}, {len(self.data)} bytes)"


class RefusedFrame:
    """A well-framed method or content header whose field tables the broker refuses (too deep,
    malformed headers): the channel it came on is closed with ``error``, the connection goes on."""

    __slots__ = ("channel", "error")

    def __init__(self, channel: int, error: AMQPChannelError) -> None:
        self.channel = channel
        self.error = error

    def __repr__(self) -> str:
        return f"RefusedFrame({self.channel}, {self.error!r})"


class HeartbeatFrame:
    """A heartbeat (always on channel 0)."""

    __slots__ = ()
    channel = 0

    def __repr__(self) -> str:
        return "HeartbeatFrame()"


class ContentMessage:
    """basic.publish with its content header and single body frame, all from one read.

    The common small message arrives as three frames in one read; delivering them as one event
    saves the channel two dispatches. Only frames that would each have parsed cleanly are fused.
    """

    __slots__ = ("channel", "method", "properties", "body")

    def __init__(self, channel: int, method: Publish, properties: bytes, body: bytes) -> None:
        self.channel = channel
        self.method = method
        self.properties = properties
        self.body = body

    def frames(self) -> list[MethodFrame | HeaderFrame | BodyFrame]:
        """The same content as separate frames, for the general path."""
        out: list[MethodFrame | HeaderFrame | BodyFrame] = [
            MethodFrame(self.channel, self.method),
            HeaderFrame(self.channel, 60, len(self.body), self.properties)]
        if self.body:
            out.append(BodyFrame(self.channel, self.body))
        return out

    def __repr__(self) -> str:
        return f"ContentMessage(channel={self.channel}, {self.method!r}, {len(self.body)} bytes)"


class ContentRun:
    """Consecutive fused publishes (``ContentMessage``) on one channel with the same method and
    property block, from one read, in order: what a publisher of many alike messages sends.

    As one event the connection takes the run with one check of its method and properties and no
    object a message; a message that differs in anything ends the run, so the order of all frames
    is kept.
    """

    __slots__ = ("channel", "method", "properties", "bodies")

    def __init__(self, channel: int, method: Publish, properties: bytes, bodies: list[bytes]) -> None:
        self.channel = channel
        self.method = method
        self.properties = properties
        self.bodies = bodies

    def messages(self) -> list[ContentMessage]:
        """The same publishes one event each, for the path that takes them one at a time."""
        channel, method, properties = self.channel, self.method, self.properties
        return [ContentMessage(channel, method, properties, body) for body in self.bodies]

    def frames(self) -> list[MethodFrame | HeaderFrame | BodyFrame]:
        """The same publishes as separate frames, for the general path."""
        return [frame for message in self.messages() for frame in message.frames()]

    def __repr__(self) -> str:
        return f"ContentRun(channel={self.channel}, {self.method!r}, {len(self.bodies)} messages)"


class AckRun:
    """Consecutive basic.ack frames with multiple=false on one channel, from one read, in order.

    A consumer acking each message sends a stream of these; as one event the channel settles them
    in one step instead of one dispatch per frame. A multiple=true ack stays a MethodFrame and ends
    the run, so the order of all frames is kept.
    """

    __slots__ = ("channel", "tags")

    def __init__(self, channel: int, tags: list[int]) -> None:
        self.channel = channel
        self.tags = tags

    def frames(self) -> list[MethodFrame]:
        """The same acks as separate frames, for the general path."""
        channel = self.channel
        return [MethodFrame(channel, Ack(tag, False)) for tag in self.tags]

    def __repr__(self) -> str:
        return f"AckRun({self.channel}, {self.tags!r})"


FrameEvent = (MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame | ContentMessage | ContentRun | RefusedFrame
              | AckRun)

_HEARTBEAT_EVENT = HeartbeatFrame()  # immutable, so one instance serves every heartbeat


# --- Light hot-path methods (same attribute names and ``name`` as pamqp's classes) ----------------


class Publish:
    """basic.publish, decoded by hand. Immutable: the reader hands out one shared instance for every
    publish with the same arguments (a publisher repeats its exchange and routing key)."""

    __slots__ = ("exchange", "routing_key", "mandatory", "immediate")
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    name = "Basic.Publish"
    frame_id = 40
    index = 0x003C0028
    ticket = 0

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> None:
        setter = object.__setattr__
        setter(self, "exchange", exchange)
        setter(self, "routing_key", routing_key)
        setter(self, "mandatory", mandatory)
        setter(self, "immediate", immediate)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Publish is immutable (shared between frames); cannot set {name}")

    def __repr__(self) -> str:
        return (f"Publish(exchange={self.exchange!r}, routing_key={self.routing_key!r}, "
                f"mandatory={self.mandatory}, immediate={self.immediate})")


class Ack:
    """basic.ack, decoded by hand."""

    __slots__ = ("delivery_tag", "multiple")
    name = "Basic.Ack"
    frame_id = 80
    index = 0x003C0050

    def __init__(self, delivery_tag: int, multiple: bool) -> None:
        self.delivery_tag = delivery_tag
        self.multiple = multiple

    def __repr__(self) -> str:
        return f"Ack(delivery_tag={self.delivery_tag}, multiple={self.multiple})"


class Nack:
    """basic.nack, decoded by hand."""

    __slots__ = ("delivery_tag", "multiple", "requeue")
    name = "Basic.Nack"
    frame_id = 120
    index = 0x003C0078

    def __init__(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.delivery_tag = delivery_tag
        self.multiple = multiple
        self.requeue = requeue

    def __repr__(self) -> str:
        return f"Nack(delivery_tag={self.delivery_tag}, multiple={self.multiple}, requeue={self.requeue})"


class Reject:
    """basic.reject, decoded by hand."""

    __slots__ = ("delivery_tag", "requeue")
    name = "Basic.Reject"
    frame_id = 90
    index = 0x003C005A

    def __init__(self, delivery_tag: int, requeue: bool) -> None:
        self.delivery_tag = delivery_tag
        self.requeue = requeue

    def __repr__(self) -> str:
        return f"Reject(delivery_tag={self.delivery_tag}, requeue={self.requeue})"
