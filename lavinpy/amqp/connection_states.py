"""A connection's states, the transitions allowed between them and what each state accepts.

AMQP 0-9-1 section 2.2.4: the client sends the protocol header, the broker connection.start; then
start-ok, tune / tune-ok, open / open-ok. Either side may close (close / close-ok). The states are
small ints in order (``state < OPEN`` is "still in the handshake", ``state >= CLOSING`` "closing or
closed"), because the connection compares them for every frame it reads.

A move the table does not allow is a bug in the broker, not bad input: ``check_transition`` raises
``IllegalTransition``. Bad input (a method a state does not accept) is answered by the connection
with RabbitMQ's reply codes.
"""

from __future__ import annotations

from pamqp import commands

AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, OPEN, CLOSING, CLOSED = range(7)
STATE_NAMES = ("AWAIT_HEADER", "AWAIT_START_OK", "AWAIT_TUNE_OK", "AWAIT_OPEN", "OPEN", "CLOSING", "CLOSED")

# state -> the states it may move to. Any state may end in CLOSED (the socket is gone, a protocol
# header refused, a timer expired, close-ok sent); CLOSING (the broker's connection.close, answered by
# the client's close-ok) needs connection.start to have been sent.
TRANSITIONS: dict[int, frozenset[int]] = {
    AWAIT_HEADER: frozenset({AWAIT_START_OK, CLOSED}),
    AWAIT_START_OK: frozenset({AWAIT_TUNE_OK, CLOSING, CLOSED}),
    AWAIT_TUNE_OK: frozenset({AWAIT_OPEN, CLOSING, CLOSED}),
    AWAIT_OPEN: frozenset({OPEN, CLOSING, CLOSED}),
    OPEN: frozenset({CLOSING, CLOSED}),
    CLOSING: frozenset({CLOSED}),
    CLOSED: frozenset(),
}

# AWAIT_HEADER accepts the protocol header only (the frame reader checks it).
# Each handshake state accepts one method on channel 0 (and connection.close, as every state before
# CLOSING does); the next state (the table above) is entered once the method was accepted and answered.
HANDSHAKE_METHOD: dict[int, type] = {
    AWAIT_START_OK: commands.Connection.StartOk,
    AWAIT_TUNE_OK: commands.Connection.TuneOk,
    AWAIT_OPEN: commands.Connection.Open,
}
# OPEN accepts these on channel 0, and anything on the other channels (the channels judge it).
OPEN_CONNECTION_METHODS = (commands.Connection.Close, commands.Connection.CloseOk,
                           commands.Connection.UpdateSecret, commands.Connection.Blocked,
                           commands.Connection.Unblocked)
# CLOSING reads only these; everything else the client sends meanwhile is discarded.
CLOSING_METHODS = (commands.Connection.Close, commands.Connection.CloseOk)
# CLOSED reads nothing: the client's leftovers are discarded until it closes the socket.


class IllegalTransition(RuntimeError):
    """A state change the table does not allow: a bug in the broker."""


def check_transition(current: int, new: int) -> int:
    """``new`` if the table allows moving there from ``current``; else IllegalTransition."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"connection state {STATE_NAMES[current]} -> {STATE_NAMES[new]}")
    return new
