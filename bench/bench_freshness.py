"""Freshness of a running mirror: the time from a Milvus-format insert to its row being readable in the table.

``python -m bench.bench_freshness [--small N] [--large N] [--samples K] [--interval S] [--no-kafka]
[--stores local,s3]``: on the embedded log and on Kafka (a tansu broker started here), a Delta table of N
synthetic rows is kept by ``jobs.mirror --snapshot never --trigger processing-time:1s`` running in this process;
one row is published every ``interval`` seconds (``msgstream publish``, Spark-free, as a new user would) and the
table is polled (every 50 ms: one delta-rs handle brought up to date, ``update_incremental``, then a
key-filtered read, which the files' key bounds in the log prune to the new files) until the row is there.
Prints p50 / p95 of that latency per backend and size, and the ratio large / small per backend (the baseline is
the small table, measured in the same run). With ``s3`` in ``--stores``, the embedded log's two sizes again with
the table in a bucket on moto's S3 server (started here as the tests start it, bench/_s3.py;
``--storage-option`` settings, Spark's checkpoint on the local disk; the poller reads the bucket too): goal
p50 <= 3 s with 4M rows, and the ratio S3 / local path at each size.

The N rows are not streamed through the job (4M rows through Spark would take most of an hour on 2
cores): they are written the way a snapshot writes a new table (Parquet data files of the table's schema in
its store, each row at the snapshot time S, ``_seq`` = ``snapshot_seq(S)``; one first version with
``msgstream.snapshot_ts`` = S). The job then opens that table as an existing mirror table and streams
the log from its start, where one row published before the table was made (so that the log names the
collection and its schema) waits; the samples start once that row is in the table.

moto handles one request at a time: the poller's requests (20 looks a second, each a LIST of the log and a GET
or two) queue with the job's, so the S3 figures carry some of the poller's own cost.

Time, full size (1k and 4M rows, 15 samples; embedded log, Kafka, and the embedded log into S3) on the shared
2-core machine: per size ~1.5-3 min (the 4M-row table written in ~20 s locally, ~40 s on S3; the job's start;
15 samples 2 s apart): about 12-15 minutes for the six. Measured 2026-11-27 (load 8-22): ``--no-kafka``, the
four, 5 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

POLL = 0.05
DIM = 8
FILE_ROWS = 500_000


def _publish(cfg: str, channels: str, start: int, rows: int) -> None:
    from msgstream_spark.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):  # its JSON summary line per call
        rc = main(["publish", "--config", cfg, "-c", channels, "--synthetic", str(rows), "--start", str(start),
                   "--dim", str(DIM), "--collection", "bench", "--no-progress"])
    if rc != 0:
        raise RuntimeError(f"publish failed with exit code {rc}")


class _Reader:
    """A reader polling the table for a key: one delta-rs handle, brought up to date before each look (only the
    commits since its last), then a key-filtered read (the files' key bounds in the log prune the others)."""

    def __init__(self, table: str, options: dict | None) -> None:
        self.table, self.options, self.dt = table, options, None

    def has(self, pk: int) -> bool:
        import deltalake
        import pyarrow.dataset as ds

        if self.dt is None:
            if not deltalake.DeltaTable.is_deltatable(self.table, storage_options=self.options):
                return False
            self.dt = deltalake.DeltaTable(self.table, storage_options=self.options)
        else:
            self.dt.update_incremental()
        got = self.dt.to_pyarrow_dataset().to_table(columns=["pk"], filter=ds.field("pk") == pk)
        return got.num_rows > 0


class _Job(threading.Thread):
    """The mirror job in this process; its error, if it ends with one."""

    def __init__(self, args, spark) -> None:
        super().__init__(daemon=True)
        self.args, self.spark, self.error, self.restarts = args, spark, None, 0

    def run(self) -> None:
        from msgstream_spark.jobs import mirror

        while True:
            try:
                mirror.run(self.args, self.spark)
                return
            except BaseException as exc:  # handed to the measuring thread, which raises it
                # Spark gives a new Python process (the data source's planner) 10 s to connect back, not
                # configurable: on a loaded machine it can miss that; the job resumes from its checkpoint
                if "failed to connect back" in str(exc) and self.restarts < 5:
                    self.restarts += 1
                    print(f"  (the job restarts from its checkpoint: {str(exc).splitlines()[0][:120]})", flush=True)
                    continue
                self.error = exc
                return


def _wait(cond, timeout: float, job: _Job, poll: float = POLL) -> float | None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if cond():
            return time.perf_counter() - t0
        if not job.is_alive():
            raise RuntimeError(f"the mirror job ended while measuring: {job.error!r}") from job.error
        time.sleep(poll)
    return None


def seed_table(spark, args, rows: int, s: int, options: dict | None = None) -> float:
    """The table's first version: ``rows`` synthetic rows as a snapshot at ``s`` writes them (files in the table's
    store, then one version naming them); seconds taken."""
    from msgstream_spark.cli.data import synthetic_batches
    from msgstream_spark.jobs.mirror import _config, _facts, _stream, rows_arrow_schema
    from msgstream_spark.mirror.common import PROP_SNAPSHOT_TS, conform, table_schema
    from msgstream_spark.mirror.order import snapshot_seq_array
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.mirror.table import open_table
    from msgstream_spark.mirror.write.layout import write_data_file

    t0 = time.perf_counter()
    probe = _stream(spark, args, _config(args), None)
    pk, cid = _facts(probe)
    fields = rows_arrow_schema(probe)
    table = open_table("delta", args.table, collection=args.collection, pk=pk, arrow_schema=fields, create=False,
                       collection_id=cid, storage_options=options)
    schema = table_schema(fields, pk)
    store = open_store(args.table, options)
    paths = []
    for i, b in enumerate(synthetic_batches(rows, DIM, FILE_ROWS)):
        t = pa.Table.from_batches([b])
        n = t.num_rows
        t = t.append_column("_ts", pa.array(np.full(n, s, np.int64))).append_column("_seq", snapshot_seq_array(s, n))
        paths.append(store.join(f"snapshot-{s}", f"part-{i:05d}.parquet"))
        write_data_file(conform(t, schema), paths[-1], store)
    table.add_files(paths, properties={PROP_SNAPSHOT_TS: str(s)})
    return time.perf_counter() - t0


def _profile(spark) -> dict:
    """Median of Spark's per-batch durations (``durationMs``: latestOffset, getBatch, addBatch (the mirror's
    foreachBatch), walCommit, commitOffsets, triggerExecution) over the batches that carried rows."""
    rows = [p["durationMs"] for q in spark.streams.active for p in q.recentProgress if p.get("numInputRows")]
    keys = sorted({k for r in rows for k in r})
    return {k: int(np.median([r.get(k, 0) for r in rows])) for k in keys} if rows else {}


def one_size(spark, work: Path, backend: str, mq: dict, rows: int, samples: int, interval: float,
             s3=None, poll: float = POLL) -> dict:
    """The freshness samples with a table of ``rows`` rows, in a local directory or (``s3``: a BenchS3) in a
    bucket on the S3 server."""
    from msgstream_spark.jobs import mirror

    name = f"{backend}-{rows}{'-s3' if s3 is not None else ''}"
    channels = f"bench-fresh-{name}_0,bench-fresh-{name}_1"
    cfg = work / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(mq))
    table, options, extra = str(work / f"t-{name}"), None, []
    if s3 is not None:
        table, options = f"s3://{s3.new_bucket('fresh')}/t-{name}", s3.options()
        extra = [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]
    budget = 600.0 + samples * (interval + 30)
    args = mirror.build_parser().parse_args([
        "--config", str(cfg), "--channels", channels, "--collection", "bench", "--table", table,
        "--table-format", "delta", "--snapshot", "never", "--trigger", "processing-time:1s",
        "--checkpoint", str(work / f"ckpt-{name}"), "--timeout", str(budget), "--progress-interval", "60", *extra])
    s = (int(time.time() * 1000) - 1000) << 18  # the snapshot time: before the first published row
    _publish(str(cfg), channels, rows, 1)  # the log names the collection; the job's first row
    seed_s = seed_table(spark, args, rows, s, options)
    reader = _Reader(table, options)
    job = _Job(args, spark)
    job.start()
    if _wait(lambda: reader.has(rows), 300, job, poll) is None:
        raise RuntimeError(f"the job did not mirror the log's first row into the {rows}-row table within 300 s")
    lat = []
    for i in range(samples):
        pk = rows + 1 + i
        t0 = time.perf_counter()
        _publish(str(cfg), channels, pk, 1)
        took = _wait(lambda pk=pk: reader.has(pk), 60, job, poll)
        if took is None:
            raise RuntimeError(f"row {pk} did not appear in {table} within 60 s ({backend})")
        lat.append(time.perf_counter() - t0)
        time.sleep(max(0.0, interval - lat[-1]))
    profile = _profile(spark)
    for q in spark.streams.active:
        q.stop()
    job.join(120)
    res = {"rows": rows, "samples": samples, "store": "s3" if s3 is not None else "local",
           "p50_s": round(float(np.percentile(lat, 50)), 3), "p95_s": round(float(np.percentile(lat, 95)), 3),
           "max_s": round(max(lat), 3), "seed_table_s": round(seed_s, 1), "job_restarts": job.restarts,
           "batch_ms_median": profile}
    print(f"  {name:18s} {rows:>10,} rows: p50 {res['p50_s']:.2f} s  p95 {res['p95_s']:.2f} s  "
          f"max {res['max_s']:.2f} s  (table written in {seed_s:.1f} s)\n    per batch with rows, median ms: {profile}",
          flush=True)
    return res


