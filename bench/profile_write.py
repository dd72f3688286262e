"""Where a Spark write's time goes, per stage (issue #47), at two sizes.

    python -m bench.profile_write [--rows 50000,200000] [--dim 128] [--reps 3] [--kafka]

For each size, interleaved ``reps`` times: the backend's bare batched produce of the pre-encoded messages
(bench_spark_write's baseline), Spark handing the rows to Python workers with nothing done to them
(``mapInArrow`` counting rows: the floor of any Python sink) and the ``msgstream`` write itself, through a
probe data source whose tasks time their stages:

- **arrow in**: waiting for Spark's next Arrow batch (the JVM converting rows to Arrow, the socket);
- **encode**: the sink's column-wise encode of the batch into Milvus requests;
- **produce wait**: waiting for the background thread's produce (only what does not overlap the above);
- **finish**: the last flush's wait, the closing time ticks, closing the producers;

and on the driver the writer's construction (options, schema plan) and its commit. Prints medians per size
and returns them; the figures in docs/benchmarks.md come from here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench._util import load_average, median
from bench.bench_spark_write import _backends, _bare_produce, _spark_handoff
from bench.profile_split import SIDES, _cpu
from msgstream_spark.sink.task import TaskWriter
from msgstream_spark.spark.datasource import MsgStreamDataSource
from msgstream_spark.spark.writer import MsgStreamArrowWriter, SinkCommitMessage

STAGES = ("arrow_in", "encode", "produce_wait", "finish", "task")


class _TimedTaskWriter(TaskWriter):
    """The sink's task writer, timing its stages (seconds, summed over the task)."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.stages = dict.fromkeys(STAGES, 0.0)

    def write_batches(self, batches):
        t_task = time.perf_counter()
        it = iter(batches)
        try:
            while True:
                t0 = time.perf_counter()
                batch = next(it, None)
                self.stages["arrow_in"] += time.perf_counter() - t0
                if batch is None:
                    break
                self.add(batch)
            t0, waited = time.perf_counter(), self.stages["produce_wait"]
            self.finish()
        finally:
            self.close()
            # the last flush's wait is counted in produce_wait, not twice
            self.stages["finish"] += time.perf_counter() - t0 - (self.stages["produce_wait"] - waited)
            self.stages["task"] = time.perf_counter() - t_task
        return self.result

    def add(self, batch) -> None:
        t0 = time.perf_counter()
        for m in self.encoder.encode(batch):
            self._pending.setdefault(m.shard, []).append(m)
            self._pending_bytes += len(m.payload)
        self.stages["encode"] += time.perf_counter() - t0
        if self._pending_bytes >= self.opts.buffer_bytes:
            self.flush()

    def _wait_inflight(self) -> None:
        t0 = time.perf_counter()
        super()._wait_inflight()
        self.stages["produce_wait"] += time.perf_counter() - t0


class _ProbeWriter(MsgStreamArrowWriter):
    def __init__(self, options, schema, overwrite: bool, out: str) -> None:
        t0 = time.perf_counter()
        super().__init__(options, schema, overwrite)
        self.out = out
        _log(out, {"driver": "writer", "seconds": time.perf_counter() - t0})

    def write(self, iterator):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        tw = _TimedTaskWriter(self.opts, self.plan, task_id=int(ctx.partitionId()) if ctx else 0)
        result = tw.write_batches(iterator)
        _log(self.out, {"task": tw.stages})
        return SinkCommitMessage.from_result(result)

    def commit(self, messages) -> None:
        t0 = time.perf_counter()
        super().commit(messages)
        _log(self.out, {"driver": "commit", "seconds": time.perf_counter() - t0})


class ProbeSource(MsgStreamDataSource):
    """``msgstream`` with the timed writer; option ``profileFile``: where stages are appended (JSON lines)."""

    @classmethod
    def name(cls) -> str:
        return "msgstream_write_probe"

    def writer(self, schema, overwrite: bool):
        opts = {k: v for k, v in self.options.items() if k.lower() != "profilefile"}
        out = self.options["profileFile"]
        return _ProbeWriter(opts, schema, overwrite, out)


