"""``mirror run --database NAME | --collections a,b | --include REGEX --table-root ROOT``: many collections in
one job, one Spark query, one checkpoint, the channels read once (``output=collections``).

Each selected collection is kept in its own table under ``ROOT`` (``mirror.many``'s naming rule:
``<root>/<db>/<collection>``, a later collection of a re-created name ``<root>/<db>/<collection>__<id>``), or with
``--catalog NAME --namespace NS`` an Iceberg table ``NS.<db>__<collection>`` of that catalog. The
stream starts at ``--from`` (``--snapshot never``) or, for a new job with ``--snapshot initial``, at the channels'
positions taken when it starts: each selected collection in Milvus at the start is snapshotted at its own S beside
the running stream (``jobs.mirror_many_pending``; with ``--snapshot-source storage``, before it: ``snapshot_all``)
and takes only the stream's rows after its S. A collection created while the job runs starts
from its CreateCollection on the stream; a dropped one's table keeps its last state and is marked
(``spark.mirror_many``).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from msgstream_spark.cli.table_args import table_options
from msgstream_spark.cli.vocab import UsageError, at_file
from msgstream_spark.errors import MirrorError
from msgstream_spark.jobs._common import parse_kv, source_options, spark_session, trigger_kwargs
from msgstream_spark.jobs.mirror_many_milvus import Locate, described_schema, milvus_collections
from msgstream_spark.jobs.mirror_many_names import catalog_holder, check_namespace_args, stored_name
from msgstream_spark.jobs.mirror_many_pending import Pending
from msgstream_spark.jobs.mirror_many_schema import Schemas
from msgstream_spark.jobs.mirror_query import run_into
from msgstream_spark.mirror.common import PROP_COLLECTION_ID, PROP_SNAPSHOT_TS
from msgstream_spark.mirror.many import DEFAULT_DB, Known, ManyState, parse_selection, table_identifier, table_location

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


# docs/mirror.md "Many collections, one job": why, and what to do when the stream's resume position is lost
WHEN_NEEDED_REFUSED = (
    "--snapshot when_needed is the one-collection job's (--collection): with --database / --collections / --include "
    "every table resumes from the job's one checkpoint, so a lost resume position would need every table "
    "re-snapshotted and the checkpoint (with its collections.json) replaced together, which this job does not do. "
    "Pass --snapshot initial (the default) or never; if retention removed the checkpoint's position, move the "
    "checkpoint and the tables under --table-root aside and start again with --snapshot initial")


def check_args(args: argparse.Namespace) -> None:
    """UsageError for a many-collection run missing what it needs, or given a one-collection flag."""
    for flag in ("snapshot_concurrency", "table_concurrency"):
        if getattr(args, flag, 1) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be 1 or more")
    if getattr(args, "namespace", None):
        return check_namespace_args(args)
    if not args.table_root:
        raise UsageError("--database / --collections / --include keep each collection in its own table: pass "
                         "--table-root LOCATION (tables at <root>/<database>/<collection>), or for Iceberg "
                         "--catalog NAME --namespace NS")
    if args.table or args.collection:
        raise UsageError("--table and --collection name one collection's table: with --database / --collections / "
                         "--include pass --table-root only")
    if not args.table_format:
        from msgstream_spark.mirror.formats import registry

        raise UsageError(f"--table-root: pass --table-format, one of {', '.join(registry.names())} (the tables' "
                         "format)")
    if args.snapshot == "when_needed":
        raise UsageError(WHEN_NEEDED_REFUSED)
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


def table_observers(table, policy, port: int | None = None, hub=None):
    """(the table's ``Upkeep`` on ``policy``, measured once; its ``JobMetrics``: served on ``port``, or a series
    on the job's shared ``hub``): the observers every mirror job hands a table's ``MirrorBatch``."""
    from msgstream_spark.jobs.mirror_metrics import JobMetrics
    from msgstream_spark.mirror.upkeep import Upkeep

    upkeep = Upkeep(table, policy)
    upkeep.measure()
    return upkeep, JobMetrics(table, upkeep, port, hub)


def remember_schema(k: Known, coll) -> None:
    """Keep the schema a collection's table is made or opened with in its ``Known`` entry when the stream gave
    none (a snapshotted collection: Milvus's; one seen by its inserts only: the inferred one). A restart opens the
    table with it instead of asking again: a collection dropped since, or made while the job was down, is
    described by no Milvus, and the log may no longer hold any of its messages."""
    if not k.schema:
        k.schema = base64.b64encode(coll.SerializeToString()).decode()


class Tables:
    """Makes or opens a collection's table by the naming rule (the ``Opener`` of ``spark.mirror_many``)."""

    def __init__(self, args, cfg, checkpoint: str, policy=None, hub=None) -> None:
        self.args, self.cfg, self.checkpoint = args, cfg, checkpoint
        self.policy, self.hub = policy, hub  # each table's maintenance policy; the job's metrics endpoint
        self.upkeeps: dict[str, Any] = {}  # table location -> its Upkeep
        self.schemas = Schemas(args, channels_option(args, cfg))

    def observers(self, table) -> list:
        """The table's maintenance (the job's policy, under the batch's lease) and its series on the job's
        metrics endpoint, told of every batch in this order (as the one-collection job's)."""
        upkeep, metrics = table_observers(table, self.policy, hub=self.hub)
        self.upkeeps[str(table.location)] = upkeep
        return [upkeep, metrics]

    def _holder(self, location: str) -> int | None:
        from msgstream_spark.mirror.formats import registry

        more = table_options(self.args)
        if self.args.namespace:  # an identifier in --catalog: the catalog says whether it has that table
            return catalog_holder(self.args.table_format, location, more)
        if not registry.detect_at(location, more["storage_options"]):
            return None
        cid = registry.stored_properties(self.args.table_format, location, **more).get(PROP_COLLECTION_ID)
        return int(cid) if cid else -1

    def schema(self, k: Known, schema_bytes: bytes | None):
        """The collection's schema: its CreateCollection's, else inferred from the channels (by id;
        ``jobs.mirror_many_schema``)."""
        return self.schemas(k.cid, schema_bytes)

    def prepare(self, cids: list[int]) -> None:
        """The collections ``cids``, whose tables are about to be made without a schema from the stream: their
        schemas inferred by one scan of the channels."""
        self.schemas.prepare(cids)

    def place(self, k: Known, coll) -> tuple[str, str, Any]:
        """(the table's location by the naming rule, the primary key, the ``rows`` schema)."""
        from msgstream_spark.msg.schema import collection_arrow_schema
        from msgstream_spark.source.rows import rows_arrow_schema
        from msgstream_spark.source.schema import primary_key

        pk = primary_key(coll)
        if pk is None:
            raise MirrorError(f"collection {k.db}.{k.name} (id {k.cid}): its schema names no primary key")
        root, db, ns = self.args.table_root, k.db or DEFAULT_DB, self.args.namespace
        if ns:
            base = table_identifier(ns, db, k.name, k.cid, None)
            where = k.location or table_identifier(ns, db, k.name, k.cid, self._holder(base))
        else:
            base = f"{root.rstrip('/')}/{db}/{k.name}"
            where = k.location or table_location(root, db, k.name, k.cid, self._holder(base))
        return where, pk, rows_arrow_schema(collection_arrow_schema(coll))

    def __call__(self, k: Known, schema_bytes: bytes | None):
        from msgstream_spark.jobs.mirror_start import START_PROPERTY
        from msgstream_spark.mirror.table import open_table
        from msgstream_spark.spark.channel_floor import FlooredBatch, channel_floors
        from msgstream_spark.spark.mirror_many import Mirrored

        coll = self.schema(k, schema_bytes)
        remember_schema(k, coll)  # kept in collections.json with the batch's (or the snapshots') next save
        where, pk, rows = self.place(k, coll)
        table = open_table(self.args.table_format, where, collection=stored_name(self.args, k, where), pk=pk,
                           arrow_schema=rows, create=True, collection_id=k.cid, **table_options(self.args))
        props = table.properties()
        s = props.get(PROP_SNAPSHOT_TS)  # a snapshot's table takes the stream's rows after its S
        # and a storage snapshot's, each channel's after its checkpoint (spark/channel_floor.py)
        floors = channel_floors(props.get(START_PROPERTY), int(s) if s else None)
        sink = FlooredBatch(table, pk, floors, checkpoint=self.checkpoint, collection_id=k.cid,
                            observers=self.observers(table))
        got = Mirrored(table, pk, rows, sink, int(s) if s else None)
        got.where = where  # what collections.json records: a location, or an identifier in --catalog
        return got


def _options(args, cfg, starting: str | None, sub: str) -> dict[str, str]:
    return source_options(args, output="collections", subscription=sub, startingPositions=starting,
                          maxRowsPerTrigger=args.max_rows_per_trigger, **channels_option(args, cfg))


def _stream(spark, args, cfg, starting: str | None, sub: str):
    return spark.readStream.format("msgstream").options(**_options(args, cfg, starting, sub)).load()


def _subscription(args) -> str:
    return args.subscription or (f"mirror-{args.namespace}" if args.namespace else
                                 f"mirror-{os.path.basename(args.table_root.rstrip('/'))}")


def direct_read(args, cfg, starting: str | None, checkpoint: str):
    """The job's own read of each batch's channel ranges (``--batch-read tasks``), or None (``stream``)."""
    from msgstream_spark.source.options import parse_read_options
    from msgstream_spark.spark.mirror_many_direct import DirectRead

    opts = parse_read_options(_options(args, cfg, starting, _subscription(args)), streaming=True)
    return DirectRead(opts, checkpoint) if getattr(args, "batch_read", "tasks") == "tasks" else None


def _run_query(spark, args, cfg, starting, sink, checkpoint: str) -> int:
    sink.direct = direct_read(args, cfg, starting, checkpoint)
    try:
        err, rows, _ = run_into(_stream(spark, args, cfg, starting, _subscription(args)), sink, checkpoint,
                                trigger_kwargs(args.trigger), args, "mirror-many")
    finally:
        sink.mirrored  # noqa: B018 - a table opened ahead that did not open: its own error, not the query's
    if err is not None:
        raise MirrorError(f"mirror query failed: {err}")
    return rows


def _run_beside(spark, args, cfg, starting, sink, checkpoint: str, pending) -> int:
    """The query, the pending collections' snapshots running beside it; after it ends, each handed over."""
    if pending is None:
        return _run_query(spark, args, cfg, starting, sink, checkpoint)
    try:
        pending.start()
        rows = _run_query(spark, args, cfg, starting, sink, checkpoint)
        pending.finish(sink)
    finally:
        pending.close()
    return rows


def snapshot_all(spark, args, cfg, checkpoint: str, state: ManyState, selection, tables: Tables, *,
                 late: bool = False) -> str | None:
    """Snapshots before the stream (``--snapshot-source storage``: ``Pending.for_job`` is None).
    A new job with ``--snapshot initial``: each selected collection in Milvus snapshotted at its own S (the
    one-collection job's ``decide_start``, ``--snapshot-concurrency`` at a time) into its table (which records S:
    the stream's rows at or before it are left out of that table); the query starts, per channel, at the earliest
    of the snapshots' positions. ``late``: a restart; only the selected collections ``collections.json`` does not
    know (made while the job was down, their creation perhaps gone from the log) are snapshotted, each at an S
    after everything the checkpoint's batches read (so the resumed stream's rows after S complete it)."""
    from msgstream_spark.jobs.mirror_start import positions_now

    found = [c for c in milvus_collections(cfg) if selection.matches(c[0], c[1])
             and not (late and c[2] in state.known)]
    if late and found:
        log.info("restart: snapshotting %d selected collections the job has not seen: %s", len(found),
                 ", ".join(f"{db}.{n}" for db, n, _ in found))
    # a late snapshot is one collection's start: a place with no progress of its own for decide_start
    start_dir = os.path.join(checkpoint, "late-snapshots") if late else checkpoint

    # the storage route starts a channel where the collection has no vchannel at "latest": the query starts such
    # a channel here instead (taken before any snapshot: a collection made later has its CreateCollection after it)
    now = positions_now(args, cfg) if found and args.snapshot_source == "storage" else None

    def one(item):
        db, name, cid = item
        k = Known(cid, name, db)
        coll = tables.schema(k, described_schema(cfg, db, name) if late else None)
        remember_schema(k, coll)  # a restart opens the table with it: Milvus and the log may no longer tell it
        where, pk, rows = tables.place(k, coll)
        start = collection_start(spark, args, cfg, k, where, rows, pk, start_dir)
        k.location = where if args.namespace else start.table.location
        return k, start

    with ThreadPoolExecutor(max_workers=max(1, args.snapshot_concurrency)) as pool:
        done = list(pool.map(one, found))
    for k, start in done:
        state.known[k.cid] = k
        log.info("collection %s.%s (id %d): %s", k.db, k.name, k.cid, start.summary)
    state.save()
    return earliest([start.starting for _, start in done], now)


def collection_start(spark, args, cfg, k: Known, where: str, rows, pk: str, start_dir: str):
    """One selected collection's start into its table at ``where`` (``mirror_start.decide_start``, the
    one-collection job's): a snapshot at its own S through ``query`` or, with ``--snapshot-source storage``, from
    Milvus's storage (its binlogs at the channels' checkpoints), or the start a table already records."""
    from msgstream_spark.jobs.mirror_start import decide_start

    sub = argparse.Namespace(**{**vars(args), "collection": k.name, "table": where})
    return decide_start(spark, sub, cfg.with_overrides({"milvus.database": k.db}), rows, pk, k.cid, start_dir)


def earliest(startings: list[str | None], fallback: str | None = None) -> str | None:
    """Per channel the position with the lowest Milvus time among the snapshots' recorded starts; a channel
    that only ``latest`` names (no snapshotted collection has rows there) starts at ``fallback``'s position."""
    from msgstream_spark.msg.position import MsgPosition

    def ts(pos: str) -> float:
        return -1 if pos == "earliest" else float("inf") if pos == "latest" else MsgPosition.from_base64(pos).timestamp

    best: dict[str, str] = {}
    for s in startings:
        for ch, pos in (json.loads(s) if s else {}).items():
            if ch not in best or ts(pos) < ts(best[ch]):
                best[ch] = pos
    for ch, pos in (json.loads(fallback) if fallback else {}).items():
        if best.get(ch) == "latest":
            best[ch] = pos
    return json.dumps(best) if best else None


def run_many(args: argparse.Namespace, spark=None) -> dict[str, Any]:
    """The many-collection job (``mirror run`` with a selection)."""
    from msgstream_spark.spark.mirror_many import ManyBatch

    check_args(args)
    selection = parse_selection(args.database, args.collections, args.include)
    args.starting = at_file(args.starting)
    from msgstream_spark.jobs.mirror_metrics import MetricsHub
    from msgstream_spark.mirror.policy import MaintenancePolicy, parse

    policy = parse(args.maintenance, MaintenancePolicy(compact_every=args.compact_every))  # a wrong key: now
    checkpoint = _checkpoint(args)
    cfg = config_of(args)
    spark = spark or spark_session("msgstream-mirror", args.master)
    state = ManyState.load(checkpoint)
    hub = MetricsHub(args.metrics_port)
    log.info("maintenance policy of every table: %s; metrics: %s", policy.as_options(),
             f"port {hub.port}" if hub.port is not None else "not served (--metrics-port)")
    sink = None
    try:
        tables = Tables(args, cfg, checkpoint, policy, hub)
        starting = args.starting
        milvus = cfg.is_set("milvus.address") and bool(cfg.get_str("milvus.address"))
        pending = Pending.for_job(spark, args, cfg, checkpoint, state, tables)  # None: snapshots before the stream
        if args.snapshot == "initial" and not os.path.isdir(os.path.join(checkpoint, "offsets")):
            starting = (pending.begin_new(selection) if pending else
                        snapshot_all(spark, args, cfg, checkpoint, state, selection, tables)) or starting
        elif args.snapshot == "initial" and milvus:
            if pending:
                pending.begin_late(selection)
            else:
                snapshot_all(spark, args, cfg, checkpoint, state, selection, tables, late=True)
        sink = ManyBatch(tables, state, selection, concurrency=args.table_concurrency,
                         locate=Locate(cfg) if milvus else None)
        sink.pending = pending  # its rows staged, its handover at a batch's start (jobs/mirror_many_pending.py)
        # an earlier run's tables: opened, then read ahead, while Spark starts the query (pending snapshots, which
        # run beside the stream from its start: opened first)
        sink.open_ahead(ahead=pending is None)
        t0 = time.perf_counter()
        sink.on_query_start = hub.watch  # the backlog metric reads the running query's progress
        rows = _run_beside(spark, args, cfg, starting, sink, checkpoint, pending)
    finally:
        if sink is not None:
            sink.close()  # every table's writer lease, held across the batches
        hub.close()
    return {"job": "mirror", "selection": selection.describe(), "table_root": args.table_root or
            f"{args.catalog}:{args.namespace}",
            "format": args.table_format, "checkpoint": checkpoint, "stream_pieces": rows,
            "stream_seconds": round(time.perf_counter() - t0, 3), "metrics_port": hub.port,
            "maintenance": {loc: u.state() for loc, u in sorted(tables.upkeeps.items())},
            "handed_over": pending.handed if pending else [], **sink.summary()}
