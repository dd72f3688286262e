"""The snapshot of a collection as a Spark batch read, written as Parquet data files by the tasks.

One task per primary-key range (:func:`msgstream_spark.mirror.snapshot.query.reader.plan_ranges`); each task sends
``Query`` itself for answer-sized pieces of its range and yields Arrow batches of the table's columns
(:class:`msgstream_spark.mirror.snapshot.query.reader.RangeReader`). Spark writes them as Parquet files; the driver
only lists the files and hands their paths to the table (never the rows). The row count of the summary
is read from the files' Parquet footers (an accumulator inside a transformation counts a retried task
twice); accumulators only feed the progress log (rows and answer bytes per second).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PARTITION
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.reader import RangeReader, ReadStats

log = logging.getLogger(__name__)


@dataclass
class SnapshotFiles:
    files: list[str]
    rows: int
    calls: int = 0  # the tasks' Query calls (from an accumulator: a retried task's calls count again)


def spark_schema(schema: pa.Schema):
    """The Spark schema of the table's Arrow columns (vectors as arrays, JSON as strings)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _reader_fn(reader: RangeReader, ranges: list[PkRange], accs):
    rows_acc, bytes_acc, calls_acc = accs

    def read(batches):
        stats = ReadStats()
        done_rows = done_bytes = 0
        for b in batches:
            for i in b.column(0).to_pylist():
                for out in reader.read([ranges[i]], stats):
                    rows_acc.add(stats.rows - done_rows)
                    bytes_acc.add(stats.bytes - done_bytes)
                    done_rows, done_bytes = stats.rows, stats.bytes
                    yield out
        calls_acc.add(stats.calls)

    return read


class _Progress:
    """Logs ``snapshot: rows done of total, rows/s, MB/s`` every ``interval`` seconds while the write runs
    (from accumulators: a retried task's rows count again here, never in the summary)."""

    def __init__(self, rows_acc, bytes_acc, total: int, interval: float) -> None:
        self.rows_acc, self.bytes_acc, self.total, self.interval = rows_acc, bytes_acc, total, interval
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mirror-snapshot-progress", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()

    def report(self) -> None:
        secs = max(1e-9, time.monotonic() - self.t0)
        rows = self.rows_acc.value
        if self.bytes_acc is None:  # a reader that counts no answer bytes (the storage route)
            log.info("snapshot: %d of %d rows read, %.0f rows/s", rows, self.total, rows / secs)
            return
        log.info("snapshot: %d of %d rows read, %.0f rows/s, %.1f MB/s of answers", rows, self.total, rows / secs,
                 self.bytes_acc.value / secs / 1e6)

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)
        self.report()


def _local(uri: str) -> str:
    """A local path for ``file:`` URIs (other file systems keep their URI)."""
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def remove_dir(spark: SparkSession, path: str) -> None:
    """Delete ``path`` and what it holds through Hadoop's file system (any URI Spark writes to)."""
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    fs = p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if fs.exists(p) and not fs.delete(p, True):
        log.warning("could not remove the snapshot directory %s", path)


def parquet_rows(files: list[str]) -> int:
    """Rows in Parquet files, from their footers."""
    return sum(pq.read_metadata(f).num_rows for f in files)


def write_snapshot(spark: SparkSession, reader: RangeReader, ranges: list[PkRange], out_dir: str,
                   total: int, progress_interval: float = 5.0) -> SnapshotFiles:
    """Read ``ranges`` in Spark tasks (one range each) and write them as Parquet files under ``out_dir``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    sschema = spark_schema(reader.schema)
    reader = replace(reader, schema=to_arrow_schema(sschema, timezone="UTC"))
    rows_acc, bytes_acc, calls_acc = (spark.sparkContext.accumulator(0) for _ in range(3))
    n = max(1, len(ranges))
    ids = spark.range(0, len(ranges), 1, numPartitions=n).toDF("i")
    df = ids.mapInArrow(_reader_fn(reader, ranges, (rows_acc, bytes_acc, calls_acc)), sschema)
    with _Progress(rows_acc, bytes_acc, total, progress_interval):
        try:
            df.write.mode("errorifexists").parquet(out_dir)
        except BaseException:
            remove_dir(spark, out_dir)  # a failed write leaves no directory behind (one per retry otherwise)
            raise
    try:
        one_row_per_key(spark, out_dir, reader.pk)
    except BaseException:
        remove_dir(spark, out_dir)
        raise
    files = sorted(_local(f) for f in spark.read.parquet(out_dir).inputFiles())
    return SnapshotFiles(files, parquet_rows(files), calls_acc.value)


def one_row_per_key(spark: SparkSession, out_dir: str, pk: str) -> int:
    """Rewrite the snapshot under ``out_dir`` with one row per key; the number of rows dropped.

    Each partition is read at its own time, so a key moved from one partition to another between two reads is
    in both (and Milvus lets one key be inserted into two partitions). Found by a key-only count; only then are
    the files rewritten, keeping the row of the largest partition id (a key moved during the snapshot is
    corrected by the stream's change of the move, which is after S; for a key held in two partitions Milvus's
    own ``query`` returns one of them).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.read.parquet(out_dir)
    dups = df.groupBy(pk).count().where(F.col("count") > 1).count()
    if not dups:
        return 0
    before = df.count()
    keep = Window.partitionBy(pk).orderBy(F.col(PARTITION).desc_nulls_last())
    fixed = out_dir.rstrip("/") + "-keys"
    try:
        (df.withColumn("__n", F.row_number().over(keep)).where(F.col("__n") == 1).drop("__n")
         .write.mode("errorifexists").parquet(fixed))
    except BaseException:
        remove_dir(spark, fixed)
        raise
    jvm = spark.sparkContext._jvm
    src, dst = jvm.org.apache.hadoop.fs.Path(fixed), jvm.org.apache.hadoop.fs.Path(out_dir)
    remove_dir(spark, out_dir)
    if not src.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).rename(src, dst):
        raise MirrorError(f"cannot move the snapshot's files from {fixed} to {out_dir}")
    log.warning("snapshot: %d key(s) were read in two partitions (moved during the snapshot, or inserted into "
                "both): one row kept per key", dups)
    return before - spark.read.parquet(out_dir).count()
