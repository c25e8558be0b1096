"""Replies after the disk: one ordered queue per session (an AMQP channel, an MQTT connection).

A reply that promises its change is durable waits for ``VHost.durable()`` (messages, acks) or
``VHost.replicated()`` (definitions) before it goes out. ``ReplyQueue`` releases such replies in the
order the methods that caused them arrived, each once its own wait and every earlier one is done,
through done-callbacks (no task, no future of its own). Frames the session sends while a reply
waits are queued behind it (``follow``), so a method's consequences (basic.cancel of a deleted
queue's consumers) never overtake its reply.

One failure rule per kind of reply, for a wait that fails (a failed fsync, a lost replication):

- a publisher confirm (``confirm``, one entry per batch of publishes): refused; the face nacks the
  batch (basic.nack) and the session goes on, as RabbitMQ nacks what it cannot take responsibility
  for;
- a reply to a method (``commit``: tx.commit-ok, declare/bind/unbind/delete/purge-ok, MQTT PUBACK):
  the face closes the session (AMQP: the channel, 506 RESOURCE_ERROR naming the failure; MQTT: the
  connection), so the client reconnects and retries; nothing queued behind it goes out.

Publisher confirms answer no method (they are asynchronous in AMQP): they keep their own order and
neither wait for nor hold back the replies to methods, so a channel that publishes with confirms
gets its other replies without an fsync's delay.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

# What a failed wait is called in the text a face sends (AMQP: "RESOURCE_ERROR - " before it).
DURABILITY_FAILED = "could not write to disk or replicate"


class ReplySink(Protocol):
    """The session a queue's replies go to (it renders them in its protocol)."""

    def send_reply(self, reply: Any) -> None:
        """A method's reply (its change durable) or a frame that followed it."""

    def durability_failed(self, reply: Any, reason: str) -> None:
        """A method's reply whose wait failed: close the session (the queue has stopped)."""


class ConfirmSink(Protocol):
    """Where a session's publisher confirms go (AMQP's confirm mode)."""

    def send_confirm(self, batch: Any) -> None:
        """A batch of publisher confirms whose messages are durable."""

    def refuse_confirm(self, batch: Any, reason: str) -> None:
        """A batch of publisher confirms whose wait failed: nack them; the session goes on."""


def failure_reason(wait: asyncio.Future[None]) -> str | None:
    """None when ``wait`` (done) succeeded, else what failed, for the face's text and log."""
    if wait.cancelled():
        return f"{DURABILITY_FAILED}: cancelled"
    error = wait.exception()
    if error is None:
        return None
    return f"{DURABILITY_FAILED}: {error}"


class _Entry:
    """A method's reply or a frame behind one; ``held`` while its method runs (see ``hold``)."""

    __slots__ = ("wait", "reply", "held", "last")

    def __init__(self, wait: asyncio.Future[None] | None, reply: Any, held: bool = False,
                 last: bool = False) -> None:
        self.wait = wait
        self.reply = reply
        self.held = held
        self.last = last  # the session's last frame (its close): nothing follows it


