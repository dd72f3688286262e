"""The snapshot of a collection as a Spark batch read, written as Parquet data files by the tasks.

One task per primary-key range (:func:`msgstream_spark.mirror.snapshot.query.reader.plan_ranges`); each task sends
``Query`` itself for answer-sized pieces of its range and writes the Arrow batches of the table's columns
(:class:`msgstream_spark.mirror.snapshot.query.reader.RangeReader`) as one Parquet file straight into the table's
store (a local directory or an object store: no shared disk, no Hadoop file system). The driver gets only each
file's path and row count from the tasks (never the rows); the summary's row count is theirs (a retried task's
output is the successful attempt's; accumulators only feed the progress log: rows and answer bytes per second).
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

from msgstream_spark.mirror.common import PARTITION
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.reader import RangeReader, ReadStats
from msgstream_spark.mirror.store import Store, store_for, uri
from msgstream_spark.mirror.write.files import ParquetOut, footer, read_parquet, remove_tree

log = logging.getLogger(__name__)
FILES_SCHEMA = "path string, rows long"


@dataclass
class SnapshotFiles:
    files: list[str]
    rows: int


def spark_schema(schema: pa.Schema):
    """The Spark schema of the table's Arrow columns (vectors as arrays, JSON as strings)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _writer_fn(reader: RangeReader, ranges: list[PkRange], out_dir: str, store: Store, rows_acc, bytes_acc):
    def write(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                got = _write_range(reader, ranges[i], uri.join(out_dir, f"part-{i:05d}-{uuid.uuid4().hex[:8]}.parquet"),
                                   store, rows_acc, bytes_acc)
                if got:
                    yield pa.RecordBatch.from_pydict({"path": [got[0]], "rows": [got[1]]})

    return write


def _write_range(reader: RangeReader, rng: PkRange, path: str, store: Store, rows_acc, bytes_acc):
    """One range's rows as the Parquet file ``path`` (none for no rows); (path, rows) or None."""
    stats = ReadStats()
    done_rows = done_bytes = 0
    out = None
    try:
        for batch in reader.read([rng], stats):
            rows_acc.add(stats.rows - done_rows)
            bytes_acc.add(stats.bytes - done_bytes)
            done_rows, done_bytes = stats.rows, stats.bytes
            if batch.num_rows:
                out = out or ParquetOut(store, path, reader.schema, reader.pk, compression="zstd")
                out.write_batch(batch, row_group_size=128 * 1024)
        return (path, out.close().rows) if out is not None else None
    except BaseException:
        if out is not None:
            out.abort()
        raise


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
    ``store`` (default: the local directory); a failure leaves nothing there."""
    from pyspark.sql.pandas.types import to_arrow_schema

    store = store if store is not None else store_for(out_dir)
    sschema = spark_schema(reader.schema)
    reader = replace(reader, schema=to_arrow_schema(sschema, timezone="UTC"))
    rows_acc = spark.sparkContext.accumulator(0)
    bytes_acc = spark.sparkContext.accumulator(0)
    n = max(1, len(ranges))
    ids = spark.range(0, len(ranges), 1, numPartitions=n).toDF("i")
    df = ids.mapInArrow(_writer_fn(reader, ranges, out_dir, store, rows_acc, bytes_acc), FILES_SCHEMA)
    try:
        with _Progress(rows_acc, bytes_acc, total, progress_interval):
            written = df.toArrow()
        paths, rows = written.column("path").to_pylist(), written.column("rows").to_pylist()
        # a retried task's lost attempt may have completed a file no result names: not the snapshot's
        mine = set(paths)
        for m in list(store.list(out_dir)):
            if m.uri not in mine:
                store.delete(m.uri)
        dropped = one_row_per_key(spark, out_dir, reader.pk, store)
    except BaseException:
        remove_dir(store, out_dir)  # a failed write leaves no files behind (one directory per retry otherwise)
        raise
    files = sorted(m.uri for m in store.list(out_dir))
    return SnapshotFiles(files, sum(rows) - dropped)


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
                yield pa.RecordBatch.from_pydict({"rows": [_drop_losers(files[i], store, pk, winners_bc.value)]})

    return dedupe


def _drop_losers(path: str, store: Store, pk: str, winners: pa.Table) -> int:
    """Rewrite file ``path`` without its rows of a repeated key outside the key's winning partition (a new
    file, then the old one deleted); the rows dropped."""
    t = read_parquet(store, path)
    at = pc.index_in(t.column(pk), value_set=winners.column(pk).combine_chunks())
    keep_part = pc.take(winners.column(PARTITION).combine_chunks(), at)
    lose = pc.fill_null(pc.and_(pc.is_valid(at), pc.not_equal(t.column(PARTITION), keep_part)), False)
    n = pc.sum(lose).as_py() or 0
    if n:
        d, name = path.rsplit("/", 1)
        with ParquetOut(store, uri.join(d, f"{name.removesuffix('.parquet')}-keys.parquet"), t.schema, pk,
                        compression="zstd") as out:
            out.write_table(t.filter(pc.invert(lose)), row_group_size=128 * 1024)
            out.close()
        store.delete(path)
    return n


def one_row_per_key(spark: SparkSession, out_dir: str, pk: str, store: Store | None = None) -> int:
    """Rewrite the snapshot under ``out_dir`` with one row per key; the number of rows dropped.

    Each partition is read at its own time, so a key moved from one partition to another between two reads is
    in both (and Milvus lets one key be inserted into two partitions). Found by tasks reading each file's key
    and partition columns and a count per key; only then are the files holding such keys rewritten (one task
    per file), keeping the row of the largest partition id (a key moved during the snapshot is corrected by the
    stream's change of the move, which is after S; for a key held in two partitions Milvus's own ``query``
    returns one of them).
    """
    from pyspark.sql import functions as F

    store = store if store is not None else store_for(out_dir)
    files = sorted(m.uri for m in store.list(out_dir) if m.uri.endswith(".parquet"))
    if not files:
        return 0
    schema = footer(store, files[0])[1].schema.to_arrow_schema()
    kschema = spark_schema(pa.schema([schema.field(pk), schema.field(PARTITION)]))
    ids = spark.range(0, len(files), 1, numPartitions=len(files))
    keys = ids.mapInArrow(_keys_fn(files, store, pk), kschema)
    winners = (keys.groupBy(pk).agg(F.count(F.lit(1)).alias("n"), F.max(PARTITION).alias(PARTITION))
               .where(F.col("n") > 1).select(pk, PARTITION).toArrow())  # the rare keys read twice
    if winners.num_rows == 0:
        return 0
    bc = spark.sparkContext.broadcast(winners)
    try:
        got = ids.mapInArrow(_dedupe_fn(files, store, pk, bc), "rows long").toArrow()
    finally:
        bc.unpersist()
    dropped = int(pc.sum(got.column("rows")).as_py() or 0)
    log.warning("snapshot: %d key(s) were read in two partitions (moved during the snapshot, or inserted into "
                "both): one row kept per key", winners.num_rows)
    return dropped
