"""Where the mirror job's stream starts: a resumed query, a recorded handover, or a new table.

A new table with ``--snapshot initial`` (or ``when_needed``): every input is checked before anything
is written (``milvus.address`` set, the collection exists in Milvus, its key is the stream's); then
the channels' positions are taken, S is their newest Milvus time, the collection is read by Spark
tasks with Strong queries (each later than S) into Parquet files, and those files become the table's
first data with the stream's start positions recorded next to them. A table that exists continues:
from its checkpoint, or (no checkpoint yet) from the positions recorded with its snapshot. With
``when_needed``, if that resume position is no longer readable (the backend's seek reports data loss:
retention removed it), a new snapshot replaces the table's rows in one commit and the old checkpoint
is moved aside, so the stream starts afresh from the new positions (issue #20).

A table and its checkpoint belong together (issue #32): a checkpoint with progress but no table, a checkpoint
whose committed batches the table never took, and a table that took stream batches but lost its checkpoint
(a new query would replay changes the table already has) fail with an error naming both; with
``when_needed`` the last one is re-snapshotted. A table with neither S, start positions nor a checkpoint is
snapshotted like a new one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from dataclasses import replace as replace_target
from typing import Any

from msgstream_spark.cli.table_args import table_options
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_COLLECTION_ID, PROP_SNAPSHOT_TS

log = logging.getLogger("msgstream_spark.jobs.mirror")

START_PROPERTY = "msgstream.mirror.start"
S_PROPERTY = PROP_SNAPSHOT_TS


@dataclass
class Start:
    table: Any
    starting: str | None  # startingPositions for a new query (None: the checkpoint decides)
    collection_id: int | None
    summary: dict[str, Any] = field(default_factory=dict)


def _open(args, pk: str, schema, cid: int | None, create: bool):
    """The table (a table of another collection, key or id fails here, nothing written)."""
    from msgstream_spark.mirror.table import open_table

    return open_table(args.table_format, args.table, collection=args.collection, pk=pk, arrow_schema=schema,
                      create=create, collection_id=cid, **table_options(args))


def _exists(table) -> bool:
    """Whether ``open_table(create=False)`` found a table (its metadata reads only then)."""
    try:
        table.properties()
    except MirrorError as exc:
        log.debug("no table yet: %s", exc)
        return False
    return True


def _channels(client, args, cfg) -> list[str]:
    if args.channels:
        return [c.strip() for c in args.channels.split(",") if c.strip()]
    prefix = cfg.dml_channel_names(1)[0].rsplit("_", 1)[0]
    pat = re.compile(rf"^{re.escape(prefix)}_[0-9]+$")
    return sorted(c for c in client.list_channels() if pat.match(c))


def positions_now(args, cfg) -> str:
    """The channels' positions now (``startingPositions`` JSON: after each channel's last message)."""
    from msgstream_spark.mirror.snapshot.handover import starting_positions, take_positions
    from msgstream_spark.stream.factory import Factory

    with Factory(cfg).client() as client:
        return starting_positions(take_positions(client, _channels(client, args, cfg)))


def decide_start(spark, args, cfg, schema, pk: str, cid: int | None, checkpoint: str) -> Start:
    """``schema``: the Arrow schema of the stream's rows (the table keeps the fields, ``_ts``, ``_seq``)."""
    table = _open(args, pk, schema, cid, create=False)
    progress = os.path.isdir(os.path.join(checkpoint, "offsets"))
    if not _exists(table):
        if progress:
            raise MirrorError(f"checkpoint {checkpoint} holds a query's progress but there is no table at "
                              f"{args.table}: the stream would resume from that checkpoint, not from a snapshot or "
                              "--from, and the table would miss everything before it. Remove the checkpoint (or "
                              "pass another --checkpoint) to start the table afresh; nothing written")
    else:
        props = table.properties()
        tcid = int(props[PROP_COLLECTION_ID]) if props.get(PROP_COLLECTION_ID) else cid
        if args.snapshot == "when_needed":
            lost = _lost(cfg, resume_offset(checkpoint, props.get(START_PROPERTY) or args.starting))
            if lost:
                for ch, why in lost.items():
                    log.warning("mirror of %s: the stream cannot resume on channel %s: %s", args.collection, ch, why)
                log.warning("mirror of %s: taking a new snapshot to replace the table's rows (--snapshot when_needed)",
                            args.collection)
                start = _snapshot(spark, args, cfg, table, schema, pk, replace=True)
                start.summary["lost"] = lost
                start.summary["old_checkpoint"] = _retire(checkpoint, start.summary["S"])
                return start
        if progress:
            _check_owner(table, args.table, checkpoint)
            return Start(table, None, tcid, {"mode": "resumed"})
        merged = sorted(table.merged_queries())
        if merged and args.snapshot == "when_needed":
            log.warning("mirror of %s: table %s took batches of query %s but checkpoint %s is gone: taking a new "
                        "snapshot to replace the table's rows (--snapshot when_needed)", args.collection, args.table,
                        merged[-1], checkpoint)
            return _snapshot(spark, args, cfg, table, schema, pk, replace=True)
        if merged:
            raise MirrorError(f"table {args.table} took stream batches of query {', '.join(merged)}, but its "
                              f"checkpoint {checkpoint} is gone: a new query would replay the stream from "
                              f"{'the snapshot positions' if props.get(START_PROPERTY) else '--from'}, and a row "
                              "deleted later in the stream would reappear until its delete replays. Restore the "
                              "checkpoint (--checkpoint), or run with --snapshot when_needed to replace the table's "
                              "rows by a new snapshot; nothing written")
        if args.snapshot != "never" and not props.get(START_PROPERTY) and not props.get(S_PROPERTY):
            # no snapshot, no start positions, no checkpoint: a first version that never got its files (an
            # Iceberg table of an older release killed between its two commits) or a --snapshot never table
            # that never streamed; streaming from --from would skip what the log no longer holds
            log.warning("mirror of %s: table %s has no snapshot, no start positions and no checkpoint: taking a "
                        "snapshot (--snapshot %s)", args.collection, args.table, args.snapshot)
            return _snapshot(spark, args, cfg, table, schema, pk, replace=True)
        starting = props.get(START_PROPERTY) or args.starting
        return Start(table, starting, tcid, {"mode": "recorded start" if props.get(START_PROPERTY) else "stream"})
    if args.snapshot == "never":
        return Start(_open(args, pk, schema, cid, create=True), args.starting, cid, {"mode": "never"})
    return _snapshot(spark, args, cfg, table, schema, pk)


