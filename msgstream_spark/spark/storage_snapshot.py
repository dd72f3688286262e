"""The snapshot from Milvus's storage as Spark tasks: one job, each task writes one Parquet file.

The plan's binlog groups are packed into units and tasks (:func:`msgstream_spark.mirror.snapshot.storage.units.pack`:
units hold disjoint key sets, about as many tasks as cores unless the binlogs are large). Each task reads
its units column-wise (Milvus's files through the mirror's ``Store``, built from the settings the driver resolved)
and writes them as one Parquet file with pyarrow straight into the table's store (no rows through the JVM, no
shared disk), under a name unique to the attempt; it answers only the file's path and row count, which the driver
collects and hands to the table, as the query route does (:mod:`msgstream_spark.spark.snapshot`). Only where a
unit would be too large (many segments of one channel re-inserting one key range) does a key pass run first: a
job over those segments' timestamps and keys, hashed into a few partitions, bringing the repeated keys with their
newest ``_seq`` to the driver.
"""

from __future__ import annotations

import logging
import uuid

import pyarrow as pa
from pyspark.sql import SparkSession

from msgstream_spark.mirror.order import SEQ
from msgstream_spark.mirror.snapshot.storage.access import SegmentGoneError
from msgstream_spark.mirror.snapshot.storage.plan import ReadTask
from msgstream_spark.mirror.snapshot.storage.reader import StorageReader, duplicate_winners, write_units
from msgstream_spark.mirror.snapshot.storage.units import Packing, Unit
from msgstream_spark.mirror.store import Store, store_for, uri
from msgstream_spark.spark.snapshot import SnapshotFiles, _Progress, remove_dir, spark_schema

FILES_SCHEMA = "path string, rows long"
log = logging.getLogger(__name__)


def _keys_fn(reader: StorageReader, tasks: list[ReadTask]):
    def read(batches):
        milvus = reader.settings.store()  # from the driver's resolved settings, not the executor's environment
        for b in batches:
            for i in b.column(0).to_pylist():
                yield reader.read_keys(tasks[i], milvus)

    return read


def part_name(i: int) -> str:
    """Task ``i``'s file name, unique to this attempt: a retried or speculative attempt of the task writes a file
    of its own, never over another attempt's (the driver takes only the files the successful attempts return)."""
    return f"part-{i:05d}-{uuid.uuid4().hex}.parquet"


def _write_fn(reader: StorageReader, bins: list[list[Unit]], out_dir: str, acc, store: Store):
    def write(batches):
        milvus = reader.settings.store()  # from the driver's resolved settings, not the executor's environment
        for b in batches:
            for i in b.column(0).to_pylist():
                path = uri.join(out_dir, part_name(i))
                rows = write_units(reader, bins[i], path, milvus, acc, store)
                yield pa.RecordBatch.from_pydict({"path": [path], "rows": [rows]})

    return write


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
        w = duplicate_winners(t, pk)
        if w.num_rows:
            yield pa.RecordBatch.from_arrays([w.column(0).combine_chunks(), w.column(1).combine_chunks()],
                                             schema=t.schema)

    return dups


def find_winners(spark: SparkSession, reader: StorageReader, tasks: list[ReadTask]) -> pa.Table:
    """(pk, the newest ``_seq``) of every key that more than one kept row of ``tasks`` holds: the keys are hashed
    into a few partitions (not Spark's 200 shuffle partitions) and each finds its repeated keys with pyarrow."""
    from pyspark.sql.pandas.types import from_arrow_schema

    kschema = from_arrow_schema(pa.schema([reader.schema.field(reader.pk), reader.schema.field(SEQ)]))
    df = _ids(spark, len(tasks)).mapInArrow(_keys_fn(reader, tasks), kschema)
    n = max(1, min(len(tasks), spark.sparkContext.defaultParallelism))
    dups = df.repartition(n, reader.pk).mapInArrow(_dups_fn(reader.pk), kschema)
    rows = _run(dups.collect)
    return pa.table({"pk": pa.array([r[0] for r in rows], reader.schema.field(reader.pk).type),
                     SEQ: pa.array([r[1] for r in rows], reader.schema.field(SEQ).type)})


def write_storage_snapshot(spark: SparkSession, reader: StorageReader, packing: Packing, out_dir: str,
                           total: int, progress_interval: float = 5.0, store: Store | None = None) -> SnapshotFiles:
    """Read the packed tasks in Spark and write the table's rows as Parquet files under ``out_dir`` in ``store``
    (default: the local directory)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    store = store if store is not None else store_for(out_dir)
    reader.schema = to_arrow_schema(spark_schema(reader.schema), timezone="UTC")
    reader.winners = find_winners(spark, reader, packing.key_pass) if packing.key_pass else None
    acc = spark.sparkContext.accumulator(0)
    df = _ids(spark, len(packing.tasks)).mapInArrow(_write_fn(reader, packing.tasks, out_dir, acc, store),
                                                    FILES_SCHEMA)
    try:
        with _Progress(acc, None, total, progress_interval):
            written = _run(df.collect)
    except BaseException:
        remove_dir(store, out_dir)  # a failed read leaves no files behind
        raise
    files = sorted(r[0] for r in written)
    return SnapshotFiles(files, sum(int(r[1]) for r in written))  # the tasks' counts (successful attempts only)
