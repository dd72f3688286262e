"""Mirror micro-batches of the ``msgstream`` rows into a table: the ``foreachBatch`` function.

    q = (spark.readStream.format("msgstream").option(...).load().writeStream
         .foreachBatch(MirrorBatch(table, pk="pk", checkpoint=chk)).option("checkpointLocation", chk).start())

Each micro-batch goes through the merge-on-read write path (msgstream_spark.mirror.write.layout,
msgstream_spark.mirror.write.taskplan) in two Spark stages: writing tasks collapse their share of the changes,
write the inserted rows as data files under the table's location and their narrow rows (key, ``_seq``, op,
file, row) as changes files beside them; planning tasks read the changes files shuffled by key, look their
keys up in the table's live files and return the positions to delete per file. The driver receives only
file lists, delete positions and counts (never a row of the batch), and commits (deletion vectors /
position deletes) with the query's id and the batch id, skipping a batch the table already holds. The
query id is Spark's own (``<checkpoint>/metadata``), stable across restarts from the same checkpoint. With a
history table, tasks write the batch's change-log rows too (``spark.history``) and the driver commits their
files before the merge.

Tasks share no disk with the driver or each other: every file goes through the table's store, built in the
task from the settings the driver resolved (``WriteSpec.storage``). What each step moved through the store
(bytes read and written, requests: the driver's and its tasks', counted by accumulators) is in the batch's log
line and summed in ``MirrorBatch.bytes``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_BATCH, PROP_QUERY
from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.formats.base import WriteSpec
from msgstream_spark.mirror.history.write import existed_from_matches
from msgstream_spark.mirror.maintenance import compact
from msgstream_spark.mirror.report import BatchReport, data_rows, op_counts
from msgstream_spark.mirror.store import io_since, io_totals
from msgstream_spark.mirror.store.writer import writer_lock
from msgstream_spark.mirror.watermark import PROP_WATERMARK, checkpoint_offset, freshness_ms
from msgstream_spark.mirror.write.attempts import begin_batch, end_batch
from msgstream_spark.mirror.write.batch import run_batch
from msgstream_spark.mirror.write.taskplan import (
    batch_collections,
    changes_count,
    existed_keys,
    merge_plans,
)
from msgstream_spark.spark.history import history_in_tasks, seed_in_tasks
from msgstream_spark.spark.mirror_tasks import Traffic, aside_rows, input_rows, plan_in_tasks, write_in_tasks

log = logging.getLogger(__name__)

# tests: kill-after-commit:<batch id> | kill-after-commit:first | kill-after-files:first (the driver);
# kill-worker-in-files:<batch id> (the first attempt of the batch's first writing task, mid-file);
# kill-executor-in-files:<batch id>|first (the same task SIGKILLs its executor JVM; first: the first batch this
# run writes rows in); several, comma-separated
FAILPOINT_ENV = "MSGSTREAM_MIRROR_FAILPOINT"


def _failpoints() -> set[str]:
    return {p.strip() for p in os.environ.get(FAILPOINT_ENV, "").split(",") if p.strip()}


def checkpoint_query_id(checkpoint: str) -> str:
    """Spark's query id, written by Spark to ``<checkpoint>/metadata`` when the query first starts."""
    path = os.path.join(checkpoint, "metadata")
    try:
        with open(path) as f:
            return str(json.loads(f.readline())["id"])
    except (OSError, ValueError, KeyError) as exc:
        raise MirrorError(f"cannot read the query id from {path} (the streaming checkpoint's metadata): {exc}") from exc


