"""PySpark data source "lavinpy": write DataFrames to exchanges; read stream queues by offset and
classic and quorum queues with acks after Spark's commit.

    from lavinpy.spark import register
    register(spark)                      # once per SparkSession
    df.write.format("lavinpy").option("exchange", "events").save()
    spark.readStream.format("lavinpy").option("queue", "events-stream").load()
    spark.readStream.format("lavinpy").option("queue", "jobs").load()   # a classic or quorum queue

See docs/spark.md. The AMQP clients (client, publisher, streams) need no pyspark; the data
source classes are imported lazily so that `import lavinpy.spark` works without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LavinpyDataSource", "register"]


def register(spark: Any) -> None:
    """Register the "lavinpy" format with a SparkSession."""
    from .datasource import LavinpyDataSource

    spark.dataSource.register(LavinpyDataSource)


def __getattr__(name: str) -> Any:
    if name == "LavinpyDataSource":
        from .datasource import LavinpyDataSource

        return LavinpyDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
