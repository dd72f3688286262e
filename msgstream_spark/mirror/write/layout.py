"""The merge-on-read write path, Spark-free: what a task does and what the driver decides.

A micro-batch never passes through one process. Each task (a Spark task, or the caller's process for
``apply_batch``) collapses its share of the changes, writes its inserted and updated rows (the keys' new
versions) as one new Parquet data file under the table's location and returns only the *narrow* columns of
its changes (key, ``_seq``, op, file, row position). Other tasks read the key and ``_seq`` columns of the
table's live data files (those whose key bounds can hold a key of the batch), minus their deleted positions,
and return the rows whose key the batch carries. The driver joins the two narrow results (:func:`plan`): the
positions to delete (an older row of a changed key, and a row a task wrote that lost to a newer change) and
the files to add; the table format commits them (Delta: deletion vectors; Iceberg: position-delete files).
See docs/mirror.md "The write path".
"""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.collapse import OP, WRITES, check_ops, collapse
from msgstream_spark.mirror.common import TS, conform
from msgstream_spark.mirror.formats.base import LiveFile, Plan, WriteSpec
from msgstream_spark.mirror.order import SEQ, SEQ_TYPE
from msgstream_spark.mirror.store import Store, store_for, uri
from msgstream_spark.mirror.store.parquet import ParquetOut, Written, write_table
from msgstream_spark.mirror.write.keyindex import KeyIndex, find_keys, indexable, save_index

FILE = "_file"
POS = "_pos"
COLLECTION = "_collection"


def narrow_schema(key_type: pa.DataType) -> pa.Schema:
    """What a writing task returns per change: key, order, op, the file and row it wrote (null: none)."""
    return pa.schema([pa.field("key", key_type), pa.field(SEQ, SEQ_TYPE), pa.field(OP, pa.string()),
                      pa.field(FILE, pa.string()), pa.field(POS, pa.int64()), pa.field(COLLECTION, pa.int64())])


def match_schema(key_type: pa.DataType) -> pa.Schema:
    """What a lookup task returns per live table row of a batch key."""
    return pa.schema([pa.field("key", key_type), pa.field(SEQ, SEQ_TYPE), pa.field(FILE, pa.string()),
                      pa.field(POS, pa.int64())])


def write_changes(changes: pa.Table, spec: WriteSpec) -> pa.Table:
    """``changes`` written by one ``TaskWriter`` (the whole share of a task at once); the narrow rows."""
    w = TaskWriter(spec)
    try:
        return w.add(changes)
    finally:
        w.close()


def data_file_options(schema: pa.Schema) -> dict:
    """``ParquetWriter`` options of a batch's data files: zstd, a dictionary for every column but float vectors
    (their floats only pay for a dictionary that never fills: a 5k-row file of 64-d vectors took 10x the time
    and came out a third larger; a 50k-row one, 1.8x the time), as a snapshot's files (``snapshot_options``)."""
    def vector(t: pa.DataType) -> bool:
        lists = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
        return lists and pa.types.is_floating(t.value_type)

    return {"compression": "zstd", "use_dictionary": [f.name for f in schema if not vector(f.type)]}


