"""Where the mirror job's stream starts: a resumed query, a recorded handover, or a new table.

A new table with ``--snapshot initial`` (or ``when_needed``): every input is checked before anything
is written (``milvus.address`` set, the collection exists in Milvus, its key is the stream's); then
the channels' positions are taken, S is their newest Milvus time, the collection is read by Spark
tasks with Strong queries (each later than S) into Parquet files, and those files become the table's
first data with the stream's start positions recorded next to them. A table that exists continues:
from its checkpoint, or (no checkpoint yet) from the positions recorded with its snapshot.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from jobs._common import parse_kv
from msgstream_spark.errors import MirrorError

log = logging.getLogger("jobs.mirror")

START_PROPERTY = "msgstream.mirror.start"
S_PROPERTY = "msgstream.mirror.snapshot_ts"
COLLECTION_PROPERTY = "msgstream.mirror.collection_id"


@dataclass
class Start:
    table: Any
    starting: str | None  # startingPositions for a new query (None: the checkpoint decides)
    collection_id: int | None
    summary: dict[str, Any] = field(default_factory=dict)


def _open(args, pk: str, schema, create: bool):
    from msgstream_spark.mirror.table import open_table

    return open_table(args.table_format, args.table, collection=args.collection, pk=pk, arrow_schema=schema,
                      catalog_uri=args.catalog_uri, create=create)


def _existing(args, pk: str, schema):
    """The table if it exists (a table of another collection or key fails here, nothing written)."""
    from msgstream_spark.mirror.table import table_exists

    if not table_exists(args.table_format, args.table, collection=args.collection, catalog_uri=args.catalog_uri):
        return None
    return _open(args, pk, schema, create=False)


def _channels(client, args, cfg) -> list[str]:
    if args.channels:
        return [c.strip() for c in args.channels.split(",") if c.strip()]
    prefix = cfg.dml_channel_names(1)[0].rsplit("_", 1)[0]
    pat = re.compile(rf"^{re.escape(prefix)}_[0-9]+$")
    return sorted(c for c in client.list_channels() if pat.match(c))


def decide_start(spark, args, cfg, probe, pk: str, cid: int | None, checkpoint: str) -> Start:
    from jobs.mirror import table_schema

    schema = table_schema(probe)
    table = _existing(args, pk, schema)
    if table is not None:
        props = table.properties()
        tcid = int(props[COLLECTION_PROPERTY]) if props.get(COLLECTION_PROPERTY) else cid
        if os.path.isdir(os.path.join(checkpoint, "offsets")):
            return Start(table, None, tcid, {"mode": "resumed"})
        starting = props.get(START_PROPERTY) or args.starting
        return Start(table, starting, tcid, {"mode": "recorded start" if props.get(START_PROPERTY) else "stream"})
    if args.snapshot == "never":
        return Start(_open(args, pk, schema, create=True), args.starting, cid, {"mode": "never"})
    return _snapshot(spark, args, cfg, schema, pk)


def _snapshot(spark, args, cfg, schema, pk: str) -> Start:
    from msgstream_spark.mirror.order import snapshot_seq
    from msgstream_spark.mirror.snapshot import (
        RangeReader,
        describe,
        milvus_target,
        plan_ranges,
        snapshot_ts,
        starting_positions,
        take_positions,
    )
    from msgstream_spark.spark.snapshot import write_snapshot
    from msgstream_spark.stream.factory import Factory

    target = milvus_target(cfg, args.config, parse_kv(args.option), args.collection)
    info = describe(target)
    if info.pk != pk:
        raise MirrorError(f"collection {args.collection!r}: Milvus names primary key {info.pk!r}, the stream's schema "
                          f"{pk!r} (is the config's log the cluster at milvus.address={target.address}?)")
    with Factory(cfg).client() as client:  # 1. positions, 2. S: before any row is read
        positions = take_positions(client, _channels(client, args, cfg))
    s = snapshot_ts(positions)
    mc = target.client()
    try:
        tasks = args.snapshot_tasks or spark.sparkContext.defaultParallelism
        ranges = plan_ranges(mc, info, args.collection, tasks)
    finally:
        mc.close()
    log.info("snapshot of %s: S=%d, %d rows, %d range(s), positions %s", args.collection, s, info.row_count,
             len(ranges), {ch: (p.timestamp if p else None) for ch, p in positions.items()})
    table = _open(args, pk, schema, create=True)
    out = os.path.join(args.table, f"snapshot-{s}-{uuid.uuid4().hex[:8]}")
    reader = RangeReader(target, info, schema, {"_ts": s, "_seq": snapshot_seq(s)})
    files = write_snapshot(spark, reader, ranges, out, info.row_count, args.progress_interval)
    starting = starting_positions(positions)
    table.add_files(files.files, properties={START_PROPERTY: starting, S_PROPERTY: str(s),
                                             COLLECTION_PROPERTY: str(info.collection_id)})
    return Start(table, starting, info.collection_id,
                 {"mode": "initial", "S": s, "rows": files.rows, "files": len(files.files), "ranges": len(ranges),
                  "positions": json.loads(starting)})