def _failpoint(batch_id: int, committed: bool, step: str = "commit") -> None:
    """Tests: ``kill-after-commit:<batch id>``, or ``kill-after-commit:first`` (the first batch that
    committed changes), SIGKILLs the driver after the table commit and before Spark's own;
    ``kill-after-files:first`` after the tasks wrote a batch's files, before the table commit."""
    specs = _failpoints()
    if f"kill-after-{step}:{batch_id}" in specs or (committed and f"kill-after-{step}:first" in specs):
        log.warning("failpoint kill-after-%s: SIGKILL after the table commit of batch %d", step, batch_id)
        if os.getpgrp() == os.getpid():  # the test started the job as a group of its own: JVM too
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class MirrorBatch:
    """``foreachBatch`` function merging each micro-batch into ``table`` exactly once.

    ``query_id``: the identity recorded with every commit (default: Spark's query id read from
    ``checkpoint``). ``collection_id``: when set, a batch holding rows of another collection id (the
    collection was dropped and re-created under its name) fails instead of mixing the two.
    ``compact_every``: compact the table after every N committed batches (0: never). ``lock``: the table's writer
    lease held by the caller for the whole query (a ``store.writer.Hold``, e.g. the mirror job's): each batch runs
    inside it (Spark calls the function on threads of its own); without it each batch takes the lease.
    ``observers``: objects told of every batch, inside its lease: ``after_batch(report, hold)`` with a
    ``mirror.report.BatchReport`` (e.g. ``mirror.upkeep.Upkeep``: maintenance between batches; the job's
    metrics), and ``batch_failed(batch_id, error)`` when one fails (optional).
    """

    def __init__(self, table, pk: str, *, query_id: str | None = None, checkpoint: str | None = None,
                 collection_id: int | None = None, compact_every: int = 0, history=None, lock=None,
                 observers=()) -> None:
        if query_id is None and checkpoint is None:
            raise MirrorError("MirrorBatch needs query_id or checkpoint (to read Spark's query id)")
        self.table, self.pk, self.checkpoint = table, pk, checkpoint
        self._query_id = query_id
        self.collection_id = collection_id
        fmt = registry.of(table)
        if history is not None and not fmt.history:
            raise MirrorError(f"a history table (--history-table {history.location}) is kept beside a "
                              f"{registry.titles('history')} mirror only; {table.location} is {fmt.article} table "
                              f"(--table-format {fmt.name}): run without --history-table, or mirror into "
                              f"{registry.titles('history')}")
        self.history = history  # a mirror.history.HistoryTable: every change appended once, before the merge
        self.batches = 0
        self.skipped = 0
        self.rows = 0
        self.compact_every = compact_every
        self.compactions = 0
        self.timings: dict[str, float] = {}  # seconds per step summed over the batches
        self.last_timings: dict[str, float] = {}
        self.bytes: dict[str, dict[str, int]] = {}  # per step: bytes read / written, requests, summed
        self.last_bytes: dict[str, dict[str, int]] = {}
        self._accs: dict[str, Traffic] = {}
        self.freshness_ms: int | None = None  # wall clock minus the last committed watermark's Milvus time
        self._executor_killed = False  # kill-executor-in-files:first: armed until a batch has written rows
        self.lock = lock
        self.observers = list(observers)
        # rows the writing tasks leave unwritten (their ``op``), and what the batch is written as when the tasks
        # found some: ``rework(df, rows) -> df`` (e.g. DropPartition / Truncate merged as deletes: removals.py)
        self.aside: tuple[str, ...] | None = None
        self.rework = None
        self.read_rows = 0  # with ``aside``: the rows the writing tasks read, each batch once

    @property
    def query_id(self) -> str:
        if self._query_id is None:
            self._query_id = checkpoint_query_id(str(self.checkpoint))
        return self._query_id

    def __call__(self, df, batch_id: int) -> None:
        try:
            with self.lease(batch_id) as hold:
                t0 = time.perf_counter()
                report = self._batch(df, batch_id, hold)
                report.seconds = round(time.perf_counter() - t0, 3)
                self.observe(report, hold)
        except Exception as e:
            self.failed(batch_id, e)
            raise

    def lease(self, batch_id: int, hold=None):
        """The table's writer lease for batch ``batch_id`` (a context manager yielding the ``Hold``): this
        function's ``lock``, or ``hold`` (a thread joining a hold taken on another), or taken for the batch."""
        return writer_lock(self.table.store, self.table.location, f"batch {batch_id}", share=hold or self.lock)

    def observe(self, report: BatchReport, hold) -> None:
        """The observers told of a batch, inside its lease."""
        for o in self.observers:
            o.after_batch(report, hold)

    def failed(self, batch_id: int, error: Exception) -> None:
        """The observers told of a failed batch."""
        for o in self.observers:
            if hasattr(o, "batch_failed"):
                o.batch_failed(batch_id, error)

    def watermark(self, batch_id: int) -> tuple[dict | None, dict[str, str] | None]:
        """(the batch's offsets from the checkpoint, the commit info recording them)."""
        offset = checkpoint_offset(self.checkpoint, batch_id) if self.checkpoint else None
        return offset, ({PROP_WATERMARK: json.dumps(offset, sort_keys=True)} if offset else None)

    def _batch(self, df, batch_id: int, hold) -> BatchReport:
        offset, info = self.watermark(batch_id)
        run = SparkRunner(self, df, batch_id)
        plan = run_batch(self.table, run, query_id=self.query_id, batch_id=batch_id, hold=hold, commit_info=info)
        return self.account(run, plan, batch_id, offset)

    def account(self, run: SparkRunner, plan, batch_id: int, offset: dict | None) -> BatchReport:
        """After ``run``'s batch committed (``plan``) or not (None): the counters, timings and traffic, the batch's
        progress line, the failpoint after the commit, the compaction every ``compact_every``; the batch's report."""
        qid = self.query_id
        if run.attempt is None:  # its commit survived a kill (or another writer's did)
            log.info("batch %d of query %s is already in the table: skipped", batch_id, qid)
            self.skipped += 1
            return BatchReport(batch_id, False, watermark=offset)
        t, io, changes = run.t, run.io, run.changes
        self._timed(write=t[1] - t[0], plan=t[3] - t[2], commit=time.perf_counter() - t[3])
        tasks = {k: _diff(m.value(), run.before[k]) for k, m in run.moved.items()}
        self._moved(write=_plus(_diff(io[1], io[0]), tasks["write"]), plan=_plus(_diff(io[3], io[2]), tasks["plan"]),
                    commit=io_since(io[3]))
        if plan is not None:
            self.batches += 1
            self.rows += changes
            if offset:  # the progress line of the batch: how far behind Milvus's clock the table is
                self.freshness_ms = freshness_ms(offset, int(time.time() * 1000))
                log.info("mirror batch %d: %d change(s) committed; table complete to %s; freshness %s ms (%s; "
                         "bytes read/written: %s)", batch_id, changes,
                         {ch: e.get("ts") for ch, e in sorted(offset.items())}, self.freshness_ms,
                         ", ".join(f"{k} {v:.2f} s" for k, v in self.last_timings.items()),
                         ", ".join(f"{k} {v['read']}/{v['written']}" for k, v in self.last_bytes.items()))
        else:
            self.skipped += 1
        _failpoint(batch_id, plan is not None and changes > 0)
        if plan is not None and self.compact_every and self.batches % self.compact_every == 0:
            done = compact(self.table)
            self.compactions += 1
            log.info("compaction after batch %d: %d files with %d deleted rows -> %d files", batch_id, done.files_in,
                     done.deleted_rows, done.files_out)
        return BatchReport(batch_id, plan is not None, changes if plan is not None else 0,
                           op_counts(changes, run.data_rows, plan), step_seconds=dict(self.last_timings),
                           watermark=offset, freshness_ms=self.freshness_ms if plan is not None else None)

    def _task_failpoint(self, batch_id: int) -> str | None:
        """Tests: the process a writing task of this batch kills (``kill-worker-in-files:<batch id>``,
        ``kill-executor-in-files:<batch id>|first``): "worker", "executor" or None."""
        specs = _failpoints()
        if f"kill-worker-in-files:{batch_id}" in specs:
            return "worker"
        if f"kill-executor-in-files:{batch_id}" in specs or ("kill-executor-in-files:first" in specs
                                                             and not self._executor_killed):
            return "executor"
        return None

    def _history(self, df, spec: WriteSpec, matches: pa.Table, qid: str, batch_id: int) -> None:
        """The batch's changes into the change log (once), written by tasks; the driver commits the files.
        The first time, the seed: the table's rows before this batch, written by tasks from its data files."""
        h = self.history
        hspec = h.spec(spec.schema, spec.snapshot_ts)
        if not h.seeded():
            h.commit_seed(seed_in_tasks(df.sparkSession, self.table, hspec))
        last = h.last_batch(qid)
        if last is not None and last >= batch_id:
            return
        files = history_in_tasks(df, hspec, existed_from_matches(matches, self.pk))
        h.commit_files(files, qid, batch_id, {PROP_QUERY: qid, PROP_BATCH: str(batch_id)})

    def _timed(self, **steps: float) -> None:
        """The batch's steps' seconds (tasks writing, tasks planning, the commit; history counted in commit) as
        the last batch's and summed over the batches (``timings``)."""
        self.last_timings = {k: round(v, 3) for k, v in steps.items()}
        for k, v in steps.items():
            self.timings[k] = round(self.timings.get(k, 0.0) + v, 3)

    def _traffic(self, sc) -> dict[str, Traffic]:
        """The accumulators of the tasks' store traffic per step (made once: Spark keeps every accumulator)."""
        if not self._accs:
            self._accs = {"write": Traffic(sc), "plan": Traffic(sc)}
        return self._accs

    def _moved(self, **steps: dict[str, int]) -> None:
        """The batch's steps' store traffic (the driver's and its tasks') as the last batch's and summed."""
        self.last_bytes = steps
        for k, v in steps.items():
            self.bytes[k] = _plus(self.bytes.get(k, {}), v)

    def _check_collection(self, ids: set[int]) -> None:
        if self.collection_id is None or not ids:
            return
        other = ids - {self.collection_id}
        if other:
            raise MirrorError(
                f"the stream holds rows of collection id(s) {sorted(other)}, but the table mirrors collection id "
                f"{self.collection_id} of that name: the collection was dropped and re-created. The table keeps the "
                f"old collection's rows; mirror the new collection into a new table (and a new checkpoint)")


