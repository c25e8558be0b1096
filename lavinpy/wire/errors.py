"""Errors carrying an AMQP reply code and text, raised by the codec and the AMQP session's own checks.

The AMQP session turns them into channel.close / connection.close (the model's refusals are
``lavinpy.broker.errors``, which the session maps to reply codes the same way). Plain attributes, no
protocol objects.
"""

from __future__ import annotations

from lavinpy.wire.constants import REPLY_NAMES
from lavinpy.wire.shortstr import fit_shortstr


class AMQPError(Exception):
    """An error with ``reply_code`` and ``text`` (what a close method carries) and the offending method's ids.

    ``text`` starts with the reply code's name, the way RabbitMQ writes it
    ("NOT_FOUND - no queue 'x' in vhost '/'"), and is cut to 255 UTF-8 bytes so it always encodes.
    ``frames`` holds the frames a ``FrameReader.feed`` call decoded before it met the error.
    """

    def __init__(self, reply_code: int, detail: str, class_id: int = 0, method_id: int = 0) -> None:
        self.reply_code = reply_code
        self.detail = detail
        self.text = fit_shortstr(f"{REPLY_NAMES.get(reply_code, 'UNKNOWN')} - {detail}")
        self.class_id = class_id
        self.method_id = method_id
        # Set by FrameReader.feed: frames decoded from the same input before the error.
        self.frames: list = []
        super().__init__(self.text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reply_code}, {self.text!r}, {self.class_id}, {self.method_id})"


class AMQPConnectionError(AMQPError):
    """A hard error: the session sends connection.close and closes the connection."""


class AMQPChannelError(AMQPError):
    """A soft error: the session sends channel.close; the connection and its other channels go on."""
