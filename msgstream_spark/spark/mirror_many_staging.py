"""A pending collection's stream rows, kept aside while its snapshot runs beside the stream, and handed over.

A collection of a many-collection job whose snapshot has not committed yet is *pending*: a batch does not merge
its rows (its table is the snapshot's alone until then) but stages them, as they came (the source's ``payload``
pieces), under ``<staging>/<collection id>/batch-<batch id>/``, through the tables' :class:`Store` (a local
directory or an object store: the tasks build theirs from the settings the driver resolved, as a table write
does). One Spark job per batch stages every pending collection's rows: each task writes one Parquet file per
collection it holds rows of, named uniquely per task attempt (``rows/part-<uuid>.parquet``: an object store has no
directory rename), and returns its name and size. The driver then writes ``staged.json`` last, listing the files
that count (from the tasks' returned results, never from a listing) and the batch's DropPartition / Truncate
rows of the collection: a batch directory without it is an unfinished attempt, ignored at the handover and
replaced when Spark runs the batch again (its old mark removed first, then its files); a file no mark lists (a
failed or speculative task attempt's) is never read.

The handover (:func:`apply_staged`, the batch thread's, never beside another write of the table) applies each
staged batch in batch-id order through the table's own :class:`~msgstream_spark.spark.mirror.MirrorBatch`, with
``min_ts`` = the snapshot's S (rows at or before it are the snapshot's) and the batch's **own** id as its record:
a batch the table already recorded (a handover killed half-way) is skipped, none is applied twice.
docs/mirror.md "Snapshots while streaming".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import uuid
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgstream_spark.mirror.store import Store, store_for, uri
from msgstream_spark.source.multi import KIND_ROWS
from msgstream_spark.spark.mirror import FAILPOINT_ENV
from msgstream_spark.spark.mirror_many_write import unpack_fn  # the stream's own unpacking of a batch's pieces
from msgstream_spark.spark.removals import Removal, Target, with_removals

log = logging.getLogger(__name__)

MARK = "staged.json"  # written last: {"rows": bool, "files": [...], "bytes": int, "removals": [...]}
_MARK_KEY = re.compile(r"(?:^|/)batch-(\d+)/" + re.escape(MARK) + "$")
STAGED_SCHEMA = "cid long, name string, bytes long"  # what a staging task returns per file it wrote


def failpoint(name: str) -> None:
    """Tests: SIGKILL the driver (and its process group, when the test made it one) at failpoint ``name`` when
    ``MSGSTREAM_MIRROR_FAILPOINT`` names it (``kill-after-staging:<collection id>``: a batch staged its rows;
    ``kill-after-snapshot:<collection id>``: its snapshot committed; ``kill-in-handover:<collection id>``: the first
    of its two or more staged batches applied)."""
    if name not in {p.strip() for p in os.environ.get(FAILPOINT_ENV, "").split(",")}:
        return
    log.warning("failpoint %s: SIGKILL", name)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def batch_dir(root: str, cid: int, batch_id: int) -> str:
    return uri.join(root, str(cid), f"batch-{batch_id}")


def _under(store: Store, where: str) -> list:
    """Every object under the directory ``where`` (not a sibling whose name starts the same)."""
    return [o for o in store.list(where) if o.uri.startswith(where.rstrip("/") + "/")
            or o.uri.startswith(where.rstrip(os.sep) + os.sep)]


def _write_fn(root: str, options: dict[str, str], batch_id: int):
    """A staging task: its rows (``_collection``, ``payload``) written as one Parquet file per collection, each
    under a name no other attempt uses; yields (collection id, file name under the batch directory, bytes)."""
    def write(batches):
        store, attempt = store_for(root, options), uuid.uuid4().hex
        files: dict[int, tuple[str, Any]] = {}
        with contextlib.ExitStack() as stack:
            for b in batches:
                if not b.num_rows:
                    continue
                for cid in pc.unique(b.column(0)).to_pylist():
                    piece = pa.table({"payload": b.filter(pc.equal(b.column(0), cid)).column(1)})
                    if cid not in files:
                        name = f"rows/part-{attempt}.parquet"
                        out = stack.enter_context(store.open_output(uri.join(batch_dir(root, cid, batch_id), name)))
                        files[cid] = (name, stack.enter_context(pq.ParquetWriter(out, piece.schema)))
                    files[cid][1].write_table(piece)
        for cid, (name, _) in sorted(files.items()):
            meta = store.head(uri.join(batch_dir(root, cid, batch_id), name))
            yield pa.RecordBatch.from_pydict({"cid": [cid], "name": [name], "bytes": [meta.size if meta else 0]})

    return write


def stage(df, store: Store, batch_id: int, wanted: dict[int, tuple[bool, list[Removal]]]) -> dict[int, int]:
    """The batch ``df``'s rows and removals of each collection in ``wanted`` (id -> (it has rows, its removals))
    staged in one Spark job; the bytes staged per collection."""
    from pyspark.sql import functions as F

    root = store.root
    for cid in wanted:  # an earlier attempt of this batch (killed before Spark committed it): its mark first
        where = batch_dir(root, cid, batch_id)
        store.delete(uri.join(where, MARK))
        for o in _under(store, where):
            store.delete(o.uri)
    with_rows = sorted(c for c, (rows, _) in wanted.items() if rows)
    got: dict[int, list] = {c: [] for c in wanted}
    if with_rows:
        part = df.where((F.col("kind") == KIND_ROWS) & F.col("_collection").isin(with_rows))
        part = part.select(F.col("_collection").cast("long"), "payload")
        for r in part.mapInArrow(_write_fn(root, dict(store.options), batch_id), STAGED_SCHEMA).collect():
            got[r["cid"]].append((r["name"], r["bytes"]))
    sizes = {}
    for cid, (_rows, removals) in sorted(wanted.items()):
        files = sorted(got[cid])
        sizes[cid] = sum(n for _, n in files)
        mark = {"rows": bool(files), "files": [f for f, _ in files], "bytes": sizes[cid],
                "removals": [asdict(r) for r in removals]}
        where = batch_dir(root, cid, batch_id)
        store.put(uri.join(where, MARK), json.dumps(mark).encode())
        log.info("batch %d: collection id %d is pending its snapshot: %d file(s) (%d bytes) and %d removal(s) "
                 "staged in %s", batch_id, cid, len(files), sizes[cid], len(removals), where)
        failpoint(f"kill-after-staging:{cid}")
    return sizes


def staged(store: Store, cid: int) -> dict[int, int]:
    """The batches staged for collection ``cid`` (finished attempts only: their marks), batch id -> bytes."""
    out = {}
    for o in _under(store, uri.join(store.root, str(cid))):
        m = _MARK_KEY.search(o.uri)
        if m:
            out[int(m.group(1))] = int(json.loads(store.read(o.uri)).get("bytes", 0))
    return dict(sorted(out.items()))


def _read_fn(options: dict[str, str]):
    """A handover task: the staged files it is given (``path``) read back as their ``payload`` batches."""
    def read(batches):
        for b in batches:
            for path in b.column(0).to_pylist():
                with store_for(path, options).open_input(path) as f:
                    yield from pq.ParquetFile(f).iter_batches(columns=["payload"])

    return read


def staged_payload(spark, store: Store, cid: int, batch_id: int):
    """Staged batch ``batch_id`` of collection ``cid``: its mark and its ``payload`` pieces (a DataFrame of the files
    the mark lists, read by tasks through the store; None: no rows)."""
    where = batch_dir(store.root, cid, batch_id)
    mark = json.loads(store.read(uri.join(where, MARK)))
    files = [uri.join(where, f) for f in mark.get("files", [])]
    if "files" not in mark and mark.get("rows"):  # staged by the version before (Spark's own write, committed whole)
        files = sorted(o.uri for o in _under(store, uri.join(where, "rows")) if o.uri.endswith(".parquet"))
    if not files:
        return mark, None
    paths = spark.createDataFrame([(f,) for f in files], "path string").repartition(min(len(files), 64))
    return mark, paths.mapInArrow(_read_fn(dict(store.options)), "payload binary")


def apply_staged(spark, m: Any, store: Store, cid: int, batch_id: int) -> None:
    """Staged batch ``batch_id`` of collection ``cid`` merged into its table (``m``: its ``Mirrored``, whose
    ``min_ts`` is the snapshot's S) with that batch id as the commit's record (skipped if recorded)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    mark, payload = staged_payload(spark, store, cid, batch_id)
    schema = from_arrow_schema(m.rows_schema)
    if payload is not None:
        rows = payload.mapInArrow(unpack_fn(m.rows_schema, m.pk, m.min_ts), schema)
    else:
        rows = spark.createDataFrame([], schema)
    removals = [Removal(**r) for r in mark["removals"]]
    if removals:
        rows = with_removals(Target(m.table, m.pk, m.rows_schema, cid, m.min_ts), rows, removals)
    m.sink(rows, batch_id)


def clear(store: Store, cid: int) -> None:
    """Collection ``cid``'s staged batches removed (every one is recorded in its table)."""
    where = uri.join(store.root, str(cid))
    for o in _under(store, where):
        store.delete(o.uri)
    loc = uri.parse(where)
    if loc.kind == "local" and os.path.isdir(loc.key):  # the emptied directories too
        shutil.rmtree(loc.key)
