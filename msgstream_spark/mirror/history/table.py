"""The mirror's change log: one row per change of a key (``insert`` / ``update`` / ``delete``), append-only,
written exactly once beside the mirror's commits; "as of T" reads and SCD2 columns computed from it.

A Milvus upsert is an Insert and a Delete of the key at one timestamp (or one ``update`` row, read with the
source option ``upsertAs=update``): one ``update`` (or ``insert`` when the key did not exist). Changes are
grouped per (key, ``_ts``): the group's last change by ``_seq`` decides (an insert or update if it holds one:
at one timestamp deletes order before inserts), and whether the key existed before the group (the previous
group's outcome, else the mirrored table's row before the batch) makes an insert an ``update`` and a delete
of an absent key no change at all (``history.write.history_rows``).

The rows are written as Parquet files by tasks (``history.write``; Spark's tasks in the job) and committed
here: the file list, one Delta version with an application transaction (query id, batch id), skipped when
the log already holds the batch. Delta tables, next to a Delta mirror. Spark-free. See docs/mirror.md,
"History".
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.collapse import OP, collapse
from msgstream_spark.mirror.common import PROP_BATCH, PROP_QUERY, TS
from msgstream_spark.mirror.formats.base import DATA_DIR
from msgstream_spark.mirror.formats.delta.log import add_of, write_commit
from msgstream_spark.mirror.formats.delta.table import CHECKPOINT_EVERY
from msgstream_spark.mirror.history.write import (
    MAX_TS,
    ROWS,
    TIME,
    HistorySpec,
    HistoryWriter,
    change_fields,
    history_rows,
    history_schema,
    seed_local,
)
from msgstream_spark.mirror.order import SEQ
from msgstream_spark.mirror.store import open_store, uri
from msgstream_spark.mirror.watermark import physical_ms
from msgstream_spark.mirror.write.layout import FILE

VALID_FROM, VALID_TO, IS_CURRENT = "_valid_from", "_valid_to", "_is_current"
SEED_APP = "msgstream.history.seed"  # the app id of the seed commit: the mirrored rows when the history began
PROP_BEGAN = "msgstream.history.began"  # Milvus time from which as_of answers
__all__ = ["HistoryTable", "as_of", "history_rows", "scd2"]


def _deltalake():
    try:
        import deltalake
    except ImportError as e:
        raise MirrorError("the history table needs the 'deltalake' package: pip install "
                          "'msgstream-spark[mirror]'") from e
    return deltalake


class HistoryTable:
    """The change log at ``location`` (Delta): a seed commit once, then one commit per (query id, batch id)."""

    def __init__(self, location: str, pk: str, storage_options: dict | None = None) -> None:
        self.location, self.pk = location, pk
        self.store = open_store(location, storage_options)
        self.root = uri.parse(location).uri()

    def _dt(self):
        dl = _deltalake()
        so = self.store.storage_options()
        return dl.DeltaTable(self.root, storage_options=so) if dl.DeltaTable.is_deltatable(self.root, so) else None

    def last_batch(self, query_id: str) -> int | None:
        dt = self._dt()
        v = None if dt is None else dt.transaction_version(query_id)
        return None if v is None else int(v)

    def seeded(self) -> bool:
        return self.last_batch(SEED_APP) is not None

    def spec(self, table_schema: pa.Schema, snapshot_ts: int | None = None) -> HistorySpec:
        """What the writing tasks need; creates the log (no rows) or adds the mirror's new columns first."""
        dl = _deltalake()
        schema = history_schema(table_schema)
        dt = self._dt()
        if dt is None:
            dl.DeltaTable.create(self.root, schema, name="msgstream history", raise_if_key_not_exists=False,
                                 storage_options=self.store.storage_options())
        else:
            have = set(dt.schema().to_arrow().names)
            extra = [f for f in schema if f.name not in have]
            if extra:
                dt.alter.add_columns([dl.Field.from_arrow(f.with_nullable(True)) for f in extra])
        return HistorySpec(schema, self.pk, uri.join(self.root, DATA_DIR), snapshot_ts, dict(self.store.options))

    def commit_files(self, files: pa.Table, app: str, version: int, info: dict[str, str]) -> bool:
        """One Delta version adding the files tasks wrote (``history.write.files_schema`` rows) with the
        application transaction (``app``, ``version``); False (nothing written) if the log already holds it."""
        dt = self._dt()
        if dt is None:
            raise MirrorError(f"no history table at {self.location} (HistoryTable.spec creates it)")
        done = dt.transaction_version(app)
        if done is not None and int(done) >= version:
            return False
        now = int(time.time() * 1000)
        actions = [{"add": add_of(self.store, self.root, p, self.pk, now, None)}
                   for p, n in zip(files.column(FILE).to_pylist(), files.column(ROWS).to_pylist()) if n]
        actions.append({"txn": {"appId": app, "version": int(version), "lastUpdated": now}})
        version_now = dt.version() + 1
        write_commit(self.store, self.root, version_now, actions, "WRITE", info)
        if version_now % CHECKPOINT_EVERY == 0:  # readers start from the last checkpoint, not every JSON
            dt.update_incremental()
            dt.create_checkpoint()
        return True

    def commit_seed(self, files: pa.Table) -> bool:
        """The seed commit (once): the files of the mirrored rows when the history began; records the newest
        ``_ts`` among them as the time from which ``as_of`` answers."""
        began = int(pc.max(files.column(MAX_TS)).as_py() or 0) if files.num_rows else 0
        return self.commit_files(files, SEED_APP, 0, {PROP_BEGAN: str(began)})

    def seed(self, read_current: Callable[[], pa.Table], table_schema: pa.Schema | None = None) -> bool:
        """The library's seed in this process (once): ``read_current()``'s rows (called only then) as inserts
        at their ``_ts``. The job seeds through Spark tasks instead (one per mirror data file)."""
        if self.seeded():
            return False
        current = read_current()
        spec = self.spec(table_schema or current.schema)
        return self.commit_seed(seed_local(current, spec))

    def append(self, changes: pa.Table, existed: pa.Table, query_id: str, batch_id: int,
               table_schema: pa.Schema | None = None) -> bool:
        """The library's append of one batch in this process (the job's tasks do the same per share): False if
        ``query_id``'s ``batch_id`` is already in the log. ``existed``: (pk, ``_ts``) of the mirrored rows of
        the batch's keys before it."""
        last = self.last_batch(query_id)
        if last is not None and last >= batch_id:
            return False
        schema = table_schema or change_fields(changes.schema)
        w = HistoryWriter(self.spec(schema), existed)
        w.add(changes.sort_by([(self.pk, "ascending"), (SEQ, "ascending")]))
        return self.commit_files(w.close(), query_id, batch_id, {PROP_QUERY: query_id, PROP_BATCH: str(batch_id)})

    def began(self) -> int:
        dt = self._dt()
        if dt is None:
            raise MirrorError(f"no history table at {self.location}")
        for commit in reversed(dt.history()):  # oldest first: the seed's commit records it
            if PROP_BEGAN in commit:
                return int(commit[PROP_BEGAN])
        raise MirrorError(f"history table {self.location} has no seed commit yet (no batch was logged)")

    def to_arrow(self) -> pa.Table:
        dt = self._dt()
        if dt is None:
            raise MirrorError(f"no history table at {self.location}")
        return pa.table(dt.to_pyarrow_table())


