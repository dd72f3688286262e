"""The ``msgstream`` sink: Spark Arrow writers for batch and streaming writes.

``df.write.format("msgstream")`` and ``df.writeStream.format("msgstream")`` end here.
Options, the schema plan and validation happen on the driver when the writer is built
(so a DataFrame the collection cannot hold fails before any task runs); each task then
encodes its Arrow batches column-wise and produces them (:mod:`msgstream_spark.sink.task`).
Writers and commit messages hold plain data only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from msgstream_spark.errors import OptionError, SchemaError
from msgstream_spark.sink.options import METADATA_COLUMNS, SinkOptions, parse_sink_options
from msgstream_spark.sink.plan import WritePlan, plan_write
from msgstream_spark.sink.task import TaskResult, TaskWriter, committed_key

log = logging.getLogger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark's local property for the micro-batch id


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task wrote: per channel counts, first/last msgID (base64), max timestamp."""

    writer_id: str
    batch_id: int
    task_id: int
    attempt: int
    channels: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: bool = False

    @classmethod
    def from_result(cls, r: TaskResult) -> SinkCommitMessage:
        return cls(r.writer_id, r.batch_id, r.task_id, r.attempt,
                   {ch: asdict(st) for ch, st in r.channels.items()}, r.skipped)

    @property
    def rows(self) -> int:
        return sum(int(s["inserted"]) + int(s["deleted"]) for s in self.channels.values())


def summarize(messages: list[SinkCommitMessage | None]) -> dict[str, Any]:
    """Totals over the tasks' commit messages (``None`` = a failed task)."""
    out: dict[str, Any] = {"tasks": 0, "failed_tasks": 0, "inserted": 0, "deleted": 0, "messages": 0,
                           "channels": {}}
    for m in messages:
        if m is None:
            out["failed_tasks"] += 1
            continue
        out["tasks"] += 1
        for ch, st in m.channels.items():
            c = out["channels"].setdefault(ch, {"inserted": 0, "deleted": 0, "messages": 0, "last_id": ""})
            for k in ("inserted", "deleted", "messages"):
                c[k] += int(st[k])
                out[k] += int(st[k])
            if st["last_id"]:
                c["last_id"] = st["last_id"]
    return out


