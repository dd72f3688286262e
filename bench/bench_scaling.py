"""How the Spark batch read's cost grows: rows/s and Python-worker peak memory by log size, by
channel count, and local[1] against local[2].

Rows are (int64 pk, 8-d float vector) in 1000-row inserts on the embedded log, read into Spark's
noop sink (the bench_spark_read machinery). Sizes come from the arguments or BENCH_SCALE_ROWS
("1000000,10000000" by default; "100000,1000000" for a quick run).

    python -m bench.bench_scaling [--rows 1000000,10000000] [--channels 1,4,16] [--masters local[1],local[2]]

Writes bench/results/scaling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_spark_read import RssSampler, publish
from msgstream_spark.config import Config

DIM = 8


def _spark(master: str):
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName(f"bench-scaling-{master}")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _read(spark, path: str, channels: list[str]) -> tuple[float, int, int]:
    """Seconds, peak worker RSS and peak anonymous RSS (bytes) of one full read."""
    opts = {"mq.type": "local", "local.path": path, "channels": ",".join(channels)}
    with RssSampler() as s:
        t0 = time.perf_counter()
        spark.read.format("msgstream").options(**opts).load().write.format("noop").mode("overwrite").save()
        t = time.perf_counter() - t0
    return t, s.peak, s.peak_anon


def _logs(d: str, sizes: list[int], channel_counts: list[int]) -> dict[tuple[int, int], tuple[str, list[str]]]:
    """One embedded log per (rows, channels) case: the size series on 2 channels, the channel series
    at the smallest size."""
    cases = sorted({(n, 2) for n in sizes} | {(sizes[0], c) for c in channel_counts})
    out = {}
    for rows, nch in cases:
        path = f"{d}/r{rows}_c{nch}.db"
        chans = [f"scale_{i}" for i in range(nch)]
        publish(Config.from_dict({"mq": {"type": "local"}, "local": {"path": path}}), rows, DIM, text=False,
                channels=chans)
        out[(rows, nch)] = (path, chans)
    return out


def run(sizes: list[int] | None = None, channel_counts: list[int] | None = None,
        masters: list[str] | None = None) -> dict:
    env = os.environ.get("BENCH_SCALE_ROWS", "1000000,10000000")
    sizes = sizes or [int(x) for x in env.split(",")]
    channel_counts = channel_counts or [1, 4, 16]
    masters = masters or ["local[1]", "local[2]"]
    res: dict = {"dim": DIM, "rows": sizes, "channels": channel_counts, "cases": []}
    with tempfile.TemporaryDirectory() as d:
        logs = _logs(d, sizes, channel_counts)
        for master in masters:
            spark = _spark(master)
            try:
                path, chans = logs[(sizes[0], 2)]
                _read(spark, path, chans)  # warm up the workers
                for (rows, nch), (path, chans) in sorted(logs.items()):
                    t, peak, anon = _read(spark, path, chans)
                    case = {"master": master, "rows": rows, "channels": nch, "rows_s": rows / t,
                            "seconds": t, "worker_peak_rss_mb": round(peak / 2**20, 1),
                            "worker_peak_anon_mb": round(anon / 2**20, 1)}
                    res["cases"].append(case)
                    print(f"{master:9s} {rows:>11,} rows {nch:>3} channels: {rows / t:>11,.0f} rows/s, worker peak "
                          f"RSS {case['worker_peak_rss_mb']} MB (anonymous {case['worker_peak_anon_mb']} MB)",
                          flush=True)
            finally:
                spark.stop()
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=None)
    ap.add_argument("--channels", default="1,4,16")
    ap.add_argument("--masters", default="local[1],local[2]")
    a = ap.parse_args()
    run([int(x) for x in a.rows.split(",")] if a.rows else None, [int(x) for x in a.channels.split(",")],
        a.masters.split(","))
