"""What a task does for the change log (``--history-table``): Spark-free, one task's share at a time.

The driver never holds a micro-batch or the mirrored rows for the history (the #27 rule). A task gets its
share of the batch's changes with every change of a key in the same task, sorted by key and ``_seq``,
turns it into change-log rows (``history_rows``) chunk by chunk, writes them as one Parquet file
under the history table's location and returns only (file, rows). The input "did the key exist before
the batch" is the mirror's own lookup of the batch's keys (``existed_from_matches``), handed to the tasks.
The seed (the mirrored rows when the history begins) is written the same way: one task per live data file
of the mirror, its live rows as inserts. The driver commits the file list (``HistoryTable.commit_files``).
See docs/mirror.md, "History".
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgstream_spark.mirror.collapse import OP, WRITES, check_ops
from msgstream_spark.mirror.common import TS, conform
from msgstream_spark.mirror.formats.base import LiveFile
from msgstream_spark.mirror.order import SEQ
from msgstream_spark.mirror.store import Store, store_for, uri
from msgstream_spark.mirror.store.parquet import ParquetOut, write_table
from msgstream_spark.mirror.write.layout import FILE, newest_seq

TIME = "_time"  # the change's time: _ts >> 18 as a UTC timestamp
TIME_TYPE = pa.timestamp("us", tz="UTC")  # Delta's timestamp (microseconds)
ROWS, MAX_TS = "_rows", "_max_ts"
_DROP = ("_channel", "_shard", "_collection", "_event_time", "_msg_id", "_position")


def history_schema(table_schema: pa.Schema) -> pa.Schema:
    """The change log's columns: ``op``, the mirror table's columns (fields, ``_ts``, ``_seq``, ``_partition``),
    ``_time``."""
    return pa.schema([pa.field(OP, pa.string()), *table_schema, pa.field(TIME, TIME_TYPE)])


def change_fields(changes: pa.Schema) -> pa.Schema:
    """The mirror-table columns of a ``rows`` output schema (no ``op``, no per-message columns)."""
    return pa.schema([f for f in changes if f.name not in (OP, TIME, *_DROP)])


def files_schema() -> pa.Schema:
    """What a history task returns per file it wrote: its path, rows, newest ``_ts`` (the seed's start)."""
    return pa.schema([pa.field(FILE, pa.string()), pa.field(ROWS, pa.int64()), pa.field(MAX_TS, pa.int64())])


def change_time(ts: pa.ChunkedArray | pa.Array) -> pa.Array:
    ms = np.asarray(pc.shift_right(ts.cast(pa.int64()), 18).to_numpy(zero_copy_only=False), dtype=np.int64)
    return pa.array(ms * 1000, TIME_TYPE)


def seq_ts(seq: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The Milvus time of each ``_seq`` (its high 64 bits), vectorised."""
    arr = seq.combine_chunks() if isinstance(seq, pa.ChunkedArray) else seq
    if len(arr) == 0:
        return np.zeros(0, np.int64)
    words = np.frombuffer(arr.buffers()[1], dtype="<u8")[2 * arr.offset: 2 * (arr.offset + len(arr))]
    return words.reshape(-1, 2)[:, 1].astype(np.int64)


def existed_from_matches(matches: pa.Table, pk: str) -> pa.Table:
    """(``pk``, ``_ts``) of the table's live rows of the batch's keys, from the mirror's lookup (key, ``_seq``,
    file, position): the newest row per key, its time from ``_seq``."""
    if matches.num_rows == 0:
        return pa.table({pk: matches.column("key"), TS: pa.array([], pa.int64())})
    newest = newest_seq(matches)
    return pa.table({pk: newest.column("key"), TS: pa.array(seq_ts(newest.column(SEQ)), pa.int64())})


def history_rows(changes: pa.Table, pk: str, existed: pa.Table) -> pa.Table:
    """The change-log rows of one batch's ``changes`` (every change: ``op`` insert, update or delete, fields,
    ``_ts``, ``_seq``); ``existed``: the table's rows (``pk``, ``_ts``) of these keys before the batch.
    Column-wise. An ``update`` (an upsert read with the source option upsertAs=update) is the key's new row, as
    an insert is: logged ``update`` if the key existed, else ``insert``; another op is a MirrorError.

    A delete at T of a key whose table row is at T or later changes nothing (a delete hides older rows
    only): the Delete half of an upsert whose Insert an earlier batch already applied (Milvus 2.3.5
    writes the Insert message first, and a batch may end between the two)."""
    check_ops(changes, pk, "the change log")
    changes = changes.drop_columns([c for c in _DROP if c in changes.column_names])
    n = changes.num_rows
    if n == 0:
        return changes.append_column(TIME, pa.array([], TIME_TYPE))
    t = changes.take(pc.sort_indices(changes, [(pk, "ascending"), (SEQ, "ascending")]))
    keys, ts = t.column(pk).combine_chunks(), t.column(TS).to_numpy()
    same_next = np.zeros(n, dtype=bool)
    same_next[:-1] = pc.equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False) & (ts[:-1] == ts[1:])
    g = t.filter(pa.array(~same_next))  # the last change of each (key, _ts) group
    m = g.num_rows
    gkeys = g.column(pk).combine_chunks()
    is_insert = pc.is_in(g.column(OP), value_set=pa.array(WRITES, g.schema.field(OP).type)).to_numpy(
        zero_copy_only=False)  # the key has this row after the change: an insert, or an upsert read as one update
    idx = pc.index_in(gkeys, value_set=existed.column(pk).combine_chunks().cast(gkeys.type))
    before = pc.is_valid(idx).to_numpy(zero_copy_only=False)
    table_ts = pc.take(existed.column(TS).combine_chunks(), idx).fill_null(-1).to_numpy(zero_copy_only=False)
    same_prev = np.zeros(m, dtype=bool)
    if m > 1:
        same_prev[1:] = pc.equal(gkeys.slice(0, m - 1), gkeys.slice(1)).to_numpy(zero_copy_only=False)
    noop = ~same_prev & ~is_insert & before & (table_ts >= g.column(TS).to_numpy())
    outcome = is_insert | noop  # the key exists after the group
    exists = np.where(same_prev, np.r_[False, outcome[:-1]], before)
    op = np.where(is_insert, np.where(exists, "update", "insert"), "delete")
    keep = (is_insert | exists) & ~noop  # a delete of an absent key changes nothing
    out = g.set_column(g.schema.get_field_index(OP), OP, pa.array(op, pa.string())).filter(pa.array(keep))
    return out.append_column(TIME, change_time(out.column(TS)))


@dataclass
class HistorySpec:
    """What a history task needs (picklable): the log's schema, the key, the directory for new files, the
    mirror's snapshot time (changes at or before it are dropped, as the mirror drops them)."""

    schema: pa.Schema
    pk: str
    data_dir: str
    snapshot_ts: int | None = None
    storage: dict[str, str] = field(default_factory=dict, repr=False)  # the history's store settings (secrets)

    def new_path(self) -> str:
        return uri.join(self.data_dir, f"{uuid.uuid4().hex}.parquet")

    def store(self) -> Store:
        return store_for(self.data_dir, self.storage)


