"""A database job's batch written into every table it touches by one Spark job (whose tasks plan the small
shares' tables too; one more job plans the others, if any), committed by the driver table by table
(``spark.mirror_many.ManyBatch``'s write step).

The steps, for the tables ``todo`` the batch touches (each a ``spark.mirror_many.Mirrored`` with its table's
``MirrorBatch``):

1. the driver, table by table: the table's writer lease (taken at the table's first batch and held across batches,
   renewed in the background, as the one-collection job holds its table's: released at the job's end, when the
   table's collection is dropped, or when a batch finds it lost), ``write.batch.begin_write``
   (a batch the table already holds is skipped; an earlier attempt's files cleared; the columns a schema change
   added made), the table's ``WriteSpec`` and this attempt's directory;
2. one Spark job over the batch's rows: each task splits its rows by collection id, unpacks each collection's
   rows with its schema (``source.pieces``: column-wise, the pieces read in place) and writes them with
   that table's spec into that table's attempt directory (``spark.mirror_tasks``: the same writing tasks as a
   one-collection batch's, several targets); a table whose share of the batch is small takes it in one task (one
   data file), a table with a DropPartition or a Truncate in the batch takes its rows and the deletes they amount
   to (``spark.removals``) in tasks of its own, all in the same job; the driver receives per table the narrow
   rows a one-collection batch's tasks return;
3. the tables' plans: a table whose small share one writing task took whole is planned in that task
   (``spark.mirror_many_plan``: its keys looked up in its live files, which the driver read after its begin, at
   the version its commit is fenced at); the others (a large share, a DropPartition / Truncate) by one Spark job
   planning them (a task per table);
4. the driver commits each table (``table_concurrency`` at once; 1: in collection id order), fenced, exactly once,
   with its own batch record, ends its batch (the attempt's leftovers deleted) and tells its observers (its
   maintenance between batches, its metrics).

A table that fails at a step is reported once every other table's outcome is known: the others go on (a failed
Spark job fails every table it wrote for).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from msgstream_spark.mirror.store import LeaseLost, io_totals
from msgstream_spark.mirror.store.writer import hold_lease
from msgstream_spark.mirror.write.batch import begin_write, finish_batch, pin_log
from msgstream_spark.mirror.write.taskplan import changes_count, changes_files, written_schema
from msgstream_spark.source.multi import KIND_ROWS
from msgstream_spark.source.pieces import split_fn, unpack_fn
from msgstream_spark.spark.mirror import SparkRunner
from msgstream_spark.spark.mirror_many_direct import Unit, write_units
from msgstream_spark.spark.mirror_many_plan import (
    collect_planned,
    plan_target,
    split_planned,
    write_and_plan_fn,
    writing_planned,
)
from msgstream_spark.spark.mirror_tasks import (
    PlanTarget,
    Traffic,
    as_planned,
    of_target,
    plan_targets,
    whole,
    writer_fn,
    writing,
)
from msgstream_spark.spark.removals import Target, with_removals

log = logging.getLogger(__name__)


class Turn:
    """One table's part of a batch: its lease, runner, spec; its failure, if it failed."""

    def __init__(self, m: Any, removals: list | None) -> None:
        self.m, self.sink, self.cid = m, m.sink, m.sink.collection_id
        self.removals = removals
        self.hold: Any = None
        self.run: SharedRunner | None = None
        self.spec: Any = None
        self.offset: dict | None = None
        self.info: dict[str, str] | None = None
        self.written: pa.Table = written_schema().empty_table()
        self.files: Any = None  # its live files, read after its begin (the version its commit is fenced at)
        self.planned: pa.Table | None = None  # its plan, when its writing task planned it
        self.error: BaseException | None = None
        self.t0 = time.perf_counter()


class SharedRunner(SparkRunner):
    """A table's steps whose writing and planning tasks run in the batch's shared jobs (``took`` and
    ``planned`` take their rows); the rest as a one-collection batch's."""

    def __init__(self, mb, batch_id: int, rows_schema: pa.Schema) -> None:
        super().__init__(mb, None, batch_id)
        self.rows_schema = rows_schema
        self.got: tuple[pa.Table, int | None] | None = None  # the planning job's rows of this table, its base

    def columns(self) -> pa.Schema:
        return self.rows_schema

    def plan(self, table, written: pa.Table):
        planned, base = self.got
        return self.planned(written, planned, base)


