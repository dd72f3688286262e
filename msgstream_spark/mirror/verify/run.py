"""``msgstream mirror verify``: the library call behind it (:func:`run_verify`), the report table and
``--repair``. See :mod:`msgstream_spark.mirror.verify.compare` for the method and docs/mirror.md for its use."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.mirror.collapse import OP
from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.formats.base import Plan
from msgstream_spark.mirror.order import SEQ, snapshot_seq_array
from msgstream_spark.mirror.snapshot.handover import snapshot_ts, take_positions
from msgstream_spark.mirror.store.writer import writer_lock
from msgstream_spark.mirror.verify.compare import (
    DEFAULT_BUCKETS,
    Result,
    compare,
    hashed_columns,
    reduce_side,
    split_flux,
    summarize,
)
from msgstream_spark.mirror.verify.milvus_side import MilvusSide
from msgstream_spark.mirror.verify.pinned import PinnedTable
from msgstream_spark.mirror.watermark import Watermark, checkpoint_query_id, table_watermark
from msgstream_spark.mirror.write.batch import lookup_local, run_batch
from msgstream_spark.mirror.write.layout import FILE, POS, TaskWriter
from msgstream_spark.source.arrow import output_schema, read_options, schema_json
from msgstream_spark.source.offsets import Offset, resolve_end
from msgstream_spark.source.read import collection_filter, plan_reads, read_range
from msgstream_spark.stream.factory import Factory

log = logging.getLogger(__name__)

REPAIR_QUERY = "msgstream.verify.repair"  # the query id of repair commits (batch ids count up)


@dataclass
class Log:
    """What verify needs of the log: channel ends and times, and the keys changed between two offsets."""

    config: Any
    collection: str

    def client(self):
        return Factory(self.config).client()

    def newest_time(self, channels: list[str]) -> int:
        """S: the newest Milvus time among the channels' last messages."""
        with self.client() as c:
            return snapshot_ts(take_positions(c, channels))

    def ends(self, channels: list[str]) -> Offset:
        with self.client() as c:
            return resolve_end(c, channels, "latest", None)

    def changed_keys(self, start: Offset, end: Offset, pk: str) -> set:
        """Primary keys of the collection's inserts and deletes in (start, end] of each channel."""
        channels = sorted(start)
        opts = read_options(self.config, channels, collection=self.collection)
        client = opts.client()
        try:
            schema, pkname, cid = output_schema(opts, channels)
            ranges = plan_reads(client, start, end, opts, schema_json(schema, cid), pkname, collection_filter(opts))
        finally:
            client.close()
        keys: set = set()
        for r in ranges:
            for b in read_range(r, schema):
                if b.num_rows and pk in b.schema.names:
                    keys.update(pc.unique(b.column(pk)).to_pylist())
        return keys


def _pin(table, checkpoint: str | None, s: int | None, wait: float) -> tuple[PinnedTable, Watermark | None]:
    """The table pinned at its current version (waiting up to ``wait`` s for a watermark at or past ``s``)."""
    qid = checkpoint_query_id(checkpoint) if checkpoint else None
    deadline = time.monotonic() + wait
    while True:
        pinned = PinnedTable(table)
        q, b = pinned.committed_by
        last = pinned.last_batch(qid) if qid else None
        wm = table_watermark(table.properties(), pinned.recorded_watermark if q == qid else None, last, qid,
                             checkpoint)
        if s is None or (wm is not None and wm.ts >= s) or time.monotonic() >= deadline:
            return pinned, wm
        time.sleep(0.5)  # polling the table for the job's next commit (bounded by --wait)


def run_verify(table, milvus: MilvusSide, log_: Log, *, checkpoint: str | None, buckets: int = DEFAULT_BUCKETS,
               wait: float = 0.0) -> Result:
    """Compare ``table`` with the collection behind ``milvus``; keys changed in the log after the table's
    watermark are reported ``in_flux``, not as errors. ``wait``: seconds to wait for the table (a running
    job) to commit a watermark at or past S before it is pinned."""
    started = time.perf_counter()
    s0 = None
    if wait > 0:
        wm0 = _pin(table, checkpoint, None, 0)[1]
        if wm0 is not None:
            s0 = log_.newest_time(sorted(wm0.offset))
    pinned, wm = _pin(table, checkpoint, s0, wait)
    schema = table.schema
    cols = hashed_columns(schema, milvus.by_partition)
    tside = reduce_side(pinned.batches(), table.pk, cols, milvus.json_columns, buckets, milvus.by_partition)
    channels = sorted(wm.offset) if wm is not None else None
    s = log_.newest_time(channels) if channels else 0
    mside = reduce_side(milvus.scan(schema, s), table.pk, cols, milvus.json_columns, buckets, milvus.by_partition)
    problems, differing = compare(mside, tside)
    changed: set = set()
    if problems and wm is not None:
        end = log_.ends(channels)
        changed = log_.changed_keys(wm.offset, end, table.pk)
    elif problems:
        log.warning("table %s records no position in the log: every difference is reported", table.location)
    errors, flux = split_flux(problems, changed)
    summary = summarize(errors, flux, mside, tside, differing, started, S=s, milvus_read="at least S",
                        table_version=pinned.version,
                        watermark=None if wm is None else {"source": wm.source, "ts": wm.ts, "batch": wm.batch})
    return Result(errors, flux, summary)


