"""``mirror run --database NAME | --collections a,b | --include REGEX --table-root ROOT``: many collections in
one job, one Spark query, one checkpoint, the channels read once (``output=collections``).

Each selected collection is kept in its own table under ``ROOT`` (``mirror.many``'s naming rule:
``<root>/<db>/<collection>``, a later collection of a re-created name ``<root>/<db>/<collection>__<id>``). The
stream starts at ``--from`` (``--snapshot never``: every table from the stream; a snapshot per collection is not
done yet). A collection created while the job runs starts from its CreateCollection on the stream; a
dropped one's table keeps its last state and is marked (``spark.mirror_many``).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import uuid
from typing import Any

from msgstream_spark.cli.table_args import table_options
from msgstream_spark.cli.vocab import UsageError, at_file
from msgstream_spark.errors import MirrorError
from msgstream_spark.jobs._common import parse_kv, source_options, spark_error_line, spark_session, trigger_kwargs
from msgstream_spark.mirror.common import PROP_COLLECTION_ID, PROP_SNAPSHOT_TS
from msgstream_spark.mirror.many import DEFAULT_DB, Known, ManyState, parse_selection, table_location

log = logging.getLogger("msgstream_spark.jobs.mirror")


def config_of(args):
    from msgstream_spark.config.loader import Config

    return Config.load(args.config, overrides=parse_kv(args.option) or None)


def channels_option(args, cfg) -> dict[str, str]:
    """The source's channels: --channels, else the config's DML channels (a pattern: Milvus may add some)."""
    if args.channels:
        return {"channels": args.channels}
    prefix = cfg.dml_channel_names(1)[0].rsplit("_", 1)[0]
    return {"channelPattern": f"^{prefix}_[0-9]+$"}


def await_query(query, trig: dict, timeout: float | None) -> None:
    try:
        if "processingTime" in trig and timeout is not None:
            if not query.awaitTermination(timeout):
                query.stop()
        else:
            query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()


def check_args(args: argparse.Namespace) -> None:
    """UsageError for a many-collection run missing what it needs, or given a one-collection flag."""
    if not args.table_root:
        raise UsageError("--database / --collections / --include keep each collection in its own table: pass "
                         "--table-root LOCATION (tables at <root>/<database>/<collection>)")
    if args.table or args.collection:
        raise UsageError("--table and --collection name one collection's table: with --database / --collections / "
                         "--include pass --table-root only")
    if not args.table_format:
        raise UsageError("--table-root: pass --table-format delta or iceberg (the tables' format)")
    if args.snapshot != "never":
        raise UsageError("--database / --collections / --include start every table from the stream in this version: "
                         "pass --snapshot never (with --from earliest, the default, the log must still hold each "
                         "collection's creation); a snapshot per collection is not done yet")
    if args.history_table:
        raise UsageError("--history-table keeps one collection's change log: not with --database / --collections / "
                         "--include")


def _checkpoint(args) -> str:
    if args.checkpoint:
        return args.checkpoint
    if "://" in args.table_root and not args.table_root.startswith("file://"):
        raise UsageError(f"--table-root {args.table_root} is in object storage: pass --checkpoint DIR, a directory "
                         "on the driver's disk for Spark's checkpoint")
    return args.table_root.removeprefix("file://").rstrip("/") + "_checkpoint"


class Tables:
    """Makes or opens a collection's table by the naming rule (the ``Opener`` of ``spark.mirror_many``)."""

    def __init__(self, args, cfg, checkpoint: str) -> None:
        self.args, self.cfg, self.checkpoint = args, cfg, checkpoint

    def _holder(self, location: str) -> int | None:
        from msgstream_spark.mirror.formats import registry

        more = table_options(self.args)
        if not registry.detect_at(location, more["storage_options"]):
            return None
        cid = registry.stored_properties(self.args.table_format, location, **more).get(PROP_COLLECTION_ID)
        return int(cid) if cid else -1

    def schema(self, k: Known, schema_bytes: bytes | None):
        """The collection's schema: its CreateCollection's, else inferred from the channels (by id)."""
        from msgstream_spark.msg.pb import schema_pb2

        if schema_bytes:
            s = schema_pb2.CollectionSchema()
            s.ParseFromString(schema_bytes)
            return s
        from msgstream_spark.source.options import parse_read_options
        from msgstream_spark.source.read import list_channels
        from msgstream_spark.source.schema import infer_collection

        named = channels_option(self.args, self.cfg)
        opts = parse_read_options(source_options(self.args, collection=str(k.cid), **named))
        client = opts.client()
        try:
            channels = list_channels(opts, client)
        finally:
            client.close()
        return infer_collection(opts, channels)[0]

    def __call__(self, k: Known, schema_bytes: bytes | None):
        from msgstream_spark.mirror.table import open_table
        from msgstream_spark.msg.schema import collection_arrow_schema
        from msgstream_spark.source.rows import rows_arrow_schema
        from msgstream_spark.source.schema import primary_key
        from msgstream_spark.spark.mirror import MirrorBatch
        from msgstream_spark.spark.mirror_many import Mirrored

        coll = self.schema(k, schema_bytes)
        pk = primary_key(coll)
        if pk is None:
            raise MirrorError(f"collection {k.db}.{k.name} (id {k.cid}): its schema names no primary key")
        rows = rows_arrow_schema(collection_arrow_schema(coll))
        root, db = self.args.table_root, k.db or DEFAULT_DB
        base = f"{root.rstrip('/')}/{db}/{k.name}"
        where = k.location or table_location(root, db, k.name, k.cid, self._holder(base))
        table = open_table(self.args.table_format, where, collection=k.name, pk=pk, arrow_schema=rows, create=True,
                           collection_id=k.cid, **table_options(self.args))
        sink = MirrorBatch(table, pk, checkpoint=self.checkpoint, collection_id=k.cid,
                           compact_every=self.args.compact_every)
        s = table.properties().get(PROP_SNAPSHOT_TS)  # a snapshot's table takes the stream's rows after its S
        return Mirrored(table, pk, rows, sink, int(s) if s else None)


