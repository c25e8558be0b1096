"""Runs of publishes: consecutive messages a channel publishes with the same basic.publish are
routed, stored and confirmed once per run instead of once per message. Their properties may differ
(message ids, timestamps, headers: the run then carries one block per message) except in what is
checked per message here (expiration, user_id, a direct reply-to): such a message ends the run.

The reader gathers alike publishes (one channel, method and property block) into a ``ContentRun``,
which the connection hands to ``publish_content_run``; each other fused publish (``ContentMessage``)
goes to ``publish_contents``, which takes the run that starts there. Anything out of the common
case (transactions, special properties, a body over the size limit, direct reply-to, or what
``VHost.publish_run`` declines) goes through ``Channel.on_message`` one message at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..broker.ops import publish as publish_ops
from ..wire.accel import load
from ..wire.frames import ContentMessage, ContentRun
from .channel_methods import REPLY_TO, REPLY_TO_PREFIX

if TYPE_CHECKING:
    from .channel import Channel

# expiration (first flags byte) or user_id (second byte): checked per message; so is a reply_to
# naming direct reply-to (a byte test: a false alarm only means one by one).
_EXPIRATION_HIGH = 0x01
_REPLY_TO_HIGH = 0x02
_USER_ID_LOW = 0x10
_DIRECT_REPLY = REPLY_TO.encode()
cpublish = load("lavinpy.amqp._cpublish")  # scan_run compiled (see py_scan_run)


def _checked_alone(properties: bytes) -> bool:
    """Whether a message with this property block must go through ``Channel.on_message``."""
    return (len(properties) < 2 or properties[0] & _EXPIRATION_HIGH or properties[1] & _USER_ID_LOW
            or (properties[0] & _REPLY_TO_HIGH and _DIRECT_REPLY in properties)) != 0


def py_scan_run(frames: Sequence[object], start: int, max_size: int) -> tuple[int, list[bytes], list[bytes] | None]:
    """The run that starts at ``frames[start]`` (a ContentMessage): the frames after it that are
    ContentMessages with the same method object and channel, a body of at most ``max_size`` bytes and
    the first one's properties, or (``varied``: each message's block, once one differs) a block not
    checked alone. Returns (index of the first frame not taken, the bodies, varied or None).
    Compiled: ``_cpublish.scan_run``, held to the same results by tests/amqp/test_publish_scan.py."""
    first = frames[start]
    assert type(first) is ContentMessage
    method, channel, properties = first.method, first.channel, first.properties
    end = start + 1
    count = len(frames)
    bodies = [first.body]
    varied: list[bytes] | None = None  # each message's properties, once one differs from the first's
    while end < count:
        frame = frames[end]
        if (type(frame) is not ContentMessage or frame.method is not method or frame.channel != channel
                or len(frame.body) > max_size):
            break
        if varied is not None:
            if _checked_alone(frame.properties):
                break
            varied.append(frame.properties)
        elif frame.properties != properties:
            if _checked_alone(frame.properties):
                break
            varied = [properties] * (end - start)
            varied.append(frame.properties)
        bodies.append(frame.body)
        end += 1
    return end, bodies, varied


if cpublish is not None:
    cpublish.init(ContentMessage, _DIRECT_REPLY)
    scan_run: Callable[[Sequence[object], int, int], tuple[int, list[bytes], list[bytes] | None]] = cpublish.scan_run
else:
    scan_run = py_scan_run


def publish_content_run(channel: Channel, run: ContentRun) -> bool:
    """Publish the messages of ``run`` (for the open ``channel``, not inside a content) as one run,
    exactly as ``publish_contents`` would take them; False, with nothing done, where they must go
    one at a time (the caller then hands them to ``publish_contents`` as ContentMessages)."""
    method, properties, bodies = run.method, run.properties, run.bodies
    max_size = channel.conn.config.max_message_size
    if (channel.tx is not None or method.immediate or _checked_alone(properties)
            or (not method.exchange and method.routing_key.startswith(REPLY_TO_PREFIX))
            # (a body in one frame is below frame_max: only a smaller size limit needs the walk)
            or (max_size < channel.conn.config.frame_max and max(map(len, bodies)) > max_size)):
        return False
    exchange = channel.publish_target(method)  # resolved and checked, as for each single publish
    if exchange is None:
        return False  # refused: the channel is closing, and drops the messages
    needs_sync = publish_ops.publish_run(channel.vhost, exchange, method.routing_key, properties, bodies,
                                         channel.counters)
    if needs_sync is None:
        return False
    channel.published_run(len(bodies), needs_sync)
    return True


def publish_contents(channel: Channel, frames: Sequence[object], start: int) -> int:
    """Publish ``frames[start]`` (a ContentMessage for the open ``channel``, not inside a content)
    and the run of identical publishes after it; returns the index of the first frame not taken."""
    first = frames[start]
    assert type(first) is ContentMessage
    method = first.method
    properties = first.properties
    max_size = channel.conn.config.max_message_size
    if (channel.tx is not None or method.immediate or _checked_alone(properties)
            or len(first.body) > max_size
            or (not method.exchange and method.routing_key.startswith(REPLY_TO_PREFIX))):
        channel.on_message(method, properties, first.body)
        return start + 1
    end, bodies, varied = (scan_run if type(frames) is list else py_scan_run)(frames, start, max_size)
    if end - start > 1:
        exchange = channel.publish_target(method)  # resolved and checked, as for each single publish
        if exchange is None:
            return start + 1  # refused: the channel is closing; the rest go the general way
        needs_sync = publish_ops.publish_run(channel.vhost, exchange, method.routing_key,
                                             properties if varied is None else varied, bodies, channel.counters)
        if needs_sync is not None:
            channel.published_run(end - start, needs_sync)
            return end
    for i in range(start, end):  # one by one, stopping where the channel stops taking fused publishes
        if channel.closing or channel.in_content:
            return i
        frame = frames[i]
        assert type(frame) is ContentMessage
        channel.on_message(frame.method, frame.properties, frame.body)
    return end
