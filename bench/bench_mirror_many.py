"""Many collections in one mirror job (issue #44): one ``--database`` job next to one job per collection, and
next to one job over one collection holding the same rows; the freshness of 20 tables kept by one job.

``python -m bench.bench_mirror_many [--collections N] [--rows N] [--changes N] [--dim D]
[--formats delta,iceberg] [--samples K] [--table-concurrency C]``, each format (default both) on logs and tables of
its own, on the embedded log (2 channels), Spark-free writers as Milvus's proxy
writes (``msgstream publish``'s ``TaskWriter``):
- the log: ``collections`` collections (``c00`` ...) of ``rows`` rows each (pk, category, score, ``dim``-d
  vector), written interleaved (rounds of 5k rows per collection, each write ending with a time tick, so every
  micro-batch holds rows of every collection, as Milvus's shared channels do); then ``changes`` changes spread
  over them (per collection half upserts of existing keys, half deletes). The baseline log: one collection
  (``big``) of ``collections x rows`` rows written the same way, then the same number of changes.
- three ways to mirror it, each run twice (``--trigger available-now``: the load, then after the changes are
  written the changes, resumed from its checkpoint): one ``mirror run --database default --table-root`` job
  (``database``); ``collections`` one-collection jobs (``--collection cNN``) run one after another (``separate``:
  each reads every channel and keeps its collection's rows); one one-collection job over ``big`` (``one``).
  Figures per phase: separate / database seconds (goal >= 5: the database job in <= 1/5 of the time) and one /
  database (goal >= 1/1.3 = 0.77: <= 1.3x the time of one job over one table of the same rows).
- freshness: the database job resumed with ``--trigger processing-time:1s``; each sample writes one row into
  every collection (so each batch touches every table) and polls every table until its row is readable
  (Delta: delta-rs, as bench_freshness does; Iceberg: the table's newest metadata opened at each look, its key
  column read, so a look costs more and the figure is an upper bound): p50 / p95 of the rows' latencies, and the
  p50 of each sample's slowest table; goal p50 <= 3 s.

Time, full size (20 x 50k rows, 64-d, 10k changes, 10 samples) on the shared 2-core machine, per format: writing the
logs ~2-4 min, the database job's load ~1-2 min, the 20 one-collection jobs ~10-20 min, the freshness part ~2 min.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from bench._util import figure, load_average, median

DIM = 64
WRITE_ROWS = 5_000  # rows per write of one collection; each write ends with a time tick on every channel
CHANNELS = 2


class _Log:
    """The embedded log's writers: one ``TaskWriter`` per write (Spark-free, as ``msgstream publish``)."""

    def __init__(self, work: Path) -> None:
        self.cfg = str(work / "log.yaml")
        Path(self.cfg).write_text(yaml.safe_dump({"mq.type": "local", "local.path": str(work / "log.db")}))

    def write(self, channels: str, collection: str, batches: list[pa.RecordBatch]) -> None:
        from msgstream_spark.cli.data import synthetic_schema
        from msgstream_spark.sink.options import parse_sink_options
        from msgstream_spark.sink.plan import plan_write
        from msgstream_spark.sink.task import TaskWriter

        opts = parse_sink_options({"channels": channels, "collection": collection, "config": self.cfg})
        writer = TaskWriter(opts, plan_write(synthetic_schema(DIM), opts))
        try:
            for b in batches:
                writer.add(b)
            writer.finish()
        finally:
            writer.close()


def _rows(start: int, n: int, seed: int = 7) -> pa.RecordBatch:
    from msgstream_spark.cli.data import synthetic_batch

    return synthetic_batch(start, n, DIM, seed)


