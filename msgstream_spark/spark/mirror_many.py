"""Many collections, one read: the ``foreachBatch`` function of a ``collections`` stream (``output=collections``).

    q = (spark.readStream.format("msgstream").option("output", "collections")...load().writeStream
         .foreachBatch(ManyBatch(tables, state, selection, checkpoint=chk)).option("checkpointLocation", chk).start())

Each micro-batch is kept by Spark (``persist``: the channels are read once per batch); the driver collects only
its DDL rows and the ids of the collections it touches, notes them in the job's collection list
(:class:`~msgstream_spark.mirror.many.ManyState`, saved before anything is written), makes the table of a
collection created on the stream from the schema its CreateCollection carries, and then writes the batch into
every touched table at once (``spark.mirror_many_write``): the driver begins each table's batch, one Spark job's
tasks split the batch's rows by collection id and write each table's files (``source.multi.unpack`` in tasks),
planning each small share's table in the task that wrote it (one more job plans the others, if any), and the
driver commits each table (``concurrency`` at once) through its
:class:`~msgstream_spark.spark.mirror.MirrorBatch`, fenced at its planned version, once, with its own batch record
(query id, batch id, the batch's offsets). Each table's writer lease is taken at its first batch and held until
:meth:`ManyBatch.close` (the job's end) or its collection's drop. A table the batch does not touch commits
nothing. After the rows, a DropCollection marks its table (``msgstream.mirror.dropped_ts``); the table keeps its
last state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from msgstream_spark.mirror.many import PROP_DROPPED_TS, PROP_NAME, PROP_RENAMED_TS, ManyState, Selection
from msgstream_spark.mirror.many_ahead import Ahead
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.schema import collection_arrow_schema
from msgstream_spark.source import multi
from msgstream_spark.source.multi import KIND_ALTER, KIND_CREATE, KIND_DROP
from msgstream_spark.source.rows import rows_arrow_schema
from msgstream_spark.spark.mirror import MirrorBatch
from msgstream_spark.spark.mirror_many_direct import DirectRead
from msgstream_spark.spark.mirror_many_facts import batch_facts
from msgstream_spark.spark.mirror_many_write import ManyWrite
from msgstream_spark.spark.removals import removals_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

# a table whose rows in a batch are at most this many is written by one task (one data file, one task's fixed
# costs), not by a task per partition of the batch: a batch spread over many collections gives each a small share
ONE_TASK_ROWS = 50_000


class Mirrored:
    """One collection's table and its batch function."""

    def __init__(self, table: Any, pk: str, rows_schema: pa.Schema, sink: MirrorBatch, min_ts: int | None) -> None:
        self.table, self.pk, self.rows_schema, self.sink, self.min_ts = table, pk, rows_schema, sink, min_ts
        self.where: str | None = None  # where the job's opener found it (a location or a catalog's identifier)


def rows_schema_of(schema: bytes) -> pa.Schema:
    """The ``rows`` schema of a serialized ``CollectionSchema``."""
    s = schema_pb2.CollectionSchema()
    s.ParseFromString(schema)
    return rows_arrow_schema(collection_arrow_schema(s))


# the job's: (the collection's Known entry, its CollectionSchema or None) -> its Mirrored (table made if missing)
Opener = Callable[[Any, Any], Mirrored]
# the job's: a collection id -> its database as Milvus answers (None: Milvus does not know it, or is not configured)
Locator = Callable[[int], "str | None"]


