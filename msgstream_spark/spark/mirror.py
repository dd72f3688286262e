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
from msgstream_spark.mirror.store import io_since, io_totals
from msgstream_spark.mirror.store.parquet import read_parquet
from msgstream_spark.mirror.store.writer import writer_lock
from msgstream_spark.mirror.watermark import PROP_WATERMARK, checkpoint_offset, freshness_ms
from msgstream_spark.mirror.write.attempts import begin_batch, end_batch
from msgstream_spark.mirror.write.batch import commit_plan
from msgstream_spark.mirror.write.layout import TaskWriter, narrow_schema
from msgstream_spark.mirror.write.taskplan import (
    ChangesFile,
    batch_collections,
    changes_count,
    changes_files,
    claims_dir,
    existed_keys,
    merge_plans,
    plan_out_schema,
    plan_share,
    written_schema,
)
from msgstream_spark.spark.failpoints import worker_failpoint
from msgstream_spark.spark.history import history_in_tasks, seed_in_tasks

log = logging.getLogger(__name__)

SEQ = "_seq"
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


class Traffic:
    """What the tasks of one step moved through the store (accumulators: a retried task's bytes count too)."""

    def __init__(self, sc) -> None:
        self.acc = {k: sc.accumulator(0) for k in ("read", "written", "requests")}

    def add(self, moved: dict[str, int]) -> None:
        """In a task: what it moved."""
        for k, v in moved.items():
            self.acc[k].add(v)

    def value(self) -> dict[str, int]:
        return {k: a.value for k, a in self.acc.items()}


def _writer_fn(spec: WriteSpec, changes_at: str, kill: str | None, traffic: Traffic):
    def write(batches):
        before = io_totals()
        w = TaskWriter(spec, claims=claims_dir(changes_at))
        changes = ChangesFile(w.store, changes_at, spec.key_type)
        try:
            for b in batches:  # one Arrow batch at a time (spark.sql.execution.arrow.maxRecordsPerBatch rows)
                if b.num_rows:
                    changes.add(w.add(pa.Table.from_batches([b])))
                    if kill:
                        worker_failpoint(w, kill)
            out = changes.close(w.close())  # before the task ends: the driver commits only files of finished tasks
        except BaseException:
            w.abort()
            changes.abort()
            raise
        traffic.add(io_since(before))
        yield from out.to_batches()

    return write


def _plan_fn(files_bc, pk: str, key_type, existed: bool, store, traffic: Traffic):
    def plan_task(batches):
        got = [b for b in batches if b.num_rows]
        if not got:  # no key of the batch hashed here
            return
        before = io_totals()
        share = pa.Table.from_batches(got)  # every change of this task's keys (narrow rows)
        out = plan_share(share, files_bc.value, pk, key_type, existed, store)
        traffic.add(io_since(before))
        yield from out.to_batches()

    return plan_task


