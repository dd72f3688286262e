"""The ``remove`` tombstones a Delta checkpoint carries, bounded by what a running mirror's expiry keeps.

A checkpoint holds the table's live ``add`` actions and the ``remove`` tombstones that have not expired
(PROTOCOL.md, "Checkpoints"; delta-rs keeps those younger than ``delta.deletedFileRetentionDuration``, which the
job sets to ``retain.age``, at least an hour). Tombstones exist for the benefit of VACUUM alone: a snapshot is
its ``add`` actions ("Action Reconciliation"); a tombstone keeps a removed file from being deleted while a
version that reads it may still be read. The job's expiry (``mirror.upkeep``) deletes the files removed at or
before its floor (the oldest kept version's commit, less the vacuum's slack): no kept version reads them and
they are gone, so their tombstones protect nothing. Kept to their hour, a job committing every second carries
thousands of them into every checkpoint (delta-rs rewrites them all at each one, and every reader loads them).

``prune`` rewrites the checkpoint the job has just written (before the next commit) without the tombstones
removed at or before the floor; every other row (adds, metadata, protocol, txns, later tombstones) is kept
as delta-rs wrote it, in its schema, and ``_last_checkpoint`` gets the new size. A reader that listed the log
in the moment between the two writes and reads the old size fails once and reads again; a reader pinned to a
kept version reads the same files as before.
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgstream_spark.mirror.formats.delta.log import log_uri
from msgstream_spark.mirror.store import NotFound, Store

log = logging.getLogger(__name__)


def prune(store: Store, root: str, version: int, floor_ms: int) -> int:
    """Rewrite the single-part checkpoint of ``version`` of the table at ``root`` without the tombstones whose
    ``deletionTimestamp`` is at or before ``floor_ms``; how many were dropped (0: nothing rewritten)."""
    name = log_uri(root, f"{version:020d}.checkpoint.parquet")
    try:
        data, _ = store.get(name)
    except NotFound:  # a multi-part checkpoint (not the job's) or none: left as it is
        return 0
    t = pq.read_table(pa.BufferReader(data))
    if "remove" not in t.column_names:
        return 0
    rm = t.column("remove")
    old = pc.less_equal(pc.struct_field(rm, "deletionTimestamp"), pa.scalar(floor_ms, pa.int64()))
    drop = pc.fill_null(pc.and_kleene(pc.is_valid(rm), old), False)
    dropped = pc.sum(drop).as_py() or 0
    if not dropped:
        return 0
    kept = t.filter(pc.invert(drop))
    sink = pa.BufferOutputStream()
    pq.write_table(kept, sink, compression="snappy")
    body = sink.getvalue().to_pybytes()
    store.put(name, body)
    last_uri = log_uri(root, "_last_checkpoint")
    last = json.loads(store.read(last_uri))
    if int(last.get("version", -1)) == version and "parts" not in last:
        last.update(size=kept.num_rows, sizeInBytes=len(body))
        last.pop("checksum", None)  # (delta-rs writes none; a stale one would be wrong)
        store.put(last_uri, json.dumps(last).encode())
    log.info("%s: checkpoint %d rewritten without %d tombstone(s) of files the expiry deleted (removed at or "
             "before %d ms); %d action(s) left", root, version, dropped, floor_ms, kept.num_rows)
    return dropped


def _removes(store: Store, root: str, version: int) -> pa.ChunkedArray | None:
    try:
        data, _ = store.get(log_uri(root, f"{version:020d}.checkpoint.parquet"))
    except NotFound:
        return None
    pf = pq.ParquetFile(pa.BufferReader(data))
    return pf.read(columns=["remove"]).column("remove") if "remove" in pf.schema_arrow.names else None


def count(store: Store, root: str, version: int) -> int:
    """The ``remove`` tombstones in the single-part checkpoint of ``version`` (0: none, or no such checkpoint)."""
    col = _removes(store, root, version)
    return 0 if col is None else len(col) - col.null_count


def oldest(store: Store, root: str, version: int) -> int | None:
    """The earliest ``deletionTimestamp`` of the tombstones in the checkpoint of ``version`` (None: none)."""
    col = _removes(store, root, version)
    return None if col is None else pc.min(pc.struct_field(col, "deletionTimestamp")).as_py()
