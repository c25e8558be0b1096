"""A data source whose two tasks each report how many objects their Python worker has frozen (a module of
its own: Spark's workers import it by name, without the test modules' imports)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


class FreezeProbe(DataSource):
    @classmethod
    def name(cls) -> str:
        return "freeze_probe"

    def schema(self) -> str:
        return "frozen long"

    def reader(self, schema: object) -> DataSourceReader:
        return FreezeProbeReader()


class FreezeProbeReader(DataSourceReader):
    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0), InputPartition(1)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        yield (gc.get_freeze_count(),)
