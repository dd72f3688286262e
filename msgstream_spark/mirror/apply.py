"""The library call of one micro-batch: collapse the changes per pk, merge them into the table, once."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.mirror.collapse import collapse
from msgstream_spark.mirror.common import PROP_COLLECTION_ID, PROP_SNAPSHOT_TS, TS
from msgstream_spark.mirror.formats.base import MirrorTable
from msgstream_spark.mirror.write.batch import LocalRunner, run_batch
from msgstream_spark.mirror.write.layout import COLLECTION, check_narrow_collection


def apply_batch(table: MirrorTable, changes: pa.Table, pk: str, query_id: str, batch_id: int,
                commit_info: dict[str, str] | None = None) -> bool:
    """Apply one batch of ``rows`` changes (``op``, the fields, ``_ts``, ``_seq``, ``_partition``) to
    ``table``: True if applied, False if this query's batch ``batch_id`` is already in the table. ``op`` is
    ``insert``, ``update`` (an upsert read with the source option ``upsertAs=update``: the key's new row) or
    ``delete``; another op raises MirrorError naming it, and nothing is written.

    Put it in your own ``foreachBatch`` (``df.toArrow()`` of a micro-batch that fits the driver) or
    use jobs/mirror.py, which collapses in Spark first.

    If the table has the property ``msgstream.snapshot_ts`` (S, stored with the snapshot's files), changes
    at or before S are dropped: the snapshot, read at least at S, already holds them, and an old insert
    of a pk the snapshot no longer has would otherwise come back until its delete is replayed.

    ``commit_info``: ``msgstream.*`` entries recorded with the commit (Delta commit info, Iceberg snapshot
    summary), e.g. ``msgstream.watermark``, the batch's end offset (docs/mirror.md, "Freshness").

    Rows of another collection id (``_collection``; a collection dropped and re-created under the same
    name) raise MirrorError naming both ids, and nothing is written.
    """
    last = table.last_batch(query_id)
    if last is not None and last >= batch_id:
        return False
    props = table.properties()
    check_collection_ids(table, props, changes)
    changes = after_snapshot(props, changes)
    runner = LocalRunner(collapse(changes, pk, f"table {table.location}"))
    return run_batch(table, runner, query_id=query_id, batch_id=batch_id, commit_info=commit_info) is not None


def check_collection_ids(table: MirrorTable, props: dict[str, str], changes: pa.Table) -> None:
    """MirrorError if ``changes`` hold rows of a collection id other than the table's."""
    if COLLECTION in changes.column_names:
        check_narrow_collection(changes, props.get(PROP_COLLECTION_ID), table.location, table.collection)


def after_snapshot(props: dict[str, str], changes: pa.Table) -> pa.Table:
    """``changes`` newer than the table's snapshot timestamp (``props``; all of them if it has none)."""
    s = props.get(PROP_SNAPSHOT_TS)
    if s is None or changes.num_rows == 0:
        return changes
    return changes.filter(pc.greater(changes.column(TS), pa.scalar(int(s), changes.schema.field(TS).type)))
