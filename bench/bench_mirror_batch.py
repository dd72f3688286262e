"""The one-collection mirror job's cost per micro-batch: what its ``foreachBatch`` function does around the table's
write (reading the batch, finding DropPartition / Truncate rows, counting the rows).

``python -m bench.bench_mirror_batch [--batches N] [--rows N] [--formats delta]``, on the embedded log (2 channels):
a collection (pk, category, score, 8-d vector) written as ``batches`` writes of ``rows`` rows, each ending with a
time tick; ``mirror run --collection --snapshot never --max-rows-per-trigger rows --trigger available-now`` makes
a micro-batch of each. Figures: the median (and mean) wall seconds of a batch's ``foreachBatch`` call (batches 2
to N: the first pays the session's first Python workers), the Spark jobs each batch ran and their tasks (Spark's
status tracker), the job's summed step seconds (write, plan, commit).

Each figure is of one run of this tree: run it on two trees to compare them (the load of the machine printed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from bench._util import load_average


def _publish(cfg: str, channels: str, batches: int, rows: int) -> None:
    from msgstream_spark.cli.data import synthetic_batch, synthetic_schema
    from msgstream_spark.sink.options import parse_sink_options
    from msgstream_spark.sink.plan import plan_write
    from msgstream_spark.sink.task import TaskWriter

    opts = parse_sink_options({"channels": channels, "collection": "bench", "config": cfg})
    for i in range(batches):  # one write (ending with a tick) per micro-batch
        writer = TaskWriter(opts, plan_write(synthetic_schema(8), opts))
        try:
            writer.add(synthetic_batch(i * rows, rows, 8, 7))
            writer.finish()
        finally:
            writer.close()


class _Timed:
    """Wraps the job's ``foreachBatch`` class: each call's wall seconds, the Spark jobs it ran and their tasks."""

    def __init__(self, spark) -> None:
        self.sc = spark.sparkContext
        self.st = self.sc.statusTracker()
        self.seconds: list[float] = []
        self.jobs: list[int] = []
        self.tasks: list[int] = []

    def _tasks(self, jobs: set[int]) -> int:
        n = 0
        for jid in jobs:
            info = self.st.getJobInfo(jid)
            for sid in (info.stageIds if info else []):
                s = self.st.getStageInfo(sid)
                n += s.numTasks if s is not None else 0
        return n

    def wrap(self, cls) -> None:
        inner, timed = cls.__call__, self

        def call(obj, df, batch_id: int):
            group = timed.sc.getLocalProperty("spark.jobGroup.id")  # the query's run id: its batches' jobs
            before = set(timed.st.getJobIdsForGroup(group))
            t0 = time.perf_counter()
            try:
                return inner(obj, df, batch_id)
            finally:
                timed.seconds.append(time.perf_counter() - t0)
                ran = set(timed.st.getJobIdsForGroup(group)) - before
                timed.jobs.append(len(ran))
                timed.tasks.append(timed._tasks(ran))

        cls.__call__ = call
        self.restore = lambda: setattr(cls, "__call__", inner)


def one_format(spark, work: Path, fmt: str, batches: int, rows: int) -> dict:
    from msgstream_spark.jobs import mirror
    from msgstream_spark.spark import removals

    cfg = work / f"{fmt}.yaml"
    cfg.write_text(yaml.safe_dump({"mq.type": "local", "local.path": str(work / f"{fmt}.db")}))
    channels = f"bench-batch-{fmt}_0,bench-batch-{fmt}_1"
    _publish(str(cfg), channels, batches, rows)
    timed = _Timed(spark)
    timed.wrap(removals.RemovingBatch)
    try:
        args = mirror.build_parser().parse_args([
            "--config", str(cfg), "--channels", channels, "--collection", "bench", "--table", str(work / fmt),
            "--table-format", fmt, "--snapshot", "never", "--max-rows-per-trigger", str(rows), "--trigger",
            "available-now", "--progress-interval", "600", "--checkpoint", str(work / f"ckpt-{fmt}")])
        res = mirror.run(args, spark)
    finally:
        timed.restore()
    n = len(timed.seconds)
    out = {"format": fmt, "batches": n, "rows_per_batch": rows, "stream_rows": res["stream_rows"],
           "batch_s_median": round(statistics.median(timed.seconds[1:] or timed.seconds), 3),
           "batch_s_mean": round(statistics.mean(timed.seconds[1:] or timed.seconds), 3),
           "spark_jobs_per_batch": statistics.median(timed.jobs[1:] or timed.jobs),
           "spark_tasks_per_batch": statistics.median(timed.tasks[1:] or timed.tasks),
           "step_seconds": res["step_seconds"], "load": load_average()}
    print(f"  {fmt}: {n} batches of {rows} rows (stream_rows {res['stream_rows']}): foreachBatch median "
          f"{out['batch_s_median']:.3f} s (mean {out['batch_s_mean']:.3f}), {out['spark_jobs_per_batch']} Spark jobs "
          f"and {out['spark_tasks_per_batch']} tasks per batch; steps {res['step_seconds']}; load {out['load']}",
          flush=True)
    return out


def run(batches: int = 30, rows: int = 2_000, formats: tuple[str, ...] = ("delta",)) -> dict:
    from msgstream_spark.jobs._common import spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    spark = spark_session("bench-mirror-batch", "local[2]")
    result: dict = {"load_average_start": load_average()}
    try:
        for fmt in formats:
            result[fmt] = one_format(spark, work, fmt, batches, rows)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_mirror_batch", description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--rows", type=int, default=2_000, help="rows per batch")
    ap.add_argument("--formats", default="delta", help="delta, iceberg or delta,iceberg")
    a = ap.parse_args(argv)
    run(a.batches, a.rows, tuple(a.formats.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
