"""Message deduplication (LavinMQ's x-message-deduplication) in the model, in process: on queues and
exchanges, the header and TTL options, the bound, the count, and the cache kept across restarts,
crashes (a torn record) and deletion."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lavinpy.broker.errors import BrokerChannelError
from lavinpy.broker.ops import object_info
from lavinpy.broker.queues.dedup_cache import DedupCache, file_name, identifier
from lavinpy.broker.settings.deduplication import DedupSettings
from tests.broker.model_harness import Model, run

ON = {"message_deduplication": True}


def send(m: Model, key: str, body: str, exchange: str = "", **headers: object) -> bool:
    return m.publish(key, body.encode(), exchange, headers=headers, delivery_mode=2)


def test_a_queue_stores_a_duplicate_once_and_counts_it(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        q = m.declare("q", durable=True, **ON)
        for text in ("a", "b", "a-again", "none"):
            ident = {"a-again": "a"}.get(text, text)
            headers = {} if text == "none" else {"x-deduplication-header": ident}
            assert send(m, "q", text, **headers)  # accepted: the publisher is confirmed either way
        send(m, "q", "none-2")  # without the header: never a duplicate
        assert m.bodies("q") == ["a", "b", "none", "none-2"]
        assert q.stats.duplicates == 1
        assert object_info.queue_info(q)["deduplication"]["duplicates"] == 1
    run(body, tmp_path)


def test_queue_level_keeps_other_queues_copies(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.exchange("fan")
        m.declare("dedup", **ON)
        m.declare("plain")
        m.bind("dedup", "fan")
        m.bind("plain", "fan")
        for _ in range(2):
            send(m, "", "x", "fan", **{"x-deduplication-header": 7})
        assert (m.count("dedup"), m.count("plain")) == (1, 2)
    run(body, tmp_path)


def test_an_exchange_routes_a_duplicate_nowhere(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        from lavinpy.broker.ops import objects as operations_objects
        operations_objects.declare_exchange(None, m.vhost, "dx", "direct", durable=True,
                                            arguments={"x-message-deduplication": True,
                                                       "x-deduplication-header": "msg-id"})
        m.declare("q1")
        m.declare("q2")
        m.bind("q1", "dx", "k")
        m.bind("q2", "dx", "k")
        assert send(m, "k", "one", "dx", **{"msg-id": "m1"})
        assert send(m, "k", "dup", "dx", **{"msg-id": "m1"})  # counted as routed: no basic.return
        assert send(m, "k", "other", "dx", **{"x-deduplication-header": "m1"})  # not the configured header
        assert m.bodies("q1") == ["one", "other"] and m.bodies("q2") == ["one", "other"]
        exchange = m.vhost.get_exchange("dx")
        assert object_info.exchange_info(m.vhost, exchange)["deduplication"]["duplicates"] == 1
    run(body, tmp_path)


def test_ttl_forgets_and_a_message_header_overrides_it(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", message_deduplication=True, cache_ttl=60_000)
        send(m, "q", "short", **{"x-deduplication-header": "s", "x-cache-ttl": 30})
        send(m, "q", "long", **{"x-deduplication-header": "l"})
        await asyncio.sleep(0.06)
        send(m, "q", "short-again", **{"x-deduplication-header": "s"})
        send(m, "q", "long-again", **{"x-deduplication-header": "l"})
        assert m.bodies("q") == ["short", "long", "short-again"]
    run(body, tmp_path)


def test_the_cache_is_bounded_oldest_first(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        q = m.declare("q", message_deduplication=True, cache_size=2)
        for ident in ("1", "2", "3", "1", "3"):
            send(m, "q", ident, **{"x-deduplication-header": ident})
        assert m.bodies("q") == ["1", "2", "3", "1"]  # "1" was evicted by "3"
        assert q.dedup is not None and len(q.dedup) == 2
    run(body, tmp_path)


def test_the_cache_survives_a_restart_and_goes_with_its_queue(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", durable=True, **ON)
        send(m, "q", "first", **{"x-deduplication-header": "id"})
        m.reopen()
        send(m, "q", "after-restart", **{"x-deduplication-header": "id"})
        assert m.bodies("q") == ["first"]
        path = m.vhost.store.path / file_name("q", "q")
        assert path.exists()
        m.vhost.delete_queue("q")
        assert not path.exists()
        m.declare("q", durable=True, **ON)
        send(m, "q", "new-queue", **{"x-deduplication-header": "id"})
        assert m.bodies("q") == ["new-queue"]
    run(body, tmp_path)


def test_a_torn_record_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        from lavinpy.store.append_file import AppendFile
        path = tmp_path / "cache"
        file = AppendFile(path, lambda fd: __import__("os").close(fd), lambda: False)
        cache = DedupCache(DedupSettings(cache_size=10), file)
        assert not cache.seen({"x-deduplication-header": "a"}, 1000)
        assert not cache.seen({"x-deduplication-header": "b"}, 1000)
        file.close()
        with path.open("ab") as f:
            f.write(b"\x05\x00torn")
        again = DedupCache(DedupSettings(cache_size=10), AppendFile(path, lambda fd: None, lambda: False))
        assert list(again.entries) == [identifier("a"), identifier("b")]
        assert again.seen({"x-deduplication-header": "a"}, 2000)
    run(body, tmp_path)


def test_identifiers_are_typed_and_long_ones_hashed() -> None:
    assert identifier("1") != identifier(1) and identifier(True) != identifier(1)
    assert identifier(1.5) is None and identifier(None) is None
    assert len(identifier("x" * 10_000) or b"") == 33


@pytest.mark.parametrize(("name", "value"), [("x-message-deduplication", "yes"), ("x-cache-size", 0),
                                             ("x-cache-size", "5"), ("x-cache-ttl", -1),
                                             ("x-deduplication-header", ""), ("x-deduplication-header", 5)])
def test_bad_values_are_refused_naming_the_argument(tmp_path: Path, name: str, value: object) -> None:
    async def body(m: Model) -> None:
        from lavinpy.broker.ops import objects as operations_objects
        with pytest.raises(BrokerChannelError) as refused:
            m.declare("q", durable=True, queue_type="quorum", **{name[2:].replace("-", "_"): value})
        assert refused.value.text.startswith("PRECONDITION_FAILED") and f"'{name}'" in refused.value.text
        with pytest.raises(BrokerChannelError) as refused:
            operations_objects.declare_exchange(None, m.vhost, "x", "direct", arguments={name: value})
        assert f"'{name}'" in refused.value.text
    run(body, tmp_path)


def test_deduplication_and_delayed_retries_on_one_queue(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        from tests.broker.model_harness import until
        q = m.declare("q", message_deduplication=True, delayed_retry_min=20)
        send(m, "q", "job", **{"x-deduplication-header": "j"})
        send(m, "q", "job", **{"x-deduplication-header": "j"})
        taken = q.get()
        assert taken is not None and q.message_count == 0
        q.requeue(taken[0])  # held, not a duplicate of itself
        assert q.delayed_count == 1
        [got] = await until(lambda: m.get("q"), what="the retry")
        assert got["payload"] == "job" and got["properties"]["headers"]["x-delivery-count"] == 1
    run(body, tmp_path)


def test_every_kind_of_identifier_is_a_duplicate_after_a_reopen(tmp_path: Path) -> None:
    """Short ASCII strings are kept as themselves in memory and as typed records on disk: a reopened
    cache must find each kind again and still tell a string from the bytes or number it spells."""
    async def body(m: Model) -> None:
        from lavinpy.store.append_file import AppendFile
        path = tmp_path / "cache"
        values = ["a", "ü", "x" * 63, "x" * 64, "y" * 500, b"a", 1, True]
        file = AppendFile(path, lambda fd: __import__("os").close(fd), lambda: False)
        cache = DedupCache(DedupSettings(cache_size=100), file)
        for value in values:
            assert not cache.seen({"x-deduplication-header": value}, 1000)
        file.write_pending()
        file.close()
        again = DedupCache(DedupSettings(cache_size=100), AppendFile(path, lambda fd: None, lambda: False))
        assert list(again.entries) == list(cache.entries)
        for value in values:
            assert again.seen({"x-deduplication-header": value}, 2000), value
        for other in ["1", b"1", "b", "x" * 62, False]:
            assert not again.seen({"x-deduplication-header": other}, 2000), other
    run(body, tmp_path)


def test_an_identifier_back_after_it_expired_is_remembered_as_the_newest(tmp_path: Path) -> None:
    """As LavinMQ's: the expired entry goes and the identifier comes back as the newest, so a full
    cache then forgets the others first (in memory, and the same after a reopen from the file)."""
    async def body(m: Model) -> None:
        from lavinpy.store.append_file import AppendFile
        path = tmp_path / "cache"
        file = AppendFile(path, lambda fd: __import__("os").close(fd), lambda: False)
        cache = DedupCache(DedupSettings(cache_size=2), file)
        assert not cache.seen({"x-deduplication-header": "a", "x-cache-ttl": 10}, 1000)
        assert not cache.seen({"x-deduplication-header": "b"}, 1000)
        assert not cache.seen({"x-deduplication-header": "a"}, 2000)  # expired at 1010: new again
        assert not cache.seen({"x-deduplication-header": "c"}, 2000)  # full: b, the oldest, goes
        assert list(cache.entries) == ["a", "c"]
        file.write_pending()
        file.close()
        again = DedupCache(DedupSettings(cache_size=2), AppendFile(path, lambda fd: None, lambda: False))
        assert list(again.entries) == ["a", "c"]
        for cached in (cache, again):
            assert cached.seen({"x-deduplication-header": "a"}, 3000)
            assert cached.seen({"x-deduplication-header": "c"}, 3000)
            assert not cached.seen({"x-deduplication-header": "b"}, 3000)  # forgotten: new, a goes
            assert list(cached.entries) == ["c", "b"]
    run(body, tmp_path)


def ident_block(value: object, **headers: object) -> bytes:
    """A persistent message's property block with this identifier (and other headers)."""
    from lavinpy.wire.field_table import encode_table
    return b"\x30\x00" + encode_table({"x-deduplication-header": value, **headers}) + b"\x02"


