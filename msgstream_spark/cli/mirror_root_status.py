"""``msgstream mirror status --table-root ROOT``: every table a many-collection job keeps under ``ROOT``.

The tables are the ones the job's collection list names (``<checkpoint>/collections.json``, ``mirror.many``;
the checkpoint defaults to ``<root>_checkpoint`` for a local root, as the job's does), else, for a local root
with no list, every table found at ``<root>/<database>/<collection>``. Each one is answered as ``mirror status
--table`` answers for one table (version, the last batch, freshness and backlog per channel, stalled), with its
database, collection id and dropped mark (``msgstream.mirror.dropped_ts``: the collection was dropped at that
Milvus time; the table keeps its last state). A table that cannot be read is listed with its error and the
command exits 1 after printing the others.
"""

from __future__ import annotations

import os
import time
from typing import Any

from msgstream_spark.cli.common import UsageError
from msgstream_spark.cli.table_args import table_options
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.many import PROP_DROPPED_TS, STATE_FILE, ManyState
from msgstream_spark.mirror.table import open_table
from msgstream_spark.mirror.verify.pinned import PinnedTable, table_identity
from msgstream_spark.mirror.verify.status import table_status
from msgstream_spark.mirror.watermark import Watermark, checkpoint_offset, checkpoint_query_id, table_watermark


def root_checkpoint(args) -> str | None:
    """``--checkpoint``, else ``<root>_checkpoint`` for a local root (the job's default), else None."""
    if getattr(args, "checkpoint", None):
        return args.checkpoint
    root = args.table_root
    if "://" in root and not root.startswith("file://"):
        return None
    return root.removeprefix("file://").rstrip("/") + "_checkpoint"


def root_tables(root: str, checkpoint: str | None) -> list[dict[str, Any]]:
    """(database, collection, id, location, dropped_ts) of each table under ``root``: the job's collection list,
    else (a local root) the directories two levels down."""
    if checkpoint and os.path.exists(os.path.join(checkpoint, STATE_FILE)):
        state = ManyState.load(checkpoint)
        return [{"database": k.db, "collection": k.name, "collection_id": cid, "table": k.location,
                 "dropped_ts": k.dropped_ts} for cid, k in sorted(state.known.items()) if k.location]
    local = root.removeprefix("file://")
    if "://" in local:
        raise UsageError(f"--table-root {root} is in object storage and no collection list was found: pass "
                         f"--checkpoint DIR, the job's checkpoint directory (it holds {STATE_FILE})")
    if not os.path.isdir(local):
        raise MirrorError(f"--table-root {root}: no such directory (and no collection list at {checkpoint})")
    out = []
    for db in sorted(os.listdir(local)):
        if db.startswith(".") or not os.path.isdir(os.path.join(local, db)):  # .msgstream-staged: no database
            continue
        for name in sorted(os.listdir(os.path.join(local, db))):
            out.append({"database": db, "collection": name.split("__")[0], "collection_id": None,
                        "table": os.path.join(local, db, name), "dropped_ts": None})
    return out


def job_watermark(checkpoint: str | None, qid: str | None) -> Watermark | None:
    """Where the job has applied every table to: the end offset of the last batch Spark's checkpoint records as
    committed (``commits/<N>``: written after the batch's ``foreachBatch`` returned, every touched table
    committed). A table no batch since its last commit touched is complete to it too: nothing of its collection
    lay between."""
    commits = os.path.join(checkpoint or "", "commits")
    if not checkpoint or not os.path.isdir(commits):
        return None
    done = [int(n) for n in os.listdir(commits) if n.isdigit()]
    off = checkpoint_offset(checkpoint, max(done)) if done else None
    return None if off is None else Watermark(off, "job", max(done), qid)


def _newer(wm: Watermark | None, job: Watermark | None) -> Watermark | None:
    if job is None or (wm is not None and wm.ts >= job.ts):
        return wm
    return job


def one_table(args, entry: dict[str, Any], client: Any, qid: str | None, checkpoint: str | None,
              now_ms: int, job: Watermark | None = None) -> dict[str, Any]:
    """The status of one table under the root (as ``mirror status --table``), with its place in the database."""
    opts = table_options(args)
    where = entry["table"]
    fmt = args.table_format or next(iter(registry.detect_at(where, opts["storage_options"])), None)
    if fmt is None:
        raise MirrorError(f"no mirrored table at {where}")
    name, pk = table_identity(fmt, where, **opts)
    table = open_table(fmt, where, collection=name, pk=pk, create=False, **opts)
    pinned = PinnedTable(table)
    q = pinned.committed_by[0]
    wm = table_watermark(table.properties(), pinned.recorded_watermark if q == qid else None,
                         pinned.last_batch(qid) if qid else None, qid, checkpoint)
    dropped = table.properties().get(PROP_DROPPED_TS) or entry["dropped_ts"]
    if dropped is None:  # a dropped collection's table stays at its drop: the job goes on without it
        wm = _newer(wm, job)
    doc = table_status(pinned, wm, client, now_ms, args.stalled_after)
    if dropped is not None:  # the log's later data is other collections': nothing this table lacks
        doc["stalled"] = False
    return {"database": entry["database"], "collection_id": entry["collection_id"], **doc,
            "last_batch": pinned.last_batch(qid) if qid else pinned.committed_by[1],
            "dropped_ts": int(dropped) if dropped is not None else None}


def root_status(args, client: Any) -> tuple[dict[str, Any], bool]:
    """(the status document of every table under ``--table-root``, whether every table was read)."""
    checkpoint = root_checkpoint(args)
    qid = checkpoint_query_id(checkpoint) if checkpoint and os.path.isdir(checkpoint) else None
    now_ms = int(time.time() * 1000)
    tables, ok = [], True
    job = job_watermark(checkpoint, qid)
    for entry in root_tables(args.table_root, checkpoint):
        try:
            tables.append(one_table(args, entry, client, qid, checkpoint, now_ms, job))
        except Exception as exc:  # noqa: BLE001 - one unreadable table is reported; the others still are
            ok = False
            tables.append({**entry, "error": f"{type(exc).__name__}: {exc}"[:500]})
    fresh = [t["freshness_ms"] for t in tables if t.get("freshness_ms") is not None]
    summary = {"tables": len(tables), "dropped": sum(1 for t in tables if t.get("dropped_ts") is not None),
               "stalled": sum(1 for t in tables if t.get("stalled")), "errors": sum(1 for t in tables if "error" in t),
               "freshness_ms_max": max(fresh) if fresh else None,
               "backlog_rows_max": max([t.get("backlog_rows") or 0 for t in tables], default=0)}
    return {"table_root": args.table_root, "checkpoint": checkpoint, "job_batch": None if job is None else job.batch,
            "tables": tables, "summary": summary}, ok