class TaskWriter:
    """A task's share of a micro-batch, chunk by chunk (memory: one chunk): the newest change per key of each
    chunk is kept; its rows of ``insert`` and ``update`` changes (the key's new version) are appended to this
    task's data file (one per value of ``split_by``) under ``spec.data_dir``; ``add`` returns the narrow rows
    (``narrow_schema``) of every change kept. A key in two chunks leaves two rows; the driver's ``plan`` deletes
    the older one in the same commit. With a ``spec.finish`` (a format's own files) each file closed is handed to
    it with the positions of its rows a later chunk's change of the same key replaced (``superseded``); a
    ``spec.finish`` with an ``open(store, spec, path)`` that returns a writer (``ParquetOut``'s methods) gets the
    rows themselves (Lance: straight into a fragment, no Parquet file staged)."""

    def __init__(self, spec: WriteSpec, claims: str | None = None) -> None:
        self.spec = spec
        self.store = spec.store()
        self.claims = claims  # an empty object there names each data file before it opens (drop_lost_files)
        self.out_schema = narrow_schema(spec.key_type)
        self._files: dict[tuple, list] = {}  # partition values -> [path, ParquetOut, rows written, key parts]
        self.done: list[Written] = []  # the files closed, as a commit records them
        self._seen: list[pa.Table] = []  # with a ``spec.finish``: the narrow rows so far (superseded rows)

    def add(self, changes: pa.Table) -> pa.Table:
        spec = self.spec
        if spec.snapshot_ts is not None and changes.num_rows:
            ts = pa.scalar(spec.snapshot_ts, changes.schema.field(TS).type)
            changes = changes.filter(pc.greater(changes.column(TS), ts))
        if changes.num_rows == 0:
            return self.out_schema.empty_table()
        changes = collapse(changes, spec.pk, f"table {spec.data_dir.rstrip('/').rsplit('/', 1)[0]}")
        ins = pc.is_in(changes.column(OP), value_set=pa.array(WRITES, changes.schema.field(OP).type))
        rows = changes.filter(ins)
        n = changes.num_rows
        file_arr = np.full(n, None, dtype=object)
        pos_arr = np.full(n, -1, dtype=np.int64)
        if rows.num_rows:
            ins_idx = pc.indices_nonzero(ins).to_numpy()
            groups = {(): np.arange(rows.num_rows)}
            if spec.split_by:
                codes = rows.select(spec.split_by).group_by(spec.split_by, use_threads=False).aggregate([])
                groups = {tuple(r.values()): pc.indices_nonzero(_row_match(rows, spec.split_by, r)).to_numpy()
                          for r in codes.to_pylist()}
            for key, g in groups.items():
                path, done = self._append(key, conform(rows.take(pa.array(g)), spec.schema))
                file_arr[ins_idx[g]] = path
                pos_arr[ins_idx[g]] = np.arange(done, done + len(g))
        coll = (changes.column(COLLECTION).cast(pa.int64()) if COLLECTION in changes.column_names
                else pa.nulls(n, pa.int64()))
        out = pa.Table.from_arrays([changes.column(spec.pk).cast(spec.key_type), changes.column(SEQ),
                                    changes.column(OP), pa.array(file_arr, pa.string()),
                                    pa.array(pos_arr, mask=pos_arr < 0), coll], schema=self.out_schema)
        if spec.finish is not None:
            self._seen.append(out.select(["key", SEQ, FILE, POS]))
        return out

    def _append(self, key: tuple, rows: pa.Table) -> tuple[str, int]:
        """Append ``rows`` to the file of partition ``key``; (its path, rows it held before)."""
        f = self._files.get(key)
        if f is None:
            name = f"{uuid.uuid4().hex}.parquet"
            path = uri.join(self.spec.data_dir, name)
            if self.claims is not None:  # the driver deletes it if the task's result is lost (a dead executor's)
                self.store.put(uri.join(self.claims, name), b"")
            opener = getattr(self.spec.finish, "open", None)  # a format writing its own file from the rows
            out = opener(self.store, self.spec, path) if opener is not None else None
            if out is None:
                out = ParquetOut(self.store, path, self.spec.schema, self.spec.pk, footer=self.spec.footers,
                                 **data_file_options(self.spec.schema))
            f = self._files[key] = [path, out, 0, []]
        f[1].write_table(rows, row_group_size=128 * 1024)
        f[2] += rows.num_rows
        if indexable(self.spec.key_type):  # the file's key index is written with it (no lookup reads it back)
            f[3].append((rows.column(self.spec.pk), rows.column(SEQ)))
        return f[0], f[2] - rows.num_rows

    def open_files(self) -> list[str]:
        """The data files this writer has open (rows written, not yet closed)."""
        return [f[0] for f in self._files.values()]

    def close(self) -> list[Written]:
        """Finish the files (each appears whole in the store as it closes) and write their key indexes;
        every file this writer wrote, with its rows, size and stats."""
        lost = superseded(pa.concat_tables(self._seen)) if self._seen else {}
        self._seen.clear()
        for path, out, _, parts in self._files.values():
            got = out.close()
            if self.spec.finish is not None:  # the format's own file made of it (its key files are the format's)
                self.done.append(self.spec.finish(self.store, self.spec, got, lost.get(path, np.zeros(0, np.int64))))
                continue
            self.done.append(got)
            if parts:
                keys = pa.chunked_array([c for k, _ in parts for c in k.chunks])
                seq = pa.chunked_array([c for _, q in parts for c in q.chunks]).cast(SEQ_TYPE)
                save_index(self.store, path, got.size, KeyIndex.build(keys, seq))
        self._files.clear()
        return self.done

    def abort(self) -> None:
        """Drop the files not closed yet (nothing of them is published)."""
        for _, out, _, _ in self._files.values():
            out.abort()
        self._files.clear()


