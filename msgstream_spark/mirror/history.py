"""The mirror's change log: one row per change of a key (``insert`` / ``update`` / ``delete``), append-only,
written exactly once beside the mirror's commits; "as of T" reads and SCD2 columns computed from it.

A Milvus upsert is an Insert and a Delete of the key at one timestamp: one ``update`` (or ``insert`` when the
key did not exist). Changes are grouped per (key, ``_ts``): the group's last change by ``_seq`` decides
(an insert if it holds one: at one timestamp deletes order before inserts), and whether the key existed
before the group (the previous group's outcome, else the mirrored table's row before the batch) makes an
insert an ``update`` and a delete of an absent key no change at all. Delta tables (delta-rs); Spark-free.
See docs/mirror.md, "History".
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.collapse import OP, collapse
from msgstream_spark.mirror.common import PROP_BATCH, PROP_QUERY, TS
from msgstream_spark.mirror.order import SEQ
from msgstream_spark.mirror.watermark import physical_ms

TIME = "_time"  # the change's time: _ts >> 18 as a UTC timestamp (ms)
VALID_FROM, VALID_TO, IS_CURRENT = "_valid_from", "_valid_to", "_is_current"
SEED_APP = "msgstream.history.seed"  # the app id of the first commit: the mirrored rows when the history began
PROP_BEGAN = "msgstream.history.began"  # Milvus time from which as_of answers
_DROP = ("_channel", "_shard", "_collection", "_event_time", "_msg_id", "_position")


def _deltalake():
    try:
        import deltalake
    except ImportError as e:
        raise MirrorError("the history table needs the 'deltalake' package: pip install "
                          "'msgstream-spark[mirror]'") from e
    return deltalake


def _time(ts: pa.ChunkedArray | pa.Array) -> pa.Array:
    ms = np.asarray(pc.shift_right(ts.cast(pa.int64()), 18).to_numpy(zero_copy_only=False), dtype=np.int64)
    return pa.array(ms, pa.timestamp("ms", tz="UTC"))


def history_rows(changes: pa.Table, pk: str, existed: pa.Table) -> pa.Table:
    """The change-log rows of one batch's ``changes`` (every change: ``op``, fields, ``_ts``, ``_seq``);
    ``existed``: the table's rows (``pk``, ``_ts``) of these keys before the batch. Column-wise.

    A delete at T of a key whose table row is at T or later changes nothing (a delete hides older rows
    only): the Delete half of an upsert whose Insert an earlier batch already applied (Milvus 2.3.5
    writes the Insert message first, and a batch may end between the two)."""
    changes = changes.drop_columns([c for c in _DROP if c in changes.column_names])
    n = changes.num_rows
    if n == 0:
        return changes.append_column(TIME, pa.array([], pa.timestamp("ms", tz="UTC")))
    t = changes.take(pc.sort_indices(changes, [(pk, "ascending"), (SEQ, "ascending")]))
    keys, ts = t.column(pk).combine_chunks(), t.column(TS).to_numpy()
    same_next = np.zeros(n, dtype=bool)
    same_next[:-1] = pc.equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False) & (ts[:-1] == ts[1:])
    g = t.filter(pa.array(~same_next))  # the last change of each (key, _ts) group
    m = g.num_rows
    gkeys = g.column(pk).combine_chunks()
    is_insert = pc.equal(g.column(OP), "insert").to_numpy(zero_copy_only=False)
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
    return out.append_column(TIME, _time(out.column(TS)))


class HistoryTable:
    """The change log at ``location`` (Delta), appended once per (query id, batch id)."""

    def __init__(self, location: str, pk: str) -> None:
        self.location, self.pk = location, pk

    def _dt(self):
        dl = _deltalake()
        return dl.DeltaTable(self.location) if dl.DeltaTable.is_deltatable(self.location) else None

    def last_batch(self, query_id: str) -> int | None:
        dt = self._dt()
        v = None if dt is None else dt.transaction_version(query_id)
        return None if v is None else int(v)

    def _append(self, rows: pa.Table, app: str, version: int, meta: dict[str, str]) -> None:
        dl = _deltalake()
        props = dl.CommitProperties(app_transactions=[dl.Transaction(app, int(version))], custom_metadata=meta)
        dl.write_deltalake(self.location, rows, mode="append", schema_mode="merge", commit_properties=props)

    def seed(self, read_current: Callable[[], pa.Table]) -> bool:
        """The first commit (once): the mirrored rows when the history begins (``read_current()``, called
        only then), as inserts at their ``_ts``."""
        if self._dt() is not None:
            return False
        current = read_current()
        began = int(pc.max(current.column(TS)).as_py() or 0) if current.num_rows else 0
        rows = current.append_column(OP, pa.array(["insert"] * current.num_rows, pa.string()))
        rows = rows.select([OP, *current.column_names]).append_column(TIME, _time(rows.column(TS)))
        self._append(rows, SEED_APP, 0, {PROP_BEGAN: str(began)})
        return True

    def append(self, changes: pa.Table, existed: pa.Table, query_id: str, batch_id: int) -> bool:
        """This batch's change rows, once: False if ``query_id``'s ``batch_id`` is already in the log."""
        last = self.last_batch(query_id)
        if last is not None and last >= batch_id:
            return False
        rows = history_rows(changes, self.pk, existed)
        self._append(rows, query_id, batch_id, {PROP_QUERY: query_id, PROP_BATCH: str(batch_id)})
        return True

    def began(self) -> int:
        dt = self._dt()
        if dt is None:
            raise MirrorError(f"no history table at {self.location}")
        first = dt.history()[-1]
        return int(first.get(PROP_BEGAN, 0))

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
