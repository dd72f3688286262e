"""A database batch read by the job's own tasks instead of through the micro-batch's DataFrame (issue #44).

The micro-batch's DataFrame is the source's read of the batch's channel ranges; executing it runs the read in a
Python worker, hands every row to the JVM, and (the job reads it twice: its facts, then its writing) keeps it in
Spark's cache, from which each writing task gets it back as Arrow. Here the job plans the very ranges the source
plans for the batch (``source.read.plan_read_tasks``, the source's partitions' plan, over the checkpoint's
offsets: ``offsets/<batch>`` the end, the batch before it the start, the source's recorded start for the query's
first batch) and reads them in its own
tasks with the Spark-free read core, the rows never leaving the Python worker that writes them:

- the facts job: a task per read task of the source, decoding no row (``read_range``'s ``keep`` empty: each
  collection's rows counted, the DDL messages whole): the same DDL rows and per-collection counts
  ``spark.mirror_many_facts`` takes from the DataFrame;
- the writing job: a task per unit, a unit being a bin of small shares (every range of the batch read, only the
  bin's collections decoded: the bin's tables written and planned in the task, as ``spark.mirror_many_plan``'s
  bins) or one read task's ranges for the tables whose share is large (written there, planned by the planning
  job).

Each range is read once by the facts job and once per writing task that needs it (a bin reads every channel's
range, decoding only its own collections' rows: ~0.04 s a 100k-row batch of 64-d vectors to count, ~0.11 s to
decode all of it, on this project's 2-core machine). Where the ranges cannot be known (no offsets in the
checkpoint, the query's first batch without a recorded start) or a batch needs the DataFrame (a DropPartition or
Truncate's deletes, a pending collection's staging), the job reads the DataFrame as before.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.mirror.watermark import checkpoint_offset
from msgstream_spark.source.multi import KIND_ROWS, collections_arrow_schema
from msgstream_spark.source.offsets import normalize
from msgstream_spark.source.read import ReadRange, plan_read_tasks, read_ranges
from msgstream_spark.spark.mirror_many_facts import _Facts, facts_of
from msgstream_spark.spark.mirror_many_plan import fused_schema, without_plan
from msgstream_spark.spark.stream_reader import start_key

log = logging.getLogger(__name__)


class DirectRead:
    """The batch's read tasks, planned as the source plans them (``opts``: the query's source options, parsed;
    ``checkpoint``: the query's checkpoint directory, where Spark logs each batch's offsets before it runs)."""

    def __init__(self, opts: Any, checkpoint: str) -> None:
        self.opts, self.checkpoint = opts, checkpoint
        self.batches = 0  # batches read here, not through the DataFrame
        self.pieces = 0  # the facts' rows: a DDL message or a collection's rows of one read task

    def _start(self, batch_id: int, client: Any) -> dict | None:
        if batch_id > 0:
            return checkpoint_offset(self.checkpoint, batch_id - 1)
        recorded = client.get_metadata(start_key(self.opts))  # the query's first batch: the source's start
        return json.loads(recorded) if recorded else None

    def tasks(self, batch_id: int, schema_json: str) -> list[list[ReadRange]] | None:
        """The source's read tasks of batch ``batch_id`` (each a list of ranges read one after the other), or None
        when its offsets are not known here (the DataFrame is read instead)."""
        end = checkpoint_offset(self.checkpoint, batch_id)
        if end is not None:
            client = self.opts.client()
            try:
                start = self._start(batch_id, client)
                if start is not None:
                    return plan_read_tasks(client, normalize(start), normalize(end), self.opts, schema_json, None)
            finally:
                client.close()
        log.info("batch %d: its offsets are not in the checkpoint; read through the stream", batch_id)
        return None

    def facts(self, spark, tasks: list[list[ReadRange]], spark_schema) -> tuple[list[Any], list[dict[str, Any]]]:
        """:func:`direct_facts`, the batch and its rows counted."""
        ddl, touched = direct_facts(spark, tasks, spark_schema)
        self.batches += 1
        self.pieces += len(ddl) + len(touched)
        return ddl, touched


class _FactsRead:
    """A facts task: its read task's ranges counted (no row decoded), summed as ``mirror_many_facts``'s tasks."""

    def __init__(self, tasks: list[list[ReadRange]], schema: pa.Schema) -> None:
        self.tasks, self.schema = tasks, schema

    def facts(self, batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                # the read core's collections schema is Spark's (the stream's own read yields it too)
                yield from _Facts(self.schema)(read_ranges(self.tasks[i], self.schema, frozenset()))

    __call__ = facts


def _units_frame(spark, n: int):
    """A frame of ``n`` one-row partitions (row i: unit i), the input of a job whose tasks read for themselves."""
    return spark.range(0, n, 1, n)


def direct_facts(spark, tasks: list[list[ReadRange]], spark_schema) -> tuple[list[Any], list[dict[str, Any]]]:
    """``mirror_many_facts.batch_facts``'s answer for a batch read by ``tasks`` (``spark_schema``: the stream's
    ``collections`` schema), in one Spark job decoding no row."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if not tasks:  # the offsets moved with no message between them (a position's time only)
        return [], []
    fn = _FactsRead(tasks, to_arrow_schema(spark_schema, timezone="UTC"))
    return facts_of(_units_frame(spark, len(tasks)).mapInArrow(fn, spark_schema).collect())


class Unit:
    """A writing task's part: the ranges it reads, the collections it decodes, its function over their packed rows
    (``_collection``, ``payload``) and whether that function returns the fused rows (with a plan column)."""

    def __init__(self, ranges: list[ReadRange], keep: frozenset[int], fn: Any, fused: bool) -> None:
        self.ranges, self.keep, self.fn, self.fused = ranges, keep, fn, fused


class _Units:
    """The writing job's task function: unit i read, its rows written by its function."""

    def __init__(self, units: list[Unit]) -> None:
        self.units = units

    def write(self, batches):
        schema = collections_arrow_schema()
        for b in batches:
            for i in b.column(0).to_pylist():
                u = self.units[i]
                for out in u.fn(_packed(read_ranges(u.ranges, schema, u.keep), u.keep)):
                    yield out if u.fused else without_plan(out)

    __call__ = write


def _packed(batches, keep: frozenset[int]):
    """Each batch's decoded pieces of the kept collections as (``_collection``, ``payload``)."""
    ids = pa.array(sorted(keep), pa.int64())
    for b in batches:
        hit = pc.and_(pc.equal(b.column("kind"), KIND_ROWS), pc.is_in(b.column("_collection"), value_set=ids))
        hit = pc.and_(pc.fill_null(hit, False), b.column("payload").is_valid())
        got = b.filter(hit).select(["_collection", "payload"])
        if got.num_rows:
            yield got


def write_units(spark, units: list[Unit]) -> pa.Table:
    """The writing job: every unit in a task of its own; the fused rows (``mirror_many_plan.fused_schema``) of
    every task."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return _units_frame(spark, len(units)).mapInArrow(_Units(units), from_arrow_schema(fused_schema())).toArrow()