def test_a_publish_run_leaves_the_duplicates_out(tmp_path: Path) -> None:
    """A run of messages with identifiers (per-message headers) to a deduplicating queue or exchange
    is taken whole; each identifier asked in order, the duplicates (also within the run) stored
    nowhere and counted, as one by one."""
    async def body(m: Model) -> None:
        vhost = m.vhost
        q = m.declare("q", durable=True, **ON)
        blocks = [ident_block(v) for v in ("1", "2", "1", "3")]
        assert vhost.publish_run(vhost.default_exchange, "q", blocks, [b"a", b"b", b"c", b"d"]) == (1, True)
        assert vhost.publish_run(vhost.default_exchange, "q", [ident_block("2"), ident_block("4")],
                                 [b"e", b"f"]) == (1, True)
        assert vhost.publish_run(vhost.default_exchange, "q", [ident_block("1"), ident_block("4")],
                                 [b"g", b"h"]) == (1, True)  # duplicates all: confirmed once "1" and "4" are durable
        assert m.bodies("q") == ["a", "b", "d", "f"] and q.stats.duplicates == 4
        operations_objects.declare_exchange(None, vhost, "dx", "direct", durable=True,
                                            arguments={"x-message-deduplication": True})
        m.declare("q1")
        m.declare("q2")
        m.bind("q1", "dx", "k")
        m.bind("q2", "dx", "k")
        assert vhost.publish_run(vhost.get_exchange("dx"), "k", [ident_block(1), ident_block(1), ident_block(b"1")],
                                 [b"x", b"y", b"z"]) == (2, True)  # (q1, q2 transient: the duplicate waits)
        assert m.bodies("q1") == ["x", "z"] and m.bodies("q2") == ["x", "z"]
        assert vhost.get_exchange("dx").stats.duplicates == 1
        m.reopen()
        send(m, "q", "after", **{"x-deduplication-header": "3"})
        assert m.bodies("q") == []  # (read above) and "3" still known after the reopen
    from lavinpy.broker.ops import objects as operations_objects
    run(body, tmp_path)