def as_of(history: HistoryTable, ts: int) -> pa.Table:
    """The collection as of Milvus time ``ts`` (hybrid): per key its last change at or before ``ts``,
    deleted keys left out; the fields, ``_ts``, ``_seq``, ``_partition`` (no ``op``/``_time``)."""
    began = history.began()
    if ts < began:
        raise MirrorError(f"history {history.location} begins at Milvus time {began} "
                          f"({physical_ms(began)} ms); {ts} is earlier")
    rows = history.to_arrow()
    rows = rows.filter(pc.less_equal(rows.column(TS), pa.scalar(int(ts), rows.schema.field(TS).type)))
    last = collapse(rows, history.pk)
    return last.filter(pc.not_equal(last.column(OP), "delete")).drop_columns([OP, TIME])


def scd2(rows: pa.Table, pk: str) -> pa.Table:
    """SCD type 2 from change-log ``rows``: one row per version (deletes close the previous one) with
    ``_valid_from`` (its ``_time``), ``_valid_to`` (the key's next change's ``_time``, null if none) and
    ``_is_current``."""
    n = rows.num_rows
    t = rows.take(pc.sort_indices(rows, [(pk, "ascending"), (SEQ, "ascending")])) if n else rows
    keys = t.column(pk).combine_chunks()
    has_next = np.zeros(n, dtype=bool)
    if n > 1:
        has_next[:-1] = pc.equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
    times = t.column(TIME).combine_chunks()
    nxt = pa.concat_arrays([times.slice(1), pa.nulls(1, times.type)]) if n else times
    valid_to = pc.if_else(pa.array(has_next), nxt, pa.nulls(n, times.type))
    out = t.append_column(VALID_FROM, times).append_column(VALID_TO, valid_to)
    out = out.append_column(IS_CURRENT, pa.array(~has_next))
    return out.filter(pc.not_equal(out.column(OP), "delete"))
