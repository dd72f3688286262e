"""The mirror job's snapshot from Milvus's storage (``--snapshot-source storage``, issue #30).

Flush the collection; read its segments, logs and every vchannel checkpoint from etcd at one revision;
Spark tasks (about one per core, each a set of segments whose keys no other task holds) read the insert
binlogs (rows at or before their channel's checkpoint, deletes applied with Milvus's rule, one row per
key) and write the table's first files, one each; the stream starts at the checkpoints. S (recorded as
``msgstream.snapshot_ts``) is the oldest checkpoint: every change at or before it is in the files, and
each channel's stream starts after its own checkpoint. A planned file garbage-collected mid-read plans
the snapshot again (up to three times), then fails naming the segment and ``dataCoord.gc.dropTolerance``.
"""

from __future__ import annotations

import json
import logging
import uuid

from msgstream_spark.errors import MirrorError

log = logging.getLogger("msgstream_spark.jobs.mirror")


def storage_snapshot(spark, args, cfg, table, schema, pk: str, channels: list[str], replace: bool = False):
    """(files, starting positions JSON, summary) of a snapshot read from storage into ``table``'s location."""
    from msgstream_spark.mirror.snapshot.handover import milvus_target
    from msgstream_spark.mirror.snapshot.storage.snapshot import prepare, with_replans
    from msgstream_spark.mirror.table import table_schema
    from msgstream_spark.spark.storage_snapshot import write_storage_snapshot

    target = milvus_target(cfg, args.collection)

    def attempt():
        mc = target.client()
        try:
            if not mc.has_collection(args.collection):
                raise MirrorError(f"collection {args.collection!r} does not exist in Milvus at {target.address}")
            prep = prepare(cfg, mc, args.collection, table_schema(schema, pk), pk)
        finally:
            mc.close()
        if table.collection_id is not None and table.collection_id != prep.collection_id:
            raise MirrorError(f"collection {args.collection!r} has id {prep.collection_id} in Milvus, but the log's "
                              f"newest collection of that name has id {table.collection_id}")
        out = table.store.join(f"snapshot-{prep.plan.snapshot_ts}-{uuid.uuid4().hex[:8]}")
        packing = prep.packing(spark.sparkContext.defaultParallelism)
        files = write_storage_snapshot(spark, prep.reader, packing, out, prep.plan.rows, args.progress_interval,
                                       table.store)
        return prep, files, packing

    prep, files, packing = with_replans(attempt)
    table.collection_id = prep.collection_id
    starting = json.dumps(prep.plan.starting_positions(channels), sort_keys=True)
    summary = {"mode": "replaced" if replace else "initial", "source": "storage", "S": prep.plan.snapshot_ts,
               "rows": files.rows, "files": len(files.files), "tasks": len(packing.tasks),
               "binlog_groups": len(prep.plan.tasks), "key_pass": len(packing.key_pass),
               "segments": len(prep.plan.segments), "etcd_revision": prep.plan.revision,
               "positions": json.loads(starting)}
    return files, starting, summary
