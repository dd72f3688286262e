"""The change log (``--history-table``) of a micro-batch, computed and written by Spark tasks.

The batch is shuffled by key (every change of a key in one task) and sorted by key and ``_seq`` within each
task; each task turns its share into change-log rows and writes them as one Parquet file
(``mirror.history.write.HistoryWriter``), returning only (file, rows). The seed (the mirrored rows when the
history begins) is one task per live data file of the mirror. The driver holds the file lists and commits
them (``mirror.history.HistoryTable``); it never holds the batch or the mirrored rows.
"""

from __future__ import annotations

import pyarrow as pa

from msgstream_spark.mirror.formats.base import LiveFile
from msgstream_spark.mirror.history.write import HistorySpec, HistoryWriter, files_schema, seed_file
from msgstream_spark.mirror.order import SEQ


def _history_fn(spec: HistorySpec, existed_bc):
    def write(batches):
        w = HistoryWriter(spec, existed_bc.value)
        for b in batches:  # in (key, _seq) order; one Arrow batch at a time
            if b.num_rows:
                w.add(pa.Table.from_batches([b]))
        yield from w.close().to_batches()  # the file is closed before the task ends

    return write


def history_in_tasks(df, spec: HistorySpec, existed: pa.Table) -> pa.Table:
    """The batch's change-log rows written as files by tasks; the files (path, rows, newest ``_ts``).
    ``existed``: (pk, ``_ts``) of the mirrored rows of the batch's keys before it (the mirror's lookup)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    spark = df.sparkSession
    bc = spark.sparkContext.broadcast(existed)
    try:
        parts = df.repartition(spark.sparkContext.defaultParallelism, spec.pk).sortWithinPartitions(spec.pk, SEQ)
        got = parts.mapInArrow(_history_fn(spec, bc), from_arrow_schema(files_schema())).toArrow()
    finally:
        bc.unpersist()
    return got.cast(files_schema())


def _seed_fn(files: list[LiveFile], spec: HistorySpec, mirror):
    def seed(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                yield from seed_file(files[i], spec, mirror).to_batches()

    return seed


def seed_in_tasks(spark, table, spec: HistorySpec) -> pa.Table:
    """The mirror's live rows as change-log inserts, one task per data file; the files written."""
    from pyspark.sql.pandas.types import from_arrow_schema

    files = table.live_files()
    if not files:
        return files_schema().empty_table()
    ids = spark.range(0, len(files), 1, numPartitions=min(len(files), 4 * spark.sparkContext.defaultParallelism))
    return ids.mapInArrow(_seed_fn(files, spec, table.store),
                          from_arrow_schema(files_schema())).toArrow().cast(files_schema())
