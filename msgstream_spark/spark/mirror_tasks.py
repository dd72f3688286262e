"""The mirror's Spark tasks: the writing tasks (each its share's changes collapsed and written as data files) and
the planning tasks (their keys looked up in the table's live files), with the store traffic they move.

Both take several tables (*targets*) at once: a one-collection batch is one target (``SOLE``); a database job's
batch (``spark.mirror_many_write``) is every table it touches, written by the tasks of one Spark job (each task
splits its rows by collection id) and planned by the tasks of one more. Every row a task returns is tagged with
its table (``TARGET``)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.formats.base import WriteSpec
from msgstream_spark.mirror.store import io_since, io_totals
from msgstream_spark.mirror.store.parquet import read_parquet
from msgstream_spark.mirror.write.layout import TaskWriter, narrow_schema
from msgstream_spark.mirror.write.taskplan import (
    ChangesFile,
    changes_count,
    changes_files,
    claims_dir,
    plan_out_schema,
    plan_share,
    written_schema,
)
from msgstream_spark.spark.failpoints import worker_failpoint

SEQ = "_seq"
# the column tagging each writing or planning task's row with its table (a database job's: the collection id)
TARGET = "_target"
SOLE = -1  # the tag of a one-collection batch's one table


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


def tagged_written_schema() -> pa.Schema:
    """A writing task's rows (``taskplan.written_schema``) with the table they belong to (``TARGET``)."""
    return pa.schema([*written_schema(), pa.field(TARGET, pa.int64())])


# The tasks' functions are instances of this module's classes, not closures: Spark pickles each ``mapInArrow``'s
# function at every batch, and cloudpickle pickles a closure by value, its code and globals, scanning every module
# the process imported for each module the closure refers to (~3-9 ms a closure in a driver with Spark, Arrow and a
# table format loaded); an instance of an importable class is pickled by reference to its class, its fields only.


class _Whole:
    """The ``split`` of a one-table writing task: every row is table ``tag``'s."""

    def __init__(self, tag: int) -> None:
        self.tag = tag

    def split(self, b: pa.RecordBatch):
        yield self.tag, pa.Table.from_batches([b])

    __call__ = split


def whole(tag: int) -> _Whole:
    """The ``split`` of a one-table writing task: every row is table ``tag``'s."""
    return _Whole(tag)


# a writing task's extra rows when asked (``aside``): its input row count, and each row it set aside unwritten
INPUT, ASIDE = "input", "aside"
ASIDE_COLUMNS = ("op", "_ts", "_shard", "_partition")


def _set_aside(b: pa.RecordBatch, ops: tuple[str, ...], out: list[dict]) -> pa.RecordBatch:
    """``b`` without its rows whose ``op`` is one of ``ops``; those rows' ``ASIDE_COLUMNS`` appended to ``out``."""
    hit = pc.fill_null(pc.is_in(b.column("op"), value_set=pa.array(ops, b.schema.field("op").type)), False)
    if not pc.any(hit).as_py():
        return b
    out.extend(b.filter(hit).select([c for c in ASIDE_COLUMNS if c in b.schema.names]).to_pylist())
    return b.filter(pc.invert(hit))


def _report(seen: int, aside: list[dict]) -> pa.Table:
    """A writing task's ``INPUT`` row (the rows it read) and an ``ASIDE`` row per row it left unwritten."""
    schema, n = written_schema(), 1 + len(aside)
    extra = {"kind": [INPUT] + [ASIDE] * len(aside), "path": [None] + [json.dumps(r) for r in aside],
             "rows": [seen] + [1] * len(aside)}
    return pa.Table.from_arrays([pa.array(extra[f.name], f.type) if f.name in extra else pa.nulls(n, f.type)
                                 for f in schema], schema=schema)


def writer_fn(targets: dict[int, tuple[WriteSpec, str]], split, kill: str | None, traffic: Traffic,
               aside: tuple[str, ...] | None = None):
    """A writing task over several tables: ``targets`` maps each table's tag to (its spec, its attempt's directory);
    ``split(batch)`` yields (tag, that table's rows of the Arrow batch). Each table the task's rows reach gets data
    files and a changes file of its own; the task returns a row per file, tagged with its table. ``aside`` (one
    target only): the task also reports its input rows and leaves the rows whose ``op`` is one of ``aside``
    unwritten (see ``write_in_tasks``)."""
    return _Writer(targets, split, kill, traffic, aside)


