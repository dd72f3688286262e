"""Lance fragments of a mirror table, and what the merge-on-read lookup reads of them.

A Parquet file becomes one Lance fragment (``LanceFragment.create``: the Lance data file written straight to
the table's location through Lance's own object store), minus the rows at given positions: a writing task's
staged file (``staged.py``), a snapshot's files (``add_files``), a Parquet file a plan adds without a task's
report. Beside each fragment the mirror keeps its *key file*: a Parquet file of the fragment's key and ``_seq``
columns in its row order (``data/_keys_of/<data file>.parquet``, with the key bounds in its metadata). The
lookup reads that file
(and the key index it builds beside it) as it reads a Delta or Iceberg data file, and its row positions are the
fragment's: a deleted position becomes a row of the fragment's Lance deletion file.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgstream_spark.mirror.common import conform
from msgstream_spark.mirror.formats.base import DATA_DIR
from msgstream_spark.mirror.formats.lance.options import lance
from msgstream_spark.mirror.order import SEQ
from msgstream_spark.mirror.store import Store, uri
from msgstream_spark.mirror.store.parquet import footer, write_table

KEYS_OF = "_keys_of"
CONVERTERS = 4  # Parquet files turned into fragments at once
KEY_MIN = b"msgstream.key_min"
KEY_MAX = b"msgstream.key_max"
FRAGMENT_ROWS = 1 << 20  # rows a fragment made of Parquet files holds at most (Lance's own max_rows_per_file)


def key_file(root: str, data_file: str) -> str:
    """The key file of the fragment whose (first) data file is ``data_file`` (its name under ``data/``)."""
    return uri.join(root, DATA_DIR, KEYS_OF, data_file.rsplit("/", 1)[-1].rsplit(".", 1)[0] + ".parquet")


def data_path(root: str, data_file: str) -> str:
    """A fragment's data file as a URI of the table's store."""
    return uri.join(root, DATA_DIR, data_file)


def write_key_file(store: Store, root: str, data_file: str, keys: pa.Table, pk: str) -> tuple[str, int]:
    """The key file of a new fragment (``keys``: its key and ``_seq`` columns in row order); (path, size)."""
    col = keys.column(pk)
    bounds = {}
    if keys.num_rows:
        mm = pc.min_max(col)
        bounds = {KEY_MIN: json.dumps(mm["min"].as_py()).encode(), KEY_MAX: json.dumps(mm["max"].as_py()).encode()}
    t = keys.replace_schema_metadata({**(keys.schema.metadata or {}), **bounds})
    path = key_file(root, data_file)
    got = write_table(store, path, t, pk)
    return path, got.size


def key_file_info(store: Store, path: str) -> tuple[Any, Any, int, int]:
    """(key min, key max, rows, size) of a key file, from its footer (two small reads; kept per process)."""
    size, meta = footer(store, path)
    kv = meta.metadata or {}
    lo = json.loads(kv[KEY_MIN]) if KEY_MIN in kv else None
    hi = json.loads(kv[KEY_MAX]) if KEY_MAX in kv else None
    return lo, hi, meta.num_rows, size


def _kept(store: Store, path: str, drop: np.ndarray | None, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of a Parquet file minus positions ``drop``, batch by batch, as ``schema``."""
    at = 0
    with store.open_input(path) as src:
        for b in pq.ParquetFile(src).iter_batches(batch_size=64 * 1024):
            n = b.num_rows
            t = pa.Table.from_batches([b])
            if drop is not None and len(drop):
                inside = drop[(drop >= at) & (drop < at + n)].astype(np.int64) - at
                if len(inside):
                    keep = np.ones(n, dtype=bool)
                    keep[inside] = False
                    t = t.filter(pa.array(keep))
            at += n
            if t.num_rows:
                yield from conform(t, schema).to_batches()


def fragment_from_parquet(store: Store, root: str, ds_uri: str, opts: dict[str, str], schema: pa.Schema, pk: str,
                          path: str, drop: np.ndarray | None = None, mode: str = "append") -> tuple[Any, str] | None:
    """The Parquet file at ``path`` (minus the positions ``drop``) as a new Lance fragment, and its key file:
    (the fragment's metadata, the key file's path); None if no row is left."""
    return fragment_from_files(store, root, ds_uri, opts, schema, pk, [path], [drop], mode)


