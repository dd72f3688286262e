"""Snapshots beside the stream (``mirror run --database/--collections/--include --snapshot initial``).

A selected collection with no committed snapshot is *pending*: ``collections.json`` records it (``pending``, the
table location the naming rule gives it, the schema) before the query starts or resumes. Its snapshot runs in a
driver thread pool of ``--snapshot-concurrency`` (the one-collection job's ``decide_start``: positions and S taken
when **that** snapshot starts; its Spark jobs in the scheduler pool ``msgstream-snapshots``) while the query
streams the other tables. Until the handover each batch stages the collection's rows (``spark.mirror_many_staging``);
at the start of the first batch after its snapshot committed (or, when the query ends first, after it) the batch
thread applies the staged batches in order with ``min_ts`` = S, each with its own batch id as record, removes the
staging directory, then clears ``pending``. docs/mirror.md "Snapshots while streaming".

A new job's stream starts at the positions taken when it starts, before the collections are listed: every
snapshot's positions are later, so every change after a collection's S is staged or streamed.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from msgstream_spark.cli.table_args import table_options
from msgstream_spark.errors import MirrorError
from msgstream_spark.jobs.mirror_many_milvus import described_schema, milvus_collections
from msgstream_spark.mirror.common import PROP_SNAPSHOT_TS
from msgstream_spark.mirror.many import Known, ManyState
from msgstream_spark.mirror.store import Store, open_store, uri

log = logging.getLogger("msgstream_spark.jobs.mirror")

POOL = "msgstream-snapshots"  # the Spark scheduler pool of the snapshots' jobs (spark.scheduler.mode=FAIR)
START_FILE = "pending-start.json"  # a new job's stream start, kept until its query has progress
STAGING_FILE = "staging.json"  # the staging location of the job's pending collections


def staging_root(master: str, args, checkpoint: str) -> str:
    """Where batches stage a pending collection's rows: ``--staging`` if given; else ``<checkpoint>/staged`` with a
    ``local[...]`` master (the tasks share the driver's disk); else ``<table-root>/.msgstream-staged`` (the tasks on
    other machines reach it through the tables' store); with ``--namespace`` on a cluster ``--staging`` is required."""
    if getattr(args, "staging", None):
        return args.staging
    if master.startswith("local"):
        return os.path.join(checkpoint, "staged")
    if not args.table_root:
        raise MirrorError(f"--namespace {args.namespace} with the master {master!r} (not local[...]): the tasks on "
                          "other machines need a place to stage the rows of a collection whose snapshot runs beside "
                          "the stream: pass --staging LOCATION (e.g. s3://bucket/prefix)")
    return uri.join(args.table_root, ".msgstream-staged")


def _kept_staging(checkpoint: str, where: str, pending: list[int]) -> None:
    """The staging location recorded in the checkpoint (``staging.json``); a run whose location differs while
    collections are still pending (their staged batches are at the old one) fails naming both."""
    path = os.path.join(checkpoint, STAGING_FILE)
    if os.path.exists(path):
        with open(path) as f:
            before = json.load(f)["location"]
        if pending and before != where:
            raise MirrorError(f"collections ids {pending} of the job at {checkpoint} are pending with their batches "
                              f"staged at {before}; this run would stage at {where}: run it with --staging {before}")
    os.makedirs(checkpoint, exist_ok=True)
    with open(f"{path}.tmp", "w") as f:
        json.dump({"location": where}, f)
    os.replace(f"{path}.tmp", path)


def _snapshot_s(args, where: str, name: str, pk: str) -> int | None:
    """S of the table at ``where`` if a snapshot of it committed (a driver killed before its handover)."""
    from msgstream_spark.mirror.table import open_table

    try:
        t = open_table(args.table_format, where, collection=name, pk=pk, arrow_schema=None, create=False,
                       **table_options(args))
        s = t.properties().get(PROP_SNAPSHOT_TS)
    except MirrorError as exc:
        log.debug("no snapshot committed at %s yet: %s", where, exc)
        return None
    return int(s) if s else None


class Pending:
    """The job's pending collections (``cids``), their background snapshots and their handovers; the
    ``pending`` hook of ``spark.mirror_many.ManyBatch``."""

    def __init__(self, spark, args, cfg, checkpoint: str, state: ManyState, tables, store: Store) -> None:
        from msgstream_spark.spark.mirror_many_staging import staged

        self.spark, self.args, self.cfg, self.checkpoint = spark, args, cfg, checkpoint
        self.state, self.tables, self.store = state, tables, store
        self.cids = {cid for cid, k in state.known.items() if k.pending}  # a gone one stays: no table, ever
        # per pending collection: batch id -> bytes staged (the staged metrics; a restart's from the marks)
        self.sizes: dict[int, dict[int, int]] = {c: staged(store, c) for c in self.cids}
        if getattr(tables, "hub", None) is not None:
            from msgstream_spark.jobs.mirror_metrics import StagedCollector

            tables.hub.registry.register(StagedCollector(self.figures))
        self.futures: dict[int, Future] = {}
        self.pool = ThreadPoolExecutor(max_workers=max(1, args.snapshot_concurrency),
                                       thread_name_prefix="mirror-snapshot")
        self.handed: list[int] = []  # collection ids handed over by this run

    @classmethod
    def for_job(cls, spark, args, cfg, checkpoint: str, state: ManyState, tables) -> Pending | None:
        """The job's pending collections, or None where snapshots run before the stream
        (``--snapshot-source storage``)."""
        left = sorted(c for c, k in state.known.items() if k.pending)
        if getattr(args, "snapshot_source", "query") != "query":
            if left:
                raise MirrorError(f"collections.json in {checkpoint} holds collections whose snapshot was running "
                                  f"beside the stream (ids {left}): run the job with --snapshot-source query to hand "
                                  "them over")
            return None
        if getattr(args, "snapshot", "initial") != "initial" and not left:
            return None  # no snapshot to take: nothing is ever staged (nor a --staging required)
        root = staging_root(spark.sparkContext.master, args, checkpoint)
        _kept_staging(checkpoint, root, left)
        store = open_store(root, table_options(args)["storage_options"])  # resolved here; tasks get store.options
        return cls(spark, args, cfg, checkpoint, state, tables, store)

    def figures(self) -> list[tuple[str, str, int, int]]:
        """Per pending collection (table location, ``db.name``, batches staged, their bytes): the staged metrics."""
        out = []
        for cid in sorted(list(self.cids)):
            k = self.state.known.get(cid)
            if k is not None and not k.gone:
                sizes = dict(self.sizes.get(cid, {}))
                out.append((k.location or "", f"{k.db}.{k.name}", len(sizes), sum(sizes.values())))
        return out

    def begin_new(self, selection) -> str | None:
        """A new job: the channels' positions taken (once: kept until the query has progress), then every
        selected collection in Milvus recorded pending; the stream's start (None: no collection found)."""
        from msgstream_spark.jobs.mirror_start import _channels
        from msgstream_spark.mirror.snapshot.handover import starting_positions, take_positions
        from msgstream_spark.stream.factory import Factory

        path = os.path.join(self.checkpoint, START_FILE)
        if os.path.exists(path):  # a new job killed before its query's first offsets: the same start
            with open(path) as f:
                starting = json.load(f)["starting"]
        else:
            with Factory(self.cfg).client() as client:
                starting = starting_positions(take_positions(client, _channels(client, self.args, self.cfg)))
            os.makedirs(self.checkpoint, exist_ok=True)
            with open(f"{path}.tmp", "w") as f:
                json.dump({"starting": starting}, f)
            os.replace(f"{path}.tmp", path)
        found = self._record(selection, late=False)
        return starting if found or self.cids else None

    def begin_late(self, selection) -> None:
        """A restart: the selected collections in Milvus the job has not seen (made while it was down) pending."""
        found = self._record(selection, late=True)
        if found:
            log.info("restart: snapshotting %d selected collections the job has not seen, beside the stream: %s",
                     len(found), ", ".join(f"{db}.{n}" for db, n, _ in found))

    def _record(self, selection, late: bool) -> list:
        found = [c for c in milvus_collections(self.cfg) if selection.matches(c[0], c[1])
                 and c[2] not in self.state.known]
        for db, name, cid in found:
            k = Known(cid, name, db, pending=True)
            coll = self.tables.schema(k, described_schema(self.cfg, db, name) if late else None)
            k.schema = base64.b64encode(coll.SerializeToString()).decode()  # the snapshot and a restart open with it
            k.location = self.tables.place(k, coll)[0]
            self.state.known[cid] = k
            self.cids.add(cid)
        self.state.save()  # before the query starts: a restart knows them
        return found

    def start(self) -> None:
        """Every pending collection's snapshot submitted (a committed one is found and kept)."""
        for cid in sorted(self.cids):
            k = self.state.known[cid]
            if k.gone:
                continue
            self.futures[cid] = self.pool.submit(self._snapshot, cid, k.name, k.db, k.location, k.schema)

    def _snapshot(self, cid: int, name: str, db: str, where: str, schema: str) -> tuple[str, dict[str, Any]]:
        from msgstream_spark.jobs.mirror_start import decide_start
        from msgstream_spark.spark.mirror_many_staging import failpoint

        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", POOL)
        k = Known(cid, name, db, schema=schema, location=where)  # the thread's own copy
        coll = self.tables.schema(k, base64.b64decode(schema) if schema else None)
        where, pk, rows = self.tables.place(k, coll)
        # a pending collection was promised a snapshot: a restart with --snapshot never still takes it (an empty
        # table would miss every row before its staged batches)
        sub = argparse.Namespace(**{**vars(self.args), "collection": name, "table": where, "snapshot": "initial"})
        s = _snapshot_s(sub, where, name, pk)
        if s is not None:
            return where, {"mode": "snapshot committed before the restart", "S": s}
        # a place with no query progress of its own for decide_start (the stream's checkpoint has some)
        start = decide_start(self.spark, sub, self.cfg.with_overrides({"milvus.database": db}), rows, pk, cid,
                             os.path.join(self.checkpoint, "late-snapshots"))
        failpoint(f"kill-after-snapshot:{cid}")
        return (where if self.args.namespace else start.table.location), start.summary

    def before_batch(self, sink, batch_id: int) -> None:
        """The batch thread, at a batch's start: every pending collection whose snapshot is done handed over."""
        for cid in sorted(self.cids):
            f = self.futures.get(cid)
            if f is not None and f.done():
                self._handover(sink, cid, f, f"batch {batch_id}")

    def stage(self, df, batch_id: int, batch_rows: dict[int, int], removals: dict) -> None:
        """The batch's rows and removals of every pending collection staged (``spark.mirror_many_staging``)."""
        from msgstream_spark.spark.mirror_many_staging import stage

        wanted = {}
        for cid in sorted(self.cids):
            rows, mine = batch_rows.get(cid, 0) > 0, removals.get(cid, [])
            if (rows or mine) and not self.state.known[cid].gone:
                wanted[cid] = (rows, mine)
        if wanted:
            for cid, n in stage(df, self.store, batch_id, wanted).items():
                self.sizes.setdefault(cid, {})[batch_id] = n

    def finish(self, sink) -> None:
        """After the query ended: every snapshot awaited and handed over (the stream's batches are all staged)."""
        for cid in sorted(self.cids):
            if cid in self.futures:
                self._handover(sink, cid, self.futures[cid], "the query's end")

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _handover(self, sink, cid: int, f: Future, when: str) -> None:
        from msgstream_spark.spark.mirror_many_staging import apply_staged, clear, failpoint, staged

        k = self.state.known[cid]
        try:
            where, summary = f.result()
        except Exception as exc:
            if self._dropped(cid, exc):
                return
            raise MirrorError(f"snapshot of collection {k.db}.{k.name} (id {cid}) beside the stream failed: "
                              f"{exc}") from exc
        log.info("collection %s.%s (id %d): %s", k.db, k.name, cid, summary)
        k.location = where
        m = self.tables(k, self.state.schema_bytes(cid))  # its table, with S: min_ts
        ids = list(staged(self.store, cid))
        for i, b in enumerate(ids):
            apply_staged(self.spark, m, self.store, cid, b)
            if i == 0 and len(ids) > 1:
                failpoint(f"kill-in-handover:{cid}")
        sink.mirrored[cid] = m
        clear(self.store, cid)  # before pending is cleared: a restart in between hands over nothing, clears it
        self.cids.discard(cid)
        self.sizes.pop(cid, None)
        k.pending = False
        self.state.save()
        log.info("collection %s.%s (id %d): handed over at %s after its snapshot at S=%s: %d staged batch(es) "
                 "%s applied", k.db, k.name, cid, when, m.min_ts, len(ids), ids)
        if k.dropped_ts is not None:  # dropped while pending: the table keeps its last state, marked
            sink._drop(cid, k.dropped_ts)
        sink._mark_renamed(cid)
        self.handed.append(cid)

    def _dropped(self, cid: int, exc: Exception) -> bool:
        """Whether a failed snapshot's collection is no longer in Milvus (dropped while pending): then it never gets
        a table (one of part of its rows would be wrong), its staged rows are removed, and the job goes on."""
        from msgstream_spark.spark.mirror_many_staging import clear

        if cid in {c[2] for c in milvus_collections(self.cfg)}:
            return False
        k = self.state.known[cid]
        log.warning("collection %s.%s (id %d) was dropped before its snapshot committed (%s): no table is made for "
                    "it; its staged rows are removed", k.db, k.name, cid, exc)
        self.futures.pop(cid, None)
        clear(self.store, cid)
        self.sizes.pop(cid, None)
        k.gone, k.location = True, ""
        self.state.save()
        return True
