"""The size of the Arrow batches a read hands to Spark, measured in CPU seconds (issue #47).

    python -m bench.profile_batch_sizes [--rows 300000] [--reps 3] [--kafka]

bench_spark_read's log (1000-row inserts of int64 pk + 128-d vector + text, 2 channels) read by Spark on local[2]
into the noop sink at a few settings of the reader's batch shape, interleaved (one read of each setting, then
the next round): per setting the wall seconds and the CPU seconds of the Spark JVM and of the Python workers,
medians. CPU is the steadier measure on a shared machine. The settings:

- ``pass-through``: a message's piece of at least 256 KiB goes to Spark as it is (here every 1000-row insert:
  ~0.5 MiB batches, no copy; the reader's rule before this measurement);
- ``1 MiB``: ``PASS_THROUGH_BYTES`` as it is now (1 MiB): pairs of inserts joined into ~1 MiB batches of 2000
  rows (the shape of ``joined 2048``);
- ``joined 2048`` / ``joined 8192`` / ``joined 16384``: every piece joined up to ``maxBatchRows`` rows (a copy
  of each column in the worker: ~1 / ~4 / ~8 MiB batches).

The setting is applied in the worker by a bench-only wrapper of the source (the threshold is a module constant).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

from bench._util import load_average, median
from bench.bench_spark_read import CHANNELS, publish
from bench.profile_split import SIDES, _cpu
from msgstream_spark.config import Config

# (name, pass-through threshold in bytes, maxBatchRows)
SETTINGS = (("pass-through", 256 * 1024, 8192), ("1 MiB", 1024 * 1024, 8192), ("joined 2048", 1 << 62, 2048),
            ("joined 8192", 1 << 62, 8192), ("joined 16384", 1 << 62, 16384))


def _tuned_source():
    """A DataSource ``msgstream_tuned``: msgstream's, with option ``benchPassThroughBytes`` set in the worker."""
    from msgstream_spark.spark.datasource import MsgStreamDataSource

    class TunedReader:
        def __init__(self, inner, threshold: int) -> None:
            self.inner, self.threshold = inner, threshold

        def partitions(self):
            return self.inner.partitions()

        def read(self, partition):
            from msgstream_spark.source import rows

            rows.PASS_THROUGH_BYTES = self.threshold
            return self.inner.read(partition)

    class Tuned(MsgStreamDataSource):
        @classmethod
        def name(cls) -> str:
            return "msgstream_tuned"

        def _opts(self, streaming):
            from msgstream_spark.source.options import parse_read_options

            return parse_read_options({k: v for k, v in self.options.items() if k.lower() != "benchpassthroughbytes"},
                                      streaming=streaming)

        def reader(self, schema):
            from pyspark.sql.datasource import DataSourceReader

            inner = super().reader(schema)
            reader = type("TunedBatchReader", (TunedReader, DataSourceReader), {})(
                inner, int({k.lower(): v for k, v in self.options.items()}.get("benchpassthroughbytes", 256 * 1024)))
            return reader

    return Tuned


def batches_seen(opts: dict, threshold: int) -> tuple[int, int]:
    """(batches, rows) the read of ``opts`` yields at ``threshold``, in this process (what Spark receives)."""
    from msgstream_spark.source import rows
    from msgstream_spark.spark.datasource import MsgStreamDataSource
    from msgstream_spark.spark.partitions import read_partition

    old, rows.PASS_THROUGH_BYTES = rows.PASS_THROUGH_BYTES, threshold
    try:
        ds = MsgStreamDataSource(opts)
        got = [b.num_rows for p in ds.reader(ds.schema()).partitions() for b in read_partition(p)]
    finally:
        rows.PASS_THROUGH_BYTES = old
    return len(got), sum(got)


def run(n: int = 300_000, reps: int = 3, kafka: bool = False) -> dict:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(_tuned_source())
    res: dict = {"rows": n, "load_start": load_average()}
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        if kafka:
            from tests.fixtures.tansu import TansuBroker

            boot = stack.enter_context(TansuBroker()).bootstrap
            cfg, base = ({"mq": {"type": "kafka"}, "kafka": {"brokerList": boot}},
                         {"mq.type": "kafka", "kafka.brokerList": boot})
        else:
            cfg, base = ({"mq": {"type": "local"}, "local": {"path": f"{d}/b.db"}},
                         {"mq.type": "local", "local.path": f"{d}/b.db"})
        chans = [f"{c}-{n}" for c in CHANNELS]
        publish(Config.from_dict(cfg), n, 128, text=True, channels=chans)
        base = {**base, "channels": ",".join(chans)}

        def opts(threshold: int, batch_rows: int) -> dict:
            return {**base, "benchPassThroughBytes": str(threshold), "maxBatchRows": str(batch_rows)}

        def read(o: dict) -> None:
            spark.read.format("msgstream_tuned").options(**o).load().write.format("noop").mode("overwrite").save()

        got: dict[str, list] = {name: [] for name, _, _ in SETTINGS}
        for _, th, br in SETTINGS:
            read(opts(th, br))  # warm-up
        for _ in range(reps):
            for name, th, br in SETTINGS:
                c0, t0 = _cpu(), time.perf_counter()
                read(opts(th, br))
                wall, c1 = time.perf_counter() - t0, _cpu()
                got[name].append({"wall_s": wall, **{f"{s} cpu_s": c1[s] - c0[s] for s in SIDES}})
        for name, th, br in SETTINGS:
            runs = got[name]
            r = {k: median([x[k] for x in runs]) for k in runs[0]}
            r["cpu_s"] = r["jvm cpu_s"] + r["python workers cpu_s"]
            r["batches"], r["rows_read"] = batches_seen({**base, "maxBatchRows": str(br)}, th)
            r["cpu_samples"] = [round(x["jvm cpu_s"] + x["python workers cpu_s"], 3) for x in runs]
            res[name] = r
            print(f"{name:<13} {r['batches']:>4} batches: wall {r['wall_s']:.2f} s, JVM {r['jvm cpu_s']:.2f} + Python "
                  f"{r['python workers cpu_s']:.2f} = {r['cpu_s']:.2f} CPU s (samples {r['cpu_samples']})", flush=True)
    res["load_end"] = load_average()
    print(f"load average {res['load_start']} -> {res['load_end']}")
    spark.stop()
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kafka", action="store_true")
    a = ap.parse_args()
    run(a.rows, a.reps, a.kafka)