def _log(path: str, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _probe_write(df, cfg: str, channels: list[str], out: str) -> float:
    t0 = time.perf_counter()
    (df.write.format("msgstream_write_probe").option("config", cfg).option("channels", ",".join(channels))
     .option("profileFile", out).mode("append").save())
    return time.perf_counter() - t0


def _one_size(spark, cfg: str, rows: int, dim: int, reps: int, d: str) -> dict:
    from msgstream_spark.jobs.publish import synthetic_df

    df = synthetic_df(spark, rows, dim, partitions=2).cache()
    df.count()
    out = f"{d}/stages-{rows}-{uuid.uuid4().hex[:6]}.jsonl"
    _probe_write(df.limit(100), cfg, [f"warm-{uuid.uuid4().hex[:6]}_{i}" for i in range(2)], f"{out}.warm")
    bare, hand, write = [], [], []
    cpu: dict[str, list] = {"bare": [], "handoff": [], "write": []}
    for _ in range(reps):
        tag = uuid.uuid4().hex[:6]
        c0 = time.process_time()  # the bare produce runs in this process (the baseline's CPU)
        bare.append(_bare_produce(cfg, [f"pb-{tag}_0", f"pb-{tag}_1"], rows, dim))
        cpu["bare"].append({"this process": time.process_time() - c0})
        c0 = _cpu()
        hand.append(_spark_handoff(df))
        c1 = _cpu()
        write.append(_probe_write(df, cfg, [f"pw-{tag}_0", f"pw-{tag}_1"], out))
        c2 = _cpu()
        cpu["handoff"].append({k: c1[k] - c0[k] for k in SIDES})
        cpu["write"].append({k: c2[k] - c1[k] for k in SIDES})
    df.unpersist()
    recs = [json.loads(ln) for ln in Path(out).read_text().splitlines()]
    tasks = [r["task"] for r in recs if "task" in r]
    per_write = max(1, len(tasks) // reps)  # tasks of one write (2 partitions)
    res = {"rows": rows, "dim": dim, "reps": reps, "load": load_average(),
           "bare_s": median(bare), "handoff_s": median(hand), "write_s": median(write),
           "write_vs_bare": median(bare) / median(write), "handoff_vs_bare": median(bare) / median(hand),
           "task_stages_s": {k: median([t[k] for t in tasks]) for k in STAGES}, "tasks_per_write": per_write,
           "driver_writer_s": median([r["seconds"] for r in recs if r.get("driver") == "writer"]),
           "driver_commit_s": median([r["seconds"] for r in recs if r.get("driver") == "commit"]),
           "cpu_s": {k: {side: median([c[side] for c in v]) for side in v[0]} for k, v in cpu.items()}}
    st = res["task_stages_s"]
    print(f"{rows:>9,} rows x {dim}-d: bare {res['bare_s']:.3f} s | hand-over alone {res['handoff_s']:.3f} s | "
          f"write {res['write_s']:.3f} s (ratio {res['write_vs_bare']:.2f}, hand-over alone "
          f"{res['handoff_vs_bare']:.2f}) | per task: " + ", ".join(f"{k} {st[k]:.3f}" for k in STAGES)
          + f" | driver: writer {res['driver_writer_s']:.3f}, commit {res['driver_commit_s']:.3f} s"
          f" | load {res['load']}", flush=True)
    print("    CPU seconds: " + "; ".join(f"{k}: " + ", ".join(f"{side} {x:.2f}" for side, x in v.items())
                                      for k, v in res["cpu_s"].items()), flush=True)
    return res


def run(rows: tuple[int, ...] = (50_000, 200_000), dim: int = 128, reps: int = 3, kafka: bool = False) -> dict:
    from msgstream_spark.jobs._common import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session("bench-profile-write", os.environ.get("BENCH_SPARK_MASTER", "local[2]"))
    spark.dataSource.register(ProbeSource)
    results: dict = {}
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        for name, cfg in _backends(Path(d), stack, kafka).items():
            print(f"-- {name}", flush=True)
            results[name] = [_one_size(spark, cfg, n, dim, reps, d) for n in rows]
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="50000,200000")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kafka", action="store_true")
    a = ap.parse_args()
    run(tuple(int(x) for x in a.rows.split(",")), a.dim, a.reps, a.kafka)
