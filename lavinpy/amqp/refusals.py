"""The model's refusals (``broker.errors``) as AMQP reply codes: the one table, and the error kinds
the sessions close a channel or the connection with, the model's and the codec's alike."""

from __future__ import annotations

from ..broker.errors import BrokerChannelError, BrokerConnectionError, BrokerError, ErrorKind
from ..wire import constants
from ..wire.errors import AMQPChannelError, AMQPConnectionError, AMQPError

REPLY_CODES: dict[ErrorKind, int] = {
    ErrorKind.NOT_FOUND: constants.NOT_FOUND,  # 404
    ErrorKind.ACCESS_REFUSED: constants.ACCESS_REFUSED,  # 403
    ErrorKind.RESOURCE_LOCKED: constants.RESOURCE_LOCKED,  # 405
    ErrorKind.PRECONDITION_FAILED: constants.PRECONDITION_FAILED,  # 406
    ErrorKind.RESOURCE_ERROR: constants.RESOURCE_ERROR,  # 506
    ErrorKind.NOT_ALLOWED: constants.NOT_ALLOWED,  # 530
    ErrorKind.NOT_IMPLEMENTED: constants.NOT_IMPLEMENTED,  # 540
    ErrorKind.COMMAND_INVALID: constants.COMMAND_INVALID,  # 503
}

# What closes a channel, and what closes the connection (the model's refusals and the session's own).
CHANNEL_ERRORS = (AMQPChannelError, BrokerChannelError)
CONNECTION_ERRORS = (AMQPConnectionError, BrokerConnectionError)


def reply_code(error: AMQPError | BrokerError) -> int:
    """The reply code a close carries: the session's own, or the model's kind through the table. The
    reply text is the error's ``text`` either way (RabbitMQ's names are the kinds' names)."""
    return error.reply_code if isinstance(error, AMQPError) else REPLY_CODES[error.kind]