def test_a_run_and_one_by_one_remember_the_same(tmp_path: Path) -> None:
    """The identifier read from the raw block (a run) is the decoded header's (one by one): the same
    keys, the same expiries (the message's own x-cache-ttl too), for every kind of value."""
    async def body(m: Model) -> None:
        values = ["a", "ü", "x" * 63, "y" * 500, b"a", 1, True, 2.5, None, ["l"]]
        blocks = [ident_block(v) for v in values] + [ident_block("t", **{"x-cache-ttl": 5000}),
                                                     ident_block("u", **{"x-cache-ttl": "bad"})]
        one = DedupCache(DedupSettings(cache_size=100, ttl_ms=60_000))
        each = DedupCache(DedupSettings(cache_size=100, ttl_ms=60_000))
        from lavinpy.wire.properties import peek_headers
        assert [one.seen_in(block, 1000) for block in blocks] == [each.seen(peek_headers(b), 1000) for b in blocks]
        # (a float, a void and an array are no identifiers: not remembered, never duplicates)
        assert one.entries == each.entries and len(one.entries) == 9
        assert one.entries["t"] == 6000 and one.entries["u"] == 61_000
        assert [one.seen_in(block, 2000) for block in blocks] == [True] * 7 + [False] * 3 + [True] * 2
    run(body, tmp_path)


