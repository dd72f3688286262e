"""DropPartition and TruncateCollection as deletes: one rule for both mirror jobs.

Milvus removes a dropped partition's rows, and a 2.6.11+ TruncateCollection removes every row older than it (each
vchannel's copy its vchannel's rows), without a Delete on the stream. The source shows each such message as a row
of its own (``source.multi.removal``: ``output=collections``'s DDL rows for the many-collection job, ``rows``
output's ``removalRows`` rows for the one-collection job); here each becomes the deletes it amounts to, at its
time, merged by the table's :class:`~msgstream_spark.spark.mirror.MirrorBatch` with the batch's other rows (one
commit, fenced, with the batch's record: exactly once). docs/mirror.md, "What each DDL does to a table".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.mirror.common import PROP_SNAPSHOT_TS
from msgstream_spark.msg.hashing import shard_indices
from msgstream_spark.msg.seq import SEQ, seq_value
from msgstream_spark.msg.wal26.envelope import CONTROL_VCHANNEL_SUFFIX
from msgstream_spark.source.multi import KIND_DROP_PARTITION, KIND_TRUNCATE

log = logging.getLogger(__name__)

REMOVAL_OPS = (KIND_DROP_PARTITION, KIND_TRUNCATE)  # ``op`` of a ``rows`` removal row, ``kind`` of a DDL row


@dataclass(frozen=True)
class Removal:
    """One copy of a DropPartition (``partition`` its id) or a TruncateCollection (``shards``: the collection's
    shard count its broadcast header names, 0 when not named) on vchannel ``shard`` at Milvus time ``ts``."""

    kind: str
    ts: int
    shard: str = ""
    partition: int | None = None
    shards: int = 0


@dataclass
class Target:
    """The table a batch's removals apply to: its key, the batch rows' Arrow schema, the collection id, and the
    time of the table's snapshot (a removal at or before it is in the snapshot already; None: no snapshot)."""

    table: Any
    pk: str
    rows_schema: pa.Schema
    collection_id: int | None
    min_ts: int | None = None


def removals_of(ddl: list) -> dict[int, list[Removal]]:
    """A batch's DropPartition and TruncateCollection rows (``collections`` DDL rows) by collection id, in stream
    order; a 2.6.6+ copy on the control vchannel is left out (each data vchannel has its own, at its own time)."""
    out: dict[int, list[Removal]] = {}
    for r in ddl:
        if r["kind"] in REMOVAL_OPS and not (r["_shard"] or "").endswith(CONTROL_VCHANNEL_SUFFIX):
            out.setdefault(r["_collection"], []).append(
                Removal(r["kind"], r["_ts"], r["_shard"] or "", r["_partition"], r["rows"] or 0))
    return out


def removal_rows(rows: list) -> list[Removal]:
    """A batch's ``removalRows`` rows of ``rows`` output (``op`` drop_partition / truncate: ``_partition`` the
    partition id, or the truncate's shard count), in stream order, the control vchannel's copies left out."""
    out = []
    for r in rows:
        shard = r["_shard"] or ""
        if shard.endswith(CONTROL_VCHANNEL_SUFFIX):
            continue
        drop = r["op"] == KIND_DROP_PARTITION
        out.append(Removal(r["op"], r["_ts"], shard, r["_partition"] if drop else None,
                           0 if drop else (r["_partition"] or 0)))
    return out


def with_removals(t: Target, rows, removals: list[Removal]):
    """``rows`` (a DataFrame of ``t.rows_schema``) and the deletes each of ``removals`` amounts to."""
    for r in removals:
        if t.min_ts is not None and r.ts <= t.min_ts:
            continue  # before the table's snapshot: the snapshot's rows have it
        more = (partition_deletes(t, rows, r.partition, r.ts) if r.kind == KIND_DROP_PARTITION
                else truncate_deletes(t, rows, r.shard, r.shards, r.ts))
        rows = rows.unionByName(more)
    return rows