def write_report(result: Result, location: str, run_id: str, storage_options: dict | None = None) -> None:
    """Append the report's keys (kind, pk as text, run id, time) to the report table at ``location`` (a path or
    a URI; ``storage_options`` over the environment's settings, as for the mirrored table; ``registry.append_report``:
    a Delta table)."""
    rows = [*result.problems, *result.in_flux]
    now = int(time.time() * 1000)
    t = pa.table({"run_id": pa.array([run_id] * len(rows), pa.string()),
                  "kind": pa.array([r["kind"] for r in rows], pa.string()),
                  "pk": pa.array([str(r["pk"]) for r in rows], pa.string()),
                  "equal": pa.array([result.equal] * len(rows), pa.bool_()),
                  "checked_at_ms": pa.array([now] * len(rows), pa.int64())})
    if not rows:  # a clean run is recorded too: one row of kind "none"
        t = pa.table({"run_id": [run_id], "kind": ["none"], "pk": pa.array([None], pa.string()),
                      "equal": [True], "checked_at_ms": pa.array([now], pa.int64())})
    registry.append_report(location, t, storage_options)


def _changes(rows: pa.Table, op: str) -> pa.Table:
    return rows.append_column(OP, pa.array([op] * rows.num_rows, pa.string()))


def repair(table, milvus: MilvusSide, log_: Log, result: Result, channels: list[str]) -> dict[str, Any]:
    """Re-read the report's keys from Milvus and make the table hold exactly Milvus's rows of them, in one commit
    under the query id ``msgstream.verify.repair`` (exactly once; its batch ids count up): every live row of a
    reported key is deleted by its position, whatever ``_seq`` it carries (a wrong row may carry any), and Milvus's
    row of each key it still has is written. The repaired row wins because it comes from Milvus, not because of
    its ``_seq``. The rows are Milvus's state at S (read at least at S: ``_ts`` = S, ``_seq`` = snapshot_seq(S)),
    like a snapshot's: the stream's later changes win over them."""
    keys = sorted({p["pk"] for p in result.problems}, key=str)
    if not keys:
        return {"keys": 0, "deleted": 0, "written": 0}
    s = log_.newest_time(channels)
    schema = table.schema
    rows = milvus.rows_of(keys, schema, s)
    rows = rows.set_column(rows.schema.get_field_index(SEQ), SEQ,
                           snapshot_seq_array(s, rows.num_rows).cast(schema.field(SEQ).type))
    last = table.last_batch(REPAIR_QUERY)  # batch 0 is a batch: `(last or -1) + 1` would reuse it, skipped as done
    batch = 0 if last is None else last + 1
    plan = replace_rows(table, pa.array(keys, schema.field(table.pk).type), rows, query_id=REPAIR_QUERY,
                        batch_id=batch)
    deleted = 0 if plan is None else sum(len(v) for v in plan.deletes.values())
    return {"keys": len(keys), "deleted": deleted, "written": rows.num_rows if plan is not None else 0, "S": s}


def replace_rows(table, keys: pa.Array, rows: pa.Table, *, query_id: str, batch_id: int) -> Plan | None:
    """One commit (``query_id``'s ``batch_id``: None if the table already holds it) after which ``keys`` have
    exactly ``rows`` (a key without one has no row): the keys' live rows deleted by position, whatever their
    ``_seq``, and ``rows`` written as a new data file, kept whatever their ``_ts`` (no snapshot-time filter). The
    batch's steps (``write.batch.run_batch``) under the table's writer lock from the lookup to the commit, so no
    other commit of this library comes between."""
    with writer_lock(table.store, table.location, f"the repair's commit (batch {batch_id})") as hold:
        return run_batch(table, _Repair(keys, rows), query_id=query_id, batch_id=batch_id, hold=hold)


class _Repair:
    """The repair's runner of a batch's steps (``write.batch.Runner``), in this process: ``rows`` written as they
    are, every live row of ``keys`` deleted."""

    def __init__(self, keys: pa.Array, rows: pa.Table) -> None:
        self.keys, self.rows = keys, rows

    def begin(self, table, hold, query_id: str, batch_id: int) -> bool:
        done = table.last_batch(query_id)
        return done is None or done < batch_id

    def columns(self) -> pa.Schema:
        return self.rows.schema

    def write(self, spec) -> list[str]:
        w = TaskWriter(dataclasses.replace(spec, snapshot_ts=None))
        try:
            if self.rows.num_rows:
                w.add(_changes(self.rows, "insert"))
        except BaseException:
            w.abort()
            raise
        return sorted(f.path for f in w.close() if f.rows)

    def plan(self, table, adds: list[str]) -> tuple[Plan, set[int]]:
        matches = lookup_local(table, self.keys)
        deletes: dict[str, np.ndarray] = {}
        for path in pc.unique(matches.column(FILE)).to_pylist():
            pos = matches.filter(pc.equal(matches.column(FILE), path)).column(POS)
            deletes[path] = np.unique(pos.to_numpy().astype(np.uint64))
        return Plan(adds, deletes, len(self.keys)), set()

    def end(self, table, hold, written, committed: bool) -> None:
        """Nothing to clean up (a failed commit's file is an orphan: ``orphans``, vacuum)."""
