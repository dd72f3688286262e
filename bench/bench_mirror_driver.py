"""The mirror driver's memory for a large micro-batch vs a 10x smaller one, ``spark.driver.memory=1g``.

``python -m bench.bench_mirror_driver [--rows N] [--dim D] [--format delta] [--executor-mb MB]``: Spark as
``local-cluster[2,1,MB]`` (two executors, each a JVM of its own with its own Python workers), so the driver's
JVM and Python process hold only what the driver itself holds, not the tasks' Arrow buffers. After an
unmeasured batch of 5,000 rows (it starts the executors and their Python workers), a micro-batch of
``rows // 10`` inserts (``dim``-d float vectors, generated in the tasks), then one of ``rows``, each handed to
``MirrorBatch`` as ``foreachBatch`` hands it. Per batch:

- **driver JVM live heap**: the peak, over the batch, of the heap used right after a full GC. A sampling
  thread forces one (``System.gc()``: a full, stop-the-world collection) every ``--gc-every``
  seconds (0.5) and once when the batch returns, and reads ``MemoryMXBean.getHeapMemoryUsage().getUsed()``:
  what is reachable at that moment, not garbage not yet collected. ``jvm_heap_live_before_mb`` is the same
  figure before the batch (Spark's own baseline).
- **driver Python RSS**: the peak of this process's ``VmRSS`` (``/proc/self/status``), sampled every 50 ms
  from the batch's start to its end (``ru_maxrss`` would be the whole process's maximum, hiding the small
  batch's figure behind anything earlier); ``python_rss_before_mb`` is the RSS at the batch's start.

Ratio = large / small of each peak (goal <= 1.2; the large batch must complete). The forced collections
slow the batches a little: the seconds are not a throughput figure.

``run()`` (``make bench``) measures in a fresh subprocess: the driver JVM's heap is fixed when the first
Spark session of a process starts it, and an earlier script's session or memory would count here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

SEQ_TYPE = pa.decimal128(38, 0)
CHUNK = 5000  # rows per generated Arrow batch
RESULT = "RESULT "
REPO = Path(__file__).resolve().parents[1]


def _gen(rows: int, dim: int, ts: int):
    def gen(batches):
        for b in batches:
            for lo in b.column(0).to_pylist():
                n = min(CHUNK, rows - lo)
                rng = np.random.default_rng(lo)
                vec = pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * dim, dim, dtype=np.int32)),
                                               pa.array(rng.random(n * dim, dtype=np.float32)))
                yield pa.RecordBatch.from_arrays(
                    [pa.array(["insert"] * n), pa.array(np.arange(lo, lo + n, dtype=np.int64)), vec,
                     pa.array(np.full(n, ts, np.int64)), pa.array([ts << 64] * n, SEQ_TYPE),
                     pa.array(np.zeros(n, np.int64))],
                    names=["op", "pk", "vec", "_ts", "_seq", "_partition"])

    return gen


def _rss() -> int:
    """This process's resident set size now, in bytes (``VmRSS``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS line in /proc/self/status")


class _Peak:
    """Samples, while the batch runs, the driver Python's RSS (every 50 ms) and the driver JVM's heap used
    right after a forced full GC (every ``gc_every`` s, and once at the end)."""

    def __init__(self, spark, gc_every: float) -> None:
        jvm = spark.sparkContext._jvm
        self.system = jvm.java.lang.System
        self.mem = jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
        self.gc_every = gc_every
        self.heap_before = self.heap = self.rss_before = self.rss = 0
        self.gcs = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._rss_loop, daemon=True),
                         threading.Thread(target=self._heap_loop, daemon=True)]

    def live_heap(self) -> int:
        self.system.gc()
        self.gcs += 1
        return int(self.mem.getHeapMemoryUsage().getUsed())

    def _rss_loop(self) -> None:
        while not self._stop.wait(0.05):
            self.rss = max(self.rss, _rss())

    def _heap_loop(self) -> None:
        while not self._stop.wait(self.gc_every):
            self.heap = max(self.heap, self.live_heap())

    def __enter__(self) -> _Peak:
        self.heap_before = self.heap = self.live_heap()
        self.rss_before = self.rss = _rss()
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        self.rss = max(self.rss, _rss())
        self.heap = max(self.heap, self.live_heap())


