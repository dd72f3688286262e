"""The snapshot of a collection as a Spark job whose tasks write the table's first Parquet files.

One task per primary-key range (:func:`msgstream_spark.mirror.snapshot.query.reader.plan_ranges`); each task
sends ``Query`` itself for answer-sized pieces of its range (``RangeReader``, several in flight) and writes
their Arrow batches with pyarrow as one Parquet file
(:func:`msgstream_spark.mirror.snapshot.files.write_batches`), as the storage route's tasks do: no row goes
through the JVM (Spark's own writer converted every vector to rows, slower than Milvus serves them, and the
reads waited for it). The driver collects only each file's path and row count and hands the paths to the
table. The row count of the summary is read from the files' Parquet footers (an accumulator inside a
transformation counts a retried task twice); accumulators only feed the progress log and the call count.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PARTITION
from msgstream_spark.mirror.snapshot.files import write_batches
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.reader import RangeReader, ReadStats
from msgstream_spark.mirror.snapshot.storage.reader import StorageReader
from msgstream_spark.mq.milvus.connection import pb_modules

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


FILES_SCHEMA = "path string, rows long"


def _write_range(reader: RangeReader, rng: PkRange, path: str, accs) -> int:
    """One range's rows as the Parquet file ``path``; progress and calls into the accumulators."""
    rows_acc, bytes_acc, calls_acc = accs
    stats, sent = ReadStats(), [0]

    def progress(rows: int) -> None:
        rows_acc.add(rows)
        bytes_acc.add(stats.bytes - sent[0])
        sent[0] = stats.bytes

    rows = write_batches(reader.schema, reader.read([rng], stats), path, progress)
    calls_acc.add(stats.calls)
    return rows


def _writer_fn(reader: RangeReader, ranges: list[PkRange], out_dir: str, accs):
    def write(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                path = os.path.join(out_dir, f"part-{i:05d}.parquet")
                rows = _write_range(reader, ranges[i], path, accs)
                yield pa.RecordBatch.from_pydict({"path": [path], "rows": [rows]})

    return write


def _warm(batches):
    """Import what a snapshot task imports: this module's imports (pyarrow, grpc, either route's reader) come
    with the function; Milvus's protobuf modules load on first use."""
    pb_modules()
    ok = {RangeReader.__name__, StorageReader.__name__} == {"RangeReader", "StorageReader"}
    for b in batches:
        yield pa.RecordBatch.from_pydict({"ok": [ok] * b.num_rows})


class WarmWorkers:
    """A Spark job of one task per core, run in the background while the driver takes the positions, that
    starts the Python workers the snapshot's tasks will be given and does their imports: Spark reuses idle
    workers (``spark.python.worker.reuse``), so the read's tasks start querying at once instead of after a
    worker start (11 s in a new session on a loaded 2-core machine, in the middle of Milvus's work: after the
    plan's calls, before the reads'). Use as a context: leaving it waits for the job (bounded), so the plan
    and the read follow each other and the warm-up never competes with the read for task slots; a failure is
    logged, not raised (the read starts its own workers)."""

    def __init__(self, spark: SparkSession, timeout: float = 120.0) -> None:
        self.spark, self.timeout = spark, timeout
        self._thread = threading.Thread(target=self._run, name="snapshot-warm-workers", daemon=True)

    def _run(self) -> None:
        try:
            n = max(1, self.spark.sparkContext.defaultParallelism)
            self.spark.range(0, n, 1, numPartitions=n).mapInArrow(_warm, "ok boolean").collect()
        except Exception as exc:  # noqa: BLE001 - only a head start for the read, which starts workers itself
            log.warning("snapshot: starting the Python workers ahead of the read failed (the read starts them): %s",
                        exc)

    def __enter__(self) -> WarmWorkers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(self.timeout)
        if self._thread.is_alive():
            log.warning("snapshot: the Python workers were not started within %.0f s; reading anyway", self.timeout)


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
    """Read ``ranges`` in Spark tasks (one range each), each writing one Parquet file under ``out_dir``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    reader = replace(reader, schema=to_arrow_schema(spark_schema(reader.schema), timezone="UTC"))
    accs = tuple(spark.sparkContext.accumulator(0) for _ in range(3))
    out = _local(out_dir)
    os.makedirs(out)
    ids = spark.range(0, len(ranges), 1, numPartitions=max(1, len(ranges))).toDF("i")
    df = ids.mapInArrow(_writer_fn(reader, ranges, out, accs), FILES_SCHEMA)
    try:
        with _Progress(accs[0], accs[1], total, progress_interval):
            written = df.collect()
        rewritten = one_row_per_key(spark, out_dir, reader.pk)
    except BaseException:
        remove_dir(spark, out_dir)  # a failed snapshot leaves no directory behind (one per retry otherwise)
        raise
    files = sorted(_local(f) for f in spark.read.parquet(out_dir).inputFiles()) if rewritten else \
        sorted(r[0] for r in written)
    return SnapshotFiles(files, parquet_rows(files), accs[2].value)


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
