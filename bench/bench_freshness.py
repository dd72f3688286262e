"""Freshness of a running mirror: the time from a Milvus-format insert to its row being readable in the table.

``python -m bench.bench_freshness [--small N] [--large N] [--samples K] [--interval S]``: on the embedded
log (2 channels), a synthetic collection of N rows is mirrored into a Delta table by ``jobs.mirror
--snapshot never --trigger processing-time:1s`` running in this process; once the table holds them, one
row is published every ``interval`` seconds (``msgstream publish``, Spark-free, as a new user would) and
the table is polled (a key-filtered read, every 50 ms) until the row is there. Prints p50 / p95 of
that latency for a small and a large table, and the ratio large / small (the baseline is the small
table, measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

CHANNELS = "bench-fresh_0,bench-fresh_1"
POLL = 0.05


def _publish(cfg: str, start: int, rows: int) -> None:
    from msgstream_spark.cli.main import main

    rc = main(["publish", "--config", cfg, "-c", CHANNELS, "--synthetic", str(rows), "--start", str(start),
               "--dim", "8", "--collection", "bench", "--no-progress"])
    if rc != 0:
        raise RuntimeError(f"publish failed with exit code {rc}")


def _has(table: Path, pk: int) -> bool:
    import deltalake
    import pyarrow.dataset as ds

    if not deltalake.DeltaTable.is_deltatable(str(table)):
        return False
    got = deltalake.DeltaTable(str(table)).to_pyarrow_dataset().to_table(columns=["pk"], filter=ds.field("pk") == pk)
    return got.num_rows > 0


def _count(table: Path) -> int:
    import deltalake

    if not deltalake.DeltaTable.is_deltatable(str(table)):
        return 0
    return deltalake.DeltaTable(str(table)).to_pyarrow_dataset().count_rows()


def _wait(cond, timeout: float) -> float | None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if cond():
            return time.perf_counter() - t0
        time.sleep(POLL)
    return None


def one_size(spark, work: Path, rows: int, samples: int, interval: float) -> dict:
    from jobs import mirror

    log = work / f"log-{rows}.db"
    cfg = work / f"local-{rows}.yaml"
    cfg.write_text(yaml.safe_dump({"mq.type": "local", "local.path": str(log)}))
    for start in range(0, rows, 50_000):  # one tick per write: a micro-batch ends at a tick
        _publish(str(cfg), start, min(50_000, rows - start))
    table = work / f"t-{rows}"
    budget = 600.0 + samples * (interval + 30)
    args = mirror.build_parser().parse_args([
        "--config", str(cfg), "--channels", CHANNELS, "--collection", "bench", "--table", str(table),
        "--table-format", "delta", "--snapshot", "never", "--trigger", "processing-time:1s",
        "--timeout", str(budget), "--progress-interval", "60"])
    job = threading.Thread(target=mirror.run, args=(args, spark), daemon=True)
    job.start()
    if _wait(lambda: _count(table) >= rows, 600) is None:
        raise RuntimeError(f"the job did not mirror the first {rows} rows within 600 s")
    lat = []
    for i in range(samples):
        pk = rows + i
        t0 = time.perf_counter()
        _publish(str(cfg), pk, 1)
        took = _wait(lambda pk=pk: _has(table, pk), 60)
        if took is None:
            raise RuntimeError(f"row {pk} did not appear in {table} within 60 s")
        lat.append(time.perf_counter() - t0)
        time.sleep(max(0.0, interval - lat[-1]))
    for q in spark.streams.active:
        q.stop()
    job.join(120)
    return {"rows": rows, "samples": samples, "p50_s": round(float(np.percentile(lat, 50)), 3),
            "p95_s": round(float(np.percentile(lat, 95)), 3), "max_s": round(max(lat), 3)}


def run(small: int = 1_000, large: int = 100_000, samples: int = 15, interval: float = 2.0) -> dict:
    from jobs._common import spark_session

    spark = spark_session("bench-freshness", "local[2]")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fresh-") as d:
            s = one_size(spark, Path(d), small, samples, interval)
            b = one_size(spark, Path(d), large, samples, interval)
    finally:
        spark.stop()
    result = {"trigger": "processing-time:1s", "log": "local", "small": s, "large": b,
              "p50_ratio_large_small": round(b["p50_s"] / s["p50_s"], 3)}
    print(json.dumps(result))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_freshness", description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=1_000)
    p.add_argument("--large", type=int, default=100_000)
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between published rows (default 2)")
    a = p.parse_args(argv)
    run(a.small, a.large, a.samples, a.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
