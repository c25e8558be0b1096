"""Runs of publishes whose messages carry properties of their own (message ids, timestamps, headers),
arriving in one read: stored, delivered and confirmed exactly as one by one, with CC/BCC still routed
per message and a user_id refused at its own position."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

from . import uid
from .conftest import lavinpy_only
from .rawamqp import RawAMQP, commands, encode_properties, writer
from .test_publish_runs import confirmed_upto


def message_bytes(channel: int, exchange: str, routing_key: str,
                  messages: list[tuple[commands.Basic.Properties, bytes]]) -> bytes:
    """basic.publish frames for each (properties, body), one after the other (one write: one read)."""
    method = writer.method_frame(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key))
    return b"".join(method + b"".join(writer.content_frames(channel, encode_properties(props), body, 131072))
                    for props, body in messages)


def varied(count: int, prefix: str = "m") -> list[tuple[commands.Basic.Properties, bytes]]:
    out = []
    for i in range(count):
        fields: dict = {"delivery_mode": 2, "message_id": f"{prefix}-{i}" * (i % 3 + 1),
                        "timestamp": datetime.fromtimestamp(1_700_000_000 + i, UTC)}
        if i % 2:
            fields["headers"] = {"id": f"{prefix}{i}", "n": i}
        if i % 5 == 1:
            fields["correlation_id"] = f"c{i}"
            fields["reply_to"] = "replies"
        out.append((commands.Basic.Properties(**fields), f"{prefix} body {i}".encode() * (i % 4 + 1)))
    return out


def drain(c: RawAMQP, queue: str) -> list[tuple[bytes, bytes]]:
    """(property block re-encoded as received, body) of every message, in order."""
    got = []
    while (message := c.get_message(1, queue)) is not None:
        _ok, hdr, body = message
        got.append((encode_properties(hdr.properties), body))
    return got


def open_confirming(c: RawAMQP) -> None:
    c.handshake()
    c.open_channel(1)
    c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)


def test_a_varied_run_stores_and_delivers_as_one_by_one(broker, clients):
    by_run, one_by_one = clients.track_queue(uid("vrun")), clients.track_queue(uid("vone"))
    messages = varied(60)
    with RawAMQP(broker.host, broker.port) as c:
        open_confirming(c)
        for q in (by_run, one_by_one):
            c.call(1, commands.Queue.Declare(queue=q, durable=True), commands.Queue.DeclareOk)
        c.send_raw(message_bytes(1, "", by_run, messages))
        assert not confirmed_upto(c, len(messages))
        for n, message in enumerate(messages, start=len(messages) + 1):
            c.send_raw(message_bytes(1, "", one_by_one, [message]))
            confirmed_upto(c, n)
        expected = [(encode_properties(props), body) for props, body in messages]
        assert drain(c, by_run) == expected
        assert drain(c, one_by_one) == expected


def test_cc_and_bcc_in_a_varied_run_route_per_message(broker, clients):
    ex = uid("vcc")
    qa, qb = clients.track_queue(uid("vcca")), clients.track_queue(uid("vccb"))
    plain = commands.Basic.Properties(message_id="p")
    messages = [
        (plain, b"1"),
        (commands.Basic.Properties(message_id="cc", headers={"CC": ["kb"]}), b"2"),
        (commands.Basic.Properties(message_id="q"), b"3"),
        (commands.Basic.Properties(message_id="bcc", headers={"BCC": ["kb"], "x": 1}), b"4"),
        (commands.Basic.Properties(message_id="r", headers={"y": 2}), b"5"),
    ]
    with RawAMQP(broker.host, broker.port) as c:
        open_confirming(c)
        c.call(1, commands.Exchange.Declare(exchange=ex, exchange_type="direct", auto_delete=True),
               commands.Exchange.DeclareOk)
        for q, key in ((qa, "ka"), (qb, "kb")):
            c.call(1, commands.Queue.Declare(queue=q), commands.Queue.DeclareOk)
            c.call(1, commands.Queue.Bind(queue=q, exchange=ex, routing_key=key), commands.Queue.BindOk)
        c.send_raw(message_bytes(1, ex, "ka", messages))
        assert not confirmed_upto(c, len(messages))
        got_a, got_b = drain(c, qa), drain(c, qb)
    assert [body for _p, body in got_a] == [b"1", b"2", b"3", b"4", b"5"]
    assert [body for _p, body in got_b] == [b"2", b"4"]
    bcc_copy = [props for props, body in got_a + got_b if body == b"4"]
    assert all(b"BCC" not in props for props in bcc_copy) and len(bcc_copy) == 2  # removed, as one by one


def test_a_foreign_user_id_mid_run_refuses_that_message_only(broker, clients):
    """The messages before it stored, the channel closed with 406 at it: nothing after it stored."""
    q = clients.track_queue(uid("vuid"))
    messages = varied(4, "u")
    messages.insert(2, (commands.Basic.Properties(message_id="bad", user_id="somebody-else"), b"refused"))
    with RawAMQP(broker.host, broker.port) as c:
        open_confirming(c)
        c.call(1, commands.Queue.Declare(queue=q, durable=True), commands.Queue.DeclareOk)
        c.send_raw(message_bytes(1, "", q, messages))
        acked = 0
        while True:
            _ch, frame = c.recv()
            if isinstance(frame, commands.Basic.Ack):
                acked = frame.delivery_tag
            elif isinstance(frame, commands.Channel.Close):
                break
            else:
                raise AssertionError(f"unexpected {frame!r}")
        assert frame.reply_code == 406 and "user_id" in frame.reply_text
        # None after it confirmed. (Confirms still owed when the channel closes in the same read are
        # not sent, one by one as in a run: the channel's books end with the close.)
        assert acked <= 2
        c.send(1, commands.Channel.CloseOk())
        c.open_channel(1)
        assert drain(c, q) == [(encode_properties(props), body) for props, body in messages[:2]]


@lavinpy_only()
def test_varied_runs_across_segment_rolls_survive_kill9(fresh_broker, tmp_path: Path):
    b = fresh_broker
    b.stop()
    shutil.rmtree(b.data_dir)
    config = tmp_path / "lavinpy.yaml"
    config.write_text("segment_size: 8192\n")
    b.extra_args = ["--config", str(config)]
    b.start()
    q = uid("vroll")
    messages = [(props, body * 20) for props, body in varied(300, "k")]  # about 16 per segment
    with RawAMQP(b.host, b.port) as c:
        open_confirming(c)
        c.call(1, commands.Queue.Declare(queue=q, durable=True), commands.Queue.DeclareOk)
        c.send_raw(message_bytes(1, "", q, messages))
        confirmed_upto(c, len(messages))
        b.kill9()
    b.start()
    assert len(list(b.data_dir.rglob("msgs.*"))) >= 20  # the run spanned many segments
    with RawAMQP(b.host, b.port) as c:
        c.handshake()
        c.open_channel(1)
        assert drain(c, q) == [(encode_properties(props), body) for props, body in messages]
