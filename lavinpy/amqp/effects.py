"""What a connection state machine asks of the code that owns its socket.

The connection never touches a transport: it queues output bytes (``data_to_send``) and these
effects (``take_effects``), and its driver (an asyncio protocol, or a test) carries them out in
order, after writing the output queued before them.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class Effect(Enum):
    PAUSE_READING = "pause_reading"
    RESUME_READING = "resume_reading"
    CLOSE = "close"  # close the socket once the output queued so far is written


class TimerKind(Enum):
    HANDSHAKE = "handshake"  # the client has this long to finish the handshake
    HEARTBEAT = "heartbeat"  # every heartbeat/2 seconds: send one, check the client's
    CLOSE_WAIT = "close_wait"  # after the broker's connection.close: drop a client that never answers
    LINGER = "linger"  # after close-ok: read and discard until the client closes, at most this long
    LOGIN = "login"  # a throttled login answer
    INPUT_TURN = "input_turn"  # 0 s: read again once the other clients had their turn
    CREDENTIAL = "credential"  # the login's credential (a token) expires: the connection is closed


class SetTimer(NamedTuple):
    """Call ``timer_fired(kind)`` after ``delay`` seconds (replacing a timer of that kind)."""

    kind: TimerKind
    delay: float


class CancelTimer(NamedTuple):
    kind: TimerKind


ConnectionEffect = Effect | SetTimer | CancelTimer
