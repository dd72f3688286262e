"""The ``collections`` output's rows split by collection, column-wise (a database job's writing task's ``split``):
each collection's pieces (``payload``, an Arrow IPC stream each: ``source.multi``) read in place from the batch's
binary column (no copy of their bytes into Python objects), the pieces of one shape concatenated and conformed to
the collection's ``rows`` schema once, not piece by piece (``source.multi.unpack`` takes Python bytes and conforms
each piece)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.source.multi import KEY


def pieces(payload: pa.Array | pa.ChunkedArray, rows: np.ndarray | None = None) -> list[pa.Table]:
    """The Arrow IPC streams of a binary column (nulls left out), each read over the column's own buffer;
    ``rows`` (a one-chunk column): only those rows' streams, in that order."""
    chunks = payload.chunks if isinstance(payload, pa.ChunkedArray) else [payload]
    out = []
    for arr in chunks:
        if not len(arr):
            continue
        _, offsets, data = arr.buffers()
        width = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
        at = np.frombuffer(offsets, dtype=width)[arr.offset:arr.offset + len(arr) + 1]
        idx = np.arange(len(arr)) if rows is None else rows
        if arr.null_count:
            idx = idx[arr.is_valid().to_numpy(zero_copy_only=False)[idx]]
        for start, end in zip(at[idx].tolist(), at[idx + 1].tolist()):
            out.append(pa.ipc.open_stream(data.slice(start, end - start)).read_all())
    return out


def conform_pieces(parts: list[pa.Table], schema: pa.Schema, pk: str, min_ts: int | None = None) -> pa.Table:
    """The pieces of one collection as one table of ``schema`` (its ``rows`` schema), as ``source.multi.unpack``
    makes it: columns a piece lacks null, its ``$key`` named ``pk``, rows at or before ``min_ts`` left out. The
    pieces of one shape are conformed together."""
    shapes: dict[pa.Schema, list[pa.Table]] = {}
    for t in parts:
        shapes.setdefault(t.schema, []).append(t)
    out = []
    for shape, same in shapes.items():
        t = pa.concat_tables(same) if len(same) > 1 else same[0]
        if KEY in shape.names:
            t = t.rename_columns([pk if n == KEY else n for n in shape.names])
        names = set(t.column_names)
        out.append(pa.Table.from_arrays([t.column(f.name).cast(f.type) if f.name in names
                                         else pa.nulls(t.num_rows, f.type) for f in schema], schema=schema))
    got = pa.concat_tables(out) if len(out) > 1 else (out[0] if out else schema.empty_table())
    if min_ts is not None and got.num_rows:
        got = got.filter(pc.greater(got.column("_ts"), pa.scalar(min_ts, pa.int64())))
    return got


_NO_ID = -(2 ** 63)  # a row without a collection id (none is in a writing task's tables)


# the tasks' functions are instances of these classes, not closures: pickled at every batch, an instance is its
# fields and a reference to its class (a closure: its code and globals, the driver's modules scanned for each)


class _Split:
    """A writing task's ``split`` (:func:`split_fn`)."""

    def __init__(self, tables: dict[int, tuple[pa.Schema, str, int | None]]) -> None:
        self.tables = tables

    def split(self, b: pa.RecordBatch) -> Iterator[tuple[int, pa.Table]]:
        # each collection's rows by position (no filtered copy of the payload column): its pieces in batch order
        cids = pc.fill_null(b.column(0), _NO_ID).to_numpy(zero_copy_only=False)
        order = np.argsort(cids, kind="stable")
        ids, starts = np.unique(cids[order], return_index=True)
        for cid, lo, hi in zip(ids.tolist(), starts.tolist(), [*starts[1:].tolist(), len(order)]):
            if cid not in self.tables:
                continue
            schema, pk, min_ts = self.tables[cid]
            got = conform_pieces(pieces(b.column(1), order[lo:hi]), schema, pk, min_ts)
            if got.num_rows:
                yield cid, got

    __call__ = split


def split_fn(tables: dict[int, tuple[pa.Schema, str, int | None]]) -> _Split:
    """A writing task's ``split``: its packed rows (``_collection``, ``payload``) by collection id, each
    collection's conformed with its table's (rows schema, primary key, snapshot time); a collection not in
    ``tables`` left out."""
    return _Split(tables)


class _Unpack:
    """A task's packed rows of one collection as its rows (:func:`unpack_fn`)."""

    def __init__(self, schema: pa.Schema, pk: str, min_ts: int | None) -> None:
        self.schema, self.pk, self.min_ts = schema, pk, min_ts

    def rows(self, batches):
        for b in batches:
            if b.num_rows:
                yield from conform_pieces(pieces(b.column(0)), self.schema, self.pk, self.min_ts).to_batches()

    __call__ = rows


def unpack_fn(schema: pa.Schema, pk: str, min_ts: int | None) -> _Unpack:
    """A task's packed rows (``payload``, one column) of one collection as its ``rows`` Arrow batches."""
    return _Unpack(schema, pk, min_ts)