def _deletes(t: Target, rows, keys: set, ts: int, pid: int):
    """One delete at ``ts`` of each of ``keys`` as a DataFrame of ``t.rows_schema``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    n = len(keys)
    fixed = {"op": pa.array(["delete"] * n), t.pk: pa.array(sorted(keys), t.rows_schema.field(t.pk).type),
             "_collection": pa.array([t.collection_id] * n, pa.int64()),
             "_partition": pa.array([pid] * n, pa.int64()), "_ts": pa.array([ts] * n, pa.int64()),
             SEQ: pa.array([Decimal(seq_value(ts, "delete"))] * n, t.rows_schema.field(SEQ).type)}
    cols = [fixed.get(f.name, pa.nulls(n, f.type)) for f in t.rows_schema]
    table = pa.Table.from_arrays(cols, schema=t.rows_schema)
    return rows.sparkSession.createDataFrame(table, schema=from_arrow_schema(t.rows_schema))


def partition_deletes(t: Target, rows, pid: int, ts: int):
    """A DropPartition of partition ``pid`` at ``ts`` as the deletes Milvus's drop amounts to: one delete at
    ``ts`` of every key in that partition, in the table or in the batch's rows before ``ts``. A row written after
    the drop (a partition of the same name is a new partition id) is newer and stays."""
    from pyspark.sql import functions as F

    current = t.table.to_arrow([t.pk, "_partition"])  # the two columns only: no vector is read
    keys = set(current.filter(pc.equal(current.column("_partition"), pid)).column(t.pk).to_pylist())
    keys |= {r[0] for r in rows.where((F.col("_partition") == pid) & (F.col("_ts") < ts)).select(t.pk).collect()}
    log.info("collection id %s: partition %d dropped at %d: %d rows deleted", t.collection_id, pid, ts, len(keys))
    return _deletes(t, rows, keys, ts, pid)


def truncate_deletes(t: Target, rows, shard: str, shards: int, ts: int):
    """One copy of a 2.6 TruncateCollection, on vchannel ``shard`` at ``ts``, as deletes: Milvus drops that
    vchannel's rows older than ``ts`` (each vchannel has its own copy, at its own time). The batch's rows are
    taken by their ``_shard``; the table's (which keep no vchannel) by their primary key's shard (Milvus's hash,
    modulo ``shards``, the collection's vchannel count its broadcast header names, against the ``v<i>`` of
    ``shard``), every one older than ``ts`` when either is unknown. A row written after the copy stays."""
    from pyspark.sql import functions as F

    current = t.table.to_arrow([t.pk, "_ts"])
    current = current.filter(pc.less(current.column("_ts"), pa.scalar(ts, pa.int64())))
    index = shard_index(shard)
    if shards > 0 and index is not None and current.num_rows:
        on = pa.array(shard_indices(current.column(t.pk).to_numpy(), shards) == index)
        current = current.filter(on)
    keys = set(current.column(t.pk).to_pylist())
    mine = (F.col("_shard") == shard) | F.col("_shard").isNull()
    keys |= {r[0] for r in rows.where(mine & (F.col("_ts") < ts)).select(t.pk).collect()}
    log.info("collection id %s: truncated at %d on %s: %d rows deleted", t.collection_id, ts, shard, len(keys))
    return _deletes(t, rows, keys, ts, -1)


def shard_index(vchannel: str) -> int | None:
    """The shard index ``i`` of a vchannel ``<pchannel>_<collection id>v<i>`` (None: another form)."""
    tail = vchannel.rsplit("_", 1)[-1]
    head, _, i = tail.rpartition("v")
    return int(i) if head.isdigit() and i.isdigit() else None


class RemovingBatch:
    """The one-collection job's ``foreachBatch`` function: a ``rows`` stream read with ``removalRows`` into
    ``sink`` (its :class:`~msgstream_spark.spark.mirror.MirrorBatch`). The batch is read once, by the write's own
    tasks, with nothing cached: they leave its removal rows (one per DropPartition / Truncate copy) unwritten and
    return them, with the count of the rows they read, beside their files. A batch that has some (rare) is written
    again, inside the same attempt, as its rows without them plus the deletes they amount to (its source read a
    second time); the first write's files go with the attempt. Either way one commit, fenced, with the batch's
    record. ``rows`` counts the batches' rows (each once: only successful task results reach the driver). The
    table's snapshot S (``msgstream.snapshot_ts``): a removal at or before it is in the snapshot already."""

    def __init__(self, sink: Any, on_query_start: Any = None) -> None:
        self.on_query_start = on_query_start  # told the query once it runs (``jobs.mirror_query.run_into``)
        s = sink.table.properties().get(PROP_SNAPSHOT_TS)
        self.sink, self.min_ts = sink, (int(s) if s else None)
        self.removals = 0  # removal copies applied (summed over the batches)
        sink.aside, sink.rework = REMOVAL_OPS, self._rework

    @property
    def rows(self) -> int:
        """The batches' rows the job wrote (the job's ``stream_rows``; a batch already in the table is not read)."""
        return self.sink.read_rows

    def _rework(self, df, found: list[dict]):
        """The batch as written with its removals: its other rows and the deletes each removal amounts to."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_schema

        removals = removal_rows(sorted(found, key=lambda r: (r["_ts"], r["_shard"] or "")))
        rows = df.where(~F.col("op").isin(*REMOVAL_OPS))
        s = self.sink
        t = Target(s.table, s.pk, to_arrow_schema(rows.schema, timezone="UTC"), s.collection_id, self.min_ts)
        self.removals += len(removals)
        return with_removals(t, rows, removals)

    def __call__(self, df, batch_id: int) -> None:
        if self.sink.history is None:
            return self.sink(df, batch_id)
        df = df.persist()  # the change log's tasks read the batch again
        try:
            self.sink(df, batch_id)
        finally:
            df.unpersist()
