"""Reading as a user with few rights: the driver finds a queue's kind by a redeclare, which needs
configure permission; without it (or on a broker whose refusal names no argument), the first delivery
decides, and an empty queue's kind comes from the options or the queueType option."""

from __future__ import annotations

from pathlib import Path

import pytest
from pamqp import commands

from lavinpy.spark.client import AMQPParams, Connection
from lavinpy.spark.queues import QUEUE, STREAM, UNKNOWN, queue_kind
from tests.e2e.conftest import FileAdmin, LocalBroker

from .conftest import error_text
from .test_queues import publish_plain

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def rights_broker(tmp_path_factory: pytest.TempPathFactory):
    """A broker with `reader` (read and write, no configure) and `stranger` (no rights on these queues),
    and a classic, a quorum, a stream and an empty classic queue."""
    broker = LocalBroker(tmp_path_factory.mktemp("rights") / "broker")
    admin = FileAdmin(broker)
    admin.add_user("reader", "pw")
    admin.set_permissions("reader", "/", "^$", ".*", ".*")
    admin.add_user("stranger", "pw")
    admin.set_permissions("stranger", "/", "^own\\.", "^own\\.", "^own\\.")
    admin.apply()
    with Connection(AMQPParams.from_url(broker.url)).open() as conn:
        ch = conn.open_channel()
        for name, kind in (("jobs", "classic"), ("votes", "quorum"), ("events", "stream"), ("idle", "classic")):
            conn.call(ch, commands.Queue.Declare(queue=name, durable=True, arguments={"x-queue-type": kind}),
                      commands.Queue.DeclareOk)
    for name in ("jobs", "votes", "events"):
        publish_plain(broker.url, name, 20, 16)
    try:
        yield broker
    finally:
        broker.stop()


def read(spark, url: str, queue: str, **options: str) -> list:
    reader = spark.read.format("lavinpy").option("url", url).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().collect()


def test_the_kind_comes_from_the_first_delivery_when_a_redeclare_is_refused(rights_broker) -> None:
    params = AMQPParams.from_url(rights_broker.url_for("reader", "pw"))
    assert queue_kind(params, "jobs") == (QUEUE, 20)
    assert queue_kind(params, "votes") == (QUEUE, 20)
    assert queue_kind(params, "events") == (STREAM, 20)
    assert queue_kind(params, "idle") == (UNKNOWN, 0)
    with Connection(AMQPParams.from_url(rights_broker.url)).open() as conn:
        ok = conn.call(conn.open_channel(), commands.Queue.Declare(queue="jobs", passive=True),
                       commands.Queue.DeclareOk)
    assert (ok.message_count, ok.consumer_count) == (20, 0), "the probe's one message went back"


def test_a_user_without_configure_permission_reads_every_kind(spark, rights_broker, tmp_path: Path) -> None:
    url = rights_broker.url_for("reader", "pw")
    rows = read(spark, url, "events")
    assert sorted(r.body[:8] for r in rows) == [b"%08d" % i for i in range(20)]
    for queue in ("jobs", "votes"):
        rows = read(spark, url, queue)
        assert sorted(r.body[:8] for r in rows) == [b"%08d" % i for i in range(20)], queue
        assert sum(r.redelivered for r in rows) <= 1, "only the kind probe's message comes redelivered"
    assert read(spark, url, "idle") == []  # empty: nothing to read, whatever its kind
    assert read(spark, url, "idle", startingOffset="first") == []
    query = (spark.readStream.format("lavinpy").option("url", url).option("queue", "idle").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception) as info:
        query.awaitTermination(120)
    text = error_text(info.value)
    assert "cannot tell whether queue 'idle' is a stream" in text and "queueType" in text, text


def test_a_user_without_read_permission_is_refused_in_the_words_of_the_refusal(spark, rights_broker) -> None:
    url = rights_broker.url_for("stranger", "pw")
    for queue in ("jobs", "events"):
        with pytest.raises(Exception) as info:
            read(spark, url, queue)
        text = error_text(info.value)
        assert f"cannot read queue '{queue}': 403 ACCESS_REFUSED - read access to queue '{queue}'" in text, text
        assert "at 'last'" not in text and "at 'first'" not in text, text