class ManyWrite:
    """The write step of every batch of one database job (its tasks' traffic accumulators made once)."""

    def __init__(self) -> None:
        self._accs: dict[str, Traffic] = {}
        self.jobs = {"write": 0, "plan": 0}  # Spark jobs run (each over every table of a batch)
        self.held: dict[int, tuple[Any, Any]] = {}  # collection id -> (its MirrorBatch, its lease's release)
        self._holding = threading.Lock()

    def __call__(self, df, batch_id: int, todo: list, removals: dict, one_task: dict[int, int],
                 concurrency: int, tasks: list | None = None) -> None:
        """Batch ``batch_id`` (``df``: its rows) into the tables ``todo`` (``removals``: the DropPartition /
        Truncate of some, by collection id; ``one_task``: the rows of the tables whose share goes to one task;
        ``tasks``: the batch's read tasks when its writing tasks read the channels themselves, ``spark.
        mirror_many_direct``; a batch with removals reads ``df``)."""
        turns = [Turn(m, removals.get(m.sink.collection_id)) for m in todo]
        try:
            self._steps(df, batch_id, turns, one_task, concurrency, None if removals else tasks)
        finally:  # a table whose batch failed between its begin and its commit: its log read anew from now on
            for t in turns:
                pin_log(t.sink.table, False)
        failed = [t for t in turns if t.error is not None]
        for t in failed:  # a lease found lost is given up: a later batch (a restarted query) takes it anew
            if isinstance(t.error, LeaseLost) or (t.hold is not None and t.hold.lease.lost):
                self.release(t.cid)
        if failed:  # every table's outcome is known before the batch fails (the others committed or not)
            for t in failed[1:]:
                log.error("batch %d: table %s failed too: %s", batch_id, t.sink.table.location, t.error)
            raise failed[0].error

    def _steps(self, df, batch_id: int, turns: list[Turn], one_task: dict[int, int], concurrency: int,
               tasks: list | None) -> None:
        _pool(concurrency, [lambda t=t: _guarded(t, batch_id, lambda: self._begin(t, batch_id)) for t in turns])
        live = [t for t in turns if t.error is None and t.spec is not None]
        if live:  # each table's live files, at the version its begin pinned (its commit's fence)
            _pool(concurrency, [lambda t=t: _guarded(t, batch_id, lambda: self._files(t)) for t in live])
            live = [t for t in live if t.error is None]
        if live:
            self._marks(live, df.sparkSession.sparkContext)
            _all(live, batch_id, lambda: self._write(df, batch_id, live, one_task, tasks))
            live = [t for t in live if t.error is None]
        if live:
            _all(live, batch_id, lambda: self._plan(df.sparkSession, batch_id, live, concurrency))
        self._commit(turns, batch_id, concurrency)

    def hold(self, t: Turn) -> Any:
        """The table's lease: taken at its first batch (or ahead, :meth:`take`; its ``MirrorBatch``'s ``lock`` from
        then on, each batch joining it), held until :meth:`release`."""
        return self.take(t.cid, t.sink)

    def take(self, cid: int, s: Any) -> Any:
        """Collection ``cid``'s table's lease (``s``: its ``MirrorBatch``), taken unless this job holds it."""
        if cid in self.held and self.held[cid][0] is not s:  # the collection's table opened anew meanwhile
            self.release(cid)
        if cid not in self.held:
            s.lock, release = hold_lease(s.table.store, s.table.location, "the database mirror job")
            with self._holding:
                self.held[cid] = (s, release)
        return s.lock

    def release(self, cid: int) -> None:
        """The lease of collection ``cid``'s table given back (its collection dropped, the job's end, lost)."""
        with self._holding:
            got = self.held.pop(cid, None)
        if got is not None:
            sink, release = got
            sink.lock = None
            release()

    def close(self) -> None:
        """Every table's lease given back (the job's end)."""
        for cid in list(self.held):
            try:
                self.release(cid)
            except Exception as e:  # noqa: BLE001 - the others are released; it expires by itself
                log.error("the writer lease of collection id %d's table not released: %s", cid, e)

    def _begin(self, t: Turn, batch_id: int) -> None:
        """The table's lease (held across batches) and its batch begun (LeaseLost, this table's batch failing, if
        the lease is no longer this job's)."""
        s = t.sink
        with s.lease(batch_id, self.hold(t)) as hold:
            t.hold = hold
            t.t0 = time.perf_counter()
            t.offset, t.info = s.watermark(batch_id)
            t.run = SharedRunner(s, batch_id, t.m.rows_schema)
            t.spec = begin_write(s.table, t.run, query_id=s.query_id, batch_id=batch_id, hold=t.hold)

    def _files(self, t: Turn) -> None:
        """The table's live files, read once its batch began (the log pinned then: the version its commit is fenced
        at): the writing tasks planning it take them, or the planning job."""
        t.files = t.sink.table.live_files()

    def _marks(self, live: list[Turn], sc) -> None:
        if not self._accs:
            self._accs = {"write": Traffic(sc), "plan": Traffic(sc)}
        before = {k: a.value() for k, a in self._accs.items()}
        for t in live:
            t.run.moved, t.run.before, t.run.spec = self._accs, before, t.spec

    def _write(self, df, batch_id: int, live: list[Turn], one_task: dict[int, int], direct: list | None) -> None:
        """The one Spark job writing every table's files (``direct``: the batch's read tasks, when the writing
        tasks read the channels themselves; else they read ``df``)."""
        from pyspark.sql import functions as F

        kill = next((k for k in (t.sink._task_failpoint(batch_id) for t in live) if k), None)
        packed = df.where(F.col("kind") == KIND_ROWS).select("_collection", "payload") if direct is None else None
        traffic = self._accs["write"]
        frames: list = []
        units: list[Unit] = []
        sc = df.sparkSession.sparkContext
        plain = [t for t in live if not t.removals]
        ones = _bins([t for t in plain if t.cid in one_task], one_task, sc.defaultParallelism)
        files_bc = sc.broadcast({t.cid: t.files for group in ones for t in group}) if ones else None
        for group in [*ones, [t for t in plain if t.cid not in one_task]]:
            if group:  # a bin of small shares: one task, a data file per table; the large ones: a task per partition
                cids = [t.cid for t in group]
                split = split_fn({t.cid: (t.m.rows_schema, t.m.pk, t.m.min_ts) for t in group})
                targets = {t.cid: (t.spec, t.run.attempt) for t in group}
                if group[0].cid in one_task:  # the bin's task holds each table's whole share: it plans them too
                    plans = {t.cid: plan_target(t.cid, t.m.pk, _key_type(t), t.sink.table.store) for t in group}
                    if direct is not None:  # the bin's task reads every range, decoding its collections only
                        fn = write_and_plan_fn(targets, split, kill, traffic, plans, files_bc, self._accs["plan"])
                        units.append(Unit([r for task in direct for r in task], frozenset(cids), fn, True))
                        continue
                    part = packed.where(F.col("_collection").isin(cids)).coalesce(1)
                    frames.append(writing_planned(part, targets, split, kill, traffic, plans, files_bc,
                                                  self._accs["plan"]))
                elif direct is not None:  # a task per read task of the source, as the stream's own partitions
                    units += [Unit(task, frozenset(cids), writer_fn(targets, split, kill, traffic), False)
                              for task in direct]
                else:
                    frames.append(writing(packed.where(F.col("_collection").isin(cids)), targets, split, kill,
                                          traffic))
        for t in (t for t in live if t.removals):  # DropPartition / Truncate: their deletes with the rows
            m = t.m
            part = packed.where(F.col("_collection") == t.cid).select("payload")
            part = part.coalesce(1) if t.cid in one_task else part
            rows = part.mapInArrow(unpack_fn(m.rows_schema, m.pk, m.min_ts), _spark_schema(m.rows_schema))
            rows = with_removals(Target(m.table, m.pk, m.rows_schema, t.cid, m.min_ts), rows, t.removals)
            frames.append(writing(rows, {t.cid: (t.spec, t.run.attempt)}, whole(t.cid), kill, traffic))
        marks = _mark(live)
        try:
            if units:  # the one Spark job reading the channels and writing every table's files
                got, planned = split_planned(write_units(df.sparkSession, units))
            else:
                with _side_by_side(df.sparkSession):
                    got, planned = collect_planned(frames)  # the one Spark job writing every table's files
        finally:
            if files_bc is not None:
                files_bc.unpersist()
        self.jobs["write"] += 1
        _mark(live, marks)
        for t in live:
            t.written = of_target(got, t.cid).cast(written_schema())
            t.planned = planned.get(t.cid)
            _guarded(t, batch_id, lambda t=t: t.run.took(t.written, kill))

    def _plan(self, spark, batch_id: int, live: list[Turn], concurrency: int) -> None:
        marks = _mark(live)
        todo = [t for t in live if changes_files(t.written) and t.planned is None]  # not planned in its writing task
        targets = [PlanTarget(t.cid, changes_files(t.written), t.m.pk, _key_type(t), t.sink.table.store, i,
                              changes_count(t.written)) for i, t in enumerate(todo)]
        got = None
        if targets:  # the one Spark job planning every table left
            got = plan_targets(spark, targets, [t.files for t in todo], False, self._accs["plan"])
            self.jobs["plan"] += 1
        _mark(live, marks)
        for t in live:
            if t.planned is not None:
                t.run.got = (as_planned(t.planned, _key_type(t)), t.files.version)
            elif changes_files(t.written) and got is not None:
                t.run.got = (as_planned(of_target(got, t.cid), _key_type(t)), t.files.version)
            else:  # nothing written: nothing to plan (an empty commit, as a one-collection batch's)
                t.run.got = (as_planned(pa.table({}), _key_type(t)), None)

    def _commit(self, turns: list[Turn], batch_id: int, concurrency: int) -> None:
        """Each table not failed: committed (a skipped one: counted) and its observers told, in its lease."""
        def one(t: Turn) -> None:
            s = t.sink
            with s.lease(batch_id, t.hold):  # this thread joins the table's lease the job holds
                plan = None
                if t.spec is not None:
                    plan = finish_batch(s.table, t.run, t.written, query_id=s.query_id, batch_id=batch_id,
                                        hold=t.hold, commit_info=t.info)
                report = s.account(t.run, plan, batch_id, t.offset)
                report.seconds = round(time.perf_counter() - t.t0, 3)
                s.observe(report, t.hold)

        todo = [t for t in turns if t.error is None]
        _pool(concurrency, [lambda t=t: _guarded(t, batch_id, lambda: one(t)) for t in todo])


