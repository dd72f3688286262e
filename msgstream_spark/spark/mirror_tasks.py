"""The mirror's Spark tasks: the writing tasks (each its share's changes collapsed and written as data files) and
the planning tasks (their keys looked up in the table's live files), with the store traffic they move."""

from __future__ import annotations

import json

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


def _reported(out: pa.Table, seen: int, aside: list[dict]) -> pa.Table:
    n = 1 + len(aside)
    extra = {"kind": [INPUT] + [ASIDE] * len(aside), "path": [None] + [json.dumps(r) for r in aside],
             "rows": [seen] + [1] * len(aside)}
    cols = [pa.array(extra[f.name], f.type) if f.name in extra else pa.nulls(n, f.type) for f in out.schema]
    return pa.concat_tables([out, pa.Table.from_arrays(cols, schema=out.schema)])


def _writer_fn(spec: WriteSpec, changes_at: str, kill: str | None, traffic: Traffic,
               aside: tuple[str, ...] | None = None):
    def write(batches):
        before = io_totals()
        w = TaskWriter(spec, claims=claims_dir(changes_at))
        changes = ChangesFile(w.store, changes_at, spec.key_type)
        seen, kept = 0, []
        try:
            for b in batches:  # one Arrow batch at a time (spark.sql.execution.arrow.maxRecordsPerBatch rows)
                seen += b.num_rows
                if aside and b.num_rows:
                    b = _set_aside(b, aside, kept)
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
        yield from (_reported(out, seen, kept) if aside is not None else out).to_batches()

    return write


def input_rows(written: pa.Table) -> int:
    """The rows the writing tasks read (each task's once: only the successful attempts' results reach the driver)."""
    return sum(r for k, r in zip(written.column("kind").to_pylist(), written.column("rows").to_pylist())
               if k == INPUT)


def aside_rows(written: pa.Table) -> list[dict]:
    """The rows the writing tasks set aside (``ASIDE_COLUMNS``), in no particular order."""
    return [json.loads(p) for k, p in zip(written.column("kind").to_pylist(), written.column("path").to_pylist())
            if k == ASIDE]


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
                   traffic: Traffic | None = None, aside: tuple[str, ...] | None = None) -> pa.Table:
    """The micro-batch's rows written as data files by Spark tasks, their narrow rows as changes files under
    ``changes_at``; a row per file (``taskplan.written_schema``). ``aside`` (not None): each task also reports
    the rows it read (a row of kind ``INPUT``) and leaves its rows whose ``op`` is one of ``aside`` unwritten, a
    row of kind ``ASIDE`` each (``input_rows``, ``aside_rows``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if SEQ not in df.columns:
        raise MirrorError(f"the stream's rows have no {SEQ} column (the change order); columns: {df.columns}")
    # no shuffle of the rows: a key whose changes land in two writing tasks (Milvus routes a key to one
    # channel, so rarely) meets its other changes in the planning shuffle, which deletes the losing rows
    out = written_schema()
    traffic = traffic or Traffic(df.sparkSession.sparkContext)
    fn = _writer_fn(spec, changes_at, kill, traffic, aside)
    return df.mapInArrow(fn, from_arrow_schema(out)).toArrow().cast(out)


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
