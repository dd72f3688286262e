"""Spark's side of a read: a partition is a :class:`~msgstream_spark.source.read.ReadRange`.

``read_partition`` runs on an executor: the range, read by the Spark-free core in the exact
Arrow schema Spark expects for the query's StructType.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from msgstream_spark.source.offsets import Offset
from msgstream_spark.source.options import ReadOptions
from msgstream_spark.source.read import ReadRange, plan_read_tasks, read_range, read_ranges


@dataclass
class ChannelPartition(ReadRange, InputPartition):
    """One range of one channel as a Spark input partition (plain data, pickled to executors)."""

    def __post_init__(self) -> None:
        InputPartition.__init__(self, self.channel)


@dataclass
class RangesPartition(InputPartition):
    """Several small ranges read one after the other by one task (``source.ranges.pack``)."""

    ranges: list[ReadRange]

    def __post_init__(self) -> None:
        InputPartition.__init__(self, ",".join(r.channel for r in self.ranges))


def _partition(r: ReadRange) -> ChannelPartition:
    return ChannelPartition(**{f.name: getattr(r, f.name) for f in fields(r)})


def plan_partitions(client: Any, start: Offset, end: Offset, opts: ReadOptions, schema_json: str,
                    pk_name: str | None, collection: tuple[int | None, str | None] = (None, None),
                    ) -> list[ChannelPartition | RangesPartition]:
    """The core's plan (:func:`~msgstream_spark.source.read.plan_reads`) as Spark partitions, small
    ranges sharing a task (:func:`~msgstream_spark.source.read.plan_tasks`)."""
    tasks = plan_read_tasks(client, start, end, opts, schema_json, pk_name, collection)
    return [_partition(g[0]) if len(g) == 1 else RangesPartition(g) for g in tasks]


def spark_arrow_schema(schema_json: str) -> pa.Schema:
    """The Arrow schema Spark expects for a StructType given as JSON."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    return to_arrow_schema(StructType.fromJson(json.loads(schema_json)), timezone="UTC")


def read_partition(part: ChannelPartition | RangesPartition) -> Iterator[pa.RecordBatch]:
    """Read one partition and yield RecordBatches of the exact Spark Arrow schema."""
    if isinstance(part, RangesPartition):
        return read_ranges(part.ranges, spark_arrow_schema(part.ranges[0].schema_json))
    return read_range(part, spark_arrow_schema(part.schema_json))

