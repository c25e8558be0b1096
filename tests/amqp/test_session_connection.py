"""AMQPConnection as a state machine: bytes in, bytes and effects out, no socket, no event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands, heartbeat
from session_client import PROTOCOL_HEADER, Client, Harness

from lavinpy.amqp import connection as connection_module
from lavinpy.amqp import connection_states as states
from lavinpy.amqp import consumer_timeout
from lavinpy.amqp import sessions as sessions_module
from lavinpy.amqp.effects import CancelTimer, Effect, SetTimer, TimerKind


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, heartbeat=20)
    yield h
    h.close()


def test_protocol_header_start_tune_open(harness: Harness) -> None:
    client = harness.connect()
    assert client.read() == []
    assert client.effects == [SetTimer(TimerKind.HANDSHAKE, 10.0)]
    assert client.conn in harness.sessions.connections

    client.send(PROTOCOL_HEADER[:5])  # a header split over two reads
    assert client.read() == []
    client.send(PROTOCOL_HEADER[5:])
    [(channel, start)] = client.read()
    assert channel == 0 and isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "PLAIN AMQPLAIN"
    capabilities = start.server_properties["capabilities"]
    assert isinstance(capabilities, dict) and capabilities["publisher_confirms"] is True

    client.send((0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                response="\0guest\0guest", locale="en_US")))
    [(_, tune)] = client.read()
    assert isinstance(tune, commands.Connection.Tune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 20)

    client.effects.clear()
    client.send((0, commands.Connection.TuneOk(channel_max=100, frame_max=8192, heartbeat=10)),
                (0, commands.Connection.Open(virtual_host="/")))
    assert client.names() == [(0, "Connection.OpenOk")]
    assert client.effects == [CancelTimer(TimerKind.HANDSHAKE)]  # heartbeats: the session layer's wheel
    assert client.conn.heartbeat_slot is not None
    assert (client.conn.frame_max, client.conn.channel_max, client.conn.heartbeat) == (8192, 100, 10)


def test_wrong_protocol_header_is_answered_with_ours_and_closed(harness: Harness) -> None:
    client = harness.connect()
    client.send(b"AMQP\x01\x01\x00\x0a")
    assert client.read() == [(0, PROTOCOL_HEADER)]
    assert client.effects[-1] is Effect.CLOSE


def test_refused_login_closes_with_403_and_the_socket_after_close_ok(harness: Harness) -> None:
    client = harness.connect()
    client.send(PROTOCOL_HEADER)
    client.read()
    client.send((0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                response="\0guest\0wrong", locale="en_US")))
    [(_, close)] = client.read()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 403
    assert close.reply_text == ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                                "For details see the broker logfile.")
    assert SetTimer(TimerKind.CLOSE_WAIT, 3.0) in client.effects
    assert Effect.CLOSE not in client.effects
    client.send((0, commands.Connection.CloseOk()))
    client.read()
    assert client.effects[-1] is Effect.CLOSE


def test_loopback_only_user_from_another_host_is_refused(harness: Harness) -> None:
    client = harness.connect(peer=("192.0.2.7", 40000))
    client.send(PROTOCOL_HEADER)
    client.read()
    client.send((0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                response="\0guest\0guest", locale="en_US")))
    [(_, close)] = client.read()
    assert (close.reply_code, close.reply_text) == (403, "ACCESS_REFUSED - user 'guest' can only connect via "
                                                         "localhost")


def test_unknown_vhost_is_a_530_connection_error(harness: Harness) -> None:
    client = harness.connect()
    client.send(PROTOCOL_HEADER)
    client.read()
    client.send((0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                response="\0guest\0guest", locale="en_US")))
    client.read()
    client.send((0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0)),
                (0, commands.Connection.Open(virtual_host="nope")))
    [(_, close)] = client.methods()
    assert (close.name, close.reply_code, close.reply_text) == ("Connection.Close", 530,
                                                                "NOT_ALLOWED - vhost nope not found")
    assert client.conn.state == connection_module.CLOSING


def test_handshake_timer_closes_a_silent_client(harness: Harness) -> None:
    client = harness.connect()
    client.send(PROTOCOL_HEADER)
    client.read()
    client.conn.timer_fired(TimerKind.HANDSHAKE)
    client.read()
    assert client.effects[-1] is Effect.CLOSE


def test_open_connection_ignores_the_handshake_timer(harness: Harness) -> None:
    client = harness.connect()
    client.handshake()
    client.conn.timer_fired(TimerKind.HANDSHAKE)
    client.read()
    assert Effect.CLOSE not in client.effects


def test_heartbeats_sent_when_idle_and_missed_ones_close(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(connection_module.time, "monotonic", lambda: now[0])
    scheduling = harness.scheduling
    client = harness.connect()
    client.handshake(heartbeat=10)
    client.effects.clear()
    assert [t.delay for t in scheduling.timers] == [sessions_module.HEARTBEAT_TICK]  # the wheel's one timer

    now[0] += 4  # the wheel turns before heartbeat/2: nothing yet
    scheduling.fire_timers()
    harness.run_soon()
    assert client.read() == []

    now[0] += 2  # more than heartbeat/2 since anything was sent: one heartbeat goes out
    client.send(heartbeat.Heartbeat.marshal())  # and the client's arrives
    scheduling.fire_timers()
    harness.run_soon()
    assert [type(f) for _, f in client.read()] == [heartbeat.Heartbeat]
    assert client.effects == []  # no timer of its own
    assert len(scheduling.timers) == 1  # the wheel turns on: the connection waits for its next check

    now[0] += 21  # nothing from the client for more than two heartbeats
    scheduling.fire_timers()
    harness.run_soon()
    client.read()
    assert client.effects[-1] is Effect.CLOSE
    client.conn.lost()
    assert client.conn.heartbeat_slot is None
    scheduling.fire_timers()
    assert scheduling.timers == []  # nobody left to watch: the wheel stops


def test_one_heartbeat_timer_for_many_connections(harness: Harness) -> None:
    clients = [harness.connect(("127.0.0.1", 50000 + i)) for i in range(20)]
    for client in clients:
        client.handshake(heartbeat=10)
    assert len(harness.scheduling.timers) == 1
    assert all(client.effects.count(SetTimer(TimerKind.HEARTBEAT, 5.0)) == 0 for client in clients)


def test_client_close_gets_close_ok_then_linger(harness: Harness) -> None:
    client = harness.connect()
    client.handshake(heartbeat=10)
    client.effects.clear()
    client.send((0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))
    assert client.names() == [(0, "Connection.CloseOk")]
    assert client.effects == [Effect.RESUME_READING, CancelTimer(TimerKind.HANDSHAKE),
                              CancelTimer(TimerKind.HEARTBEAT), SetTimer(TimerKind.LINGER, 30.0)]
    client.send(b"leftover publishes are discarded")
    assert client.read() == []
    client.conn.timer_fired(TimerKind.LINGER)
    client.read()
    assert client.effects[-1] is Effect.CLOSE
    client.conn.lost()
    assert client.conn not in harness.sessions.connections


def test_frame_on_unopened_channel_is_a_504_connection_error(harness: Harness) -> None:
    client = harness.connect()
    client.handshake()
    client.send((3, commands.Queue.Declare(queue="q")))
    [(channel, close)] = client.read()
    assert channel == 0 and isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (504, "CHANNEL_ERROR - expected 'channel.open' on channel 3")


def test_unwritable_transport_pauses_reading_until_it_drains(harness: Harness) -> None:
    client = harness.connect()
    client.handshake()
    client.effects.clear()
    client.conn.set_writable(False)
    client.read()
    assert client.effects == [Effect.PAUSE_READING]
    client.conn.set_writable(True)
    client.read()
    assert client.effects == [Effect.PAUSE_READING, Effect.RESUME_READING]


def test_resource_alarm_blocks_a_publishing_connection(harness: Harness) -> None:
    client = harness.connect()
    client.handshake()
    client.open_channel()
    client.effects.clear()
    harness.sessions.resources_changed("memory alarm")  # what the broker calls on an alarm
    [(_, blocked)] = client.methods()
    assert (blocked.name, blocked.reason) == ("Connection.Blocked", "memory alarm")
    assert client.effects == []  # it has not published: it is still read
    client.send(*client.publish(1, "nowhere", b"x"))
    client.read()
    assert client.effects == [Effect.PAUSE_READING]
    harness.sessions.resources_changed(None)
    assert client.names() == [(0, "Connection.Unblocked")]
    assert client.effects == [Effect.PAUSE_READING, Effect.RESUME_READING]


def test_input_turn_pauses_reading_for_one_loop_turn(harness: Harness) -> None:
    client = harness.connect()
    client.handshake()
    client.open_channel()
    client.effects.clear()
    big = b"y" * 100_000
    client.send(*[f for _ in range(3) for f in client.publish(1, "nowhere", big)])
    client.read()
    assert client.effects == [Effect.PAUSE_READING, SetTimer(TimerKind.INPUT_TURN, 0.0)]
    client.conn.timer_fired(TimerKind.INPUT_TURN)
    client.read()
    assert client.effects[-1] is Effect.RESUME_READING


def _start_ok(client: Client, password: str) -> None:
    client.send(PROTOCOL_HEADER)
    client.read()
    client.send((0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                response=f"\0guest\0{password}", locale="en_US")))


def _pipelined_login(client: Client, password: str) -> None:
    """StartOk, TuneOk and Open in one write, as some clients send them."""
    client.send(PROTOCOL_HEADER)
    client.read()
    client.send((0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                response=f"\0guest\0{password}", locale="en_US")),
                (0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0)),
                (0, commands.Connection.Open(virtual_host="/")))


def test_throttled_login_is_answered_by_the_login_timer(harness: Harness) -> None:
    async def attempts() -> None:  # the throttle's log summary needs an event loop
        for _ in range(3):  # free failures: answered at once
            client = harness.connect()
            _start_ok(client, "wrong")
            assert [name for _, name in client.names()] == ["Connection.Close"]
        client = harness.connect()
        _pipelined_login(client, "wrong")  # from an address that keeps failing: answered later
        assert client.read() == []
        assert client.effects[-2:] == [Effect.PAUSE_READING, SetTimer(TimerKind.LOGIN, 0.1)]
        client.send((0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)))
        assert client.read() == []  # read before the pause took effect: waits for the answer too
        client.conn.timer_fired(TimerKind.LOGIN)
        # The refusal, never "unexpected Connection.TuneOk"; what followed StartOk was not handled
        # before it (the Close after it is answered as in any closing connection).
        [(_, close), (_, close_ok)] = client.methods()
        assert (close.reply_code, close.reply_text) == (403, "ACCESS_REFUSED - Login was refused using "
                                                             "authentication mechanism PLAIN. For details see "
                                                             "the broker logfile.")
        assert isinstance(close_ok, commands.Connection.CloseOk)

        client = harness.connect()
        _pipelined_login(client, "guest")  # right, yet delayed too: timing tells nothing
        assert client.read() == []
        assert client.effects[-1] == SetTimer(TimerKind.LOGIN, 0.2)
        client.conn.timer_fired(TimerKind.LOGIN)
        assert client.names() == [(0, "Connection.Tune"), (0, "Connection.OpenOk")]
        assert Effect.RESUME_READING in client.effects
        client.open_channel()

    asyncio.run(attempts())


def test_state_table_moves_forward_only_and_ends_closed() -> None:
    names = states.STATE_NAMES
    assert set(states.TRANSITIONS) == set(range(len(names)))
    for state, allowed in states.TRANSITIONS.items():
        assert all(new > state for new in allowed), names[state]  # no way back into the handshake
        assert state == states.CLOSED or states.CLOSED in allowed  # the socket may go at any time
    assert states.TRANSITIONS[states.CLOSED] == frozenset()
    assert states.check_transition(states.OPEN, states.CLOSING) == states.CLOSING
    with pytest.raises(states.IllegalTransition, match="OPEN -> AWAIT_OPEN"):
        states.check_transition(states.OPEN, states.AWAIT_OPEN)
    with pytest.raises(states.IllegalTransition, match="AWAIT_HEADER -> CLOSING"):
        states.check_transition(states.AWAIT_HEADER, states.CLOSING)


def test_illegal_transition_is_a_bug_not_a_state_change(harness: Harness) -> None:
    client = harness.connect()
    client.handshake()
    with pytest.raises(states.IllegalTransition):
        client.conn.enter_state(states.AWAIT_TUNE_OK)
    assert client.conn.state == states.OPEN


def test_a_closed_connection_stays_closed(harness: Harness) -> None:
    client = harness.connect()
    client.send(PROTOCOL_HEADER)
    client.send((0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))
    assert client.names() == [(0, "Connection.Start"), (0, "Connection.CloseOk")]
    assert client.conn.state == states.CLOSED
    client.conn.timer_fired(TimerKind.LINGER)  # the client never closed its socket
    client.conn.lost()
    client.read()
    assert client.effects[-1] is Effect.CLOSE and client.conn.state == states.CLOSED
    assert client.conn not in harness.sessions.connections


def test_consumer_timeout_sweep_runs_on_the_injected_timer(harness: Harness) -> None:
    scheduling = harness.scheduling
    harness.sessions.start()
    [timer] = scheduling.timers
    assert timer.delay == consumer_timeout.SWEEP_INTERVAL
    scheduling.fire_timers()  # a sweep (nothing to time out), and the next one is set
    [timer] = scheduling.timers
    harness.sessions.close()
    assert timer.cancelled


def test_tasks_run_on_the_adapters_loop(harness: Harness) -> None:
    client = harness.connect()
    done: list[str] = []

    async def work() -> None:
        await asyncio.sleep(0)
        done.append("ran")
    client.conn.start_task(work())
    assert done == [] and len(harness.scheduling.tasks) == 1  # handed over, not run by the connection
    harness.scheduling.run_tasks()
    assert done == ["ran"]


def test_body_spool_comes_from_the_session_layer_once(harness: Harness) -> None:
    client = harness.connect()
    spool = client.conn.body_spool()
    assert client.conn.body_spool() is spool
    assert spool.directory == harness.broker.datadir.path
