"""``upsertAs=update``: a Milvus upsert as one ``update`` row instead of an insert row and a delete row.

Milvus 2.3-2.5 writes an upsert as an Insert and a Delete of the key with one timestamp (2.3.5: the Insert
message first). With the option, a delete row whose key and ``_ts`` match an insert row of the same
channel is dropped and that insert row's ``op`` becomes ``update``. Rows are paired within what one read
task yields: the rows at the newest ``_ts`` of a batch wait for the next batch (both halves carry that
time), so a pair is never split by the task's own batching; a pair cut by two micro-batches' boundary
(a time tick between the two messages) stays an insert and a delete.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_I = "__row"


def pair(table: pa.Table, pk: str) -> pa.Table:
    """``table``'s rows with each upsert's delete row dropped and its insert row(s) made ``update``."""
    if table.num_rows == 0 or pk not in table.column_names:
        return table
    keys = [pk, "_ts", "_channel"] if "_channel" in table.column_names else [pk, "_ts"]
    base = table.select(keys).append_column(_I, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    ops = table.column("op")
    ins = base.filter(pc.equal(ops, "insert"))
    dels = base.filter(pc.equal(ops, "delete"))
    if ins.num_rows == 0 or dels.num_rows == 0:
        return table
    hit = ins.join(dels.drop_columns([_I]).group_by(keys).aggregate([]), keys, join_type="inner")
    gone = dels.join(ins.drop_columns([_I]).group_by(keys).aggregate([]), keys, join_type="inner")
    if hit.num_rows == 0:
        return table
    n = table.num_rows
    upd = np.zeros(n, dtype=bool)
    upd[hit.column(_I).to_numpy()] = True
    drop = np.zeros(n, dtype=bool)
    drop[gone.column(_I).to_numpy()] = True
    op = pc.if_else(pa.array(upd), pa.scalar("update", ops.type), ops)
    out = table.set_column(table.schema.get_field_index("op"), table.schema.field("op"), op)
    return out.filter(pa.array(~drop))


class Pairer:
    """Pairs upserts across the record batches one read task yields (see the module's docstring)."""

    def __init__(self, pk: str | None) -> None:
        self.pk = pk
        self.pending: pa.Table | None = None

    def feed(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            t = pa.Table.from_batches([b]) if self.pending is None else pa.concat_tables([self.pending,
                                                                                      pa.Table.from_batches([b])])
            if t.num_rows == 0 or "_ts" not in t.column_names:
                self.pending = t
                continue
            last = t.column("_ts")[-1]
            tail = pc.equal(t.column("_ts"), last).to_numpy(zero_copy_only=False)
            held = int(np.argmin(tail[::-1])) if not tail.all() else t.num_rows  # the trailing rows at that time
            cut = t.num_rows - held
            self.pending = t.slice(cut)
            yield from pair(t.slice(0, cut), self.pk or "").to_batches()

    def finish(self) -> Iterator[pa.RecordBatch]:
        if self.pending is not None and self.pending.num_rows:
            yield from pair(self.pending, self.pk or "").to_batches()
        self.pending = None
