"""Hypothesis over names at the AMQP face, in process on the sans-IO session: any UTF-8 queue or exchange name
and routing key up to 255 bytes, and over-long names where AMQP can carry them (the long strings of
x-dead-letter-exchange, x-dead-letter-routing-key and alternate-exchange arguments), for declare, bind,
publish and delete. Each answer is the method's reply or a channel close with a 4xx code (never 541,
never an exception out of the session), and the connection keeps serving its other channels."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body, commands, header

from lavinpy.wire.frames import build_method
from lavinpy.wire.writer import method_frame
from tests.amqp.session_client import Client, Harness

FUZZ, WITNESS = 1, 2


def _short(text: str) -> str:
    """The text cut to at most 255 bytes of UTF-8 (at a character boundary)."""
    return text.encode()[:255].decode("utf-8", "ignore")


NAMES = st.one_of(st.text(max_size=255).map(_short), st.sampled_from(["", "amq.x", "amq.direct", "a" * 255]),
                  st.text(st.characters(min_codepoint=0x800, max_codepoint=0xFFFF, exclude_categories=("Cs",)),
                          min_size=85, max_size=85))  # 255 bytes, 3 each
LONG = st.text(min_size=256, max_size=400)


class Session:
    """One connection: channel FUZZ takes the names, channel WITNESS must keep being served."""

    def __init__(self, harness: Harness) -> None:
        self.client: Client = harness.connect()
        self.client.handshake()
        self.client.open_channel(FUZZ)
        self.client.open_channel(WITNESS)
        self.served = 0

    def call(self, method: Any, *content: bytes, reply: type | None = None) -> Any:
        """Send ``method`` on FUZZ (with a body for a publish): its reply ("ok" when none is due), or
        "closed" after a 4xx channel close (channel FUZZ is opened again)."""
        frames: list[Any] = [method_frame(FUZZ, method)]
        if content:
            frames += [(FUZZ, header.ContentHeader(0, len(content[0]), commands.Basic.Properties())),
                       (FUZZ, body.ContentBody(content[0]))]
        self.client.send(*frames)
        got = self.client.methods()
        for channel, frame in got:
            assert not isinstance(frame, commands.Connection.Close), (method, frame.reply_code, frame.reply_text)
            if isinstance(frame, commands.Channel.Close):
                assert channel == FUZZ and 400 <= frame.reply_code < 500, (method, frame.reply_code, frame.reply_text)
                self.client.send((FUZZ, commands.Channel.CloseOk()))
                self.client.open_channel(FUZZ)
                return "closed"
        if reply is None:
            assert got == [], got
            return "ok"
        assert [type(f) for _, f in got] == [reply], (method, got)
        return got[0][1]

    def witness(self) -> None:
        """The other channel still answers: a publish to its queue and a get of it."""
        self.served += 1
        payload = str(self.served).encode()
        self.client.send(*self.client.publish(WITNESS, "witness", payload),
                         method_frame(WITNESS, build_method(commands.Basic.Get, queue="witness", no_ack=True)))
        got = [(c, f) for c, f in self.client.read() if not isinstance(f, header.ContentHeader)]
        assert [type(f) for _, f in got] == [commands.Basic.GetOk, body.ContentBody], got
        assert got[-1][1].value == payload


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    with tempfile.TemporaryDirectory() as path:
        harness = Harness(Path(path))
        try:
            s = Session(harness)
            s.client.send(method_frame(WITNESS, build_method(commands.Queue.Declare, queue="witness")))
            assert s.client.names() == [(WITNESS, "Queue.DeclareOk")]
            yield s
        finally:
            harness.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queue=NAMES, exchange=NAMES, key=NAMES)
def test_any_name_is_answered(session: Session, queue: str, exchange: str, key: str) -> None:
    declared = session.call(build_method(commands.Queue.Declare, queue=queue, auto_delete=False),
                            reply=commands.Queue.DeclareOk)
    if declared != "closed":
        assert declared.queue == queue if queue else declared.queue.startswith("amq.gen-"), (queue, declared.queue)
        queue = declared.queue
    session.call(build_method(commands.Exchange.Declare, exchange=exchange, exchange_type="direct"),
                 reply=commands.Exchange.DeclareOk)
    session.call(build_method(commands.Queue.Bind, queue=queue, exchange=exchange, routing_key=key),
                 reply=commands.Queue.BindOk)
    session.call(build_method(commands.Basic.Publish, exchange=exchange, routing_key=key), b"x")
    session.call(build_method(commands.Queue.Unbind, queue=queue, exchange=exchange, routing_key=key),
                 reply=commands.Queue.UnbindOk)
    session.call(build_method(commands.Queue.Delete, queue=queue), reply=commands.Queue.DeleteOk)
    session.call(build_method(commands.Exchange.Delete, exchange=exchange), reply=commands.Exchange.DeleteOk)
    session.witness()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, long=LONG, which=st.sampled_from(["x-dead-letter-exchange", "x-dead-letter-routing-key",
                                                     "alternate-exchange"]))
def test_over_long_names_in_arguments_are_refused(session: Session, name: str, long: str, which: str) -> None:
    name = _short("arg-" + name)  # a new queue or exchange: a built-in one's declaration always matches
    args = {which: long}
    if which == "x-dead-letter-routing-key":
        args["x-dead-letter-exchange"] = "amq.direct"
    if which == "alternate-exchange":
        method = build_method(commands.Exchange.Declare, exchange=name, exchange_type="direct", arguments=args)
        outcome = session.call(method, reply=commands.Exchange.DeclareOk)
    else:
        method = build_method(commands.Queue.Declare, queue=name, arguments=args)
        outcome = session.call(method, reply=commands.Queue.DeclareOk)
    assert outcome == "closed", (which, len(long.encode()))  # 406 PRECONDITION_FAILED
    session.witness()
