"""One AMQP client connection as a state machine: bytes in, output bytes and effects out.

``receive_data`` takes what the client sent; ``data_to_send`` and ``take_effects`` give what to
write and what to do (pause/resume reading, close, timers); ``timer_fired`` reports a timer. The
socket, the timers and the write-buffer callbacks belong to the driver (transport.py); the states
and the moves between them are connection_states.py's table; the session layer it belongs to
(``SessionHost``) schedules its output and provides its body spool.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import commands

from ..broker.errors import BrokerConnectionError
from ..broker.ops import Actor, LoginAttempt, LoginOutcome, PeerCertificate
from ..broker.ops.ack_head import ack_head
from ..wire import writer
from ..wire.accel import cwire
from ..wire.constants import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    FRAME_MIN_SIZE,
    NOT_ALLOWED,
    PROTOCOL_HEADER,
    REPLY_SUCCESS,
    UNEXPECTED_FRAME,
)
from ..wire.errors import AMQPConnectionError
from ..wire.reader import (
    AckRun,
    BadProtocolHeader,
    BodyFrame,
    ContentMessage,
    ContentRun,
    FrameReader,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
    Publish,
    RefusedFrame,
)
from ..wire.shortstr import fit_shortstr
from .channel import Channel
from .closing import send_close_ok
from .connection_states import (
    AWAIT_HEADER,
    AWAIT_OPEN,
    AWAIT_START_OK,
    CLOSED,
    CLOSING,
    CLOSING_METHODS,
    HANDSHAKE_METHOD,
    OPEN,
    OPEN_CONNECTION_METHODS,
    check_transition,
)
from .effects import CancelTimer, Effect, SetTimer, TimerKind
from .log import RateLimitedLog
from .login_flow import LoginFlow
from .output import ConnectionOutput, OutputScheduler, init_room_check
from .publish_batch import publish_content_run, publish_contents
from .refusals import CONNECTION_ERRORS, reply_code

if TYPE_CHECKING:
    from ..broker.ops import Broker, VHost
    from .spool import BodySpool

log = logging.getLogger("lavinpy.connection")
# Client errors and internal errors, each at most a burst of lines per interval (shared by all clients).
client_error_log = RateLimitedLog(log)
internal_error_log = RateLimitedLog(log, burst=5, interval=60.0)
# (set up by sessions.py for exactly this class; None on the pure path)
_ack_read = cwire.ack_read if cwire is not None else None

HANDSHAKE_TIMEOUT = 10.0
CLOSE_WAIT_TIMEOUT = 3.0  # after the broker's connection.close, the client's close-ok is awaited this long
# Methods other than publishes and ack runs decoded and handled in one turn (a KiB of tables counts as one
# more; the rest waits undecoded or in _held_frames): 256 KiB of small methods held the loop 0.2-0.6 s.
METHODS_PER_TURN = 100
# Deliveries settled by multiple acks, nacks and rejects that count as one such method: 65,535 acked at
# once hold the loop about 1 ms, as long as a turn's 100 small methods may.
SETTLED_PER_METHOD = 1000


class SessionHost(OutputScheduler, Protocol):
    """What a connection needs of the session layer it belongs to (sessions.Sessions)."""

    broker: Broker
    connections: set[AMQPConnection]  # the live ones: a connection is in it from start to lost
    consuming: set[AMQPConnection]  # the live ones that sent basic.consume or basic.get (consumer timeouts)
    reply_to: dict[str, Channel]  # direct reply-to, for the channels: reply key -> requester

    def connection_started(self, connection: AMQPConnection) -> None:
        """Into ``connections`` and the model's connection registry."""

    def connection_lost(self, connection: AMQPConnection) -> None:
        """Out of ``connections``, ``consuming`` and the model's connection registry."""

    def run_pending(self) -> None:
        """Deliveries and output queued so far, now."""

    def end_of_input(self) -> None:
        """A batch of input was handled: the deliveries it made possible, now (their output waits for
        the loop's turn)."""

    def new_spool(self) -> BodySpool:
        """A body spool (files in the data dir) for this connection."""

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` alongside, on the adapter's event loop."""

    def watch_heartbeat(self, connection: AMQPConnection, due: float) -> None:
        """Call ``connection.heartbeat_due`` at ``due`` (one wheel for all connections, not a timer each)."""

    def unwatch_heartbeat(self, connection: AMQPConnection) -> None:
        """No more heartbeat checks for ``connection``."""


# Methods after which a channel can hold unacked deliveries (the consumer-timeout sweep looks at those).
CONSUMING_METHODS = (commands.Basic.Consume, commands.Basic.Get)


class AMQPConnection(ConnectionOutput, LoginFlow):
    __slots__ = ("sessions", "broker", "config", "reader", "state", "name", "peer_host", "username", "vhost",
                 "client_properties", "channels", "frame_max", "channel_max", "heartbeat", "heartbeat_slot",
                 "consuming", "published", "blocked", "confirms_pending", "settled_in_turn", "_last_recv",
                 "connected_at", "actor", "_login", "_held_frames", "_held_input", "_body_spool", "_torn_down",
                 "peer_certificate", "auth_mechanism", "login_outcome", "__weakref__")

    sessions: SessionHost

    def __init__(self, sessions: SessionHost, peer: tuple[Any, ...] | None = None) -> None:
        self.sessions = sessions
        self.broker = broker = sessions.broker
        self.config = broker.config
        # Until tune-ok, frames up to initial_frame_max: a stranger's partial frame is held up to that.
        self.reader = FrameReader(min(self.config.frame_max, self.config.initial_frame_max),
                                  methods_per_feed=METHODS_PER_TURN)
        self.state = AWAIT_HEADER
        self.name = "?"
        self.peer_host: str | None = None
        if peer is not None:
            self.peer_host = peer[0]
            self.name = f"{peer[0]}:{peer[1]}"
        self.username = ""
        self.peer_certificate: PeerCertificate | None = None  # a verified client certificate (set by the driver)
        self.auth_mechanism = "PLAIN"
        self.login_outcome: LoginOutcome | None = None  # the handshake's login (its backend, a token's grants)
        self.vhost: VHost | None = None
        self.client_properties: dict = {}
        self.channels: dict[int, Channel] = {}
        self.frame_max = self.config.frame_max
        self.channel_max = self.config.channel_max
        self.heartbeat = 0
        self.heartbeat_slot: int | None = None  # the session layer's heartbeat wheel slot it waits in
        self.consuming = False  # has sent basic.consume or basic.get (then in sessions.consuming)
        # Has published: under a resource alarm such a connection is no longer read (the API's
        # "blocked"); one that never published still is, until it does ("blocking").
        self.published = False
        self.blocked = False
        self.confirms_pending: set[Channel] = set()
        self.settled_in_turn = 0
        self.init_output()
        self._last_recv = time.monotonic()
        self.connected_at = int(time.time() * 1000)  # RabbitMQ's connected_at: ms since the epoch
        self.actor: Actor | None = None  # the logged-in user, set once the vhost is open
        # A login being decided (the throttle's delay, a slow hash): meanwhile nothing more is read or
        # handled; the frames already read wait in _held_frames, input read before the pause in _held_input.
        self._login: LoginAttempt | None = None
        self._held_frames: list[Any] = []
        self._held_input: list[bytes] = []
        self._body_spool: BodySpool | None = None
        self._torn_down = False

    # --- driver interface -----------------------------------------------------------------------
    def start(self) -> None:
        """The client is connected: the handshake clock starts."""
        self.sessions.connection_started(self)
        self.broker.node_counters.connection_opened()
        self.effect(SetTimer(TimerKind.HANDSHAKE, HANDSHAKE_TIMEOUT))

    def input_left(self) -> bool:
        """Input read before the socket went is still held for the next turn (INPUT_TURN), and will be
        applied: the connection is open and no login is being decided. A driver whose socket has gone
        gives it its turns before it reports ``lost``: the client sent it before it went, so its acks
        count and its publishes are routed (the replies go nowhere)."""
        return self.state == OPEN and self._input_waits()

    def _input_waits(self) -> bool:
        """Input is held for the next turn (INPUT_TURN runs it), and no login is being decided."""
        return self._login is None and bool(self._held_frames or self._held_input or self.reader.undecoded)

    def lost(self) -> None:
        """The socket is gone (whoever closed it)."""
        if self.state != CLOSED:
            self.enter_state(CLOSED)
        self.teardown()
        if self in self.sessions.connections:  # lost once, counted once
            self.sessions.connection_lost(self)
            self.broker.node_counters.connection_closed()

    def timer_fired(self, kind: TimerKind) -> None:
        if kind is TimerKind.INPUT_TURN:
            self.end_input_turn()
            if self.state < CLOSED and self._input_waits():
                self._run_held()
        elif kind is TimerKind.LOGIN and self._login is not None:
            self._decide_login(self._login)
        elif kind is TimerKind.HANDSHAKE and self.state < OPEN:
            log.info("connection %s: handshake timed out", self.name)
            self.abort()
        elif kind is TimerKind.CLOSE_WAIT or kind is TimerKind.LINGER:  # the client did not close in time
            self.abort()
        elif kind is TimerKind.CREDENTIAL:
            self.credential_expired()

    def teardown(self) -> None:
        """The connection is over for the broker: channels close, exclusive queues go (once)."""
        if self._torn_down:
            return
        self._torn_down = True
        login, self._login = self._login, None
        if login is not None:
            login.abandon()
        self.sessions.unwatch_heartbeat(self)
        for channel in list(self.channels.values()):
            channel.release()
        self.broker.client_limits.channels_closed(self.username, len(self.channels))
        self.channels.clear()
        if self._body_spool is not None:
            self._body_spool.close()
        if self.vhost is not None:
            for queue in list(self.vhost.queues_owned_by(self)):
                self.vhost.delete_queue(queue.name)
            self.broker.client_limits.connection_closed(self.vhost.name, self.username)
            log.info("connection %s closed (user %r, vhost %r)", self.name, self.username, self.vhost.name)

    def receive_data(self, data: bytes, resumed: bool = False) -> None:
        """Everything the client sent since the last call; replies and effects queue up (``resumed``:
        held input, b"" for none, behind the rest of a read left undecoded)."""
        if _ack_read is not None and not self._held_frames:
            # A consumer's read of in-order acks, the commonest read with many consumers, in one compiled
            # call (False: not that read, nothing done; the rest of this method is its pure twin)
            try:
                if _ack_read(self, data):
                    return
            except Exception as e:
                self._read_failed(e)
                return
        self._last_recv = time.monotonic()
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if self.state >= CLOSED:
            return
        if (self._login is not None or self._held_frames or self.reader.undecoded) and not resumed:
            self._held_input.append(data)  # read before the pause took effect: after those
            return
        if data == writer.HEARTBEAT and self.state == OPEN and not self.reader.buffered:
            return  # an idle client's heartbeat, alone: noted above, nothing else to do
        try:
            frames = self.reader.feed(data)
        except BadProtocolHeader:
            self.send(PROTOCOL_HEADER)
            self.abort()
            return
        except CONNECTION_ERRORS as e:
            self.close_with_error(e)
            return
        if self.state == AWAIT_HEADER and not self.reader.expect_protocol_header:
            self.greet()
        self._run_frames(frames, len(data))
        if self.reader.undecoded and self._login is None and not self._held_frames and self.state < CLOSED:
            self.yield_input_turn()  # the rest of the read in the next turn (INPUT_TURN: _run_held)

    def _run_frames(self, frames: list[Any], nbytes: int) -> None:
        """Handle ``frames`` (from ``nbytes`` of input) in order; a login that must wait holds the rest."""
        channels = self.channels
        methods = 0
        self.settled_in_turn = 0
        try:
            i = 0
            while i < len(frames):
                frame: Any = frames[i]  # dispatched on type(frame), the cheapest test
                i += 1
                kind = type(frame)
                if kind is AckRun:
                    channel = channels.get(frame.channel)
                    if (self.state == OPEN and channel is not None and not channel.closing
                            and not channel.in_content):
                        # the common case in one compiled call (False: not it, nothing done)
                        if ack_head is None or channel.tx is not None or not ack_head(channel.deliveries,
                                                                                      frame.tags):
                            channel.on_ack_run(frame.tags)
                    else:  # the general path takes them one frame at a time
                        i -= 1
                        frames[i:i + 1] = frame.frames()
                    continue
                if kind is ContentRun:
                    channel = channels.get(frame.channel)
                    if (self.state != OPEN or channel is None or channel.closing or channel.in_content
                            or not publish_content_run(channel, frame)):
                        i -= 1  # the general path takes them one message at a time
                        frames[i:i + 1] = frame.messages()
                    continue
                if self.state != OPEN:
                    if self.state >= CLOSING:
                        self._handle_while_closing(frame)
                    else:
                        self._handle_frame(frame)
                        if self._login is not None:
                            self._held_frames = frames[i:]
                            break
                    continue
                # Hot path: content frames and basic.publish straight to an open channel.
                if kind is ContentMessage:
                    channel = channels.get(frame.channel)
                    if channel is not None and not channel.closing and not channel.in_content:
                        i = publish_contents(channel, frames, i - 1)
                    else:
                        for part in frame.frames():
                            if self.state != OPEN:
                                break
                            self._handle_frame(part)
                    continue
                if kind is BodyFrame or kind is HeaderFrame:
                    channel = channels.get(frame.channel)
                    if channel is not None and not channel.closing and channel.in_content:
                        if kind is BodyFrame:
                            channel.on_body(frame.data)
                        else:
                            channel.on_header(frame)
                        continue
                elif kind is MethodFrame and type(frame.method) is Publish:
                    channel = channels.get(frame.channel)
                    if channel is not None and not channel.closing and not channel.in_content:
                        channel.on_publish(frame.method)
                        continue
                self._handle_frame(frame)
                methods += 1
                if self._login is not None or (
                        methods + self.settled_in_turn // SETTLED_PER_METHOD >= METHODS_PER_TURN and i < len(frames)):
                    self._held_frames = frames[i:]  # an update-secret being decided, or the others' turn
                    if self._login is None:
                        self.yield_input_turn()
                    break
            if self.confirms_pending:
                pending, self.confirms_pending = self.confirms_pending, set()
                for channel in pending:
                    channel.send_confirms()
            self.sessions.end_of_input()
            self.broker.note_input(nbytes)
            self.count_input_turn(nbytes)
        except Exception as e:
            self._read_failed(e)

    def _read_failed(self, e: Exception) -> None:
        """A read raised ``e``: the connection closes with its code (541 for a bug: not the broker's end)."""
        if isinstance(e, CONNECTION_ERRORS):
            self.close_with_error(e)
            return
        if internal_error_log.allow():
            log.exception("connection %s: internal error", self.name)
        self.close_with_error(AMQPConnectionError(541, f"internal error: {type(e).__name__}"))

    def body_spool(self) -> BodySpool:
        """Where this connection's large incoming bodies and uncommitted publishes wait."""
        if self._body_spool is None:
            self._body_spool = self.sessions.new_spool()
        return self._body_spool

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (a wait for the store, say) alongside: the adapter's loop runs it, not this core."""
        self.sessions.start_task(work)

    def enter_state(self, state: int) -> None:
        """Move to ``state`` (connection_states); a move the table does not allow is a bug."""
        self.state = check_transition(self.state, state)

    def abort(self) -> None:
        """Close the socket (after writing what is queued); input from now on is ignored."""
        if self.state != CLOSED:
            self.enter_state(CLOSED)
        self.effect(Effect.CLOSE)

    # --- closing ------------------------------------------------------------------------------
    def close_with_error(self, error: AMQPConnectionError | BrokerConnectionError) -> None:
        client_error_log.log(logging.INFO, "connection %s closed by the broker: %s", self.name, error.text)
        self.close(reply_code(error), error.text, error.class_id, error.method_id)

    def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        if self.state >= CLOSING:
            return
        if self.state < AWAIT_START_OK:
            self.abort()
            return
        self.send(writer.method_frame(0, commands.Connection.Close(
            reply_code=code, reply_text=fit_shortstr(text), class_id=class_id, method_id=method_id)))
        self.enter_state(CLOSING)
        for channel in list(self.channels.values()):
            channel.release()
        # Give the client a moment to answer close-ok, then drop it anyway.
        self.effect(SetTimer(TimerKind.CLOSE_WAIT, CLOSE_WAIT_TIMEOUT))

    def _handle_while_closing(self, frame: Any) -> None:
        if self.state >= CLOSED:
            return  # close-ok sent: the rest of the client's input is discarded
        method = getattr(frame, "method", None)
        if not isinstance(method, CLOSING_METHODS):
            return  # discarded: the client has not seen the broker's connection.close yet
        if isinstance(method, commands.Connection.CloseOk):
            self.abort()
        else:
            send_close_ok(self)

    # --- frames -------------------------------------------------------------------------------
    def _handle_frame(self, frame: Any) -> None:
        if isinstance(frame, HeartbeatFrame):
            return
        channel_id = frame.channel
        if self.state != OPEN:
            self._handle_handshake(frame)
            return
        if channel_id == 0:
            if not isinstance(frame, MethodFrame):
                raise AMQPConnectionError(UNEXPECTED_FRAME, "content frame on channel 0")
            self._handle_connection_method(frame.method)
            return
        channel = self.channels.get(channel_id)
        if channel is None:
            method = getattr(frame, "method", None)
            if isinstance(method, commands.Channel.Open):
                self._open_channel(channel_id)
                return
            if isinstance(method, (commands.Channel.Close, commands.Channel.CloseOk)):
                if isinstance(method, commands.Channel.Close):
                    self.send(writer.method_frame(channel_id, commands.Channel.CloseOk()))
                return
            raise AMQPConnectionError(CHANNEL_ERROR, f"expected 'channel.open' on channel {channel_id}")
        if type(frame) is RefusedFrame:  # a well-framed method or header with unacceptable tables
            if not channel.closing:
                channel.close_with_error(frame.error, None)
            return
        method = getattr(frame, "method", None)
        if isinstance(method, commands.Channel.Open) and not channel.closing:
            raise AMQPConnectionError(CHANNEL_ERROR, f"channel {channel_id} is already open")
        if not self.consuming and isinstance(method, CONSUMING_METHODS):
            self.consuming = True
            self.sessions.consuming.add(self)
        channel.handle_frame(frame)

    def _open_channel(self, channel_id: int) -> None:
        # RabbitMQ counts the open channels against channel_max; any number 1..65535 may be used
        # (aiormq's test suite opens channel 65535 on a connection tuned to channel_max 2047).
        if len(self.channels) >= self.channel_max:
            raise AMQPConnectionError(NOT_ALLOWED, f"number of channels opened ({len(self.channels)}) has "
                                                   f"reached the negotiated channel_max ({self.channel_max})")
        self.broker.client_limits.channel_opened(self.username)  # the user's max-channels
        self.channels[channel_id] = Channel(self, channel_id)  # counted open by its books
        self.send(writer.method_frame(channel_id, commands.Channel.OpenOk()))

    def remove_channel(self, channel_id: int) -> None:
        channel = self.channels.pop(channel_id, None)
        if channel is not None:
            channel.release()
            self.broker.client_limits.channels_closed(self.username)

    def _handle_connection_method(self, method: Any) -> None:
        if not isinstance(method, OPEN_CONNECTION_METHODS):
            raise AMQPConnectionError(CHANNEL_ERROR, f"unexpected method {method.name} on channel 0")
        if isinstance(method, commands.Connection.Close):
            send_close_ok(self)
        elif isinstance(method, commands.Connection.CloseOk):
            self.abort()
        elif isinstance(method, commands.Connection.UpdateSecret):
            self.on_update_secret(method)
        # connection.blocked and unblocked: a client may send these; nothing to do

    # --- handshake ----------------------------------------------------------------------------
    def _handle_handshake(self, frame: Any) -> None:
        method = getattr(frame, "method", None)
        if frame.channel != 0 or method is None:
            raise AMQPConnectionError(COMMAND_INVALID, "expected a connection method on channel 0 "
                                                       "during the handshake")
        if isinstance(method, commands.Connection.Close):
            send_close_ok(self)
            return
        expected = HANDSHAKE_METHOD.get(self.state)
        if expected is None or not isinstance(method, expected):
            raise AMQPConnectionError(COMMAND_INVALID, f"unexpected {method.name} during the handshake")
        if isinstance(method, commands.Connection.StartOk):
            self._on_start_ok(method)
        elif isinstance(method, commands.Connection.TuneOk):
            self._on_tune_ok(method)
        elif isinstance(method, commands.Connection.Open):
            self._on_open(method)

    def capability(self, name: str) -> bool:
        caps = self.client_properties.get("capabilities")
        return isinstance(caps, dict) and bool(caps.get(name))

    def _on_tune_ok(self, method: commands.Connection.TuneOk) -> None:
        frame_max = method.frame_max or self.config.frame_max
        if frame_max < FRAME_MIN_SIZE:
            raise AMQPConnectionError(NOT_ALLOWED, f"frame_max={frame_max} < {FRAME_MIN_SIZE} min size")
        if frame_max > self.config.frame_max:
            raise AMQPConnectionError(NOT_ALLOWED, f"frame_max={frame_max} > {self.config.frame_max} max size")
        self.frame_max = frame_max
        self.reader.frame_max = frame_max
        self.channel_max = method.channel_max or self.config.channel_max
        if self.channel_max > self.config.channel_max:
            raise AMQPConnectionError(NOT_ALLOWED, f"channel_max={self.channel_max} > "
                                                   f"{self.config.channel_max} max")
        self.heartbeat = method.heartbeat
        self.enter_state(AWAIT_OPEN)

    def _on_open(self, method: commands.Connection.Open) -> None:
        name = method.virtual_host or "/"
        outcome = self.broker.logins.admit(self.login_outcome or LoginOutcome(self.username), name)
        if not outcome.ok:
            raise AMQPConnectionError(NOT_ALLOWED, outcome.text.removeprefix("NOT_ALLOWED - "))
        self.vhost, self.actor = outcome.vhost, outcome.actor
        self.enter_state(OPEN)
        self.send(writer.method_frame(0, commands.Connection.OpenOk()))
        self.effect(CancelTimer(TimerKind.HANDSHAKE))
        if self.heartbeat:
            self.sessions.watch_heartbeat(self, time.monotonic() + self.heartbeat / 2)
        if self.broker.blocked_reason and self.capability("connection.blocked"):
            self.set_blocked(self.broker.blocked_reason)
        log.info("connection %s opened (user %r, vhost %r)", self.name, self.username, name)

    # --- heartbeats ---------------------------------------------------------------------------
    def heartbeat_due(self, now: float) -> None:
        """Every heartbeat/2 seconds (the session layer's wheel): send one if nothing else was sent
        meanwhile; close a client silent for two heartbeats."""
        if self.state >= CLOSING:
            return
        # While reading is paused (output backed up, alarm) the client's heartbeats stay unread.
        if now - self._last_recv > 2 * self.heartbeat and not self.reading_paused:
            log.info("connection %s: missed heartbeats from client, timeout %ds", self.name, self.heartbeat)
            self.abort()
            return
        if now - self.last_send >= self.heartbeat / 2:
            self.send(writer.HEARTBEAT)
        self.sessions.watch_heartbeat(self, now + self.heartbeat / 2)

    # --- flow ---------------------------------------------------------------------------------
    def set_blocked(self, reason: str | None) -> None:
        """Resource alarm: tell the client and stop reading its publishes until cleared."""
        if self.state != OPEN:
            return
        if reason and not self.blocked:
            self.blocked = True
            if self.capability("connection.blocked"):
                self.send(writer.method_frame(0, commands.Connection.Blocked(reason=reason)))
            self.update_reading()
        elif not reason and self.blocked:
            self.blocked = False
            if self.capability("connection.blocked"):
                self.send(writer.method_frame(0, commands.Connection.Unblocked()))
            self.update_reading()

    def schedule_channel_deliveries(self, channel: Channel) -> None:
        assert self.vhost is not None
        for consumer in channel.consumers.values():
            if consumer.queue.message_count:
                self.vhost.schedule_delivery(consumer.queue)

    def consumers_have_room(self) -> bool:
        """Whether a consumer on this connection may take more deliveries now (its prefetch windows are
        not all full): only then is its output worth holding for more (ConnectionOutput.run_pending)."""
        for channel in self.channels.values():
            consumers = channel.consumers
            if not consumers:
                continue
            deliveries = channel.deliveries  # its room() inline: this runs per held output and turn
            if not deliveries.prefetch or len(deliveries.unacked) < deliveries.prefetch:
                for consumer in consumers.values():
                    if consumer.no_ack or not consumer.prefetch or consumer.unacked < consumer.prefetch:
                        return True
        return False

    def shutdown(self, text: str = "broker shutdown") -> None:
        """Server stopping: connection.close 320 to the client."""
        if self.state == OPEN:
            self.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {text}")
        else:
            self.abort()


init_room_check(AMQPConnection.consumers_have_room)  # the output hold's check, compiled (output.py)


# OPEN and CLOSING stay importable from here (session views, tests) as before the states had a module.
__all__ = ["AMQPConnection", "CLOSED", "CLOSING", "OPEN", "REPLY_SUCCESS", "SessionHost"]