class _Writer:
    """A writing task's function (:func:`writer_fn`)."""

    def __init__(self, targets: dict[int, tuple[WriteSpec, str]], split, kill: str | None, traffic: Traffic,
                 aside: tuple[str, ...] | None) -> None:
        self.targets, self.split, self.kill, self.traffic, self.aside = targets, split, kill, traffic, aside

    def write(self, batches):
        before = io_totals()
        tables = _TaskTables(self.targets, self.kill)
        seen, kept = 0, []
        try:
            for b in batches:  # one Arrow batch at a time (spark.sql.execution.arrow.maxRecordsPerBatch rows)
                seen += b.num_rows
                if self.aside and b.num_rows:
                    b = _set_aside(b, self.aside, kept)
                if b.num_rows:
                    tables.add(list(self.split(b)))
            outs = tables.close()  # before the task ends: the driver commits only files of finished tasks
        except BaseException:
            tables.abort()
            raise
        finally:
            tables.shutdown()
        self.traffic.add(io_since(before))
        if self.aside is not None:
            outs.append((next(iter(self.targets)), _report(seen, kept)))
        for tag, out in outs:
            yield from out.append_column(TARGET, pa.array([tag] * out.num_rows, pa.int64())).to_batches()

    __call__ = write


def input_rows(written: pa.Table) -> int:
    """The rows the writing tasks read (each task's once: only the successful attempts' results reach the driver)."""
    return sum(r for k, r in zip(written.column("kind").to_pylist(), written.column("rows").to_pylist())
               if k == INPUT)


def aside_rows(written: pa.Table) -> list[dict]:
    """The rows the writing tasks set aside (``ASIDE_COLUMNS``), in no particular order."""
    return [json.loads(p) for k, p in zip(written.column("kind").to_pylist(), written.column("path").to_pylist())
            if k == ASIDE]


# a writing task adds rows to, and finishes the files of, this many of its tables at once (each waits for the
# store: a local file's fsyncs, an object's upload)
TABLE_THREADS = 8


class _TaskTables:
    """A writing task's tables: a ``TaskWriter`` and a ``ChangesFile`` each, opened at the table's first rows;
    several tables' rows added, and files finished, side by side."""

    def __init__(self, targets: dict[int, tuple[WriteSpec, str]], kill: str | None) -> None:
        self.targets, self.kill = targets, kill
        self.open: dict[int, tuple[TaskWriter, ChangesFile]] = {}
        self.pool: ThreadPoolExecutor | None = None

    def add(self, parts: list[tuple[int, pa.Table]]) -> None:
        """Each (tag, rows) of ``parts`` into its table's files."""
        for tag, _ in parts:
            if tag not in self.open:
                spec, changes_at = self.targets[tag]
                w = TaskWriter(spec, claims=claims_dir(changes_at))
                self.open[tag] = (w, ChangesFile(w.store, changes_at, spec.key_type))
        self._each(self._add, parts)

    def _add(self, part: tuple[int, pa.Table]) -> None:
        w, changes = self.open[part[0]]
        changes.add(w.add(part[1]))
        if self.kill:
            worker_failpoint(w, self.kill)

    def close(self) -> list[tuple[int, pa.Table]]:
        """Every table's files finished: (tag, the rows naming its files)."""
        return self._each(lambda item: (item[0], item[1][1].close(item[1][0].close())), sorted(self.open.items()))

    def abort(self) -> None:
        for w, changes in self.open.values():
            w.abort()
            changes.abort()

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()

    def _each(self, fn, items: list) -> list:
        """``fn`` of each item, several at once; every call ended before the first failure is raised."""
        if len(items) <= 1:
            return [fn(i) for i in items]
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=TABLE_THREADS, thread_name_prefix="task-tables")
        futures = [self.pool.submit(fn, i) for i in items]
        wait(futures)
        return [f.result() for f in futures]