def _arrow_schema(schema) -> pa.Schema:
    """The Arrow schema of the columns the sink writes (reader metadata columns dropped)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType


    kept = StructType([f for f in schema.fields if f.name not in METADATA_COLUMNS])
    try:
        return to_arrow_schema(kept, timezone="UTC")
    except (TypeError, AssertionError) as exc:
        raise SchemaError(f"the DataFrame's schema has a type the sink cannot write: {exc}") from exc


def _task_ids() -> tuple[int, int, str | None]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, None
    return int(ctx.partitionId()), int(ctx.attemptNumber()), ctx.getLocalProperty(BATCH_ID_PROPERTY)


class _SinkBase:
    def __init__(self, options: Mapping[str, Any], schema, overwrite: bool, *, streaming: bool) -> None:
        if overwrite:
            raise OptionError("the msgstream sink only appends: save mode overwrite / output mode complete "
                              "is not supported (use mode('append') / outputMode('append'))")
        self.opts: SinkOptions = parse_sink_options(options, streaming=streaming)
        self.plan: WritePlan = plan_write(_arrow_schema(schema), self.opts)

    def _write(self, iterator: Iterator[pa.RecordBatch], batch_id: int | None) -> SinkCommitMessage:
        task_id, attempt, prop = _task_ids()
        if batch_id is None:
            batch_id = int(prop) if prop not in (None, "") else 0
        # 2.6: the driver sends the closing ticks once every task is done (see closing_ticks)
        tw = TaskWriter(self.opts, self.plan, batch_id=batch_id, task_id=task_id, attempt=attempt,
                        ticks=self.opts.wire_format != "2.6")
        if tw.already_committed():
            log.info("msgstream sink: batch %s of writer %s was already committed; skipping task %s",
                     batch_id, self.opts.writer_id, task_id)
            tw.result.skipped = True
            tw.close()
            for _ in iterator:  # drain the input
                pass
            return SinkCommitMessage.from_result(tw.result)
        return SinkCommitMessage.from_result(tw.write_batches(iterator))

    def closing_ticks(self, messages: list[SinkCommitMessage | None]) -> None:
        """2.6: the time ticks of the whole write, sent by the driver after every task.

        A 2.6 reader (and Milvus) drops a message whose ``_tt`` is below a TimeTick it has already
        seen. A tick sent by one task while another is still producing would drop the other task's
        rows, so in this format the tasks send none and the driver sends one above every task's
        timestamps.
        """
        if self.opts.wire_format != "2.6":
            return
        done = [m for m in messages if m is not None]
        written = sorted({ch for m in done for ch, st in m.channels.items() if int(st["messages"])})
        if not written:
            return
        after = max(int(st["max_ts"]) for m in done for st in m.channels.values())
        tw = TaskWriter(self.opts, self.plan)
        try:
            tw.send_ticks(self.opts.channels if self.opts.time_tick == "all" else written, after_ts=after)
        finally:
            tw.close()


class MsgStreamArrowWriter(_SinkBase, DataSourceArrowWriter):
    """Batch sink (``df.write.format("msgstream").mode("append").save()``)."""

    def __init__(self, options: Mapping[str, Any], schema, overwrite: bool = False) -> None:
        super().__init__(options, schema, overwrite, streaming=False)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return self._write(iterator, 0)

    def commit(self, messages: list[SinkCommitMessage | None]) -> None:
        self.closing_ticks(messages)
        s = summarize(messages)
        log.info("msgstream sink committed: %d inserted, %d deleted rows in %d messages on %s",
                 s["inserted"], s["deleted"], s["messages"], ", ".join(sorted(s["channels"])) or "no channel")

    def abort(self, messages: list[SinkCommitMessage | None]) -> None:
        s = summarize(messages)
        try:
            self.closing_ticks(messages)  # readers advance past the successful tasks' rows
        except Exception as exc:  # noqa: BLE001 - keep the abort going
            log.warning("msgstream sink: the closing time ticks could not be sent: %s", exc)
        if self.opts.transactional:
            log.warning("msgstream sink aborted: %d task(s) failed; their transactions were rolled back (or expire "
                        "after txnKeepalive); successful tasks had committed %d inserted and %d deleted rows",
                        s["failed_tasks"], s["inserted"], s["deleted"])
            return
        log.warning("msgstream sink aborted: %d task(s) failed; successful tasks had already produced "
                    "%d inserted and %d deleted rows (messages cannot be retracted; read with dedupe "
                    "to drop replays when the write is retried)", s["failed_tasks"], s["inserted"], s["deleted"])


class MsgStreamStreamArrowWriter(_SinkBase, DataSourceStreamArrowWriter):
    """Streaming sink: messages carry (writer, batch, task, seq) for exactly-once reading.

    With an explicit ``writerId`` the last committed batch id is stored in the backend
    and a batch Spark replays after it was committed is skipped.
    """

    def __init__(self, options: Mapping[str, Any], schema, overwrite: bool = False) -> None:
        super().__init__(options, schema, overwrite, streaming=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return self._write(iterator, None)

    def commit(self, messages: list[SinkCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        self.closing_ticks(messages)
        s = summarize(messages)
        if self.opts.writer_id_explicit:
            tw = TaskWriter(self.opts, self.plan)
            try:
                tw.client.put_metadata(committed_key(self.opts.writer_id), str(int(batchId)))
            finally:
                tw.close()
        log.info("msgstream sink batch %s committed: %d inserted, %d deleted rows", batchId,
                 s["inserted"], s["deleted"])

    def abort(self, messages: list[SinkCommitMessage | None], batchId: int) -> None:  # noqa: N803
        s = summarize(messages)
        log.warning("msgstream sink batch %s aborted (%d failed task(s)); %d rows were already produced "
                    "and will be written again on retry: read with dedupe=true", batchId, s["failed_tasks"],
                    s["inserted"] + s["deleted"])


# Names the DataSource imports lazily.
def batch_writer(options: Mapping[str, Any], schema, overwrite: bool = False) -> MsgStreamArrowWriter:
    return MsgStreamArrowWriter(options, schema, overwrite)


def stream_writer(options: Mapping[str, Any], schema, overwrite: bool = False) -> MsgStreamStreamArrowWriter:
    return MsgStreamStreamArrowWriter(options, schema, overwrite)