class ReplyQueue:
    """A session's replies after the disk, in order; see the module's docstring for the rules."""

    __slots__ = ("_sink", "_confirm_sink", "_released", "_replies", "_confirms", "stopped")

    def __init__(self, sink: ReplySink, confirm_sink: ConfirmSink | None = None,
                 released: Callable[[], None] | None = None) -> None:
        self._sink = sink
        self._confirm_sink = confirm_sink
        self._released = released  # called when no method reply waits any more (held deliveries may go)
        # Made on first use: most sessions never wait (an idle device or channel stays small).
        self._replies: deque[_Entry] | None = None  # method replies and what follows them
        self._confirms: deque[tuple[asyncio.Future[None] | None, Any]] | None = None  # (wait, batch)
        self.stopped = False  # the session is over: nothing more goes out

    @property
    def waiting(self) -> bool:
        """A method's reply waits: what the session sends now must go behind it (``follow``)."""
        return bool(self._replies)

    # --- method replies -----------------------------------------------------------------------
    def commit(self, wait: asyncio.Future[None] | None, reply: Any) -> None:
        """A method's reply, sent once ``wait`` (None: nothing to wait for) and the replies before it
        are done; a failed wait closes the session."""
        if self.stopped:
            return
        if not self._replies and (wait is None or (wait.done() and failure_reason(wait) is None)):
            self._sink.send_reply(reply)  # nothing to wait for: at once
            return
        self._queue(_Entry(wait, reply))
        self._watch(wait)

    def follow(self, reply: Any, last: bool = False) -> None:
        """A frame with no wait of its own, after the replies queued before it (at once if none);
        ``last``: the session's close, after which the queue stops."""
        if self.stopped:
            return
        if self._replies:
            self._replies.append(_Entry(None, reply, last=last))
            return
        self._sink.send_reply(reply)
        if last:
            self.stop()

    def hold(self) -> object:
        """A place for the reply of a method about to run: what the session sends meanwhile (frames
        the method causes) waits behind it until ``fill``."""
        entry = _Entry(None, None, held=True)
        if not self.stopped:
            self._queue(entry)
        return entry

    def fill(self, place: object, wait: asyncio.Future[None] | None, reply: Any) -> None:
        """The reply (None: the method has none, or failed) for a place taken by ``hold``."""
        assert isinstance(place, _Entry)
        place.held = False
        place.wait = wait
        place.reply = reply
        if self.stopped:
            return
        if wait is None or wait.done():
            self._release()
        else:
            self._watch(wait)

    def _queue(self, entry: _Entry) -> None:
        if self._replies is None:
            self._replies = deque()
        self._replies.append(entry)

    def _watch(self, wait: asyncio.Future[None] | None) -> None:
        if wait is None or wait.done():
            self._release()
        else:
            wait.add_done_callback(self._release)

    def _release(self, _done: object = None) -> None:
        """Send the leading replies whose wait is over, in order."""
        replies, sink = self._replies, self._sink
        if replies is None:
            return
        released = False
        while replies and not self.stopped:
            entry = replies[0]
            wait = entry.wait
            if entry.held or (wait is not None and not wait.done()):
                break
            replies.popleft()
            released = True
            reason = None if wait is None else failure_reason(wait)
            if reason is not None:
                self.stop()
                sink.durability_failed(entry.reply, reason)
                return
            if entry.reply is not None:
                sink.send_reply(entry.reply)
            if entry.last:
                self.stop()
                return
        if released and not replies and not self.stopped and self._released is not None:
            self._released()

    # --- publisher confirms -------------------------------------------------------------------
    def confirm(self, wait: asyncio.Future[None] | None, batch: Any) -> None:
        """A batch of publisher confirms, after ``wait`` and the batches before it; a failed wait
        refuses the batch. One entry and one done-callback per batch, none per message."""
        if self.stopped:
            return
        confirms = self._confirms
        if not confirms and wait is None:
            assert self._confirm_sink is not None
            self._confirm_sink.send_confirm(batch)
            return
        # In order after the batches still waiting, but these messages joined the group commit at
        # the call, not once the earlier confirms went out (a replicated flush is acknowledged later
        # than the next one can start). A callback: the confirm goes out in the turn the flush ends.
        if confirms is None:
            confirms = self._confirms = deque()
        confirms.append((wait, batch))
        if wait is None or wait.done():
            self._release_confirms()
        else:
            wait.add_done_callback(self._release_confirms)

    def _release_confirms(self, _done: object = None) -> None:
        confirms, sink = self._confirms, self._confirm_sink
        if confirms is None:
            return  # stopped before the flush ended
        assert sink is not None
        while confirms and not self.stopped:
            wait, batch = confirms[0]
            if wait is not None and not wait.done():
                return
            confirms.popleft()
            reason = None if wait is None else failure_reason(wait)
            if reason is None:
                sink.send_confirm(batch)
            else:
                sink.refuse_confirm(batch, reason)

    # --- the end ------------------------------------------------------------------------------
    def stop(self) -> None:
        """The session is over (closed, or its connection gone): what still waits is dropped."""
        self.stopped = True
        self._replies = self._confirms = None