def writing(df, targets: dict[int, tuple[WriteSpec, str]], split, kill: str | None, traffic: Traffic,
            aside: tuple[str, ...] | None = None):
    """``df``'s rows written into ``targets`` by its tasks (lazy: :func:`collect_written` runs it), ``split``
    choosing each row's table (see ``writer_fn``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    fn = writer_fn(targets, split, kill, traffic, aside)
    return df.mapInArrow(fn, from_arrow_schema(tagged_written_schema()))


def collect_written(frames: list) -> pa.Table:
    """The rows of ``frames`` (:func:`writing`'s DataFrames over a batch's rows) in one Spark job: their union."""
    if not frames:
        return tagged_written_schema().empty_table()
    got = reduce(lambda a, b: a.unionByName(b), frames)
    return got.toArrow().cast(tagged_written_schema())


def of_target(t: pa.Table, tag: int) -> pa.Table:
    """The rows of table ``tag`` among the tasks' tagged rows, without the tag."""
    return t.filter(pc.equal(t.column(TARGET), tag)).drop_columns([TARGET])


def write_in_tasks(df, spec: WriteSpec, changes_at: str, kill: str | None = None,
                   traffic: Traffic | None = None, aside: tuple[str, ...] | None = None) -> pa.Table:
    """The micro-batch's rows written as data files by Spark tasks, their narrow rows as changes files under
    ``changes_at``; a row per file (``taskplan.written_schema``). ``aside`` (not None): each task also reports
    the rows it read (a row of kind ``INPUT``) and leaves its rows whose ``op`` is one of ``aside`` unwritten, a
    row of kind ``ASIDE`` each (``input_rows``, ``aside_rows``)."""
    if SEQ not in df.columns:
        raise MirrorError(f"the stream's rows have no {SEQ} column (the change order); columns: {df.columns}")
    # no shuffle of the rows: a key whose changes land in two writing tasks (Milvus routes a key to one
    # channel, so rarely) meets its other changes in the planning shuffle, which deletes the losing rows
    traffic = traffic or Traffic(df.sparkSession.sparkContext)
    got = collect_written([writing(df, {SOLE: (spec, changes_at)}, whole(SOLE), kill, traffic, aside)])
    return of_target(got, SOLE).cast(written_schema())


# a batch of at most this many changes is planned by one task reading every changes file (~60 bytes a change,
# no shuffle: one Spark stage); a larger one by tasks taking the changes files shuffled by key
ONE_TASK_PLAN_ROWS = 1_000_000
PLANNED = ("kind", "file", "positions", "rows")  # the planning tasks' columns of every table (no key)


@dataclass(frozen=True)
class PlanTarget:
    """One table a planning job plans: its tag (``TARGET``), its changes files, key, store, the index of its live
    files in the job's broadcast list, and its changes (how many)."""

    tag: int
    paths: list[str]
    pk: str
    key_type: pa.DataType
    store: Any
    files: int
    changes: int


def _plan_schema(key_type: pa.DataType, existed: bool) -> pa.Schema:
    """A planning task's rows, tagged: with ``existed`` every column of ``plan_out_schema`` (one key type: one
    table), else the columns every table has."""
    out = plan_out_schema(key_type)
    cols = list(out) if existed else [out.field(c) for c in PLANNED]
    return pa.schema([*cols, pa.field(TARGET, pa.int64())])


def _tagged(out: pa.Table, t: PlanTarget, existed: bool) -> pa.Table:
    out = out if existed else out.select(list(PLANNED))
    return out.append_column(TARGET, pa.array([t.tag] * out.num_rows, pa.int64()))


class _PlanShare:
    """Tasks over table ``t``'s changes shuffled by key: each plans its share."""

    def __init__(self, t: PlanTarget, files_bc, existed: bool, traffic: Traffic) -> None:
        self.t, self.files_bc, self.existed, self.traffic = t, files_bc, existed, traffic

    def plan_task(self, batches):
        t = self.t
        got = [b for b in batches if b.num_rows]
        if not got:  # no key of the batch hashed here
            return
        before = io_totals()
        share = pa.Table.from_batches(got)  # every change of this task's keys (narrow rows)
        out = plan_share(share, self.files_bc.value[t.files], t.pk, t.key_type, self.existed, t.store)
        self.traffic.add(io_since(before))
        yield from _tagged(out, t, self.existed).to_batches()

    __call__ = plan_task


def plan_whole(t: PlanTarget, paths: list[str], files: Any, existed: bool, traffic: Traffic) -> pa.Table:
    """In a task: table ``t`` planned whole from its changes files ``paths`` (its store traffic in ``traffic``)."""
    before = io_totals()
    share = pa.concat_tables([read_parquet(t.store, p) for p in paths])
    out = plan_share(share, files, t.pk, t.key_type, existed, t.store)
    traffic.add(io_since(before))
    return out