def _bins(turns: list[Turn], rows: dict[int, int], n: int) -> list[list[Turn]]:
    """``turns`` in at most ``n`` bins of about equal rows (the largest first into the emptiest): one writing task
    each, the tasks side by side."""
    bins: list[list[Turn]] = [[] for _ in range(max(1, min(n, len(turns))))]
    held = [0] * len(bins)
    for t in sorted(turns, key=lambda t: -rows.get(t.cid, 0)):
        i = held.index(min(held))
        bins[i].append(t)
        held[i] += rows.get(t.cid, 0) + 1
    return bins


# Spark 4.1+: a union of frames of the same output partitioning is planned partition by partition (its children's
# partitions i concatenated into the union's partition i): the bins, each coalesced to one partition, would all go
# into ONE task, written one after the other instead of a task per core (issue #44's database job: one task of ~3 s
# where two of ~1.6 s fit). Off for the writing job's union only: the bins' tasks side by side, as before 4.1.
UNION_PARTITIONING = "spark.sql.unionOutputPartitioning"
_CONF = threading.Lock()


@contextlib.contextmanager
def _side_by_side(spark):
    """The writing job's union of bins planned as a task per bin (``UNION_PARTITIONING`` off while it is planned;
    the session's own value, if any, back afterwards)."""
    with _CONF:
        was = spark.conf.get(UNION_PARTITIONING, None)
        spark.conf.set(UNION_PARTITIONING, "false")
    try:
        yield
    finally:
        with _CONF:
            if was is None:
                spark.conf.unset(UNION_PARTITIONING)
            else:
                spark.conf.set(UNION_PARTITIONING, was)


