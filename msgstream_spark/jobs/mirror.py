"""Mirror: keep a Delta or Iceberg table equal to a Milvus collection.

``msgstream mirror run --config C --collection NAME --table PATH [--table-format delta|iceberg]``
(the format is needed to create a table; an existing table's is detected) starts a new table
from a snapshot of the collection (``--snapshot initial``: the channels' positions first, then S,
then the rows through Milvus's SDK, written by Spark tasks as the table's first data files), then
merges the stream from those positions, one commit per micro-batch, recording the query and the
batch so that a re-run batch is skipped (exactly once).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from msgstream_spark.cli.table_args import (
    add_table_args,
    checkpoint_of,
    resolve_table_format,
    storage_options,
    table_options,
)
from msgstream_spark.cli.vocab import UsageError, add_channels_arg, add_flag, at_file
from msgstream_spark.errors import MirrorError
from msgstream_spark.jobs._common import (
    add_config_args,
    main_wrapper,
    source_options,
    spark_session,
    trigger_kwargs,
)
from msgstream_spark.jobs.mirror_many import channels_option as _channels_option
from msgstream_spark.jobs.mirror_many import config_of as _config
from msgstream_spark.jobs.mirror_many import run_many, table_observers
from msgstream_spark.jobs.mirror_query import run_into

log = logging.getLogger("msgstream_spark.jobs.mirror")

SNAPSHOT_MODES = ("initial", "never", "when_needed")


def _add_many_args(p: argparse.ArgumentParser) -> None:
    """The many-collection job's placement and concurrency flags."""
    p.add_argument("--table-root", metavar="LOCATION", help="with --database/--collections/--include: the tables "
                                                            "go to <root>/<database>/<collection>")
    p.add_argument("--namespace", metavar="NS", help="with --catalog NAME, instead of --table-root: the tables in "
                   "the catalog's namespace NS, NS.<database>__<collection> (Iceberg)")
    p.add_argument("--snapshot-concurrency", type=int, default=2, help="with --table-root: collections snapshotted "
                                                                       "at once at the start (default 2)")
    p.add_argument("--staging", metavar="LOCATION", help="with --table-root/--namespace: where the batches stage the "
                   "rows of a collection whose snapshot runs beside the stream (a URI or a path every task reaches); "
                   "default <checkpoint>/staged with a local[...] master, else <table-root>/.msgstream-staged "
                   "(required with --namespace on a cluster)")
    p.add_argument("--table-concurrency", type=int, default=4, help="with --table-root: tables written and committed "
                                                                    "at once per batch (default 4)")
    p.add_argument("--batch-read", choices=["tasks", "stream"], default="tasks",
                   help="with --table-root/--namespace: how a batch's messages reach its writing tasks: 'tasks' "
                        "(default) each task reads the batch's channel ranges itself, decoding only its tables' "
                        "rows (a range is read once for the batch's facts and once by each writing task); 'stream' "
                        "the stream's DataFrame, cached in Spark, read once")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mirror", description=__doc__.split("\n\n")[0])
    add_config_args(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--collection", help="collection name (one collection into --table)")
    which.add_argument("--database", metavar="NAME", help="every collection of database NAME, each into its own table "
                                                          "under --table-root (docs/mirror.md, Many collections)")
    which.add_argument("--collections", metavar="A,B,...", help="these collections (name or db.name), each into its "
                                                                "own table under --table-root")
    which.add_argument("--include", metavar="REGEX", help="every collection whose db.name the regex matches, each "
                                                          "into its own table under --table-root")
    add_table_args(p, creates=True, table_required=False)
    _add_many_args(p)
    p.add_argument("--snapshot", default="initial", choices=SNAPSHOT_MODES,
                   help="initial (default): a new table starts from a snapshot read through Milvus's SDK "
                        "(config key milvus.address); never: from the stream alone (--from); when_needed: "
                        "like initial for a new table, and an existing table whose resume position was removed "
                        "by retention is replaced by a new snapshot (its old checkpoint moved aside)")
    p.add_argument("--snapshot-source", default="query", choices=("query", "storage"),
                   help="query (default): the snapshot's rows through Milvus's query; storage: from Milvus's binlogs "
                        "(storage v1, 2.3-2.5: etcd.endpoints, etcd.rootPath, common.storageType, localStorage.path or "
                        "minio.* from the config), the stream from the channel checkpoints")
    add_channels_arg(p, required=False, meaning="comma-separated channels (default: the config's DML channels, "
                                                 "<cluster>-<rootcoord-dml>_N)")
    add_flag(p, ("--from",), old=("--starting",), dest="starting", default="earliest", metavar="POSITIONS",
             help="with --snapshot never: where the stream starts (earliest, or positions as for ingest: JSON/base64 "
                  "or @file)")
    p.add_argument("--subscription", help="subscription name (default: mirror-<collection>-<table dir name>)")
    p.add_argument("--trigger", default="available-now",
                   help="available-now (default), once, or processing-time:<interval>")
    p.add_argument("--max-rows-per-trigger", type=int, default=100000,
                   help="rows per micro-batch (tasks write and plan them; no row reaches the driver; default 100000)")
    p.add_argument("--compact-every", type=int, default=0,
                   help="compact the table after every N committed micro-batches (default 0: by the maintenance "
                        "policy's thresholds only); the same as --maintenance compact.every=N")
    p.add_argument("--maintenance", action="append", default=[], metavar="KEY=VALUE",
                   help="the maintenance policy run between batches (repeatable; e.g. retain.age=1h, retain.max=100, "
                        "compact.small-files=32, enabled=false): docs/mirror.md, Maintenance policy")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve Prometheus metrics on this port (0: any free port, logged); docs/mirror.md, Metrics")
    add_flag(p, ("--num-snapshot-tasks",), old=("--snapshot-tasks",), dest="snapshot_tasks", type=int, default=0,
             metavar="N", help="snapshot read tasks (default: Spark parallelism)")
    p.add_argument("--snapshot-answer-mb", type=float, default=16.0,
                   help="snapshot: bytes of one Query answer, in MiB (default 16; Milvus refuses answers above "
                        "quotaAndLimits.limits.maxOutputSize, 100 MiB, and above the proxy's gRPC send size)")
    p.add_argument("--timeout", type=float, help="stop a processing-time query after this many seconds")
    p.add_argument("--history-table", help="also keep a change log here (Delta, append-only: op insert/update/"
                                           "delete, the fields after the change, _ts, _time, _seq), written once "
                                           "per batch by tasks beside the mirror's commits; --table-format delta "
                                           "only; a path or URI, --storage-option applies (docs/mirror.md, "
                                           "History)")
    p.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress lines")
    return p


def _stream(spark, args, cfg, starting: str | None):
    sub = args.subscription or f"mirror-{args.collection}-{os.path.basename(args.table.rstrip('/'))}"
    opts = source_options(args, collection=args.collection, subscription=sub, startingPositions=starting,
                          maxRowsPerTrigger=args.max_rows_per_trigger, removalRows="true",  # spark/removals.py
                          **_channels_option(args, cfg))
    return spark.readStream.format("msgstream").options(**opts).load()


def _facts(df) -> tuple[str, int | None]:
    """(primary key, collection id) from the schema the source inferred."""
    from msgstream_spark.spark.datasource import COLLECTION_META, PK_META

    pk = next((f.name for f in df.schema.fields if (f.metadata or {}).get(PK_META)), None)
    if pk is None:
        raise MirrorError("the stream's schema names no primary key (was the collection created in this log?)")
    cid = (df.schema["op"].metadata or {}).get(COLLECTION_META)
    return pk, (int(cid) if cid is not None else None)


def rows_arrow_schema(df):
    """The stream's rows as an Arrow schema (the table keeps the fields, ``_ts``, ``_seq``, ``_partition``)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(df.schema, timezone="UTC")


SCHEMA_RESTARTS = 3  # a 2.6 AlterCollection adding a field: restart the query, which infers the new schema


def _stream_into(spark, args, cfg, starting: str | None, sink, checkpoint: str, trig: dict):
    """Run the stream into ``sink`` until it ends; (error text or None, rows, batches)."""
    return run_into(_stream(spark, args, cfg, starting), sink, checkpoint, trig, args, "mirror")


def _stream_all(spark, args, cfg, start, sink, checkpoint, trig) -> tuple[int, int]:
    rows = restarts = 0
    while True:
        err, n, _ = _stream_into(spark, args, cfg, start.starting, sink, checkpoint, trig)
        rows += n
        if err is None:
            return rows, restarts
        if "adds field(s)" not in err or restarts >= SCHEMA_RESTARTS:
            raise MirrorError(f"mirror query failed: {err}")
        restarts += 1  # the restarted query (same checkpoint) infers the altered schema; the merge adds the column
        log.info("schema change, restarting the query (%d of %d): %s", restarts, SCHEMA_RESTARTS, err)


def _observers(args, table, policy):
    """The job's maintenance (``policy``) and its metrics (served on --metrics-port), told of every batch in this
    order."""
    upkeep, metrics = table_observers(table, policy, args.metrics_port)
    log.info("maintenance policy of %s: %s; metrics: %s", args.table, upkeep.policy.as_options(),
             f"port {metrics.port}" if metrics.port is not None else "not served (--metrics-port)")
    return upkeep, metrics


def run(args: argparse.Namespace, spark=None) -> dict[str, Any]:
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its callback server logs every call at INFO
    if args.collection is None:  # --database / --collections / --include: many collections, one read
        return run_many(args, spark)
    if args.table is None or args.table_root is not None:
        raise UsageError("--collection mirrors one collection into --table LOCATION (--table-root is for "
                         "--database / --collections / --include)")
    resolve_table_format(args, create=True)  # before Spark starts: a wrong or missing format fails at once
    args.starting = at_file(args.starting)
    from msgstream_spark.mirror.formats import registry

    if args.history_table and not registry.has(args.table_format, "history"):
        raise MirrorError(f"--history-table {args.history_table}: the change log is kept beside a "
                          f"{registry.titles('history')} mirror only ({registry.flags('history')}), not "
                          f"--table-format {args.table_format}; nothing written")
    trig = trigger_kwargs(args.trigger)
    checkpoint = checkpoint_of(args, required=True)
    from msgstream_spark.mirror.policy import MaintenancePolicy, parse

    policy = parse(args.maintenance, MaintenancePolicy(compact_every=args.compact_every))  # a wrong key: now
    from msgstream_spark.mirror.store import open_store

    store = open_store(args.table, table_options(args)["storage_options"])  # settings resolved here, on the driver
    cfg = _config(args)
    spark = spark or spark_session("msgstream-mirror", args.master)  # Spark first, then pymilvus clients
    from msgstream_spark.jobs.mirror_start import decide_start
    from msgstream_spark.mirror.history.table import HistoryTable
    from msgstream_spark.mirror.store.writer import writer_lock
    from msgstream_spark.mirror.table import open_table
    from msgstream_spark.spark.mirror import MirrorBatch
    from msgstream_spark.spark.removals import RemovingBatch

    probe = _stream(spark, args, cfg, None)
    pk, cid = _facts(probe)
    where = args.table
    if registry.names_in_catalog(args.table, args.catalog):  # the catalog places the table: made now, its lease there
        placed = open_table(args.table_format, args.table, collection=args.collection, pk=pk, create=False,
                            arrow_schema=rows_arrow_schema(probe), collection_id=cid, **table_options(args))
        store, where = placed.store, placed.location
    with writer_lock(store, where, "the mirror job") as hold:  # the table's one writer while the job runs
        start = decide_start(spark, args, cfg, rows_arrow_schema(probe), pk, cid, checkpoint)
        history = HistoryTable(args.history_table, pk, storage_options(args)) if args.history_table else None
        upkeep, metrics = _observers(args, start.table, policy)
        sink = MirrorBatch(start.table, pk, checkpoint=checkpoint, collection_id=start.collection_id,
                           history=history, lock=hold, observers=[upkeep, metrics])
        removing = RemovingBatch(sink, on_query_start=metrics.hub.watch)  # and the backlog metric watches the query
        t0 = time.perf_counter()
        try:
            _, restarts = _stream_all(spark, args, cfg, start, removing, checkpoint, trig)
            rows = removing.rows  # each batch once (Spark's input count repeats a lost executor's cached rows)
        finally:
            metrics.close()
    secs = time.perf_counter() - t0
    return {"job": "mirror", "table": args.table, "format": args.table_format, "collection": args.collection,
            "checkpoint": checkpoint, "snapshot": start.summary, "stream_rows": rows,
            "merged_batches": sink.batches, "skipped_batches": sink.skipped, "merged_changes": sink.rows,
            "compactions": upkeep.runs["compact"], "maintenance": upkeep.state(),
            "table_version": upkeep.version(), "metrics_port": metrics.port,
            "schema_restarts": restarts, "removals": removing.removals, "stream_seconds": round(secs, 3),
            "freshness_ms": sink.freshness_ms, "step_seconds": sink.timings, "step_bytes": sink.bytes}


def main(argv=None, prog: str | None = None) -> int:
    rc = main_wrapper(build_parser(), run, argv, prog)
    # delta-rs can abort the process at interpreter exit after a correct commit (delta-rs issue 2184):
    # the job's exit code is decided here, not by destructors.
    try:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


if __name__ == "__main__":
    raise SystemExit(main())
