"""The snapshot of a collection as a Spark job whose tasks write the table's first Parquet files.

One task per primary-key range (:func:`msgstream_spark.mirror.snapshot.query.reader.plan_ranges`); each task sends
``Query`` itself for answer-sized pieces of its range (``RangeReader``, several in flight) and writes their Arrow
batches with pyarrow as one Parquet file straight into the table's store (a local directory or an object store: no
shared disk, no Hadoop file system), with the snapshot's write options
(:func:`msgstream_spark.mirror.store.parquet.snapshot_options`), as the storage route's tasks do: no row goes through
the JVM (Spark's own writer converted every vector to rows, slower than Milvus serves them, and the reads waited for
it). The driver gets only each file's path and row count from the tasks (never the rows), and those paths are the
files the snapshot commits, as the storage route's and the batch writer's are (never a listing of the directory,
which may hold a late file of an attempt Spark gave up on, or lag a rewrite); the summary's row count is theirs
(a retried task's output is the successful attempt's; accumulators only feed the progress log, rows and answer
bytes per second, and the summary's count of the tasks' ``Query`` calls).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PARTITION
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.reader import RangeReader, ReadStats
from msgstream_spark.mirror.snapshot.storage.reader import StorageReader
from msgstream_spark.mirror.store import Store, store_for, uri
from msgstream_spark.mirror.store.parquet import ParquetOut, footer, read_parquet, remove_tree, snapshot_options
from msgstream_spark.mq.milvus.connection import pb_modules

log = logging.getLogger(__name__)
FILES_SCHEMA = "path string, rows long"


@dataclass
class SnapshotFiles:
    files: list[str]
    rows: int
    calls: int = 0  # the tasks' Query calls (from an accumulator: a retried task's calls count again)


def spark_schema(schema: pa.Schema):
    """The Spark schema of the table's Arrow columns (vectors as arrays, JSON as strings)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def writer_fn(reader: RangeReader, ranges: list[PkRange], out_dir: str, store: Store, accs):
    def write(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                got = _write_range(reader, ranges[i], uri.join(out_dir, f"part-{i:05d}-{uuid.uuid4().hex[:8]}.parquet"),
                                   store, accs)
                if got:
                    yield pa.RecordBatch.from_pydict({"path": [got[0]], "rows": [got[1]]})

    return write


def _write_range(reader: RangeReader, rng: PkRange, path: str, store: Store, accs):
    """One range's rows as the Parquet file ``path`` (none for no rows); (path, rows) or None. Progress and the
    range's ``Query`` calls go into the accumulators ``accs`` (rows, answer bytes, calls)."""
    rows_acc, bytes_acc, calls_acc = accs
    stats = ReadStats()
    done_rows = done_bytes = 0
    out = None
    try:
        for batch in reader.read([rng], stats):
            rows_acc.add(stats.rows - done_rows)
            bytes_acc.add(stats.bytes - done_bytes)
            done_rows, done_bytes = stats.rows, stats.bytes
            if batch.num_rows:
                out = out or ParquetOut(store, path, reader.schema, reader.pk, **snapshot_options(reader.schema))
                out.write_batch(batch, row_group_size=128 * 1024)
        calls_acc.add(stats.calls)
        return (path, out.close().rows) if out is not None else None
    except BaseException:
        if out is not None:
            out.abort()
        raise


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


def remove_dir(store: Store, path: str) -> None:
    """Delete what the store holds under ``path`` (a failed snapshot's files)."""
    remove_tree(store, path)


def write_snapshot(spark: SparkSession, reader: RangeReader, ranges: list[PkRange], out_dir: str,
                   total: int, progress_interval: float = 5.0, store: Store | None = None) -> SnapshotFiles:
    """Read ``ranges`` in Spark tasks (one range each), each writing one Parquet file under ``out_dir`` in
    ``store`` (default: the local directory); a failure leaves nothing there.

    The files the snapshot commits are those the tasks' successful attempts returned (after the key pass's
    rewrites, which its tasks return too), never a listing of ``out_dir``: an attempt Spark gave up on may finish
    its upload at any time after (committed next to its retry's copy, every row of its range would be twice),
    and an object store's listing may lag a rewrite (a rewritten file missing, a deleted one present). What such
    an attempt leaves is no version's file: ``mirror orphans`` lists it, ``vacuum`` removes it."""
    from pyspark.sql.pandas.types import to_arrow_schema

    store = store if store is not None else store_for(out_dir)
    reader = replace(reader, schema=to_arrow_schema(spark_schema(reader.schema), timezone="UTC"))
    accs = tuple(spark.sparkContext.accumulator(0) for _ in range(3))  # rows, answer bytes, Query calls
    ids = spark.range(0, len(ranges), 1, numPartitions=max(1, len(ranges))).toDF("i")
    df = ids.mapInArrow(writer_fn(reader, ranges, out_dir, store, accs), FILES_SCHEMA)
    try:
        with _Progress(accs[0], accs[1], total, progress_interval):
            written = df.toArrow()
        paths, rows = written.column("path").to_pylist(), written.column("rows").to_pylist()
        _remove_strays(store, out_dir, set(paths))
        files, dropped = one_row_per_key(spark, paths, reader.pk, store)
        if not files:  # no row at S (a collection created, nothing inserted yet): the table's first version is a
            files = [_empty_file(store, out_dir, reader)]  # file of none, so it still records S and the positions
    except BaseException:
        remove_dir(store, out_dir)  # a failed write leaves no files behind (one directory per retry otherwise)
        raise
    return SnapshotFiles(sorted(files), sum(rows) - dropped, accs[2].value)


def _empty_file(store: Store, out_dir: str, reader: RangeReader) -> str:
    """A Parquet file of no rows in the snapshot's schema under ``out_dir``: what the snapshot of a collection
    empty at S commits (every format's first version needs a data file)."""
    path = uri.join(out_dir, f"part-empty-{uuid.uuid4().hex[:8]}.parquet")
    ParquetOut(store, path, reader.schema, reader.pk, **snapshot_options(reader.schema)).close()
    return path


def _remove_strays(store: Store, out_dir: str, mine: set[str]) -> None:
    """Delete the files under ``out_dir`` no task result names that are already there (a retried task's lost
    attempt completed its file): a tidy-up only, never what decides the snapshot's files."""
    for m in list(store.list(out_dir)):
        if m.uri not in mine:
            log.info("snapshot: deleting %s, a file no task returned (an attempt Spark gave up on)", m.uri)
            store.delete(m.uri)


def _keys_fn(files: list[str], store: Store, pk: str):
    def keys(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                t = read_parquet(store, files[i], [pk, PARTITION])
                yield from t.to_batches()

    return keys


def _dedupe_fn(files: list[str], store: Store, pk: str, winners_bc):
    def dedupe(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                path, dropped = _drop_losers(files[i], store, pk, winners_bc.value)
                yield pa.RecordBatch.from_pydict({"i": [i], "path": [path], "rows": [dropped]},
                                                 schema=DEDUPED_SCHEMA)

    return dedupe


DEDUPED_SCHEMA = pa.schema([("i", pa.int64()), ("path", pa.string()), ("rows", pa.int64())])


def _drop_losers(path: str, store: Store, pk: str, winners: pa.Table) -> tuple[str | None, int]:
    """File ``path`` without its rows of a repeated key outside the key's winning partition: (the file that holds
    its rows now, the rows dropped). Unchanged: ``path`` itself; else a new file (a name of its own per attempt:
    an attempt Spark gave up on leaves an uncommitted file, never one the snapshot names); None when no row is
    left. The task never deletes ``path``: a retry of it must still find it (the driver deletes it once every
    task has answered)."""
    t = read_parquet(store, path)
    at = pc.index_in(t.column(pk), value_set=winners.column(pk).combine_chunks())
    keep_part = pc.take(winners.column(PARTITION).combine_chunks(), at)
    lose = pc.fill_null(pc.and_(pc.is_valid(at), pc.not_equal(t.column(PARTITION), keep_part)), False)
    n = pc.sum(lose).as_py() or 0
    if not n:
        return path, 0
    kept, new = t.filter(pc.invert(lose)), None
    if kept.num_rows:
        d, name = path.rsplit("/", 1)
        new = uri.join(d, f"{name.removesuffix('.parquet')}-keys-{uuid.uuid4().hex[:8]}.parquet")
        with ParquetOut(store, new, t.schema, pk, **snapshot_options(t.schema)) as out:
            out.write_table(kept, row_group_size=128 * 1024)
            out.close()
    return new, n


def one_row_per_key(spark: SparkSession, files: list[str], pk: str, store: Store) -> tuple[list[str], int]:
    """The snapshot's ``files`` rewritten to hold one row per key: (the files that hold the rows now, the number
    of rows dropped), from what the tasks return (never a listing of their directory).

    Each partition is read at its own time, so a key moved from one partition to another between two reads is
    in both (and Milvus lets one key be inserted into two partitions). Found by tasks reading each file's key
    and partition columns and a count per key; only then are the files holding such keys rewritten (one task
    per file), keeping the row of the largest partition id (a key moved during the snapshot is corrected by the
    stream's change of the move, which is after S; for a key held in two partitions Milvus's own ``query``
    returns one of them).
    """
    from pyspark.sql import functions as F

    files = sorted(f for f in files if f.endswith(".parquet"))
    if not files:
        return files, 0
    schema = footer(store, files[0])[1].schema.to_arrow_schema()
    kschema = spark_schema(pa.schema([schema.field(pk), schema.field(PARTITION)]))
    ids = spark.range(0, len(files), 1, numPartitions=len(files))
    keys = ids.mapInArrow(_keys_fn(files, store, pk), kschema)
    winners = (keys.groupBy(pk).agg(F.count(F.lit(1)).alias("n"), F.max(PARTITION).alias(PARTITION))
               .where(F.col("n") > 1).select(pk, PARTITION).toArrow())  # the rare keys read twice
    if winners.num_rows == 0:
        return files, 0
    bc = spark.sparkContext.broadcast(winners)
    try:
        got = ids.mapInArrow(_dedupe_fn(files, store, pk, bc), spark_schema(DEDUPED_SCHEMA)).toArrow()
    finally:
        bc.unpersist()
    now = dict(zip(got.column("i").to_pylist(), got.column("path").to_pylist()))
    if sorted(now) != list(range(len(files))):
        raise MirrorError(f"snapshot: the key pass returned {len(now)} result(s) for {len(files)} file(s)")
    for i, p in now.items():  # the files the key pass replaced, once every task has answered
        if p != files[i]:
            store.delete(files[i])
    dropped = int(pc.sum(got.column("rows")).as_py() or 0)
    log.warning("snapshot: %d key(s) were read in two partitions (moved during the snapshot, or inserted into "
                "both): one row kept per key", winners.num_rows)
    return sorted(p for p in now.values() if p is not None), dropped