def _s3_vs_local(result: dict, small: int, large: int) -> None:
    """The S3 run's p50 over the local path's, at each size (both on the embedded log, same run)."""
    r = result["local_s3"]
    for size in ("small", "large"):
        r[f"p50_ratio_s3_local_{size}"] = round(r[size]["p50_s"] / result["local"][size]["p50_s"], 3)
    met = "met" if r["large"]["p50_s"] <= 3.0 else "NOT met"
    print(f"  S3 / local path, p50: {r['p50_ratio_s3_local_small']} ({small:,} rows), "
          f"{r['p50_ratio_s3_local_large']} ({large:,} rows); on S3 with {large:,} rows p50 "
          f"{r['large']['p50_s']:.2f} s (goal <= 3 s: {met})", flush=True)


def run(small: int = 1_000, large: int = 4_000_000, samples: int = 15, interval: float = 2.0,
        kafka: bool = True, stores: tuple[str, ...] = ("local", "s3"), poll: float = POLL) -> dict:
    """``poll``: seconds between the reader's looks at the table (the latencies' resolution)."""
    from pyspark.sql import SparkSession

    from bench._s3 import load_average
    from msgstream_spark.jobs._common import spark_session

    # a Python worker connecting back to its executor gives up after 15 s by default: on a machine shared with
    # other jobs (load average ~20 on 2 cores) one such timeout ended a whole run
    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", "120")
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):  # as spark_session sets them, before Spark starts
        os.environ.setdefault(var, sys.executable)
    SparkSession.builder.master("local[2]").config("spark.python.authenticate.socketTimeout", "120s").getOrCreate()
    spark = spark_session("bench-freshness", "local[2]")
    result: dict = {"trigger": "processing-time:1s", "interval_s": interval, "goal_p50_s": 3.0,
                    "load_average_start": load_average()}
    print(f"freshness: insert -> readable, {samples} samples, one row every {interval} s, "
          f"trigger processing-time:1s, Delta; load average {result['load_average_start']}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fresh-") as d, contextlib.ExitStack() as stack:
            def s3_server():
                from bench._s3 import BenchS3

                return stack.enter_context(BenchS3(Path(d)))

            def log_cfg() -> dict:
                return {"mq.type": "local", "local.path": f"{d}/log.db"}

            backends = [("local", log_cfg, None)]
            if kafka:
                def kafka_cfg() -> dict:
                    from tests.fixtures.tansu import TansuBroker

                    return {"mq.type": "kafka", "kafka.brokerList": stack.enter_context(TansuBroker()).bootstrap}

                backends.append(("kafka", kafka_cfg, None))
            if "s3" in stores:
                backends.append(("local_s3", log_cfg, s3_server))
            for backend, mq, on in backends:
                conf = mq()
                server = on() if on is not None else None
                label = backend.removesuffix("_s3")
                s = one_size(spark, Path(d), label, conf, small, samples, interval, server, poll)
                b = one_size(spark, Path(d), label, conf, large, samples, interval, server, poll)
                ratio = round(b["p50_s"] / s["p50_s"], 3)
                result[backend] = {"small": s, "large": b, "p50_ratio_large_small": ratio,
                                   "goal_met": max(s["p50_s"], b["p50_s"]) <= 3.0}
                print(f"  {backend}: p50 large/small {ratio}  goal p50 <= 3 s at both sizes: "
                      f"{'met' if result[backend]['goal_met'] else 'NOT met'}", flush=True)
                if server is not None:
                    result[backend]["moto_rss_mb"] = round(server.rss_mb())
            if "local_s3" in result:
                _s3_vs_local(result, small, large)
    finally:
        spark.stop()
    result["load_average_end"] = load_average()
    print(json.dumps(result))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_freshness", description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=1_000)
    p.add_argument("--large", type=int, default=4_000_000)
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between published rows (default 2)")
    p.add_argument("--no-kafka", action="store_true", help="the embedded log only")
    p.add_argument("--stores", default="local,s3",
                   help="local: tables in a local directory only; local,s3: the embedded log's also on the S3 server")
    a = p.parse_args(argv)
    run(a.small, a.large, a.samples, a.interval, not a.no_kafka, tuple(a.stores.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