class SparkRunner:
    """A batch's steps (``write.batch.Runner``) in Spark tasks: the writing tasks' files in this attempt's
    directory (``write.attempts``), the planning tasks' lookups; the driver keeps the narrow results only. The
    database job's runner (``spark.mirror_many_write``) takes its written and planned rows from jobs it shares
    with the batch's other tables (:meth:`took`, :meth:`planned`)."""

    def __init__(self, mb: MirrorBatch, df, batch_id: int) -> None:
        self.mb, self.df, self.batch_id = mb, df, batch_id
        self.attempt: str | None = None
        self.changes, self.collections = 0, set()
        self.data_rows = 0
        self.t: list[float] = []  # the steps' clocks: write start, end; plan start, end
        self.io: list[dict[str, int]] = []  # the driver's store traffic at the same points
        self.moved: dict[str, Traffic] = {}  # the tasks' store traffic per step, and its values before the batch
        self.before: dict[str, dict[str, int]] = {}

    def _mark(self) -> None:
        self.t.append(time.perf_counter())
        self.io.append(io_totals())

    def begin(self, table, hold, query_id: str, batch_id: int) -> bool:
        self.attempt = begin_batch(table, hold, query_id, batch_id)  # earlier attempts' files cleared
        return self.attempt is not None

    def columns(self) -> pa.Schema:
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(self.df.schema, timezone="UTC")

    def write(self, spec: WriteSpec) -> pa.Table:
        kill = self.mb._task_failpoint(self.batch_id)  # read here, shipped to the task (executors lack the env)
        self.spec = spec
        self.moved = self.mb._traffic(self.df.sparkSession.sparkContext)  # (a skipped batch touches no df)
        self.before = {k: m.value() for k, m in self.moved.items()}
        self._mark()
        mb = self.mb
        written = write_in_tasks(self.df, spec, self.attempt, kill, self.moved["write"], mb.aside)
        if mb.aside is not None:
            mb.read_rows += input_rows(written)
            found = aside_rows(written)
            if found:  # written again, as ``rework`` makes it: the first write's files are dropped with the attempt
                self.df = mb.rework(self.df, found)
                written = write_in_tasks(self.df, spec, self.attempt, None, self.moved["write"])
        self._mark()
        return self.took(written, kill)

    def took(self, written: pa.Table, kill: str | None) -> pa.Table:
        """What the writing tasks returned (``kill``: the failpoint they were given): counted, its collection
        ids checked, the failpoint after the files."""
        self.changes = changes_count(written)
        self.data_rows = data_rows(written)
        if kill == "executor" and self.changes:
            self.mb._executor_killed = True
        self.collections = batch_collections(written)
        self.mb._check_collection(self.collections)
        _failpoint(self.batch_id, self.changes > 0, "files")
        return written

    def plan(self, table, written: pa.Table):
        mb = self.mb
        self._mark()
        planned, base = plan_in_tasks(self.df.sparkSession, table, written, mb.history is not None,
                                      self.moved["plan"])
        self._mark()
        return self.planned(written, planned, base)

    def planned(self, written: pa.Table, planned: pa.Table, base: int | None):
        """The plan of the planning tasks' rows (``base``: the version their lookups read); the history first."""
        mb = self.mb
        if mb.history is not None:  # before the commit: a re-run batch finds the table as the log saw it
            mb._history(self.df, self.spec, existed_keys(planned), mb.query_id, self.batch_id)
        return merge_plans(written, planned, base), self.collections

    def end(self, table, hold, written: pa.Table, committed: bool) -> None:
        end_batch(table, hold, self.attempt, written if committed else None)


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def _plus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}}
