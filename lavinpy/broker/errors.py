"""The model's refusals, the same for every face.

An operation that refuses raises a ``BrokerError``: its kind (RabbitMQ's name for it: not found,
access refused, precondition failed, resource locked, resource error, not allowed, not implemented,
command invalid), the detail and the text RabbitMQ writes ("NOT_FOUND - no queue 'x' in vhost '/'",
at most 255 bytes of UTF-8), and the ids of the AMQP method it answers when the model knows them.
``BrokerChannelError`` leaves the session open (AMQP closes the channel); ``BrokerConnectionError``
ends it. Each face maps the kind once: to AMQP reply codes (``amqp/refusals.py``), to HTTP statuses
(``http/errors.py``), to MQTT return codes (``mqtt/connection.py``).
"""

from __future__ import annotations

from enum import Enum

from lavinpy.wire.shortstr import fit_shortstr


class ErrorKind(Enum):
    NOT_FOUND = "NOT_FOUND"
    ACCESS_REFUSED = "ACCESS_REFUSED"
    RESOURCE_LOCKED = "RESOURCE_LOCKED"
    PRECONDITION_FAILED = "PRECONDITION_FAILED"
    RESOURCE_ERROR = "RESOURCE_ERROR"
    NOT_ALLOWED = "NOT_ALLOWED"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
    COMMAND_INVALID = "COMMAND_INVALID"


NOT_FOUND = ErrorKind.NOT_FOUND
ACCESS_REFUSED = ErrorKind.ACCESS_REFUSED
RESOURCE_LOCKED = ErrorKind.RESOURCE_LOCKED
PRECONDITION_FAILED = ErrorKind.PRECONDITION_FAILED
RESOURCE_ERROR = ErrorKind.RESOURCE_ERROR
NOT_ALLOWED = ErrorKind.NOT_ALLOWED
NOT_IMPLEMENTED = ErrorKind.NOT_IMPLEMENTED
COMMAND_INVALID = ErrorKind.COMMAND_INVALID


class BrokerError(Exception):
    """A refusal of the model: ``kind``, ``detail``, RabbitMQ's ``text`` and the answered method's ids."""

    def __init__(self, kind: ErrorKind, detail: str, class_id: int = 0, method_id: int = 0) -> None:
        self.kind = kind
        self.detail = detail
        self.text = fit_shortstr(f"{kind.value} - {detail}")
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(self.text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind.value}, {self.text!r}, {self.class_id}, {self.method_id})"


class BrokerChannelError(BrokerError):
    """The session goes on (AMQP: channel.close; the connection and its other channels go on)."""


class BrokerConnectionError(BrokerError):
    """The session ends (AMQP: connection.close)."""