def _check_owner(table, location: str, checkpoint: str) -> None:
    """MirrorError if the checkpoint committed batches that the table never took (the table was removed and
    made anew, or the checkpoint is another table's): resuming would skip what came before its offsets."""
    from msgstream_spark.spark.mirror import checkpoint_query_id

    commits = os.path.join(checkpoint, "commits")
    if not any(n.isdigit() for n in (os.listdir(commits) if os.path.isdir(commits) else [])):
        return
    qid = checkpoint_query_id(checkpoint)
    if table.last_batch(qid) is None:
        raise MirrorError(f"checkpoint {checkpoint} (query {qid}) committed batches that table {location} never "
                          "took: it belongs to another (or an earlier) table. Remove the checkpoint (or pass another "
                          "--checkpoint) to start afresh; nothing written")


def resume_offset(checkpoint: str, starting: str | None) -> dict:
    """Where a query would resume: the checkpoint's last committed offset, else ``starting`` (a snapshot's
    recorded positions or --from; ``earliest``/``latest`` are never lost). Spark-free."""
    from msgstream_spark.source.lost import checkpoint_offset, positions_offset

    commits = os.path.join(checkpoint, "commits")
    done = sorted(int(n) for n in (os.listdir(commits) if os.path.isdir(commits) else []) if n.isdigit())
    if done:
        path = os.path.join(checkpoint, "offsets", str(done[-1]))
        with open(path) as f:
            try:
                return checkpoint_offset(f.read())
            except ValueError as exc:
                raise MirrorError(f"checkpoint offsets file {path}: {exc}") from exc
    if not starting or starting.strip().lower() in ("earliest", "latest"):
        return {}
    try:
        names = list(json.loads(starting))
    except (json.JSONDecodeError, TypeError):
        names = []
    return positions_offset(starting, names) if names else {}


def _lost(cfg, offset: dict) -> dict[str, str]:
    from msgstream_spark.source.lost import lost_positions
    from msgstream_spark.stream.factory import Factory

    if not offset:
        return {}
    with Factory(cfg).client() as client:
        return lost_positions(client, offset)


def _retire(checkpoint: str, s: int) -> str | None:
    """Move the old checkpoint aside (kept for inspection): the stream starts a fresh one at the new positions."""
    if not os.path.isdir(checkpoint):
        return None
    old = f"{checkpoint.rstrip('/')}.lost-{s}-{uuid.uuid4().hex[:6]}"
    os.rename(checkpoint, old)
    log.warning("old checkpoint moved to %s; the stream starts a new one at %s", old, checkpoint)
    return old


def _committed(args, pk: str, s: int) -> bool:
    """Whether the table at ``args.table`` holds the snapshot of time ``s`` (its commit landed)."""
    try:
        return _open(args, pk, None, None, create=False).properties().get(S_PROPERTY) == str(s)
    except MirrorError as exc:
        log.debug("no table with snapshot %d: %s", s, exc)
        return False


def _plan(cfg, args, info, s: int, tasks: int):
    """(where the tasks query: at least at S, pinned at S when the server pins iterator reads; the ranges;
    bytes per row; the plan's Query calls)."""
    from msgstream_spark.mirror.snapshot.handover import collection_partitions, probe_pin, query_target
    from msgstream_spark.mirror.snapshot.query.reader import plan_ranges, row_bytes
    from msgstream_spark.mirror.snapshot.query.rpc import Querier

    parts = collection_partitions(cfg, info, args.collection)
    qt = replace_target(query_target(cfg, info, args.collection), floor_ts=s)
    q = Querier(qt)
    try:
        if s > 0 and probe_pin(q, info):
            qt = replace_target(qt, pin_ts=s)
        ranges = plan_ranges(q, info.pk, info.pk_is_string, tasks, parts)
        width = row_bytes(q, info.pk, info.pk_is_string, ranges[0]) if ranges else 0
    finally:
        q.close()
    return qt, ranges, width, q.calls