def _changes(rows: int, n: int, seed: int) -> list[pa.RecordBatch]:
    """``n`` changes of a collection of ``rows`` rows: half upserts of existing keys (new values), half deletes,
    the keys spread over the collection."""
    from msgstream_spark.cli.data import delete_batch

    ups, dels = n - n // 2, n // 2
    step = max(2, rows // max(1, n))
    up_keys = (np.arange(ups, dtype=np.int64) * step) % rows
    b = _rows(0, ups, seed)
    upserts = pa.RecordBatch.from_arrays([pa.array(up_keys), *b.columns[1:]], schema=b.schema)
    del_keys = (np.arange(dels, dtype=np.int64) * step + 1) % rows
    return [upserts, delete_batch(del_keys)] if dels else [upserts]


def write_load(log: _Log, names: list[str], channels: str, rows: int) -> float:
    """Every collection's ``rows`` rows, interleaved: rounds of ``WRITE_ROWS`` rows per collection."""
    t0 = time.perf_counter()
    for start in range(0, rows, WRITE_ROWS):
        for name in names:
            log.write(channels, name, [_rows(start, min(WRITE_ROWS, rows - start))])
    return time.perf_counter() - t0


def write_changes(log: _Log, names: list[str], channels: str, rows: int, changes: int) -> None:
    per = changes // len(names)
    for i, name in enumerate(names):
        log.write(channels, name, _changes(rows, per, seed=100 + i))


class _Lines(logging.Handler):
    """The jobs' per-table batch lines (logger ``msgstream_spark.mirror.batches``, JSON): where a batch's time goes."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = json.loads(record.getMessage())
        except ValueError:
            return
        if line.get("committed"):
            self.lines.append(line)

    def steps(self) -> dict:
        """Medians over the table-batches committed since the last call: batch seconds and its steps."""
        got, self.lines = self.lines, []
        out: dict = {"table_batches": len(got)}
        if got:
            out["batch_s"] = round(median([ln["batch_seconds"] for ln in got]), 3)
            for k in ("write", "plan", "commit"):
                out[f"{k}_s"] = round(median([ln["step_seconds"].get(k, 0.0) for ln in got]), 3)
        return out


LINES = _Lines()


def _job(spark, argv: list[str]) -> tuple[float, dict]:
    from msgstream_spark.jobs import mirror

    args = mirror.build_parser().parse_args(argv)
    LINES.steps()  # forget earlier jobs' lines
    t0, c0 = time.perf_counter(), time.process_time()
    res = mirror.run(args, spark)
    secs = time.perf_counter() - t0
    res["driver_cpu_s"] = round(time.process_time() - c0, 2)  # the driver process's (every thread; not the JVM's)
    res["table_batch_medians"] = LINES.steps()
    return secs, res


class _Setup:
    """Where the logs and tables of one run live, and the argv of each job."""

    def __init__(self, work: Path, n: int, fmt: str, table_concurrency: int, separate_run: int = 0) -> None:
        self.work, self.fmt, self.table_concurrency = work, fmt, table_concurrency
        self.separate_run = separate_run  # one-collection jobs run (0: all)
        self.batch_read = "tasks"  # the database job's --batch-read
        self.names = [f"c{i:02d}" for i in range(n)]
        self.many_ch = ",".join(f"bench-many_{i}" for i in range(CHANNELS))
        self.one_ch = ",".join(f"bench-one_{i}" for i in range(CHANNELS))
        self.log = _Log(work)

    def common(self, name: str) -> list[str]:
        return ["--config", self.log.cfg, "--table-format", self.fmt, "--snapshot", "never", "--progress-interval",
                "600", "--checkpoint", str(self.work / f"ckpt-{self.fmt}-{name}"), "--subscription", f"b-{name}"]

    def database(self, *extra: str) -> list[str]:
        return [*self.common("database"), "--channels", self.many_ch, "--database", "default", "--table-root",
                str(self.work / f"lake-{self.fmt}"), "--table-concurrency", str(self.table_concurrency),
                "--batch-read", self.batch_read, *extra]

    def separate(self, name: str) -> list[str]:
        return [*self.common(f"sep-{name}"), "--channels", self.many_ch, "--collection", name, "--table",
                str(self.work / f"sep-{self.fmt}" / name)]

    def one(self) -> list[str]:
        return [*self.common("one"), "--channels", self.one_ch, "--collection", "big", "--table",
                str(self.work / f"one-{self.fmt}")]


def _phase(spark, s: _Setup, phase: str) -> dict:
    """The three ways over what the log holds now (each job resumes from its checkpoint). ``s.separate_run``
    of the one-collection jobs run (the first ones; all by default): their sum scaled to all of them (each reads
    the same channels and keeps one collection of equal size)."""
    db_s, res = _job(spark, s.database())
    ran = s.names[:s.separate_run or len(s.names)]
    seps = [_job(spark, s.separate(name))[0] for name in ran]
    one_s, one_res = _job(spark, s.one())
    sep_total = sum(seps) * len(s.names) / len(ran)
    out = {"database_s": round(db_s, 2), "separate_s": round(sep_total, 2), "separate_run": len(ran),
           "separate_each_s": [round(x, 2) for x in seps], "one_s": round(one_s, 2),
           "database_batches": res.get("batches"), "database_table_batches": res["table_batch_medians"],
           "database_driver_cpu_s": res["driver_cpu_s"], "one_driver_cpu_s": one_res["driver_cpu_s"],
           "one_table_batches": one_res["table_batch_medians"],
           "separate_vs_database": figure([sep_total], [db_s], goal=5.0),
           "one_vs_database": figure([one_s], [db_s], goal=round(1 / 1.3, 3))}
    print(f"    per table and batch, medians: database job {res['table_batch_medians']}; one job, one table "
          f"{one_res['table_batch_medians']}", flush=True)
    print(f"  {s.fmt:8} {phase:8}: database job {db_s:7.1f} s ({res.get('batches')} batches); "
          f"{len(s.names)} one-collection jobs {sep_total:7.1f} s ({len(ran)} run; ratio {sep_total / db_s:.2f}, "
          f"goal >= 5); "
          f"one job, one table {one_s:7.1f} s (database / one {db_s / one_s:.2f}x, goal <= 1.3x); "
          f"load {load_average()}", flush=True)
    return out


def throughput(spark, s: _Setup, rows: int, changes: int) -> dict:
    out: dict = {}
    out["load"] = _phase(spark, s, "load")
    write_changes(s.log, s.names, s.many_ch, rows, changes)
    write_changes(s.log, ["big"], s.one_ch, rows * len(s.names), changes)
    out["changes"] = _phase(spark, s, "changes")
    return out


class _DeltaReader:
    """Polls a Delta table for a key: one delta-rs handle brought up to date before each look, then a key-filtered
    query (delta-rs's SQL engine: the tables carry deletion vectors once a batch deleted rows)."""

    def __init__(self, table: str) -> None:
        self.table, self.dt = table, None

    def has(self, pk: int) -> bool:
        import deltalake

        if self.dt is None:
            if not deltalake.DeltaTable.is_deltatable(self.table):
                return False
            self.dt = deltalake.DeltaTable(self.table)
        else:
            self.dt.update_incremental()
        got = deltalake.QueryBuilder().register("t", self.dt).execute(f"SELECT pk FROM t WHERE pk = {int(pk)}")
        return got.read_all().num_rows > 0


class _TableReader:
    """Polls a table of another format (Iceberg) for a key: its newest version opened at each look through the
    mirror's own reader, its key column read."""

    def __init__(self, fmt: str, table: str) -> None:
        self.fmt, self.table = fmt, table

    def has(self, pk: int) -> bool:
        import pyarrow.compute as pc

        from msgstream_spark.errors import MirrorError
        from msgstream_spark.mirror.table import open_existing

        try:
            t = open_existing(self.fmt, self.table)
        except MirrorError:  # not made yet
            return False
        return bool(pc.any(pc.equal(t.to_arrow(["pk"]).column("pk"), pk)).as_py())


def _reader(fmt: str, table: str):
    return _DeltaReader(table) if fmt == "delta" else _TableReader(fmt, table)


def _latencies(s: _Setup, readers: dict, job, key: int) -> list[float]:
    """One sample: a row of key ``key`` into every collection; each one's seconds until its table shows it."""
    from bench.bench_freshness import _wait

    sent = {}
    for name in s.names:
        sent[name] = time.perf_counter()
        s.log.write(s.many_ch, name, [_rows(key, 1, seed=3)])
    lat = {}
    for name in s.names:
        if _wait(lambda r=readers[name]: r.has(key), 120, job, 0.05) is None:
            raise RuntimeError(f"row {key} did not appear in the table of {name} within 120 s")
        lat[name] = time.perf_counter() - sent[name]
    return list(lat.values())


def freshness(spark, s: _Setup, rows: int, samples: int, interval: float = 2.0) -> dict:
    """The database job kept running (trigger 1 s); ``samples`` rounds of one row per collection."""
    from bench.bench_freshness import _Job
    from msgstream_spark.jobs import mirror

    budget = 300 + samples * (interval + 60)
    args = mirror.build_parser().parse_args(s.database("--trigger", "processing-time:1s", "--timeout", str(budget)))
    readers = {n: _reader(s.fmt, str(s.work / f"lake-{s.fmt}" / "default" / n)) for n in s.names}
    job = _Job(args, spark)
    job.start()
    try:
        _latencies(s, readers, job, rows + 1)  # the job's start and first batch: not a sample
        LINES.steps()
        every, slowest = [], []
        for i in range(samples):
            t0 = time.perf_counter()
            lat = _latencies(s, readers, job, rows + 2 + i)
            every += lat
            slowest.append(max(lat))
            time.sleep(max(0.0, interval - (time.perf_counter() - t0)))
    finally:
        for q in spark.streams.active:
            q.stop()
        job.join(120)
    out = {"format": s.fmt, "tables": len(s.names), "samples": samples, "trigger": "processing-time:1s",
           "goal_p50_s": 3.0,
           "p50_s": round(float(np.percentile(every, 50)), 3), "p95_s": round(float(np.percentile(every, 95)), 3),
           "slowest_table_p50_s": round(median(slowest), 3), "load": load_average(),
           "table_batch_medians": LINES.steps()}
    out["goal_met"] = out["p50_s"] <= 3.0
    print(f"  {s.fmt} freshness, {len(s.names)} tables in one job, trigger 1 s: p50 {out['p50_s']:.2f} s, p95 "
          f"{out['p95_s']:.2f} s, slowest table per sample p50 {out['slowest_table_p50_s']:.2f} s (goal p50 <= 3 s: "
          f"{'met' if out['goal_met'] else 'NOT met'}; load {out['load']}); per table and batch, medians: "
          f"{out['table_batch_medians']}", flush=True)
    return out


def _warm(spark, work: Path, formats: tuple[str, ...] = ("delta",)) -> None:
    """Untimed: a database job and a one-collection job over two small collections in each of ``formats``, so
    that neither measured kind of job pays the session's first Python workers and first reads, nor its format's
    first use (pyiceberg's and its catalog's imports: ~1 s of the first Iceberg job's driver, which the database
    job, run first, paid alone)."""
    for fmt in formats:
        (work / f"warm-{fmt}").mkdir()
        s = _Setup(work / f"warm-{fmt}", 2, fmt, 2)
        s.many_ch = ",".join(f"bench-warm-{fmt}_{i}" for i in range(CHANNELS))
        write_load(s.log, s.names, s.many_ch, 200)
        _job(spark, s.database())
        _job(spark, s.separate(s.names[0]))


def _spark():
    from pyspark.sql import SparkSession

    from msgstream_spark.jobs._common import spark_session

    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", "120")  # a loaded machine: as bench_freshness
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        os.environ.setdefault(var, sys.executable)
    (SparkSession.builder.master("local[2]").config("spark.python.authenticate.socketTimeout", "120s")
     .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    return spark_session("bench-mirror-many", "local[2]")


def run(collections: int = 20, rows: int = 50_000, changes: int = 10_000,
        formats: tuple[str, ...] = ("delta", "iceberg"),
        samples: int = 10, table_concurrency: int = 4, separate_run: int = 0, stop: bool = True,
        batch_read: str = "tasks") -> dict:
    """``stop``: stop the Spark session at the end (False: leave it to the caller, e.g. a test's shared one).
    ``separate_run``: how many of the one-collection jobs run (0: all), their time scaled to all."""
    batches = logging.getLogger("msgstream_spark.mirror.batches")
    batches.setLevel(logging.INFO)
    batches.addHandler(LINES)
    work = Path(tempfile.mkdtemp(prefix="bench-many-"))
    os.environ["MSGSTREAM_KEY_CACHE_DIR"] = str(work / "key-cache")  # before Spark starts its Python workers
    spark = _spark()
    result: dict = {"collections": collections, "rows_per_collection": rows, "changes": changes, "dim": DIM,
                    "channels": CHANNELS, "table_concurrency": table_concurrency, "batch_read": batch_read,
                    "load_average_start": load_average()}
    print(f"many collections in one job: {collections} x {rows:,} rows ({DIM}-d), then {changes:,} changes; "
          f"load {result['load_average_start']}", flush=True)
    try:
        _warm(spark, work, tuple(formats))
        for fmt in formats:  # each format on logs of its own
            (work / fmt).mkdir()
            s = _Setup(work / fmt, collections, fmt, table_concurrency, separate_run)
            s.batch_read = batch_read
            r: dict = {"write_many_s": round(write_load(s.log, s.names, s.many_ch, rows), 1),
                       "write_one_s": round(write_load(s.log, ["big"], s.one_ch, rows * collections), 1)}
            r.update(throughput(spark, s, rows, changes))
            if samples > 0:
                r["freshness"] = freshness(spark, s, rows, samples)
            result[fmt] = r
    finally:
        batches.removeHandler(LINES)
        if stop:
            spark.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    result["load_average_end"] = load_average()
    print(json.dumps(result, default=str), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_mirror_many", description=__doc__.splitlines()[0])
    ap.add_argument("--collections", type=int, default=20)
    ap.add_argument("--rows", type=int, default=50_000, help="rows per collection")
    ap.add_argument("--changes", type=int, default=10_000, help="changes spread over the collections after the load")
    ap.add_argument("--formats", default="delta,iceberg", help="delta, iceberg or delta,iceberg (default)")
    ap.add_argument("--samples", type=int, default=10, help="freshness samples (0: no freshness part)")
    ap.add_argument("--table-concurrency", type=int, default=4)
    ap.add_argument("--separate-run", type=int, default=0,
                    help="run only the first K one-collection jobs, their time scaled to all (default 0: all)")
    ap.add_argument("--batch-read", default="tasks", choices=["tasks", "stream"],
                    help="the database job's --batch-read (default tasks)")
    a = ap.parse_args(argv)
    run(a.collections, a.rows, a.changes, tuple(a.formats.split(",")), a.samples, a.table_concurrency,
        a.separate_run, batch_read=a.batch_read)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