def superseded(narrow: pa.Table) -> dict[str, np.ndarray]:
    """The positions per file of the rows a writer wrote whose key a later change of its own replaced (the
    ``plan``'s order: largest ``_seq``, then the later row), sorted: the plan deletes each of them."""
    t = narrow.append_column("__i", pa.array(np.arange(narrow.num_rows, dtype=np.int64)))
    t = t.sort_by([("key", "ascending"), (SEQ, "ascending"), ("__i", "ascending")])
    n = t.num_rows
    last = np.ones(n, dtype=bool)
    if n > 1:
        keys = t.column("key")
        last[:-1] = pc.not_equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
    lost = t.filter(pa.array(~last)).drop_null()
    out: dict[str, np.ndarray] = {}
    for f, pos in zip(lost.column(FILE).to_pylist(), lost.column(POS).to_pylist()):
        out.setdefault(f, []).append(pos)
    return {f: np.unique(np.asarray(v, np.int64)) for f, v in out.items()}


def _row_match(rows: pa.Table, cols: list[str], values: dict) -> pa.ChunkedArray:
    mask = None
    for c in cols:
        col = rows.column(c)
        m = pc.is_null(col) if values[c] is None else pc.fill_null(pc.equal(col, values[c]), False)
        mask = m if mask is None else pc.and_(mask, m)
    return mask


def write_data_file(table: pa.Table, path: str, store: Store | None = None, key: str | None = None) -> Written:
    """One Parquet data file, whole in the store (default: the local one of ``path``) before its path is handed
    to a commit."""
    return write_table(store if store is not None else store_for(path), path, table, key)


def prune(files: list[LiveFile], keys: pa.Array) -> list[LiveFile]:
    """The files whose key bounds hold at least one of ``keys`` (files without bounds are kept)."""
    if len(keys) == 0:
        return []
    ks = np.sort(np.asarray(keys.to_numpy(zero_copy_only=False)))
    out = []
    for f in files:
        if f.key_min is None or f.key_max is None:
            out.append(f)
            continue
        lo = np.searchsorted(ks, f.key_min, side="left")
        if lo < len(ks) and ks[lo] <= f.key_max:
            out.append(f)
    return out


def lookup_file(f: LiveFile, pk: str, keys: pa.Array, key_type: pa.DataType, store: Store | None = None) -> pa.Table:
    """The live rows of data file ``f`` whose key is one of ``keys``: (key, _seq, file, position).
    Integer keys: from the file's key index (``keyindex``: sorted keys beside the file, written with it or
    built on the first lookup); other keys: the key column read, and ``_seq`` of the matching rows only."""
    store = store if store is not None else store_for(f.path)
    if indexable(key_type):
        return _lookup_indexed(store, f, pk, keys, key_type)
    with store.open_input(f.path) as src:
        pf = pq.ParquetFile(src)
        key_col = pf.read(columns=[pk]).column(pk).cast(key_type)
        mask = pc.is_in(key_col, value_set=keys.cast(key_type))
        hit = pc.indices_nonzero(mask)
        if len(f.deleted) and len(hit):
            hit = pc.filter(hit, pc.invert(pc.is_in(hit.cast(pa.uint64()),
                                                    value_set=pa.array(f.deleted, pa.uint64()))))
        if len(hit) == 0:
            return match_schema(key_type).empty_table()
        seq = pf.read(columns=[SEQ]).column(SEQ).take(hit)
    paths = pa.array([f.path] * len(hit), pa.string())
    return pa.Table.from_arrays([key_col.take(hit), seq, paths, hit.cast(pa.int64())], schema=match_schema(key_type))


_SORTED: list = [None, None]  # the last batch's keys and their sorted unique values (a task looks up many files)


def _sorted_keys(keys: pa.Array) -> np.ndarray:
    if _SORTED[0] is not keys:
        _SORTED[:] = [keys, np.unique(np.asarray(keys.cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64))]
    return _SORTED[1]


def _lookup_indexed(store: Store, f: LiveFile, pk: str, keys: pa.Array, key_type: pa.DataType) -> pa.Table:
    want = _sorted_keys(keys)
    if f.key_min is not None and f.key_max is not None:  # only the keys within the file's bounds are searched
        want = want[np.searchsorted(want, int(f.key_min), "left"):np.searchsorted(want, int(f.key_max), "right")]
    k, pos, seq = find_keys(store, f.path, pk, f.num_rows, f.size, want)
    if len(f.deleted) and len(pos):  # deleted positions are sorted and unique (a deletion vector, np.unique)
        upos = pos.astype(np.uint64)
        keep = f.deleted[np.minimum(np.searchsorted(f.deleted, upos), len(f.deleted) - 1)] != upos
        k, pos, seq = k[keep], pos[keep], seq.filter(pa.array(keep))
    if len(pos) == 0:
        return match_schema(key_type).empty_table()
    return pa.Table.from_arrays([pa.array(k).cast(key_type), seq, pa.array([f.path] * len(pos), pa.string()),
                                 pa.array(pos, pa.int64())], schema=match_schema(key_type))