def _stream(spark, args, cfg, starting: str | None, sub: str):
    opts = source_options(args, output="collections", subscription=sub, startingPositions=starting,
                          maxRowsPerTrigger=args.max_rows_per_trigger, **channels_option(args, cfg))
    return spark.readStream.format("msgstream").options(**opts).load()


def _run_query(spark, args, cfg, starting, sink, checkpoint: str) -> int:
    from msgstream_spark.jobs.ingest import Progress

    trig = trigger_kwargs(args.trigger)
    sub = args.subscription or f"mirror-{os.path.basename(args.table_root.rstrip('/'))}"
    df = _stream(spark, args, cfg, starting, sub)
    query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(**trig).queryName(f"mirror-many-{uuid.uuid4().hex[:8]}").start())
    progress = Progress(query, args.progress_interval).start()
    try:
        await_query(query, trig, args.timeout)
    finally:
        progress.stop()
    err = query.exception()
    if err is not None:
        raise MirrorError(f"mirror query failed: {spark_error_line(err) or err}")
    return progress.rows


def _opened(state: ManyState, tables: Tables) -> dict[int, Any]:
    """The tables an earlier run made (a restart): each opened by the location it recorded."""
    out = {}
    for cid, k in sorted(state.known.items()):
        if k.location:
            out[cid] = tables(k, state.schema_bytes(cid))
    return out


def run_many(args: argparse.Namespace, spark=None) -> dict[str, Any]:
    """The many-collection job (``mirror run`` with a selection)."""
    from msgstream_spark.spark.mirror_many import ManyBatch

    check_args(args)
    selection = parse_selection(args.database, args.collections, args.include)
    args.starting = at_file(args.starting)
    checkpoint = _checkpoint(args)
    cfg = config_of(args)
    spark = spark or spark_session("msgstream-mirror", args.master)
    state = ManyState.load(checkpoint)
    tables = Tables(args, cfg, checkpoint)
    sink = ManyBatch(tables, state, selection, mirrored=_opened(state, tables), concurrency=args.table_concurrency)
    t0 = time.perf_counter()
    rows = _run_query(spark, args, cfg, args.starting, sink, checkpoint)
    return {"job": "mirror", "selection": selection.describe(), "table_root": args.table_root,
            "format": args.table_format, "checkpoint": checkpoint, "stream_rows": rows,
            "stream_seconds": round(time.perf_counter() - t0, 3), **sink.summary()}