def fragment_from_files(store: Store, root: str, ds_uri: str, opts: dict[str, str], schema: pa.Schema, pk: str,
                        paths: list[str], drops: list[np.ndarray | None],
                        mode: str = "append") -> tuple[Any, str] | None:
    """The Parquet files at ``paths``, one after the other (each minus its positions in ``drops``), as one new
    Lance fragment, and its key file: (the fragment's metadata, the key file's path); None if no row is left."""
    keys: list[pa.Table] = []
    batches = itertools.chain.from_iterable(_kept(store, p, d, schema) for p, d in zip(paths, drops, strict=True))
    first = next(batches, None)
    if first is None:
        return None

    def rows() -> Iterator[pa.RecordBatch]:
        for b in itertools.chain([first], batches):
            keys.append(pa.Table.from_batches([b]).select([pk, SEQ]))
            yield b

    reader = pa.RecordBatchReader.from_batches(schema, rows())
    md = lance().fragment.LanceFragment.create(ds_uri, reader, schema=schema, mode=mode, storage_options=opts,
                                               max_rows_per_group=64 * 1024)
    if not md.physical_rows:
        return None
    key_path, _ = write_key_file(store, root, md.files[0].path, pa.concat_tables(keys), pk)
    return md, key_path


def packed(store: Store, paths: list[str], target_rows: int) -> list[list[str]]:
    """``paths`` (URIs of the store) in order, in runs of consecutive files holding at most ``target_rows`` rows
    together (their footers'; a file with more is a run of its own): each run becomes one fragment."""
    runs: list[list[str]] = []
    rows = 0
    for p in paths:
        n = footer(store, p)[1].num_rows
        if runs and rows + n <= target_rows:
            runs[-1].append(p)
            rows += n
        else:
            runs.append([p])
            rows = n
    return runs


def fragments_of(table: Any, schema: pa.Schema, paths: list[str], deletes: dict[str, np.ndarray] | None = None,
                 mode: str = "append") -> list:
    """The Parquet files at ``paths`` as new fragments of ``table`` (minus their positions in ``deletes``):
    consecutive files packed into fragments of up to ``table.fragment_rows`` rows (a snapshot's files are often
    far smaller: a batch's deletes touch, and rewrite the deletion file of, every fragment holding a changed key,
    so fragments as many as files would make a batch cost grow with the table), a few fragments at a time (Lance
    and pyarrow release the GIL); with the key files written beside them."""
    full = {(p if "://" in p else uri.parse(p).uri()): p for p in paths}

    def one(run: list[str]):
        return fragment_from_files(table.store, table.root, table.uri, table._opts, schema, table.pk, run,
                                   [(deletes or {}).get(full[p]) for p in run], mode)

    runs = packed(table.store, list(full), table.fragment_rows)
    with ThreadPoolExecutor(max_workers=max(1, min(CONVERTERS, len(runs)))) as pool:
        return [got[0] for got in pool.map(one, runs) if got is not None]


def deleted_positions(fragment: Any) -> np.ndarray:
    """The deleted row offsets of a fragment (sorted, unique), from the rows Lance reads as live."""
    md = fragment.metadata
    if md.deletion_file is None:
        return np.zeros(0, np.uint64)
    live = fragment.to_table(columns=[], with_row_address=True).column("_rowaddr").to_numpy()
    offsets = (live & np.uint64(0xFFFFFFFF)).astype(np.uint64)
    return np.setdiff1d(np.arange(md.physical_rows, dtype=np.uint64), offsets)


def vector_like(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and (
        pa.types.is_floating(t.value_type) or pa.types.is_int8(t.value_type) or pa.types.is_uint8(t.value_type))


def fixed_vectors(schema: pa.Schema, store: Store, paths: list[str]) -> pa.Schema:
    """``schema`` with each variable list of numbers (a vector, as the collection's Arrow schema spells it) made a
    fixed-size list of the one length its values have in the Parquet files at ``paths`` (a Lance vector index
    needs fixed-size lists); a column without values, or with values of several lengths, stays as it is."""
    want = [f.name for f in schema if vector_like(f.type)]
    if not want:
        return schema
    sizes: dict[str, set[int]] = {n: set() for n in want}
    for p in paths:
        with store.open_input(p) as src:
            pf = pq.ParquetFile(src)
            cols = [n for n in want if n in pf.schema_arrow.names]
            if not cols:
                continue
            t = pf.read(columns=cols)
        for n in cols:
            lengths = pc.list_value_length(t.column(n)).drop_null()
            if len(lengths):
                mm = pc.min_max(lengths)
                sizes[n] |= {mm["min"].as_py(), mm["max"].as_py()}
    out = []
    for f in schema:
        got = sizes.get(f.name)
        if got is not None and len(got) == 1 and next(iter(got)) > 0:
            f = f.with_type(pa.list_(f.type.value_field, next(iter(got))))
        out.append(f)
    return pa.schema(out, metadata=schema.metadata)


def file_schema(store: Store, path: str) -> pa.Schema:
    """The Arrow schema of the Parquet file at ``path`` (its footer)."""
    with store.open_input(path) as src:
        return pq.ParquetFile(src).schema_arrow
