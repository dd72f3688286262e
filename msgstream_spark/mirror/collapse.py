"""A batch of changes -> the last change of each primary key (by ``_seq``), column-wise."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.order import SEQ, SEQ_TYPE

OP = "op"
# what a change's op may be: ``update`` is a Milvus upsert read with the source option upsertAs=update (one row:
# the key's new version), ``insert`` and ``update`` leave the key that row, ``delete`` leaves it none
OPS = ("insert", "update", "delete")
WRITES = ("insert", "update")
_INPUT_INDEX = "__msgstream_input_index"


def collapse(changes: pa.Table, pk: str, where: str = "") -> pa.Table:
    """One row per primary key: the change with the largest ``_seq`` (its ``op``: insert, update or delete).

    Equal ``_seq`` of one pk (not produced by Milvus; see docs/spark-source.md) resolve to the later
    row of ``changes``, so the result never depends on the sort's implementation. The columns and
    their order are kept; the rows come out sorted by ``pk``. An ``op`` outside ``OPS`` is a MirrorError
    naming it, the key column and ``where`` (e.g. the table), never a row dropped.
    """
    _check_columns(changes, pk)
    check_ops(changes, pk, where)
    n = changes.num_rows
    if n == 0:
        return changes
    if changes.column(pk).null_count:
        raise MirrorError(f"the primary key column {pk!r} of a change batch holds nulls")
    seq = changes.column(SEQ)
    if seq.null_count:
        raise MirrorError(f"column {SEQ!r} of a change batch holds nulls (every change needs its order)")
    keyed = changes.select([pk, SEQ]).append_column(_INPUT_INDEX, pa.array(np.arange(n, dtype=np.int64)))
    order = pc.sort_indices(keyed, [(pk, "ascending"), (SEQ, "ascending"), (_INPUT_INDEX, "ascending")])
    keys = pc.take(changes.column(pk), order)
    if n > 1:
        last = pc.not_equal(keys.slice(0, n - 1), keys.slice(1))
        last = pa.concat_arrays([*(c for c in last.chunks), pa.array([True])]) if isinstance(
            last, pa.ChunkedArray) else pa.concat_arrays([last, pa.array([True])])
        order = pc.filter(order, last)
    if len(order) == n and bool(np.all(np.diff(order.to_numpy()) > 0)):  # keys sorted and unique: no copy
        return changes
    return changes.take(order)


def _check_columns(changes: pa.Table, pk: str) -> None:
    missing = [c for c in (pk, SEQ, OP) if c not in changes.column_names]
    if missing:
        raise MirrorError(f"a change batch needs the columns {missing} (has {changes.column_names})")
    if changes.schema.field(SEQ).type != SEQ_TYPE:
        raise MirrorError(f"column {SEQ!r} must be {SEQ_TYPE}, got {changes.schema.field(SEQ).type}")


def check_ops(changes: pa.Table, pk: str, where: str = "") -> None:
    """MirrorError if a change's ``op`` is not one of ``OPS`` (null included): the op, the key column, the first
    such row's key and its place (``_ts``, ``_channel``, ``_position`` where the batch has them) and ``where``."""
    ops = changes.column(OP)
    if changes.num_rows == 0 or set(pc.unique(ops).to_pylist()) <= set(OPS):  # a few distinct values: cheap
        return
    bad = pc.invert(pc.is_in(ops, value_set=pa.array(OPS, ops.type)))
    i = int(pc.indices_nonzero(pc.fill_null(bad, True))[0].as_py())
    row = changes.slice(i, 1).to_pylist()[0]
    found = sorted({str(v) for v in pc.unique(pc.filter(ops, pc.fill_null(bad, True))).to_pylist()})
    place = ", ".join(f"{c} {row[c]}" for c in ("_ts", "_channel", "_position") if row.get(c) is not None)
    raise MirrorError(f"a change batch{' of ' + where if where else ''} holds op {row[OP]!r} (key column {pk!r} = "
                      f"{row.get(pk)!r}{', ' + place if place else ''}; ops found: {', '.join(found)}): the mirror "
                      f"applies only {', '.join(OPS)}; the batch fails, nothing committed")