def one(spark, fmt: str, work: Path, name: str, rows: int, dim: int, gc_every: float) -> dict:
    from pyspark.sql.pandas.types import from_arrow_schema

    from msgstream_spark.mirror import open_table
    from msgstream_spark.spark.mirror import MirrorBatch

    schema = pa.schema([pa.field("op", pa.string()), pa.field("pk", pa.int64()),
                        pa.field("vec", pa.list_(pa.float32())), pa.field("_ts", pa.int64()),
                        pa.field("_seq", SEQ_TYPE), pa.field("_partition", pa.int64())])
    fields = pa.schema([pa.field("pk", pa.int64(), False), pa.field("vec", pa.list_(pa.float32()))])
    table = open_table(fmt, str(work / name), collection="bench", pk="pk", arrow_schema=fields)
    starts = spark.createDataFrame([(i,) for i in range(0, rows, CHUNK)], "lo long").repartition(2)
    df = starts.mapInArrow(_gen(rows, dim, 10), from_arrow_schema(schema))
    sink = MirrorBatch(table, "pk", query_id="bench")
    t0 = time.perf_counter()
    with _Peak(spark, gc_every) as peak:
        sink(df, 0)
    secs = time.perf_counter() - t0
    mb = 2 ** 20
    return {"rows": rows, "seconds": round(secs, 1), "jvm_heap_live_before_mb": round(peak.heap_before / mb),
            "jvm_heap_live_peak_mb": round(peak.heap / mb), "full_gcs": peak.gcs,
            "python_rss_before_mb": round(peak.rss_before / mb), "python_rss_peak_mb": round(peak.rss / mb),
            "committed": sink.batches == 1}


def _remove_worker_dir(app_id: str) -> None:
    """local-cluster's workers keep each executor's directory (logs, fetched files) under
    ``$SPARK_HOME/work/<application id>`` (the pip package's directory here): removed after the run."""
    from pyspark.find_spark_home import _find_spark_home

    shutil.rmtree(Path(_find_spark_home()) / "work" / app_id, ignore_errors=True)


def measure(rows: int = 1_000_000, dim: int = 768, fmt: str = "delta", executor_mb: int = 1024,
            gc_every: float = 0.5) -> dict:
    """The measurement, in this process (which must not have started Spark yet)."""
    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="bench-mirror-driver-"))
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python workers: this venv (pyarrow, the package)
    spark = (SparkSession.builder.master(f"local-cluster[2,1,{executor_mb}]").appName("bench-mirror-driver")
             .config("spark.driver.memory", "1g").config("spark.executor.memory", f"{executor_mb}m")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.executorEnv.PYTHONPATH", str(REPO))
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    try:
        master = spark.sparkContext.master
        if not master.startswith("local-cluster"):
            raise RuntimeError(f"this process already had a Spark session ({master}): run the bench in a fresh one")
        max_heap = int(spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory())
        t0 = time.perf_counter()
        one(spark, fmt, work, "warmup", CHUNK, dim, gc_every)  # unmeasured: starts the executors, Python workers
        warmup = time.perf_counter() - t0
        small = one(spark, fmt, work, "small", rows // 10, dim, gc_every)
        large = one(spark, fmt, work, "large", rows, dim, gc_every)
    finally:
        app = spark.sparkContext.applicationId
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
        _remove_worker_dir(app)
    for r in (small, large):
        if not r["committed"]:
            raise RuntimeError(f"the {r['rows']:,}-row batch committed nothing: its figures would measure no work")
    out = {"format": fmt, "dim": dim, "master": master, "driver_max_heap_mb": round(max_heap / 2 ** 20),
           "warmup_seconds": round(warmup, 1),
           "small": small, "large": large,
           "heap_ratio": round(large["jvm_heap_live_peak_mb"] / max(1, small["jvm_heap_live_peak_mb"]), 2),
           "rss_ratio": round(large["python_rss_peak_mb"] / max(1, small["python_rss_peak_mb"]), 2)}
    for r in (small, large):
        print(f"{fmt} {r['rows']:>9,} rows x {dim}-d: {r['seconds']:6.1f} s, driver JVM live heap peak "
              f"{r['jvm_heap_live_peak_mb']} MB (before {r['jvm_heap_live_before_mb']}, {r['full_gcs']} forced GCs), "
              f"driver Python RSS peak {r['python_rss_peak_mb']} MB (before {r['python_rss_before_mb']})", flush=True)
    print(f"ratios large/small: live heap {out['heap_ratio']}x, RSS {out['rss_ratio']}x (goal <= 1.2)", flush=True)
    return out


def run(rows: int = 1_000_000, dim: int = 768, fmt: str = "delta", executor_mb: int = 1024,
        gc_every: float = 0.5, timeout: float = 3600) -> dict:
    """``measure`` in a fresh Python process (a fresh driver JVM of 1 GiB); its printout passes through."""
    cmd = [sys.executable, "-m", "bench.bench_mirror_driver", "--rows", str(rows), "--dim", str(dim), "--format", fmt,
           "--executor-mb", str(executor_mb), "--gc-every", str(gc_every)]
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True, timeout=timeout)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT):])
        else:
            print(line, flush=True)
    if proc.returncode != 0 or result is None:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode} without a result (its stderr is above)")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--format", default="delta", choices=["delta", "iceberg"])
    p.add_argument("--executor-mb", type=int, default=1024, help="each executor's memory (local-cluster)")
    p.add_argument("--gc-every", type=float, default=0.5, help="seconds between the forced full GCs")
    a = p.parse_args()
    print(RESULT + json.dumps(measure(a.rows, a.dim, a.format, a.executor_mb, a.gc_every)), flush=True)


if __name__ == "__main__":
    main()
