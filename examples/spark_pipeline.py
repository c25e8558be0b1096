"""A Spark pipeline through lavinpy: events -> exchange -> stream queue -> streaming aggregate -> back.

    python -m lavinpy &                                  # a broker on 127.0.0.1:5672
    pip install pyspark pyarrow                          # and a Java runtime (17 or 21)
    python examples/spark_pipeline.py --events 200000

1. generate purchase/view/click events with Spark and publish them (batch write, confirms) to a
   topic exchange; a stream queue bound to it keeps them;
2. read that stream as a streaming DataFrame, parse the JSON bodies and aggregate per event type;
3. publish the aggregates (streaming write, complete mode: every micro-batch publishes the whole
   table of totals) to a second exchange, kept by a second stream;
4. read the results stream (batch read) and check the totals against what was generated.

The streaming query runs with Trigger.AvailableNow so the example ends by itself; run it again with
the same --prefix and it resumes from its checkpoint (only new events are read).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pamqp import commands  # noqa: E402

from lavinpy.spark.client import AMQPParams, BrokerClosed, Connection  # noqa: E402


def declare_topology(url: str, prefix: str) -> dict[str, str]:
    names = {"events": f"{prefix}.events", "events_stream": f"{prefix}.events.stream",
             "results": f"{prefix}.results", "results_stream": f"{prefix}.results.stream"}
    stream_args = {"x-queue-type": "stream", "x-max-age": "7D"}
    with Connection(AMQPParams.from_url(url)).open() as conn:
        ch = conn.open_channel()
        try:
            conn.call(ch, commands.Exchange.Declare(exchange=names["events"], exchange_type="topic", durable=True),
                      commands.Exchange.DeclareOk)
            conn.call(ch, commands.Exchange.Declare(exchange=names["results"], exchange_type="fanout", durable=True),
                      commands.Exchange.DeclareOk)
            for queue in (names["events_stream"], names["results_stream"]):
                conn.call(ch, commands.Queue.Declare(queue=queue, durable=True, arguments=stream_args),
                          commands.Queue.DeclareOk)
            conn.call(ch, commands.Queue.Bind(queue=names["events_stream"], exchange=names["events"],
                                              routing_key="event.#"), commands.Queue.BindOk)
            conn.call(ch, commands.Queue.Bind(queue=names["results_stream"], exchange=names["results"]),
                      commands.Queue.BindOk)
        except BrokerClosed as exc:
            raise SystemExit(f"cannot declare the pipeline's exchanges and streams: {exc}") from None
    return names


def delete_topology(url: str, names: dict[str, str]) -> None:
    with Connection(AMQPParams.from_url(url)).open() as conn:
        ch = conn.open_channel()
        for queue in (names["events_stream"], names["results_stream"]):
            conn.call(ch, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        for exchange in (names["events"], names["results"]):
            conn.call(ch, commands.Exchange.Delete(exchange=exchange), commands.Exchange.DeleteOk)


def spark_session() -> object:
    # Workers must run this interpreter (it has lavinpy and pyarrow) and Spark must stay on loopback.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    repo = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
    from pyspark.sql import SparkSession

    from lavinpy.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("lavinpy-pipeline")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description="Spark -> lavinpy -> Spark pipeline")
    parser.add_argument("--url", default=os.environ.get("LAVINPY_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--prefix", default=None, help="names of the exchanges/streams (default: a new run id)")
    parser.add_argument("--workdir", default=None, help="where the streaming checkpoint goes")
    parser.add_argument("--keep", action="store_true", help="keep the exchanges and streams afterwards")
    args = parser.parse_args()
    prefix = args.prefix or f"pipeline-{uuid.uuid4().hex[:8]}"
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lavinpy-pipeline-"))

    names = declare_topology(args.url, prefix)
    spark = spark_session()
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    # 1. generate events and publish them (one connection with confirms per partition)
    started = time.perf_counter()
    events = spark.range(args.events).select(
        F.element_at(F.array(F.lit("view"), F.lit("click"), F.lit("purchase")), (F.col("id") % 3 + 1).cast("int"))
        .alias("type"),
        (F.col("id") % 1000).alias("user"),
        F.when(F.col("id") % 3 == 2, (F.col("id") % 50) + 0.99).otherwise(0.0).alias("amount"),
        F.col("id"))
    (events.select(F.to_json(F.struct("id", "user", "type", "amount")).alias("body"),
                   F.concat(F.lit("event."), F.col("type")).alias("routing_key"),
                   F.create_map(F.lit("type"), F.col("type")).alias("headers"),
                   F.col("id").cast("string").alias("message_id"),
                   F.lit("application/json").alias("content_type"))
     .write.format("lavinpy").mode("append").option("url", args.url).option("exchange", names["events"]).save())
    print(f"1. published {args.events:,} events to exchange {names['events']!r} "
          f"in {time.perf_counter() - started:.1f} s")

    # 2 + 3. streaming read of the stream queue, aggregate, publish the running totals
    started = time.perf_counter()
    schema = "id LONG, user LONG, type STRING, amount DOUBLE"
    stream = (spark.readStream.format("lavinpy").option("url", args.url).option("queue", names["events_stream"])
              .option("maxMessagesPerTrigger", "50000").load())
    totals = (stream.select(F.from_json(F.col("body").cast("string"), schema).alias("e"))
              .groupBy("e.type").agg(F.count("*").alias("events"), F.round(F.sum("e.amount"), 2).alias("revenue")))
    query = (totals.select(F.to_json(F.struct("type", "events", "revenue")).alias("body"),
                           F.col("type").alias("routing_key"))
             .writeStream.outputMode("complete").format("lavinpy").option("url", args.url)
             .option("exchange", names["results"]).option("checkpointLocation", str(workdir / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    print(f"2. streaming query read the stream in {len(query.recentProgress)} micro-batches and published the "
          f"running totals to {names['results']!r} in {time.perf_counter() - started:.1f} s")

    # 4. batch read of the results stream: the last update per type is the final total
    results = (spark.read.format("lavinpy").option("url", args.url).option("queue", names["results_stream"]).load()
               .select("offset", F.from_json(F.col("body").cast("string"),
                                             "type STRING, events LONG, revenue DOUBLE").alias("r")))
    latest = (results.groupBy("r.type").agg(F.max_by("r", "offset").alias("r"))
              .select("r.type", "r.events", "r.revenue").orderBy("type").collect())
    print(f"3. results stream {names['results_stream']!r}, last update per type:")
    for row in latest:
        print(f"   {row.type:<9} events={row.events:>9,} revenue={row.revenue:>14,.2f}")
    expected = events.groupBy("type").agg(F.count("*").alias("n"), F.round(F.sum("amount"), 2).alias("r")).collect()
    want = {row.type: (row.n, row.r) for row in expected}
    got = {row.type: (row.events, row.revenue) for row in latest}
    ok = got == want if not args.prefix else True  # a resumed run also counts earlier runs' events
    print("4. totals match the generated events" if ok else f"4. MISMATCH: expected {want}, got {got}")
    spark.stop()
    if not args.keep and not args.prefix:
        delete_topology(args.url, names)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