def write_in_tasks(df, spec: WriteSpec, changes_at: str, kill: str | None = None,
                   traffic: Traffic | None = None) -> pa.Table:
    """The micro-batch's rows written as data files by Spark tasks, their narrow rows as changes files under
    ``changes_at``; a row per file (``taskplan.written_schema``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if SEQ not in df.columns:
        raise MirrorError(f"the stream's rows have no {SEQ} column (the change order); columns: {df.columns}")
    # no shuffle of the rows: a key whose changes land in two writing tasks (Milvus routes a key to one
    # channel, so rarely) meets its other changes in the planning shuffle, which deletes the losing rows
    out = written_schema()
    traffic = traffic or Traffic(df.sparkSession.sparkContext)
    return df.mapInArrow(_writer_fn(spec, changes_at, kill, traffic), from_arrow_schema(out)).toArrow().cast(out)


# a batch of at most this many changes is planned by one task reading every changes file (~60 bytes a change,
# no shuffle: one Spark stage); a larger one by tasks taking the changes files shuffled by key
ONE_TASK_PLAN_ROWS = 1_000_000


def _plan_all_fn(paths: list[str], files_bc, pk: str, key_type, existed: bool, store, traffic: Traffic):
    def plan_task(batches):
        for _ in batches:  # the one row of spark.range: this task plans the whole batch
            pass
        before = io_totals()
        share = pa.concat_tables([read_parquet(store, p) for p in paths])
        out = plan_share(share, files_bc.value, pk, key_type, existed, store)
        traffic.add(io_since(before))
        yield from out.to_batches()

    return plan_task


def _changes_fn(paths: list[str], store, traffic: Traffic):
    """Tasks reading the changes files (one each, through the store): the narrow rows to shuffle by key."""
    def read(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                before = io_totals()
                got = read_parquet(store, paths[i])
                traffic.add(io_since(before))
                yield from got.to_batches()

    return read


def plan_in_tasks(spark, table, written: pa.Table, existed: bool = False,
                  traffic: Traffic | None = None) -> tuple[pa.Table, int | None]:
    """The batch planned by Spark tasks, each its keys' changes (every change of a key in one task) looked up in
    the table's live files (``taskplan.plan_share``); the tasks' rows (deleted positions per file, rows applied)
    and the table version those files were read at (the commit's fence; None: nothing to plan)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    key_type = table.schema.field(table.pk).type
    out = from_arrow_schema(plan_out_schema(key_type))
    paths = changes_files(written)
    if not paths:
        return plan_out_schema(key_type).empty_table(), None
    traffic = traffic or Traffic(spark.sparkContext)
    files = table.live_files()
    files_bc = spark.sparkContext.broadcast(files)
    store = table.store
    try:
        if changes_count(written) <= ONE_TASK_PLAN_ROWS:
            one = spark.range(0, 1, 1, numPartitions=1)
            fn = _plan_all_fn(paths, files_bc, table.pk, key_type, existed, store, traffic)
            got = one.mapInArrow(fn, out).toArrow()
        else:
            ids = spark.range(0, len(paths), 1, numPartitions=len(paths))
            narrow = ids.mapInArrow(_changes_fn(paths, store, traffic), from_arrow_schema(narrow_schema(key_type)))
            shares = narrow.repartition(spark.sparkContext.defaultParallelism, "key")
            got = shares.mapInArrow(_plan_fn(files_bc, table.pk, key_type, existed, store, traffic), out).toArrow()
    finally:
        files_bc.unpersist()
    return got.cast(plan_out_schema(key_type)), files.version


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
    """

    def __init__(self, table, pk: str, *, query_id: str | None = None, checkpoint: str | None = None,
                 collection_id: int | None = None, compact_every: int = 0, history=None, lock=None) -> None:
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

    @property
    def query_id(self) -> str:
        if self._query_id is None:
            self._query_id = checkpoint_query_id(str(self.checkpoint))
        return self._query_id

    def __call__(self, df, batch_id: int) -> None:
        with writer_lock(self.table.store, self.table.location, f"batch {batch_id}", share=self.lock) as hold:
            return self._batch(df, batch_id, hold)

    def _batch(self, df, batch_id: int, hold) -> None:
        qid = self.query_id
        changes_at = begin_batch(self.table, hold, qid, batch_id)  # earlier attempts' files cleared (attempts.py)
        if changes_at is None:  # its commit survived a kill (or another writer's did)
            log.info("batch %d of query %s is already in the table: skipped", batch_id, qid)
            self.skipped += 1
            return
        from pyspark.sql.pandas.types import to_arrow_schema

        self.table.prepare(to_arrow_schema(df.schema, timezone="UTC"))
        kill = self._task_failpoint(batch_id)  # read here, shipped to the task (executors lack the driver's env)
        spec = self.table.write_spec()
        moved = self._traffic(df.sparkSession.sparkContext)
        before = {k: t.value() for k, t in moved.items()}
        io0, t0 = io_totals(), time.perf_counter()
        written = write_in_tasks(df, spec, changes_at, kill, moved["write"])
        t1, io1 = time.perf_counter(), io_totals()
        changes = changes_count(written)
        if kill == "executor" and changes:
            self._executor_killed = True
        collections = batch_collections(written)
        self._check_collection(collections)
        _failpoint(batch_id, changes > 0, "files")
        offset = checkpoint_offset(self.checkpoint, batch_id) if self.checkpoint else None
        info = {PROP_WATERMARK: json.dumps(offset, sort_keys=True)} if offset else None
        t2, io2 = time.perf_counter(), io_totals()
        planned, base = plan_in_tasks(df.sparkSession, self.table, written, self.history is not None, moved["plan"])
        t3, io3 = time.perf_counter(), io_totals()
        if self.history is not None:  # before the merge: a re-run batch finds the table as the log saw it
            self._history(df, spec, existed_keys(planned), qid, batch_id)
        plan = commit_plan(self.table, merge_plans(written, planned, base), collections, query_id=qid,
                           batch_id=batch_id, commit_info=info, hold=hold)
        end_batch(self.table, hold, changes_at, written if plan is not None else None)
        self._timed(write=t1 - t0, plan=t3 - t2, commit=time.perf_counter() - t3)
        tasks = {k: _diff(t.value(), before[k]) for k, t in moved.items()}
        self._moved(write=_plus(_diff(io1, io0), tasks["write"]), plan=_plus(_diff(io3, io2), tasks["plan"]),
                    commit=io_since(io3))
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


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def _plus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}}
