"""Parquet files written and read through the table's store, and what a commit needs to know of them.

A writer (a Spark task, the driver's compaction) streams a file into ``store.open_output`` (a local file moved
into place when complete; an object store's multipart upload completed on close: a killed writer publishes
nothing) and keeps the file's footer and size as it closes it: the commit takes rows, size and the key's
bounds from there (shipped by the task as :class:`Written`), never by reading the file back; a format whose
commit reads a file's statistics from its footer (Iceberg) has the task ship the footer itself (``footer=True``;
the driver keeps it, :func:`keep_footer`). A file written by someone else is known by its footer, read by range
(:func:`footer`). Both are kept per process (a file never changes once written), so a driver that wrote a file
itself, or was sent its footer, never reads it back.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.mirror.store import NotFound, Store, uri

log = logging.getLogger(__name__)

_FOOTERS: OrderedDict[tuple[str, int], Any] = OrderedDict()  # (uri, size) -> FileMetaData, newest last
_FOOTERS_MAX = 4096
_FOOTERS_LOCK = threading.Lock()  # (a database job's driver commits several tables at once)


def _remember(target: str, size: int, meta: Any) -> None:
    with _FOOTERS_LOCK:
        _FOOTERS[(target, size)] = meta
        _FOOTERS.move_to_end((target, size))
        while len(_FOOTERS) > _FOOTERS_MAX:
            _FOOTERS.popitem(last=False)


def footer_bytes(meta: Any) -> bytes:
    """A Parquet ``FileMetaData`` serialized (a metadata-only Parquet file: ~1 KB, ~10 us), as a task ships it."""
    sink = pa.BufferOutputStream()
    meta.write_metadata_file(sink)
    return sink.getvalue().to_pybytes()


def keep_footer(target: str, size: int, raw: bytes) -> None:
    """The footer a task shipped of the file it wrote at ``target`` (``size`` bytes), kept as if read from it:
    :func:`footer` then reads nothing (on object storage, a HEAD and ranged GETs per file and commit)."""
    _remember(target, size, pq.read_metadata(pa.BufferReader(raw)))


def footer(store: Store, target: str, size: int = 0) -> tuple[int, Any]:
    """(size in bytes, Parquet ``FileMetaData``) of a data file (``size``: its size, when the table's metadata
    knows it; else asked of the store): kept from its writing in this process, else read from its footer by
    range (two small reads, not the file)."""
    if size <= 0:
        meta = store.head(target)
        if meta is None:
            raise NotFound(f"{target}: no such object (a data file the table names is gone)")
        size = meta.size
    got = _FOOTERS.get((target, size))
    if got is None:
        with store.open_input(target) as f:
            got = pq.ParquetFile(f).metadata
        _remember(target, size, got)
    return size, got


def read_parquet(store: Store, target: str, columns: list[str] | None = None) -> pa.Table:
    """A whole Parquet file (one read of the object: faster than ranged reads for a file read whole), or only
    ``columns`` of it (ranged reads of their column chunks). Read by ``ParquetFile``, not ``pq.read_table``
    (whose dataset machinery cost ~0.4 ms more CPU a file: a planning task reads a changes file per table)."""
    if columns is not None:
        with store.open_input(target) as f:
            return pq.ParquetFile(f).read(columns=columns)
    return pq.ParquetFile(pa.BufferReader(store.read(target))).read()


@dataclass
class Written:
    """A file a writer finished: its URI, rows, size, and the stats a commit records (JSON: ``numRecords`` and
    the key's ``minValues`` / ``maxValues`` / ``nullCount``, Delta's stats without ``tightBounds``)."""

    path: str
    rows: int
    size: int
    stats: str
    footer: bytes = b""  # the file's Parquet footer, serialized (a format whose commit reads it asked for it)


def key_stats(meta: Any, key: str | None) -> dict:
    """Delta-style stats of a Parquet footer: rows, and the bounds and nulls of column ``key`` (none when a row
    group has no statistics for it)."""
    stats: dict = {"numRecords": meta.num_rows}
    col = _leaf(meta.schema, key) if key is not None else None
    if col is None:
        return stats
    lo = hi = None
    nulls = 0
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(col).statistics
        if st is None or not st.has_min_max:
            return stats
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
        nulls += st.null_count or 0
    if lo is not None:
        stats.update(minValues={key: _plain(lo)}, maxValues={key: _plain(hi)}, nullCount={key: nulls})
    return stats


def _leaf(schema: Any, name: str) -> int | None:
    """The index of top-level column ``name`` among a Parquet schema's leaf columns (a row group's columns: a
    struct before it counts one leaf per member, so its Arrow field index is not it), None if there is none."""
    for i in range(len(schema)):
        if schema.column(i).path == name:
            return i
    return None


def _plain(v: object) -> object:
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


def snapshot_options(schema: pa.Schema) -> dict[str, Any]:
    """``ParquetWriter`` options for a snapshot's files (both routes' tasks, and their rewrite when a key was read
    twice): strings and binaries dictionary-encoded, nothing else (a vector's floats would only pay for a
    dictionary that never fills); snappy, except lists of floating-point values (float vectors), written without
    compression and without page statistics: embeddings do not compress (snappy saved 2% on 128-d vectors), an
    element's min and max prune nothing, and writing them so took a third less time. Every other column keeps
    its statistics (the key's bounds in a commit's stats come from them)."""
    floats = {f.name for f in schema if _float_list(f.type)}
    return {"use_dictionary": [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_binary(f.type)],
            "compression": {f.name: "none" if f.name in floats else "snappy" for f in schema},
            "write_statistics": [f.name for f in schema if f.name not in floats]}


def _float_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and \
        pa.types.is_floating(t.value_type)


class ParquetOut:
    """One Parquet file streamed into the store (``ParquetWriter`` keyword arguments as given). ``close`` returns
    the :class:`Written`; ``abort`` (or an exception in a ``with`` block) publishes nothing. ``transient``: a file
    whose loss in a crash is harmless (``Store.open_transient``: a local one is not fsync'd); ``footer``: the
    ``Written`` carries the file's footer too."""

    def __init__(self, store: Store, target: str, schema: pa.Schema, key: str | None = None,
                 transient: bool = False, footer: bool = False, **kw: Any) -> None:
        self.store, self.path, self.key, self.footer = store, target, key, footer
        self._out = store.open_transient(target) if transient else store.open_output(target)
        self._meta: list = []
        try:
            self._writer = pq.ParquetWriter(self._out, schema, metadata_collector=self._meta, **kw)
        except BaseException:
            self.abort()
            raise
        self.rows = 0

    def write_table(self, t: pa.Table, row_group_size: int | None = None) -> None:
        self._writer.write_table(t, row_group_size=row_group_size)
        self.rows += t.num_rows

    def write_batch(self, b: pa.RecordBatch, row_group_size: int | None = None) -> None:
        self._writer.write_batch(b, row_group_size=row_group_size)
        self.rows += b.num_rows

    def close(self) -> Written:
        self._writer.close()
        size = self._out.tell()
        self._out.close()  # the object appears now, whole
        meta = self._meta[0]
        _remember(self.path, size, meta)
        return Written(self.path, meta.num_rows, size, json.dumps(key_stats(meta, self.key)),
                       footer_bytes(meta) if self.footer else b"")

    def abort(self) -> None:
        if getattr(self, "_writer", None) is not None and self._writer.is_open:
            try:  # its footer goes into a file that is then dropped: the error that aborts it is the one raised
                self._writer.close()
            except Exception as e:  # noqa: BLE001
                log.debug("closing the aborted writer of %s: %s", self.path, e)
        self._out.abort()

    def __enter__(self) -> ParquetOut:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def write_table(store: Store, target: str, table: pa.Table, key: str | None = None, **kw: Any) -> Written:
    """``table`` as one Parquet file (zstd, row groups of 128 Ki rows unless ``kw`` says otherwise)."""
    kw.setdefault("compression", "zstd")
    rg = kw.pop("row_group_size", 128 * 1024)
    with ParquetOut(store, target, table.schema, key, **kw) as out:
        out.write_table(table, row_group_size=rg)
        return out.close()


def remove_tree(store: Store, directory: str) -> None:
    """Delete every object under ``directory`` (and, on a local store, the emptied directories)."""
    for m in list(store.list(directory)):
        store.delete(m.uri)
    local = uri.parse(directory)
    if local.kind == "local" and os.path.isdir(local.key):
        shutil.rmtree(local.key)
