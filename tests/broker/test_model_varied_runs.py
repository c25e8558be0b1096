"""Publish runs whose messages carry properties of their own (ids, timestamps, headers): taken whole
where nothing routes or is checked on those properties, and stored exactly as one by one would be
(each message's property block byte for byte, in order, after a restart too); declined (None, nothing
done) where a property matters per message."""

from __future__ import annotations

from pathlib import Path

from lavinpy.broker.ops import messages as operations_messages
from lavinpy.broker.ops import objects as operations_objects
from lavinpy.store.record import StoredMessage
from tests.broker.model_harness import OWNER, Model, run


def props(**properties: object) -> bytes:
    return operations_messages.properties_from_json(properties)


def varied(count: int, **common: object) -> list[bytes]:
    """Property blocks of different lengths and fields, as applications send them."""
    blocks = []
    for i in range(count):
        extra: dict[str, object] = {"message_id": f"id-{i}" * (i % 4 + 1), "timestamp": 1_700_000_000 + i}
        if i % 3 == 0:
            extra["headers"] = {"task": f"t{i}", "retries": i}
        if i % 4 == 1:
            extra["correlation_id"] = f"c{i}"
            extra["reply_to"] = "replies"
        blocks.append(props(**common, **extra))
    return blocks


def taken(model: Model, queue: str) -> list[StoredMessage]:
    out = []
    q = model.vhost.get_queue(queue)
    while (got := q.get()) is not None:
        out.append(got[1])
    return out


def test_a_varied_run_stores_each_messages_properties_as_one_by_one(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("by-run", durable=True)
        m.declare("one-by-one", durable=True)
        blocks = varied(40, delivery_mode=2, content_type="application/json")
        bodies = [f"body {i}".encode() * (i % 7 + 1) for i in range(40)]
        vhost = m.vhost
        assert vhost.publish_run(vhost.default_exchange, "by-run", blocks, bodies) == (1, True)
        for block, payload in zip(blocks, bodies, strict=True):
            vhost.publish(vhost.default_exchange, "one-by-one", block, payload)
        m.reopen()  # read back from the records
        by_run, one_by_one = taken(m, "by-run"), taken(m, "one-by-one")
        assert [(msg.properties, msg.body) for msg in by_run] == list(zip(blocks, bodies, strict=True))
        assert [(msg.properties, msg.body) for msg in one_by_one] == [(msg.properties, msg.body) for msg in by_run]
    run(body, tmp_path)


def test_a_varied_run_in_hand_to_a_waiting_consumer_keeps_each_block(tmp_path: Path) -> None:
    """messages(i) of a run with a list: the C and Python builders give each message its own block."""
    from lavinpy.broker.queues.publish_run import PublishRun
    blocks = varied(5)
    run_ = PublishRun("x", "k", blocks, [b"a", b"b", b"c", b"d", b"e"], 7)
    assert [msg.properties for msg in run_.messages(1, 3)] == blocks[1:4]
    assert run_.message(4) == StoredMessage(7, "x", "k", blocks[4], b"e")


def test_a_varied_run_through_a_direct_exchange_reaches_every_bound_queue(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.exchange("ex", "direct")
        for name in ("qa", "qb"):
            m.declare(name)
            m.bind(name, "ex", "k")
        blocks = varied(10)
        vhost = m.vhost
        assert vhost.publish_run(vhost.get_exchange("ex"), "k", blocks, [b"%d" % i for i in range(10)]) == (2, False)
        for name in ("qa", "qb"):
            assert [msg.properties for msg in taken(m, name)] == blocks
    run(body, tmp_path)


def test_what_matters_per_message_declines_a_varied_run(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        vhost = m.vhost
        m.declare("q")
        m.declare("dedup", message_deduplication=True)
        m.exchange("fan", "fanout")
        m.bind("dedup", "fan")
        m.bind("q", "fan")
        m.exchange("hx", "headers")
        m.exchange("dx", "direct")
        m.exchange("e2e", "direct")
        m.declare("hq")
        operations_objects.bind_queue(None, vhost, "hq", "hx", "", {"task": "t0"}, owner=OWNER)
        operations_objects.bind_exchange(None, vhost, "hx", "e2e", "k", None)
        m.bind("q", "dx", "k")
        plain = props(message_id="a")
        default = vhost.default_exchange
        bodies = [b"1", b"2"]
        declined = [
            (default, "q", [plain, props(expiration="1000")]),  # a TTL per message
            (default, "q", [plain, props(headers={"CC": ["other"]})]),  # routes per message
            (default, "q", [plain, props(headers={"BCC": ["other"]})]),
            (default, "q", [props(delivery_mode=2), props(delivery_mode=1)]),  # persistent or not
            # two queues, one deduplicating: they would keep different messages
            (vhost.get_exchange("fan"), "", [plain, props(headers={"x-deduplication-header": "1"})]),
            (default, "nowhere", [plain, props(message_id="b")]),  # unroutable: returns, one by one
            (vhost.get_exchange("hx"), "", [plain, props(headers={"task": "t0"})]),  # routes by headers
            (vhost.get_exchange("e2e"), "k", [plain, props(headers={"task": "t0"})]),  # on to a headers exchange
        ]
        for exchange, key, blocks in declined:
            assert vhost.publish_run(exchange, key, blocks, bodies) is None, (exchange.name, key, blocks)
        assert m.count("q") == 0 and m.count("dedup") == 0 and m.count("hq") == 0
        # without headers a deduplicating queue has nothing to ask: taken whole
        assert vhost.publish_run(default, "dedup", [plain, props(message_id="b")], bodies) == (1, False)
        assert vhost.publish_run(vhost.get_exchange("dx"), "k", [plain, props(headers={"a": 1})], bodies) == (1, False)
        assert m.count("dedup") == 2 and m.count("q") == 2
    run(body, tmp_path)