class HistoryWriter:
    """One task's change-log file. ``add`` takes the task's changes in (key, ``_seq``) order, chunk by chunk;
    the rows of the chunk's last key wait for the next chunk (a key's changes are decided together)."""

    def __init__(self, spec: HistorySpec, existed: pa.Table) -> None:
        self.spec, self.existed = spec, existed
        self._pending: pa.Table | None = None
        self._writer: ParquetOut | None = None
        self._path, self._rows, self._max_ts = "", 0, 0

    def add(self, changes: pa.Table) -> None:
        spec = self.spec
        if spec.snapshot_ts is not None and changes.num_rows:
            s = pa.scalar(spec.snapshot_ts, changes.schema.field(TS).type)
            changes = changes.filter(pc.greater(changes.column(TS), s))
        if changes.num_rows == 0:
            return
        if self._pending is not None:
            changes = pa.concat_tables([self._pending, changes.cast(self._pending.schema)])
        keys = changes.column(spec.pk)
        last = pc.equal(keys, keys[changes.num_rows - 1])
        self._pending = changes.filter(last)
        self._write(history_rows(changes.filter(pc.invert(last)), spec.pk, self.existed))

    def _write(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        rows = conform(rows, self.spec.schema)
        if self._writer is None:
            self._path = self.spec.new_path()
            self._writer = ParquetOut(self.spec.store(), self._path, self.spec.schema, self.spec.pk,
                                      compression="zstd")
        self._writer.write_table(rows, row_group_size=128 * 1024)
        self._rows += rows.num_rows
        self._max_ts = max(self._max_ts, int(pc.max(rows.column(TS)).as_py()))

    def close(self) -> pa.Table:
        """Finish the file (whole in the store before its path reaches a commit); the files row (none if
        empty)."""
        if self._pending is not None:
            self._write(history_rows(self._pending, self.spec.pk, self.existed))
            self._pending = None
        if self._writer is None:
            return files_schema().empty_table()
        self._writer.close()
        self._writer = None
        return pa.table([[self._path], [self._rows], [self._max_ts]], schema=files_schema())


def seed_rows(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """Mirrored rows as change-log inserts at their ``_ts``."""
    out = rows.append_column(OP, pa.array(["insert"] * rows.num_rows, pa.string()))
    return conform(out.append_column(TIME, change_time(rows.column(TS))), schema)


def seed_file(f: LiveFile, spec: HistorySpec, mirror: Store) -> pa.Table:
    """The live rows of the mirror's data file ``f`` (in the ``mirror``'s store) as one change-log file of
    inserts (row group by row group); the files row (none if no row is live)."""
    src = mirror.open_input(f.path)
    pf = pq.ParquetFile(src)
    deleted = np.asarray(f.deleted, dtype=np.int64)
    path, writer, rows, max_ts, start = spec.new_path(), None, 0, 0, 0
    try:
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g)
            n = t.num_rows
            if len(deleted):
                dead = deleted[(deleted >= start) & (deleted < start + n)] - start
                keep = np.ones(n, dtype=bool)
                keep[dead] = False
                t = t.filter(pa.array(keep))
            start += n
            if t.num_rows == 0:
                continue
            if writer is None:
                writer = ParquetOut(spec.store(), path, spec.schema, spec.pk, compression="zstd")
            writer.write_table(seed_rows(t, spec.schema), row_group_size=128 * 1024)
            rows += t.num_rows
            max_ts = max(max_ts, int(pc.max(t.column(TS)).as_py()))
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        src.close()
    if writer is None:
        return files_schema().empty_table()
    return pa.table([[path], [rows], [max_ts]], schema=files_schema())


def seed_local(rows: pa.Table, spec: HistorySpec) -> pa.Table:
    """The library's seed from rows in this process (``HistoryTable.seed``): one file; the files row."""
    if rows.num_rows == 0:
        return files_schema().empty_table()
    path = spec.new_path()
    write_table(spec.store(), path, seed_rows(rows, spec.schema), spec.pk)
    return pa.table([[path], [rows.num_rows], [int(pc.max(rows.column(TS)).as_py())]], schema=files_schema())
