"""Writing DataFrames to lavinpy: batch (100k rows checked one by one), streaming, and failures."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from .conftest import drain, error_text, unique

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


def test_batch_write_100k_rows_checked_message_by_message(spark, broker, admin) -> None:
    exchange, queue = unique("spark-x"), unique("spark-q")
    admin.exchange_declare(exchange, "topic", durable=True)
    admin.queue_declare(queue, durable=True)
    admin.queue_bind(queue, exchange, "rk.*")
    n = 100_000
    df = spark.range(n).selectExpr(
        "concat('event-', id) AS body",
        "concat('rk.', id % 3) AS routing_key",
        "map('id', cast(id AS string), 'parity', if(id % 2 = 0, 'even', 'odd')) AS headers",
        "cast(id AS string) AS message_id",
        "concat('corr-', id) AS correlation_id",
        "'text/plain' AS content_type",
        "cast(id % 10 AS int) AS priority",
        "timestamp_seconds(1700000000 + id) AS timestamp",
    )
    (df.write.format("lavinpy").mode("append").option("url", broker.url).option("exchange", exchange)
     .option("maxInFlight", "5000").save())

    got = drain(broker.url, queue, n)
    assert len(got) == n, f"expected {n} messages, got {len(got)}"
    seen = set()
    for method, props, body in got:
        i = int(props.message_id)
        assert i not in seen, f"message {i} delivered twice"
        seen.add(i)
        assert body == f"event-{i}".encode()
        assert method.routing_key == f"rk.{i % 3}"
        assert method.exchange == exchange
        assert props.headers == {"id": str(i), "parity": "even" if i % 2 == 0 else "odd"}
        assert props.correlation_id == f"corr-{i}"
        assert props.content_type == "text/plain"
        assert props.priority == i % 10
        assert props.timestamp == 1700000000 + i
        assert props.delivery_mode == 2
    assert seen == set(range(n))


def test_body_only_to_queue_through_default_exchange(spark, broker, admin) -> None:
    queue = unique("spark-q")
    admin.queue_declare(queue, durable=True)
    df = spark.createDataFrame([(b"\x00\x01binary",), (b"",), (b"x" * 300_000,)], "body binary")
    df.write.format("lavinpy").mode("append").option("url", broker.url).option("queue", queue) \
        .option("persistent", "false").save()
    got = drain(broker.url, queue, 3)
    assert sorted(body for _, _, body in got) == sorted([b"\x00\x01binary", b"", b"x" * 300_000])
    assert {props.delivery_mode for _, props, _ in got} == {None}


def test_streaming_write_with_checkpoint(spark, broker, admin, tmp_path: Path) -> None:
    exchange, queue = unique("spark-x"), unique("spark-q")
    admin.exchange_declare(exchange, "direct", durable=True)
    admin.queue_declare(queue, durable=True)
    admin.queue_bind(queue, exchange, "order")
    admin.queue_bind(queue, exchange, "refund")
    source = tmp_path / "in"
    source.mkdir()

    def add_file(name: str, rows: list[dict]) -> None:
        (source / name).write_text("\n".join(json.dumps(r) for r in rows))

    def run_stream() -> None:
        events = spark.readStream.schema("id LONG, kind STRING, amount DOUBLE").json(str(source))
        out = events.selectExpr("to_json(struct(id, amount)) AS body", "kind", "cast(id AS string) AS message_id")
        query = (out.writeStream.format("lavinpy").option("url", broker.url).option("exchange", exchange)
                 .option("routingKeyColumn", "kind").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    add_file("a.json", [{"id": i, "kind": "order" if i % 4 else "refund", "amount": i * 1.5} for i in range(500)])
    run_stream()
    first = drain(broker.url, queue, 500)
    assert sorted(int(p.message_id) for _, p, _ in first) == list(range(500))
    for method, props, body in first:
        i = int(props.message_id)
        assert method.routing_key == ("order" if i % 4 else "refund")
        assert json.loads(body) == {"id": i, "amount": i * 1.5}

    # restarted from its checkpoint, the query publishes only the new file's rows
    add_file("b.json", [{"id": i, "kind": "order", "amount": 1.0} for i in range(500, 800)])
    run_stream()
    second = drain(broker.url, queue, 300)
    assert sorted(int(p.message_id) for _, p, _ in second) == list(range(500, 800))


def test_write_to_missing_exchange_fails_clearly(spark, broker) -> None:
    exchange = unique("no-such-exchange")
    df = spark.range(10).selectExpr("cast(id AS string) AS body")
    with pytest.raises(Exception) as info:
        df.write.format("lavinpy").mode("append").option("url", broker.url).option("exchange", exchange) \
            .option("routingKey", "x").save()
    text = error_text(info.value)
    assert f"exchange '{exchange}' not found" in text, text


def test_unroutable_messages_fail_the_task(spark, broker, admin) -> None:
    exchange = unique("spark-x")
    admin.exchange_declare(exchange, "direct", durable=True)  # no binding: nothing routes
    df = spark.range(50).selectExpr("cast(id AS string) AS body")
    with pytest.raises(Exception) as info:
        df.write.format("lavinpy").mode("append").option("url", broker.url).option("exchange", exchange) \
            .option("routingKey", "nowhere").save()
    text = error_text(info.value)
    assert "returned as unroutable" in text and "NO_ROUTE" in text, text
    # mandatory=false: the broker drops them and the write succeeds
    df.write.format("lavinpy").mode("append").option("url", broker.url).option("exchange", exchange) \
        .option("routingKey", "nowhere").option("mandatory", "false").save()


def test_bad_columns_and_options_fail_on_the_driver(spark, broker) -> None:
    df = spark.range(3).selectExpr("cast(id AS string) AS body", "id AS sequence")
    with pytest.raises(Exception) as info:
        df.write.format("lavinpy").mode("append").option("url", broker.url).option("queue", "q").save()
    assert "unknown column 'sequence'" in error_text(info.value)
    no_body = spark.range(3).selectExpr("cast(id AS string) AS payload")
    with pytest.raises(Exception) as info:
        no_body.write.format("lavinpy").mode("append").option("url", broker.url).option("queue", "q").save()
    assert "needs a `body` column" in error_text(info.value)
    with pytest.raises(Exception) as info:
        df.select("body").write.format("lavinpy").mode("append").option("url", broker.url) \
            .option("queue", "q").option("confirm", "maybe").save()
    assert "confirm='maybe'" in error_text(info.value)


def test_timestamp_column_of_epoch_seconds(spark, broker, admin) -> None:
    queue = unique("spark-q")
    admin.queue_declare(queue, durable=True)
    when = int(dt.datetime(2024, 5, 1, tzinfo=dt.UTC).timestamp())
    df = spark.createDataFrame([("a", when, 60000)], "body string, timestamp long, expiration int")
    df.write.format("lavinpy").mode("append").option("url", broker.url).option("queue", queue).save()
    [(_, props, body)] = drain(broker.url, queue, 1)
    assert (body, props.timestamp, props.expiration) == (b"a", when, "60000")