class ManyBatch:
    """``foreachBatch`` function mirroring every selected collection of a ``collections`` stream.

    ``opener``: makes or opens a collection's table (the job's naming rule and table settings). ``mirrored``:
    the tables the job opened at its start (collections snapshotted or resumed), by collection id (or, a
    restart's, opened by :meth:`open_ahead` while the query starts).
    ``concurrency``: tables begun and committed at once (1: one after the other, in collection id order; their
    files are written by one Spark job for all).
    ``locate``: a collection's database from Milvus, for one the stream names no database of (2.3-2.6.5 write
    none into CreateCollection, and into an insert only what the request's ``db_name`` field held: clients that
    pass the database in the connection's header, as pymilvus does, leave it empty).
    """

    def __init__(self, opener: Opener, state: ManyState, selection: Selection, *,
                 mirrored: dict[int, Mirrored] | None = None,
                 concurrency: int = 4, locate: Locator | None = None) -> None:
        self.opener, self.state, self.selection, self.locate = opener, state, selection, locate
        self._tables = {} if mirrored is None else mirrored  # (``mirrored``: waits for the tables opened ahead)
        self._ahead: Ahead | None = None
        self.concurrency = max(1, concurrency)
        self.batches = 0
        self.created: list[int] = []  # collection ids whose table this run made or opened on the stream
        self.dropped: list[int] = []  # collection ids whose table this run marked dropped
        # the job's pending collections (snapshots beside the stream, jobs/mirror_many_pending.py): their
        # handovers at a batch's start, their rows staged instead of merged; None: no collection is ever pending
        self.pending: Any = None
        self.shared = ManyWrite()  # the write step: one Spark job writing (planning small shares) every table
        # the job's own read of each batch's channel ranges (``spark.mirror_many_direct``); None: the DataFrame's
        self.direct: DirectRead | None = None
        self._unsaved = False  # a table made whose location collections.json does not hold yet

    @property
    def mirrored(self) -> dict[int, Mirrored]:
        """The tables open now, by collection id (tables opened ahead: once they all are; an error opening one
        raised here)."""
        if self._ahead is not None:
            self._ahead.wait_opened()
        return self._tables

    def open_ahead(self, ahead: bool = True) -> None:
        """The tables an earlier run made (a restart: each by the location it recorded) opened, then read ahead,
        in a thread of their own while Spark starts the query (``mirror.many_ahead``; the first batch waits
        for them); ``ahead`` False: opened now, in this thread."""
        if not ahead:
            self._tables.update(self._opened())
            return
        self._ahead = Ahead(self._opened, self._tables, self._take)

    def _take(self, cid: int, m: Mirrored) -> None:
        """A table's writer lease taken ahead (a dropped collection's is not: the job writes it no more)."""
        k = self.state.known.get(cid)
        if k is not None and k.dropped_ts is None:
            self.shared.take(cid, m.sink)

    def _opened(self) -> dict[int, Mirrored]:
        known = sorted(self.state.known.items())  # a pending one's table is its snapshot's until the handover
        return {cid: self.opener(k, self.state.schema_bytes(cid)) for cid, k in known if k.location and not k.pending}

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if self._ahead is not None:  # no table read by two threads: the read ahead stops after its current one
            self._ahead.stop()
            self.mirrored  # noqa: B018 - an error opening a table: raised by the first batch
        if self.pending is not None:  # collections whose snapshot committed: their staged batches applied first
            self.pending.before_batch(self, batch_id)
        tasks = None
        if self.direct is not None and (self.pending is None or not self.pending.cids):
            tasks = self.direct.tasks(batch_id, df.schema.json())  # None: its offsets not known here
        df = df.persist()  # read once by the jobs reading it (none when its tasks read the channels themselves)
        try:
            self._batch(df, batch_id, tasks)
        finally:
            df.unpersist()

    def _batch(self, df: DataFrame, batch_id: int, tasks: list | None = None) -> None:
        if tasks is None:
            ddl, touched = batch_facts(df)  # one Spark job, no shuffle
        else:  # one Spark job reading the channels, decoding no row
            ddl, touched = self.direct.facts(df.sparkSession, tasks, df.schema)
        for r in ddl:
            if r["kind"] == KIND_CREATE:
                cid = r["_collection"]
                self.state.created(cid, r["name"] or "", self._db(cid, r["db"]), r["payload"], r["_ts"])
            elif r["kind"] == KIND_ALTER:
                self._altered(r["_collection"], r["payload"], r["_ts"])
            elif r["kind"] == multi.KIND_RENAME:
                self.state.renamed(r["_collection"], r["name"] or "", r["db"] or "", r["_ts"])
        for r in touched:
            self.state.seen(r["_collection"], r["name"] or "", self._db(r["_collection"], r["db"]))
        self.state.save()  # before any table is written: a restart knows what this batch's stream told
        removals = removals_of(ddl)
        batch_rows = {r["_collection"]: r["n"] for r in touched}
        if self.pending is not None:  # a pending collection's rows and removals go to its staging, not its table
            self.pending.stage(df, batch_id, batch_rows, removals)
        ids = sorted({r["_collection"] for r in touched} | {c for c in removals if c in self.mirrored})
        made = [r["_collection"] for r in ddl if r["kind"] == KIND_CREATE]
        self._prepare([*ids, *made])
        try:
            todo = [m for m in (self._mirrored(cid) for cid in ids) if m is not None]
            for cid in made:  # a collection created in this batch with no rows yet gets its (empty) table now
                self._mirrored(cid)
        finally:
            if self._unsaved:  # the new tables' locations, once for the batch, before anything is written
                self.state.save()
                self._unsaved = False
        self._write(df, batch_id, todo, removals, batch_rows, tasks)
        for r in ddl:
            if r["kind"] == KIND_DROP:
                self._drop(r["_collection"], r["_ts"])
            elif r["kind"] == multi.KIND_RENAME:
                self._mark_renamed(r["_collection"])

    def _db(self, cid: int, db: str | None) -> str:
        """The collection's database: the stream's, else the one known, else Milvus's answer ("" if none)."""
        known = self.state.known.get(cid)
        if db or (known is not None and known.db) or self.locate is None:
            return db or ""
        return self.locate(cid) or ""

    def _altered(self, cid: int, schema: bytes, ts: int) -> None:
        """A 2.6 schema change: the collection's newest schema; its table gains the new fields as columns (the
        batch's write adds them before any file is written)."""
        if not self.state.altered(cid, schema, ts):
            return
        m = self.mirrored.get(cid)
        if m is not None:
            m.rows_schema = rows_schema_of(schema)
            log.info("collection id %d: schema changed at %d; its table takes the new fields", cid, ts)

    def _new(self, cid: int) -> bool:
        """Whether collection ``cid``'s table is to be made now (selected, known by name, not open, not pending)."""
        if cid in self.mirrored or (self.pending is not None and cid in self.pending.cids):
            return False
        k = self.state.known.get(cid)
        return k is not None and bool(k.name and k.db) and self.selection.matches(k.db, k.name)

    def _prepare(self, cids: list[int]) -> None:
        """The opener told the collections whose tables this batch makes with no schema from the stream (their
        schemas inferred by one scan of the channels, ``jobs.mirror_many_schema``)."""
        prepare = getattr(self.opener, "prepare", None)
        new = sorted({c for c in cids if self._new(c) and not self.state.schema_bytes(c)})
        if prepare is not None and new:
            prepare(new)

    def _mirrored(self, cid: int) -> Mirrored | None:
        """The collection's table (made from the schema its CreateCollection carried), or None when it is not
        selected (or its database or name is not known yet: 2.3-2.5 tell the database in its inserts)."""
        got = self.mirrored.get(cid)
        if got is not None or (self.pending is not None and cid in self.pending.cids):
            return got  # a pending collection's table is its snapshot's alone until the handover
        k = self.state.get(cid)
        if not k.name or not k.db or not self.selection.matches(k.db, k.name):
            return None
        got = self.opener(k, self.state.schema_bytes(cid))
        self.mirrored[cid] = got
        if not k.location:  # the opener's name of it (an identifier for a table in a catalog's namespace)
            k.location = getattr(got, "where", None) or got.table.location
            self._unsaved = True  # saved once the batch's new tables are open
        self.created.append(cid)
        log.info("collection %s.%s (id %d): table %s", k.db, k.name, cid, got.table.location)
        return got

    def _write(self, df: DataFrame, batch_id: int, todo: list[Mirrored], removals: dict | None = None,
               rows: dict[int, int] | None = None, tasks: list | None = None) -> None:
        """The batch into every table of ``todo`` (``spark.mirror_many_write``); ``rows``: the batch's rows per
        collection id (a table of at most ``ONE_TASK_ROWS`` of them takes its share in one task); ``tasks``: the
        batch's read tasks, when the writing tasks read the channels themselves."""
        one_task = {cid: n for cid, n in (rows or {}).items() if n <= ONE_TASK_ROWS}
        mine = {c: r for c, r in (removals or {}).items() if c in {m.sink.collection_id for m in todo}}
        self.shared(df, batch_id, todo, mine, one_task, self.concurrency, tasks)
        self.batches += 1

    def _drop(self, cid: int, ts: int) -> None:
        k = self.state.get(cid)
        if k.dropped_ts is None:
            k.dropped_ts = ts
            self.state.save()
        m = self.mirrored.get(cid)
        if m is None:
            return
        if m.table.properties().get(PROP_DROPPED_TS) != str(k.dropped_ts):  # 2.6.6+: a copy per vchannel
            m.table.set_properties({PROP_DROPPED_TS: str(k.dropped_ts)})
            self.dropped.append(cid)
            log.info("collection %s.%s (id %d) dropped at %d: table %s keeps its last state", k.db, k.name, cid, ts,
                     m.table.location)
        self.shared.release(cid)  # its table's lease, held since its first batch: no more batches of it

    def _mark_renamed(self, cid: int) -> None:
        """A 2.6.6+ rename: the table stays where it is (the collection id decides); its properties record the
        collection's name now and when it took it (docs/mirror.md "What each DDL does to a table")."""
        k, m = self.state.get(cid), self.mirrored.get(cid)
        if m is None or k.renamed_ts is None:
            return
        props = {PROP_NAME: f"{k.db}.{k.name}", PROP_RENAMED_TS: str(k.renamed_ts)}
        if any(m.table.properties().get(p) != v for p, v in props.items()):
            m.table.set_properties(props)
            log.info("collection id %d renamed %s at %d: table %s stays, its %s records the name", cid,
                     props[PROP_NAME], k.renamed_ts, m.table.location, PROP_NAME)

    def close(self) -> None:
        """The job's end: every table's writer lease, held across batches, given back."""
        if self._ahead is not None:  # (a job that ran no batch: the leases it took ahead, given back too)
            self._ahead.stop()
        self.shared.close()

    def input_rows(self) -> int:
        """The rows of the batches its own tasks read (Spark's progress counts none of them): the facts' rows."""
        return self.direct.pieces if self.direct is not None else 0

    def summary(self) -> dict[str, Any]:
        tables = {}
        for cid, m in sorted(self.mirrored.items()):
            k = self.state.known.get(cid)
            key = f"{k.db}.{k.name}" if k else str(cid)
            key = f"{key}__{cid}" if key in tables else key  # a name created again: the later id's, as its table
            tables[key] = {
                "id": cid, "table": m.table.location, "batches": m.sink.batches, "skipped": m.sink.skipped,
                "changes": m.sink.rows, "dropped_ts": k.dropped_ts if k else None}
        return {"batches": self.batches, "read_by_tasks": self.direct.batches if self.direct is not None else 0,
                "created": self.created, "dropped": self.dropped, "tables": tables}