def _key_type(t: Turn) -> pa.DataType:
    return t.sink.table.schema.field(t.sink.table.pk).type


def _spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _mark(live: list[Turn], marks: tuple | None = None) -> tuple:
    """A step's start (``marks`` None: returned) or end: the clock and the driver's store traffic, in every
    table's runner (each is told the shared step's figures)."""
    now = (time.perf_counter(), io_totals())
    for t in live:
        if marks is not None:
            t.run.t += [marks[0], now[0]]
            t.run.io += [marks[1], now[1]]
    return now


def _guarded(t: Turn, batch_id: int, step) -> None:
    """``step`` of table ``t``; its failure kept (its observers told), the others go on."""
    try:
        step()
    except Exception as e:  # noqa: BLE001 - kept, logged, told to its observers, raised once all tables are done
        t.error = e
        log.error("batch %d: table %s failed: %s", batch_id, t.sink.table.location, e)
        t.sink.failed(batch_id, e)


def _all(live: list[Turn], batch_id: int, step) -> None:
    """A step shared by tables ``live``: its failure is each one's."""
    try:
        step()
    except Exception as e:  # noqa: BLE001 - each table's failure, raised once all tables are done
        for t in live:
            if t.error is None:
                t.error = e
                t.sink.failed(batch_id, e)
        log.error("batch %d: a step shared by %d tables failed: %s", batch_id, len(live), e)


def _pool(concurrency: int, calls: Iterable) -> list:
    """The calls' results, ``concurrency`` at once (1: in order, in this thread)."""
    calls = list(calls)
    if concurrency <= 1 or len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(calls)), thread_name_prefix="mirror-tables") as pool:
        return list(pool.map(lambda c: c(), calls))
