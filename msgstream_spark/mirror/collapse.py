"""A batch of changes -> the last change of each primary key (by ``_seq``), column-wise."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.order import SEQ, SEQ_TYPE

OP = "op"
_INPUT_INDEX = "__msgstream_input_index"


def collapse(changes: pa.Table, pk: str) -> pa.Table:
    """One row per primary key: the change with the largest ``_seq`` (its ``op`` says insert or delete).

    Equal ``_seq`` of one pk (not produced by Milvus; see docs/spark-source.md) resolve to the later
    row of ``changes``, so the result never depends on the sort's implementation. The columns and
    their order are kept; the rows come out sorted by ``pk``.
    """
    _check_columns(changes, pk)
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
    return changes.take(order)


def _check_columns(changes: pa.Table, pk: str) -> None:
    missing = [c for c in (pk, SEQ, OP) if c not in changes.column_names]
    if missing:
        raise MirrorError(f"a change batch needs the columns {missing} (has {changes.column_names})")
    if changes.schema.field(SEQ).type != SEQ_TYPE:
        raise MirrorError(f"column {SEQ!r} must be {SEQ_TYPE}, got {changes.schema.field(SEQ).type}")
