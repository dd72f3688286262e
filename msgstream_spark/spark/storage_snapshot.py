"""The snapshot from Milvus's storage as Spark tasks: one task per insert binlog group of a segment.

Two passes over the plan's tasks (``mapInArrow``): the first reads only the timestamps and keys and finds
the keys kept more than once (Spark's ``groupBy``; only those keys and their newest ``_seq`` reach the
driver), the second reads every field and writes the table's Parquet files. The driver lists the files
and hands their paths to the table, as the query route does (:mod:`msgstream_spark.spark.snapshot`).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import SparkSession

from msgstream_spark.mirror.order import SEQ
from msgstream_spark.mirror.storage.access import SegmentGoneError
from msgstream_spark.mirror.storage.plan import ReadTask
from msgstream_spark.mirror.storage.reader import StorageReader, duplicate_winners
from msgstream_spark.spark.snapshot import SnapshotFiles, _local, _Progress, parquet_rows, spark_schema


def _tasks_fn(reader: StorageReader, tasks: list[ReadTask], keys_only: bool, acc=None):
    def read(batches):
        fs_ = reader.settings.filesystem()
        for b in batches:
            for i in b.column(0).to_pylist():
                out = reader.read_keys(tasks[i], fs_) if keys_only else reader.read(tasks[i], fs_)
                if acc is not None:
                    acc.add(out.num_rows)
                yield out

    return read


def _ids(spark: SparkSession, n: int):
    return spark.range(0, n, 1, numPartitions=max(1, n)).toDF("i")


def _run(action):
    """Spark's failure, with a garbage-collected file found in it raised as :class:`SegmentGoneError`."""
    try:
        return action()
    except Exception as exc:  # noqa: BLE001 - py4j / PythonException; re-raised unless it names a gone file
        gone = SegmentGoneError.in_text(str(exc))
        if gone is not None:
            raise gone from exc
        raise


def _dups_fn(pk: str):
    def dups(batches):
        t = pa.Table.from_batches(list(batches))
        for k, top in duplicate_winners(t, pk).items():
            yield pa.RecordBatch.from_pylist([{pk: k, SEQ: top}], schema=t.schema)

    return dups


def find_winners(spark: SparkSession, reader: StorageReader, tasks: list[ReadTask]) -> dict:
    """pk -> the newest ``_seq`` of every key that more than one kept row holds: the keys are hashed into a few
    partitions (not Spark's 200 shuffle partitions) and each finds its repeated keys with pyarrow."""
    from pyspark.sql.pandas.types import from_arrow_schema

    kschema = from_arrow_schema(pa.schema([reader.schema.field(reader.pk), reader.schema.field(SEQ)]))
    df = _ids(spark, len(tasks)).mapInArrow(_tasks_fn(reader, tasks, True), kschema)
    n = max(1, min(len(tasks), spark.sparkContext.defaultParallelism))
    dups = df.repartition(n, reader.pk).mapInArrow(_dups_fn(reader.pk), kschema)
    return {r[0]: r[1] for r in _run(dups.collect)}


def write_storage_snapshot(spark: SparkSession, reader: StorageReader, tasks: list[ReadTask], out_dir: str,
                           total: int, progress_interval: float = 5.0) -> SnapshotFiles:
    """Read ``tasks`` in Spark tasks and write the table's rows as Parquet files under ``out_dir``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    sschema = spark_schema(reader.schema)
    reader.schema = to_arrow_schema(sschema, timezone="UTC")
    reader.winners = find_winners(spark, reader, tasks)
    acc = spark.sparkContext.accumulator(0)
    df = _ids(spark, len(tasks)).mapInArrow(_tasks_fn(reader, tasks, False, acc), sschema)
    with _Progress(acc, None, total, progress_interval):
        _run(lambda: df.write.mode("errorifexists").parquet(out_dir))
    files = sorted(_local(f) for f in spark.read.parquet(out_dir).inputFiles())
    return SnapshotFiles(files, parquet_rows(files))  # from the footers: a retried task's rows count once