def _positions(args, cfg, table, target, pk: str):
    """The collection checked against the stream, then the positions and S: (info, positions, S)."""
    from msgstream_spark.mirror.snapshot.handover import describe, snapshot_ts, take_positions
    from msgstream_spark.stream.factory import Factory

    info = describe(target, count=False)  # the plan counts the rows (at S, not at the proxy's "now")
    if info.pk != pk:
        raise MirrorError(f"collection {args.collection!r}: Milvus names primary key {info.pk!r}, the stream's schema "
                          f"{pk!r} (is the config's log the cluster at milvus.address={target.address}?)")
    if table.collection_id is not None and table.collection_id != info.collection_id:
        raise MirrorError(f"collection {args.collection!r} has id {info.collection_id} in Milvus, but the log's newest "
                          f"collection of that name has id {table.collection_id}: is the config's log the cluster at "
                          f"milvus.address={target.address}?")
    table.collection_id = info.collection_id
    with Factory(cfg).client() as client:  # 1. positions, 2. S: before any row is read
        positions = take_positions(client, _channels(client, args, cfg))
    return info, positions, snapshot_ts(positions)


def _snapshot(spark, args, cfg, table, schema, pk: str, replace: bool = False) -> Start:
    if getattr(args, "snapshot_source", "query") == "storage":  # no loaded collection needed
        return _from_storage(spark, args, cfg, table, schema, pk, replace)
    from msgstream_spark.mirror.snapshot.handover import check_same_collection, milvus_target, starting_positions
    from msgstream_spark.mirror.snapshot.query.reader import RangeReader
    from msgstream_spark.mirror.table import table_schema
    from msgstream_spark.spark.snapshot import WarmWorkers, remove_dir, write_snapshot

    target = milvus_target(cfg, args.collection)
    with WarmWorkers(spark):  # the read's Python workers start while the driver takes the positions
        info, positions, s = _positions(args, cfg, table, target, pk)
    t0 = time.monotonic()  # then Milvus's work, plan and read, with nothing of Spark's start between
    qt, ranges, width, calls = _plan(cfg, args, info, s, args.snapshot_tasks or spark.sparkContext.defaultParallelism)
    plan_s = time.monotonic() - t0
    pinned = qt.pin_ts > 0
    read = "exactly at S (pinned iterator reads)" if pinned else "at least at S (this Milvus does not pin reads)"
    total = sum(max(0, r.rows) for r in ranges)
    log.info("snapshot of %s: S=%d, %d rows, %d range(s) planned with %d Query calls in %.2f s, rows read %s, "
             "positions %s", args.collection, s, total, len(ranges), calls, plan_s, read,
             {ch: (p.timestamp if p else None) for ch, p in positions.items()})
    out = table.store.join(f"snapshot-{s}-{uuid.uuid4().hex[:8]}")
    reader = RangeReader(qt, info.pk, info.pk_is_string, table_schema(schema, pk), s,
                         answer_bytes=int(args.snapshot_answer_mb * (1 << 20)), row_bytes=width or 1024)
    files = write_snapshot(spark, reader, ranges, out, total, args.progress_interval, table.store)
    check_same_collection(target, info)
    starting = starting_positions(positions)
    props = {START_PROPERTY: starting, S_PROPERTY: str(s)}
    try:
        if replace:  # one commit: a crash before it leaves the old table (and its checkpoint) as they were
            table.replace_files(files.files, properties=props)
        else:
            table.add_files(files.files, properties=props)
    except BaseException:
        if not _committed(args, pk, s):  # the files are no version's: remove them with their directory
            remove_dir(table.store, out)
        raise
    return Start(table, starting, info.collection_id,
                 {"mode": "replaced" if replace else "initial", "S": s, "rows": files.rows, "read": read,
                  "pinned": pinned, "files": len(files.files), "ranges": len(ranges), "plan_calls": calls,
                  "plan_seconds": round(plan_s, 3), "read_calls": files.calls, "positions": json.loads(starting)})


def _from_storage(spark, args, cfg, table, schema, pk: str, replace: bool) -> Start:
    """``--snapshot-source storage``: the rows from Milvus's binlogs, the stream from the channel checkpoints."""
    from msgstream_spark.jobs.mirror_storage import storage_snapshot
    from msgstream_spark.stream.factory import Factory

    with Factory(cfg).client() as client:
        channels = _channels(client, args, cfg)
    files, starting, summary = storage_snapshot(spark, args, cfg, table, schema, pk, channels, replace)
    props = {START_PROPERTY: starting, S_PROPERTY: str(summary["S"])}
    if replace:
        table.replace_files(files.files, properties=props)
    else:
        table.add_files(files.files, properties=props)
    return Start(table, starting, table.collection_id, summary)