class _PlanAll:
    """Tasks over ``spark.range(len(targets))``: row i's task plans table ``targets[i]`` whole (:func:`plan_whole`)."""

    def __init__(self, targets: list[PlanTarget], files_bc, existed: bool, traffic: Traffic) -> None:
        self.targets, self.files_bc, self.existed, self.traffic = targets, files_bc, existed, traffic

    def plan_task(self, batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                t = self.targets[i]
                out = plan_whole(t, t.paths, self.files_bc.value[t.files], self.existed, self.traffic)
                yield from _tagged(out, t, self.existed).to_batches()

    __call__ = plan_task


class _ReadChanges:
    """Tasks reading the changes files (one each, through the store): the narrow rows to shuffle by key."""

    def __init__(self, paths: list[str], store, traffic: Traffic) -> None:
        self.paths, self.store, self.traffic = paths, store, traffic

    def read(self, batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                before = io_totals()
                got = read_parquet(self.store, self.paths[i])
                self.traffic.add(io_since(before))
                yield from got.to_batches()

    __call__ = read


def plan_targets(spark, targets: list[PlanTarget], files: list[Any], existed: bool = False,
                 traffic: Traffic | None = None) -> pa.Table:
    """Tables ``targets`` planned by the tasks of one Spark job, every change of a key in one task, looked up in
    its table's live files (``files[t.files]``; ``taskplan.plan_share``); the tasks' rows, tagged. A table of at
    most ``ONE_TASK_PLAN_ROWS`` changes is planned by one task; a larger one by tasks taking its changes files
    shuffled by key. ``existed`` (a history's: the key's newest ``_seq``) for one table only."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if existed and len({t.key_type for t in targets}) > 1:
        raise MirrorError("plan_targets: existed keys are planned for tables of one key type only")
    schema = _plan_schema(targets[0].key_type, existed)
    out = from_arrow_schema(schema)
    traffic = traffic or Traffic(spark.sparkContext)
    files_bc = spark.sparkContext.broadcast(files)
    small = [t for t in targets if t.changes <= ONE_TASK_PLAN_ROWS]
    frames = []
    try:
        if small:  # the tables side by side in a task per core
            ids = spark.range(0, len(small), 1, numPartitions=min(len(small), spark.sparkContext.defaultParallelism))
            frames.append(ids.mapInArrow(_PlanAll(small, files_bc, existed, traffic), out))
        for t in (t for t in targets if t.changes > ONE_TASK_PLAN_ROWS):
            ids = spark.range(0, len(t.paths), 1, numPartitions=len(t.paths))
            narrow_out = from_arrow_schema(narrow_schema(t.key_type))
            narrow = ids.mapInArrow(_ReadChanges(t.paths, t.store, traffic), narrow_out)
            shares = narrow.repartition(spark.sparkContext.defaultParallelism, "key")
            frames.append(shares.mapInArrow(_PlanShare(t, files_bc, existed, traffic), out))
        return reduce(lambda a, b: a.unionByName(b), frames).toArrow().cast(schema)
    finally:
        files_bc.unpersist()


def as_planned(got: pa.Table, key_type: pa.DataType) -> pa.Table:
    """One table's planning rows (untagged) as ``plan_out_schema`` has them (columns the tasks left out: nulls)."""
    out = plan_out_schema(key_type)
    n = got.num_rows
    return pa.Table.from_arrays([got.column(f.name) if f.name in got.column_names else pa.nulls(n, f.type)
                                 for f in out], schema=out)


def plan_in_tasks(spark, table, written: pa.Table, existed: bool = False,
                  traffic: Traffic | None = None) -> tuple[pa.Table, int | None]:
    """The batch planned by Spark tasks (:func:`plan_targets`, one table): the tasks' rows (deleted positions per
    file, rows applied) and the table version those files were read at (the commit's fence; None: nothing to
    plan)."""
    key_type = table.schema.field(table.pk).type
    paths = changes_files(written)
    if not paths:
        return plan_out_schema(key_type).empty_table(), None
    files = table.live_files()
    t = PlanTarget(SOLE, paths, table.pk, key_type, table.store, 0, changes_count(written))
    got = plan_targets(spark, [t], [files], existed, traffic)
    return as_planned(of_target(got, SOLE), key_type), files.version
