"""The compiled loops of the MQTT reader (lavinpy/wire/_cwire_mqtt.c: the split of short packets, a
publish run's tail) give what the pure-Python loops give: the same packets, the same runs, the same
errors, on random input cut at random places."""

from __future__ import annotations

import random
from collections import deque

import pytest

from lavinpy.mqtt import codec
from lavinpy.wire.accel import cwire

pytestmark = pytest.mark.skipif(cwire is None, reason="the compiled extension is not built (pure-Python run)")


def _packet(rng: random.Random) -> bytes:
    choice = rng.random()
    topic = rng.choice(["a", "a/b", "t/" + "x" * 40])
    if choice < 0.5:
        return codec.publish(topic, rng.randbytes(rng.choice([0, 1, 16, 90, 130, 300])), rng.choice([0, 1, 1, 2]),
                             rng.random() < 0.1, rng.random() < 0.1, rng.randrange(0, 3) or rng.randrange(1, 65536))
    if choice < 0.7:
        return codec.puback(rng.randrange(0, 65536))
    if choice < 0.8:
        return bytes((0xC0, 0x00))  # PINGREQ
    if choice < 0.9:  # a reserved type or flags, a bad length: the reader's errors
        return rng.choice([bytes((0x00, 0x00)), bytes((0x41, 0x02, 0, 1)), bytes((0x30, 0xFF, 0xFF, 0xFF, 0xFF))])
    return bytes((0x82, 0x80, 0x01)) + b"\x00" * 128  # a SUBSCRIBE-shaped packet with a 2-byte length


def _read(chunks: list[bytes], limit: int, one: bool) -> list[object]:
    reader = codec.PacketReader(limit)
    out: list[object] = []
    for chunk in chunks:
        try:
            out.append(reader.feed(chunk, one))
        except codec.MQTTProtocolError as e:
            out.append(("error", str(e), e.reason))
            break
        out.append(reader.buffered)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_split_reads_as_the_python_loop(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    data = b"".join(_packet(rng) for _ in range(rng.randrange(1, 60)))
    cuts = sorted(rng.sample(range(len(data) + 1), min(len(data), rng.randrange(0, 6))))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    limit = rng.choice([20, 100, 1 << 20])
    one = rng.random() < 0.2
    compiled = _read(chunks, limit, one)
    monkeypatch.setattr(codec, "_SPLIT", None)
    assert _read(chunks, limit, one) == compiled


def _tail(backlog: deque[tuple[int, int, bytes]], max_payload: int) -> tuple[object, list[object]]:
    kind, flags, body = backlog.popleft()
    try:
        packet = codec.parse_publish(flags, body)
    except codec.MQTTProtocolError as e:
        return ("error", str(e)), list(backlog)
    run = codec.publish_run_tail(backlog, flags, body, packet.payload, packet.packet_id, max_payload)
    return run, list(backlog)


@pytest.mark.parametrize("seed", range(40))
def test_a_publish_run_tail_takes_what_the_python_loop_takes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    qos = rng.choice([1, 2])
    packets = [codec.publish("a/b", rng.randbytes(rng.choice([0, 5, 40])), qos, False, rng.random() < 0.2,
                             rng.randrange(1, 65536)) for _ in range(rng.randrange(1, 30))]
    for _ in range(rng.randrange(0, 3)):  # what ends a run: another topic, QoS, retain, id 0, a PUBACK
        packets.insert(rng.randrange(1, len(packets) + 1), rng.choice([
            codec.publish("a/c", b"x", qos, False, False, 9), codec.publish("a/b", b"x", 3 - qos, False, False, 9),
            codec.publish("a/b", b"x", qos, True, False, 9), codec.publish("a/b", b"x", qos, False, False, 0),
            codec.publish("a/bb", b"x", qos, False, False, 9), codec.puback(5)]))
    parsed = codec.PacketReader(1 << 20).feed(b"".join(packets))
    max_payload = rng.choice([10, 1 << 20])
    compiled = _tail(deque(parsed), max_payload)
    monkeypatch.setattr(codec, "_PUBLISH_TAIL", None)
    assert _tail(deque(parsed), max_payload) == compiled


@pytest.mark.parametrize("seed", range(40))
def test_a_read_of_pubacks_settles_as_the_python_loop(seed: int) -> None:
    rng = random.Random(seed)
    ids = [rng.randrange(0, 40) for _ in range(rng.randrange(0, 30))]
    data = b"".join(codec.puback(packet_id) for packet_id in ids)
    if rng.random() < 0.3:  # a read that is not PUBACKs alone: nothing settled
        data = rng.choice([data + b"\xc0\x00", b"\x40\x03\x00\x01\x00" + data, data[:-1], data + b"\x40"])
    inflight = {packet_id: rng.choice([None, rng.randrange(1000)]) for packet_id in rng.sample(range(40), 25)}
    expected_left = dict(inflight)
    expected = codec.puback_tags_py(data, expected_left)
    assert cwire.mqtt_puback_tags(data, inflight) == expected
    assert inflight == expected_left
