"""A database job's writing tasks that also plan the tables whose whole share of the batch they hold (a bin of small
shares, ``spark.mirror_many_write``): once a task has written such a table's files it looks the table's keys up in
the table's live files (read by the driver after the table's begin, at the version its commit is fenced at, and
broadcast) and returns the plan with its files, so a batch of small shares runs one Spark job writing and planning
instead of a writing job and a planning job (issue #44: each job's scheduling, planning and task launches).

A table's plan travels as one row of the writing job's output: kind ``PLAN_KIND``, its tag, the planning rows
(``mirror_tasks.PLANNED``) as an Arrow IPC stream in column ``plan``. The rows are what the planning job's task
would return for the table (``taskplan.plan_share`` over every changes file of the table, which this task wrote).
A table whose share is spread over several tasks (a large share, or one with a DropPartition / Truncate) is
planned by the planning job as before.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.mirror.write.taskplan import changes_files
from msgstream_spark.spark.mirror_tasks import (
    PLANNED,
    TARGET,
    PlanTarget,
    Traffic,
    plan_whole,
    tagged_written_schema,
    writer_fn,
)

PLAN_KIND = "plan"  # a fused output row carrying a table's plan, not a file
PLAN_COLUMN = "plan"


def fused_schema() -> pa.Schema:
    """The writing tasks' rows (tagged) and a plan column (null but in a table's ``PLAN_KIND`` row)."""
    return pa.schema([*tagged_written_schema(), pa.field(PLAN_COLUMN, pa.binary())])


class _WriteAndPlan:
    """A writing task's function (``mirror_tasks``'s writer) whose tables in ``plans`` (tag -> its ``PlanTarget``,
    ``files`` naming its live files in the broadcast dict) are planned in the task once their files are written."""

    def __init__(self, writer, plans: dict[int, PlanTarget], files_bc, traffic: Traffic) -> None:
        self.writer, self.plans, self.files_bc, self.traffic = writer, plans, files_bc, traffic

    def write(self, batches):
        schema, out = fused_schema(), []
        for b in self.writer(batches):  # the files' rows, as the writer returns them (after its files are closed)
            out.append(b)
            yield without_plan(b)
        if not out:
            return
        got = pa.Table.from_batches(out)
        for tag, t in sorted(self.plans.items()):
            mine = got.filter(pc.equal(got.column(TARGET), tag))
            paths = changes_files(mine)
            if not paths:  # nothing of the table here (or no changes): nothing to plan
                continue
            planned = plan_whole(t, paths, self.files_bc.value[t.files], False, self.traffic)
            yield _plan_row(schema, tag, planned.select(list(PLANNED)))

    __call__ = write


def without_plan(b: pa.RecordBatch) -> pa.RecordBatch:
    """A writing task's tagged rows as fused rows (no plan)."""
    return pa.RecordBatch.from_arrays([*b.columns, pa.nulls(b.num_rows, pa.binary())], schema=fused_schema())


def _plan_row(schema: pa.Schema, tag: int, planned: pa.Table) -> pa.RecordBatch:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, planned.schema) as w:
        w.write_table(planned)
    given = {"kind": pa.array([PLAN_KIND]), TARGET: pa.array([tag], pa.int64()),
             PLAN_COLUMN: pa.array([sink.getvalue().to_pybytes()], pa.binary())}
    return pa.RecordBatch.from_arrays([given.get(f.name, pa.nulls(1, f.type)) for f in schema], schema=schema)


def writing_planned(df, targets: dict, split, kill: str | None, traffic: Traffic, plans: dict[int, PlanTarget],
                    files_bc, plan_traffic: Traffic):
    """``df``'s rows written into ``targets`` (as ``mirror_tasks.writing``), the tables of ``plans`` planned in
    the same tasks (lazy: :func:`collect_planned` runs it)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    fn = write_and_plan_fn(targets, split, kill, traffic, plans, files_bc, plan_traffic)
    return df.mapInArrow(fn, from_arrow_schema(fused_schema()))


def write_and_plan_fn(targets: dict, split, kill: str | None, traffic: Traffic, plans: dict[int, PlanTarget],
                      files_bc, plan_traffic: Traffic) -> _WriteAndPlan:
    """The task function of :func:`writing_planned` (over packed rows: ``_collection``, ``payload``)."""
    return _WriteAndPlan(writer_fn(targets, split, kill, traffic), plans, files_bc, plan_traffic)


def collect_planned(frames: list) -> tuple[pa.Table, dict[int, pa.Table]]:
    """The rows of ``frames`` (:func:`writing_planned`'s and ``mirror_tasks.writing``'s) in one Spark job: (the
    writing tasks' tagged rows, each table's plan planned in its writing task by tag)."""
    if not frames:
        return tagged_written_schema().empty_table(), {}
    return split_planned(reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames).toArrow())


def split_planned(got: pa.Table) -> tuple[pa.Table, dict[int, pa.Table]]:
    """The fused rows of a writing job: (the files' tagged rows, each table's plan by tag)."""
    if PLAN_COLUMN not in got.column_names:
        return got.cast(tagged_written_schema()), {}
    is_plan = pc.fill_null(pc.equal(got.column("kind"), PLAN_KIND), False)
    plans: dict[int, pa.Table] = {}
    rows = got.filter(is_plan)
    for tag, raw in zip(rows.column(TARGET).to_pylist(), rows.column(PLAN_COLUMN).to_pylist()):
        plans[tag] = pa.ipc.open_stream(raw).read_all()
    written = got.filter(pc.invert(is_plan)).drop_columns([PLAN_COLUMN])
    return written.cast(tagged_written_schema()), plans


def plan_target(tag: int, pk: str, key_type: pa.DataType, store: Any) -> PlanTarget:
    """A table planned in its writing task (its changes files are the task's own; ``files``: its tag)."""
    return PlanTarget(tag, [], pk, key_type, store, tag, 0)
