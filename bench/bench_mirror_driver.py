"""The mirror driver's peak memory for a large micro-batch vs a 10x smaller one, ``spark.driver.memory=1g``.

``python -m bench.bench_mirror_driver [--rows N] [--dim D] [--format delta]``: a Spark local[2] session with a
1 GiB driver heap; a micro-batch of ``rows`` inserts (``dim``-d float vectors, generated in tasks) handed to
``MirrorBatch`` as ``foreachBatch`` hands it, then one of ``rows // 10``. Peaks sampled every 50 ms: the JVM's
used heap, and this (driver) Python process's RSS. Ratio = large / small (goal <= 1.2; the batch must complete).
In local mode the tasks run in the driver's JVM, so the heap figure includes the tasks' Arrow buffers.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

SEQ_TYPE = pa.decimal128(38, 0)


def _gen(dim: int, ts: int):
    def gen(batches):
        for b in batches:
            for lo in b.column(0).to_pylist():
                n = 5000
                rng = np.random.default_rng(lo)
                vec = pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * dim, dim, dtype=np.int32)),
                                               pa.array(rng.random(n * dim, dtype=np.float32)))
                yield pa.RecordBatch.from_arrays(
                    [pa.array(["insert"] * n), pa.array(np.arange(lo, lo + n, dtype=np.int64)), vec,
                     pa.array(np.full(n, ts, np.int64)), pa.array([ts << 64] * n, SEQ_TYPE),
                     pa.array(np.zeros(n, np.int64))],
                    names=["op", "pk", "vec", "_ts", "_seq", "_partition"])

    return gen


class _Peak:
    def __init__(self, spark) -> None:
        self.rt = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
        self.heap = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.heap = max(self.heap, self.rt.totalMemory() - self.rt.freeMemory())

    def __enter__(self) -> _Peak:
        self.rt.gc()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)


def one(spark, fmt: str, work: Path, rows: int, dim: int) -> dict:
    from pyspark.sql.pandas.types import from_arrow_schema

    from msgstream_spark.mirror import open_table
    from msgstream_spark.spark.mirror import MirrorBatch

    schema = pa.schema([pa.field("op", pa.string()), pa.field("pk", pa.int64()),
                        pa.field("vec", pa.list_(pa.float32())), pa.field("_ts", pa.int64()),
                        pa.field("_seq", SEQ_TYPE), pa.field("_partition", pa.int64())])
    fields = pa.schema([pa.field("pk", pa.int64(), False), pa.field("vec", pa.list_(pa.float32()))])
    table = open_table(fmt, str(work / f"t{rows}"), collection="bench", pk="pk", arrow_schema=fields)
    starts = spark.createDataFrame([(i,) for i in range(0, rows, 5000)], "lo long").repartition(2)
    df = starts.mapInArrow(_gen(dim, 10), from_arrow_schema(schema))
    sink = MirrorBatch(table, "pk", query_id="bench")
    t0 = time.perf_counter()
    with _Peak(spark) as peak:
        sink(df, 0)
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rows": rows, "seconds": round(secs, 1), "jvm_heap_peak_mb": round(peak.heap / 2**20),
            "python_rss_peak_mb": round(rss / 2**20), "committed": sink.batches == 1}


def run(rows: int = 1_000_000, dim: int = 768, fmt: str = "delta") -> dict:
    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="bench-mirror-driver-"))
    spark = (SparkSession.builder.master("local[2]").appName("bench-mirror-driver")
             .config("spark.driver.memory", "1g").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    try:
        small = one(spark, fmt, work, rows // 10, dim)
        large = one(spark, fmt, work, rows, dim)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = {"format": fmt, "dim": dim, "small": small, "large": large,
           "heap_ratio": round(large["jvm_heap_peak_mb"] / max(1, small["jvm_heap_peak_mb"]), 2),
           "rss_ratio": round(large["python_rss_peak_mb"] / max(1, small["python_rss_peak_mb"]), 2)}
    for r in (small, large):
        print(f"{fmt} {r['rows']:>9,} rows x {dim}-d: {r['seconds']:6.1f} s, JVM heap peak {r['jvm_heap_peak_mb']} MB, "
              f"driver Python RSS peak {r['python_rss_peak_mb']} MB", flush=True)
    print(f"ratios large/small: heap {out['heap_ratio']}x, RSS {out['rss_ratio']}x (goal <= 1.2)", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--format", default="delta", choices=["delta", "iceberg"])
    a = p.parse_args()
    run(a.rows, a.dim, a.format)


if __name__ == "__main__":
    main()
