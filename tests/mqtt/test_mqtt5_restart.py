"""An MQTT 5 persistent session across a restart of the broker on the same data dir (sans-IO): its
subscription options (No Local, Retain As Published, subscription identifiers, shared subscriptions
at QoS 2) and a will waiting for its Will Delay Interval come back; a session that resumed in time
leaves no will for the next start."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lavinpy.mqtt import codec, codec5, state5
from lavinpy.mqtt.codec import Will
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.state5 import FilterOptions, _options_record, parse

from .test_mqtt_qos2_sansio import Broker

EXPIRY = {"session_expiry_interval": 600}


class Broker5(Broker):
    def connect5(self, client_id: str, present: bool = False, **kwargs: Any) -> MQTTConnection:
        conn = self.sessions.new_connection(("127.0.0.1", 50000))
        conn.start()
        self.feed(conn, codec5.encode_connect(client_id, username="guest", password=b"guest", **kwargs))
        packets = self.read(conn)
        assert packets[0][0] == codec.CONNACK and packets[0][2][:2] == bytes((int(present), 0)), packets[0]
        self.rest = packets[1:]  # what came right after the CONNACK
        return conn

    def publishes(self, conn: MQTTConnection) -> list[tuple[codec.Publish, dict[str, Any]]]:
        return [codec5.parse_publish(f, b) for k, f, b in self.read(conn) if k == codec.PUBLISH]

    def wait(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker5]:
    b = Broker5(tmp_path)
    yield b
    b.sessions.shutdown()
    b.close()


def test_subscription_options_and_shared_qos2_survive_a_restart(broker: Broker5) -> None:
    conn = broker.connect5("opts", properties=EXPIRY)
    broker.feed(conn, codec5.encode_subscribe(1, [("own/#", 0x04 | 0x08 | 1)], subscription_id=7)
                + codec5.encode_subscribe(2, [("$share/g/jobs/#", 2)]))
    assert [b[-1:] for k, _, b in broker.read(conn) if k == codec.SUBACK] == [b"\x01", b"\x02"]
    before = dict(conn.subscriptions.options)  # type: ignore[union-attr]
    conn.lost()
    broker.restart()
    again = broker.connect5("opts", present=True, clean_start=False, properties=EXPIRY)
    assert dict(again.subscriptions.options) == before  # type: ignore[union-attr]
    # No Local: its own publish does not come back; another client's does, with the identifier.
    broker.feed(again, codec5.publish("own/a", b"mine", 1, False, False, 1, b"\x00"))
    other = broker.connect5("other")
    broker.feed(other, codec5.publish("own/a", b"theirs", 1, False, False, 1, b"\x00")
                + codec5.publish("jobs/x", b"job", 2, False, False, 2, b"\x00"))
    broker.read(other)
    got = {p.payload: (p.qos, props) for p, props in broker.publishes(again)}
    assert set(got) == {b"theirs", b"job"}
    assert got[b"theirs"][1].get("subscription_identifier") == 7
    assert got[b"job"][0] == 2  # the shared subscription again, at QoS 2


def test_options_of_a_session_that_ended_do_not_come_back(broker: Broker5) -> None:
    conn = broker.connect5("brief", properties=EXPIRY)
    broker.feed(conn, codec5.encode_subscribe(1, [("b/#", 0x04 | 1)]))
    broker.read(conn)
    broker.feed(conn, b"\xe0\x07\x00\x05\x11\x00\x00\x00\x00")  # DISCONNECT, session expiry now 0
    broker.restart()
    again = broker.connect5("brief", clean_start=False)
    assert dict(again.subscriptions.options) == {}  # type: ignore[union-attr]


def test_delayed_will_survives_a_restart_and_is_published_when_due(broker: Broker5) -> None:
    will = Will("wills/dev", b"gone", 1, False)
    conn = broker.connect5("dev", properties=EXPIRY, will=will, will_properties={"will_delay_interval": 1})

    async def lose() -> None:
        conn.lost()
    broker.loop.run_until_complete(lose())
    broker.restart()  # before the will is due: not published, kept in the file
    watcher = broker.connect5("watcher")
    broker.feed(watcher, codec5.encode_subscribe(1, [("wills/#", 1)]))
    broker.read(watcher)

    async def start() -> int:
        return broker.sessions.resume_wills()
    assert broker.loop.run_until_complete(start()) == 1
    assert broker.publishes(watcher) == []
    broker.wait(1.2)
    [(p, _)] = broker.publishes(watcher)
    assert (p.topic, p.payload) == ("wills/dev", b"gone")
    broker.restart()  # published: not again after the next start
    assert broker.loop.run_until_complete(start()) == 0


def test_session_resumed_within_the_delay_leaves_no_will_after_a_restart(broker: Broker5) -> None:
    will = Will("wills/back", b"gone", 0, False)
    conn = broker.connect5("back", properties=EXPIRY, will=will, will_properties={"will_delay_interval": 60})

    async def lose() -> None:
        conn.lost()
    broker.loop.run_until_complete(lose())
    broker.restart()

    async def start() -> int:
        return broker.sessions.resume_wills()
    assert broker.loop.run_until_complete(start()) == 1
    broker.connect5("back", clean_start=False, properties=EXPIRY)  # back in time: no will (no queues: not present)
    broker.restart()
    assert broker.loop.run_until_complete(start()) == 0


def test_torn_last_record_is_dropped() -> None:
    options = FilterOptions(2, True, False, 9, "g")
    record = _options_record("c", "a/#", options)
    for cut in range(1, len(record)):
        records, end = parse(record + record[:cut])
        assert end == len(record) and records == [(b"O", "c", ("a/#", options))]


def test_the_file_is_rewritten_with_the_live_state(broker: Broker5, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many changes of one persistent session and a clean one beside: once the file holds mostly stale
    records it is rewritten with the persistent session's options alone, which a restart reads back."""
    monkeypatch.setattr(state5, "COMPACT_MIN_BYTES", 2000)
    clean = broker.connect5("clean")  # expiry 0: its options never go to the file
    broker.feed(clean, codec5.encode_subscribe(1, [("c/#", 1)], subscription_id=3))
    conn = broker.connect5("churn", properties=EXPIRY)
    for i in range(100):
        broker.feed(conn, codec5.encode_subscribe(i + 1, [(f"t/{i % 3}", 1)], subscription_id=i + 1))
    broker.read(conn)
    file = state5.vhost_state(broker.harness.broker.vhosts["/"]).file
    assert file is not None
    records, end = parse(file.open())  # type: ignore[attr-defined]
    assert end < 2000 + 200 and {c for _, c, _ in records} == {"churn"}
    expected = dict(conn.subscriptions.options)  # type: ignore[union-attr]
    conn.lost()
    clean.lost()
    broker.restart()
    again = broker.connect5("churn", present=True, clean_start=False, properties=EXPIRY)
    assert dict(again.subscriptions.options) == expected  # type: ignore[union-attr]
    assert {f: o.subscription_id for f, o in expected.items()} == {"t/0": 100, "t/1": 98, "t/2": 99}


def test_a_persistent_members_group_keeps_its_messages_across_a_restart(broker: Broker5) -> None:
    """Messages a publisher had PUBREC for, waiting in the group's queue while its persistent member is
    away, are there after a restart and reach the member at QoS 2 when it resumes."""
    member = broker.connect5("gm", properties=EXPIRY)
    broker.feed(member, codec5.encode_subscribe(1, [("$share/keep/k/#", 2)]))
    broker.read(member)
    member.lost()
    pub = broker.connect5("gp")
    broker.feed(pub, b"".join(codec5.publish("k/x", b"%d" % i, 2, False, False, i + 1, b"\x00") for i in range(3)))
    assert [k for k, _, _ in broker.read(pub)] == [codec.PUBREC] * 3
    broker.restart()
    broker.connect5("gm", present=True, clean_start=False, properties=EXPIRY)
    got = [codec5.parse_publish(f, b)[0] for k, f, b in broker.rest if k == codec.PUBLISH]
    assert [(p.payload, p.qos) for p in got] == [(b"0", 2), (b"1", 2), (b"2", 2)]