def newest_seq(matches: pa.Table) -> pa.Table:
    """(key, ``_seq``) of the newest live table row of each key in a lookup's ``matches``."""
    return matches.select(["key", SEQ]).group_by("key").aggregate([(SEQ, "max")]).rename_columns(["key", SEQ])


def plan(narrow: pa.Table, matches: pa.Table, base: int | None = None) -> Plan:
    """Join the batch's narrow changes with the table's live rows of their keys.

    Per key the newest change wins (largest ``_seq``; equal ones: the later file and row). A table row is
    deleted when the winner is newer than it; a row a task wrote is kept only if it is the winner and newer
    than every table row of the key, else its position is deleted in the same commit. An ``insert`` or
    ``update`` change names the row its task wrote; one that names none, or an op outside ``collapse.OPS``, is
    a MirrorError (a winner with no row would delete the key's row and leave nothing in its place). ``base``:
    the table version ``matches`` were read at (``LiveFiles.version``), which the commit is fenced at.
    """
    if narrow.num_rows == 0:
        return Plan([], {}, 0, base)
    check_ops(narrow, "key", "narrow changes")
    rowless = pc.and_(pc.is_in(narrow.column(OP), value_set=pa.array(WRITES, narrow.schema.field(OP).type)),
                      pc.is_null(narrow.column(FILE)))
    if pc.any(rowless).as_py():
        k = narrow.filter(rowless).slice(0, 1).to_pylist()[0]
        raise MirrorError(f"the batch's {k[OP]!r} change of key {k['key']!r} (_seq {k[SEQ]}) names no row its task "
                          "wrote: applied, it would delete the key's row and write none; nothing committed")
    t = narrow.append_column("__i", pa.array(np.arange(narrow.num_rows, dtype=np.int64)))
    t = t.sort_by([("key", "ascending"), (SEQ, "ascending"), ("__i", "ascending")])
    keys = t.column("key")
    n = t.num_rows
    last = np.ones(n, dtype=bool)
    if n > 1:
        last[:-1] = pc.not_equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
    winners = t.filter(pa.array(last))
    losers = t.filter(pa.array(~last))
    if matches.num_rows:
        tbl_max = newest_seq(matches).rename_columns(["key", "__tseq"])
        w = winners.join(tbl_max, "key", join_type="left outer")
    else:
        w = winners.append_column("__tseq", pa.nulls(winners.num_rows, SEQ_TYPE))
    newer = pc.or_kleene(pc.is_null(w.column("__tseq")), pc.greater(w.column(SEQ), w.column("__tseq")))
    newer = pc.fill_null(newer, True)
    deletes: dict[str, list] = {}

    def _add(paths: pa.ChunkedArray, pos: pa.ChunkedArray) -> None:
        for p, q in zip(paths.to_pylist(), pos.to_pylist()):
            if p is not None:
                deletes.setdefault(p, []).append(q)

    # rows tasks wrote that lose: a non-winner of its key, or a winner not newer than the table's row
    _add(losers.column(FILE), losers.column(POS))
    stale = w.filter(pc.invert(newer))
    _add(stale.column(FILE), stale.column(POS))
    # table rows of keys whose winner is newer
    if matches.num_rows:
        applied_keys = w.filter(newer).column("key")
        old = matches.filter(pc.is_in(matches.column("key"), value_set=applied_keys.combine_chunks()))
        _add(old.column(FILE), old.column(POS))
    adds = sorted(pc.unique(narrow.column(FILE).drop_null()).to_pylist())  # a few files, not a list per row
    return Plan(adds, {p: np.unique(np.asarray(v, dtype=np.uint64)) for p, v in deletes.items()},
                int(pc.sum(newer).as_py() or 0), base)


def check_narrow_collection(narrow: pa.Table, want: int | None, location: str, collection: str) -> None:
    """MirrorError if the batch holds rows of another collection id than the table's ``want``."""
    if want is None or narrow.num_rows == 0:
        return
    check_collections(set(pc.unique(narrow.column(COLLECTION).drop_null()).to_pylist()), want, location, collection)


def check_collections(ids: set[int], want: int | None, location: str, collection: str) -> None:
    """MirrorError if ``ids`` (the collection ids a batch's rows carry) hold one other than the table's ``want``."""
    other = sorted(i for i in ids if want is not None and i != int(want))
    if other:
        raise MirrorError(f"table {location} mirrors collection {collection!r} id {want}; the batch holds "
                          f"rows of collection id(s) {other} (dropped and re-created under the same name?): mirror "
                          "it into a new table; nothing written")
