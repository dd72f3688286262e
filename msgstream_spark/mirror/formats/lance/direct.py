"""A writing task's rows streamed straight into a Lance fragment: no staged Parquet file is written and read back.

:class:`FragmentOut` stands where the shared ``TaskWriter`` would open a Parquet file (``FragmentTask.open``):
each table of rows it is handed goes, through a small queue (at most ``QUEUED`` tables: a task's memory stays a
chunk or two), to ``LanceFragment.create`` reading them as a stream in a thread of its own, which writes the
fragment's data file straight to the table's location through Lance's object store. ``close`` waits for the
fragment and writes its key file (the rows' key and ``_seq``, kept as they passed). The rows a later change of the
same task replaced are only known then: a fragment with some is rewritten without them (:func:`rewrite`; a key
changed in two chunks of one task, the rare case). ``abort`` ends the stream: what Lance wrote of the data file is
in no version (an orphan: ``orphans``, vacuum).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from typing import Any

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import conform
from msgstream_spark.mirror.formats.lance.fragments import data_path, key_file, write_key_file
from msgstream_spark.mirror.formats.lance.options import lance
from msgstream_spark.mirror.order import SEQ
from msgstream_spark.mirror.store import Store, StoreError, uri
from msgstream_spark.mirror.store.parquet import Written

log = logging.getLogger(__name__)

DIRECT = "lance.direct"  # a ``Written``'s stats from FragmentOut: the fragment's metadata (JSON)
QUEUED = 2  # tables of rows waiting for the fragment's writer
WAIT_S = 1.0  # how often a writer kept waiting by a full queue checks that the fragment's writer still runs
ROWS_PER_GROUP = 64 * 1024


class FragmentOut:
    """One new fragment of the Lance dataset at ``ds_uri`` made of the tables handed to ``write_table`` (as
    ``ParquetOut`` is one Parquet file); ``path`` is the name the task's narrow rows give its rows."""

    def __init__(self, store: Store, root: str, ds_uri: str, opts: dict[str, str], schema: pa.Schema, pk: str,
                 path: str) -> None:
        self.store, self.root, self.ds_uri, self.opts = store, root, ds_uri, opts
        self.schema, self.pk, self.path = schema, pk, path
        self.rows = 0
        self._keys: list[pa.Table] = []
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUED)
        self._got: dict[str, Any] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._create, name=f"lance-fragment-{path.rsplit('/', 1)[-1]}",
                                        daemon=True)
        self._thread.start()

    def _stream(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield from item.to_batches()

    def _create(self) -> None:
        try:
            reader = pa.RecordBatchReader.from_batches(self.schema, self._stream())
            self._got["md"] = lance().fragment.LanceFragment.create(
                self.ds_uri, reader, schema=self.schema, mode="append", storage_options=self.opts,
                max_rows_per_group=ROWS_PER_GROUP)
        except BaseException as e:  # noqa: BLE001 - handed to the task's thread, which raises it
            self._got["error"] = e

    def _put(self, item: Any) -> None:
        """``item`` queued for the fragment's writer; its error if it stopped (it reads no more)."""
        while True:
            if not self._thread.is_alive():
                raise self._failure() from self._got.get("error")
            try:
                self._queue.put(item, timeout=WAIT_S)
                return
            except queue.Full:
                continue

    def _failure(self) -> MirrorError:
        e = self._got.get("error")
        return MirrorError(f"writing the Lance fragment of {self.path} under {self.root} failed: {e!r}")

    def write_table(self, t: pa.Table, row_group_size: int | None = None) -> None:
        """``t`` (the table's schema) appended to the fragment (``row_group_size``: Lance groups rows its way)."""
        t = aligned(conform(t, self.schema))
        self._put(t)
        self._keys.append(t.select([self.pk, SEQ]))
        self.rows += t.num_rows

    def close(self) -> Written:
        """The fragment, whole, with its key file; its metadata in the ``Written``'s stats (``DIRECT``)."""
        self._closed = True
        self._put(None)
        self._thread.join()
        md = self._got.get("md")
        if md is None:
            raise self._failure() from self._got.get("error")
        write_key_file(self.store, self.root, md.files[0].path, pa.concat_tables(self._keys), self.pk)
        size = sum(f.file_size_bytes or 0 for f in md.files)
        return Written(self.path, md.physical_rows, size, json.dumps({DIRECT: md.to_json()}))

    def abort(self) -> None:
        """The stream ended with an error: the fragment's writer stops, nothing of it is in the table."""
        if self._closed or not self._thread.is_alive():
            return
        self._closed = True
        while True:  # room for the stop (the writer reads no more after it)
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(MirrorError(f"the task writing {self.path} aborted"))
        self._thread.join()


def direct_fragment(written: Written) -> Any:
    """The fragment a :class:`FragmentOut` made (its ``Written``), or None (a staged Parquet file)."""
    if not written.stats or DIRECT not in written.stats:
        return None
    got = json.loads(written.stats)
    return lance().fragment.FragmentMetadata.from_json(json.dumps(got[DIRECT])) if DIRECT in got else None


def rewrite(store: Store, root: str, ds_uri: str, opts: dict[str, str], schema: pa.Schema, pk: str, md: Any,
            drop: np.ndarray, mode: str = "append") -> Any:
    """A new fragment of ``md``'s rows minus positions ``drop`` as ``schema``, with its key file; ``md``'s files
    (never committed) deleted. None if no row is left."""
    lo = lance()
    old = md.files[0].path
    t = lo.file.LanceFileReader(_local(data_path(root, old)), storage_options=opts).read_all().to_table()
    if len(drop):
        keep = np.ones(t.num_rows, dtype=bool)
        keep[np.asarray(drop, np.int64)] = False
        t = t.filter(pa.array(keep))
    new = None
    if t.num_rows:
        t = conform(t, schema)
        new = lo.fragment.LanceFragment.create(ds_uri, t, schema=schema, mode=mode, storage_options=opts,
                                               max_rows_per_group=ROWS_PER_GROUP)
        write_key_file(store, root, new.files[0].path, t.select([pk, SEQ]), pk)
    for target in (data_path(root, old), key_file(root, old)):
        try:
            store.delete(target)
        except (OSError, StoreError) as e:  # a leftover is an orphan (orphans, vacuum): logged, never fatal
            log.warning("could not delete %s (a fragment rewritten before its commit): %s", target, e)
    return new


def _local(target: str) -> str:
    loc = uri.parse(target)
    return loc.key if loc.kind == "local" else loc.uri()


def aligned(t: pa.Table) -> pa.Table:
    """``t`` with each column whose buffers do not all start on an 8-byte boundary copied (a ``take``: fresh,
    aligned buffers); the others as they are. Lance reads a table through the C data interface, and Arrow's Rust
    side panics on a buffer off its type's alignment: rows passed on without a copy can lie in foreign memory at any
    byte (an IPC stream read in place, a float vector viewed in a message's payload)."""
    cols, copied = list(t.columns), False
    for i, col in enumerate(cols):
        if any(b is not None and b.address % 8 for c in col.chunks for b in c.buffers()):
            cols[i], copied = col.take(pa.array(np.arange(len(col), dtype=np.int64))), True
    return pa.Table.from_arrays(cols, schema=t.schema) if copied else t