@pytest.mark.parametrize("seed", range(4))
def test_a_run_asked_at_once_matches_one_by_one_and_writes_the_same_file(tmp_path: Path, seed: int) -> None:
    """``new_in`` (a run's identifiers in one loop) keeps, forgets, expires and writes as ``seen_in``
    asked message by message: the same duplicates, the same entries in the same order, the same file
    records, read back the same after a reopen; with a full cache, expiring identifiers coming back,
    messages with their own TTL, without an identifier, and identifiers of other types mixed in."""
    import random

    from lavinpy.store.append_file import AppendFile

    rng = random.Random(seed)
    values: list[object] = [*(str(n) for n in range(30)), "ü", b"b", 7, "z" * 64]
    blocks = []
    for _ in range(600):
        roll = rng.random()
        if roll < 0.05:
            blocks.append(b"\x10\x00\x02")  # no headers: never a duplicate
        elif roll < 0.15:
            blocks.append(ident_block(rng.choice(values), **{"x-cache-ttl": rng.choice([0, 5, 50])}))
        else:
            blocks.append(ident_block(rng.choice(values)))

    async def body(m: Model) -> None:
        caches = []
        for name in ("one", "run"):
            file = AppendFile(tmp_path / name, lambda fd: __import__("os").close(fd), lambda: False)
            caches.append((file, DedupCache(DedupSettings(cache_size=12, ttl_ms=40), file)))
        (one_file, one), (run_file, batch) = caches
        at, now = 0, 1000
        while at < len(blocks):
            size = rng.randint(1, 40)
            chunk = blocks[at:at + size]
            expected = [i for i, block in enumerate(chunk) if not one.seen_in(block, now)]
            kept = batch.new_in(chunk, now)
            assert (list(range(len(chunk))) if kept is None else kept) == expected
            assert list(batch.entries.items()) == list(one.entries.items())
            if rng.random() < 0.5:
                one_file.write_pending()
                run_file.write_pending()
            at += size
            now += rng.randint(0, 20)
        for file in (one_file, run_file):
            file.write_pending()
            file.close()
        reread = [DedupCache(DedupSettings(cache_size=12, ttl_ms=40),
                             AppendFile(tmp_path / name, lambda fd: None, lambda: False)) for name in ("one", "run")]
        assert list(reread[0].entries.items()) == list(reread[1].entries.items()) == list(one.entries.items())
    run(body, tmp_path)


def test_a_rewrite_waits_for_the_write_of_its_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's rewrite (it has grown past twice the cache) is done when the identifiers are
    written, after their messages' index entries, not while a run is asked: then it would put on
    disk identifiers whose messages are not stored yet (a kill -9 would make their retries
    duplicates)."""
    from lavinpy.broker.queues import dedup_cache
    from lavinpy.store.vhost_store import VhostStore
    monkeypatch.setattr(dedup_cache, "COMPACT_MIN_RECORDS", 2)

    async def scenario() -> None:
        store = VhostStore(tmp_path, fsync="always")
        store.open()
        store.finish_recovery()
        cache = DedupCache(DedupSettings(cache_size=2), store.open_append_file("dedup"))
        blocks = [ident_block(f"id{n}") for n in range(6)]
        assert cache.new_in(blocks, 0) is None
        assert (tmp_path / "dedup").read_bytes() == b""  # nothing on disk before the run is stored
        await asyncio.shield(store.durable())
        again = DedupCache(DedupSettings(cache_size=2), store.open_append_file("dedup2"))
        again._load((tmp_path / "dedup").read_bytes())  # the rewrite: the two live entries only
        assert list(again.entries) == ["id4", "id5"] and again._records == 2
        store.close()

    asyncio.run(scenario())
