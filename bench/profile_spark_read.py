"""Where a Spark batch read's time goes (issue #47), per stage, at two sizes.

    python -m bench.profile_spark_read [--rows 100000,1000000] [--reps 3] [--kafka]

Two views of bench_spark_read's log (1000-row inserts of int64 pk + 128-d vector + text, 2 channels):

- **in one process** (no Spark), the read tasks' code (``read_partition``) with its stages timed: plan (schema
  inference + partitions, the driver's part), partition open (client, reader, seek), fetch (the backend's
  ``receive_batch``), decode (protobuf to Arrow columns, transactions, dedupe), Arrow assembly (the rows
  builder: metadata columns, ``_seq``, positions, batch joins); CPU seconds of the whole read beside them;
- **in Spark** (local[2], noop sink), interleaved with the same-schema synthetic Arrow source: wall seconds and
  CPU seconds of the Spark JVM and of the Python workers for each. The synthetic source's figures are Spark's
  hand-over and query costs alone; what our read adds on the Python side is ours.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

from bench._util import load_average, median
from bench.bench_spark_read import CHANNELS, _sources, publish
from bench.profile_split import SIDES, _cpu
from msgstream_spark.config import Config

STAGES = ("plan", "open", "fetch", "decode", "arrow", "other")


class _Timer:
    """Seconds per stage, from wrappers put around the read path's functions (this process only)."""

    def __init__(self) -> None:
        self.t = dict.fromkeys(STAGES, 0.0)
        self._undo: list = []

    def wrap(self, owner, name: str, stage: str, minus: tuple[str, ...] = ()) -> None:
        """Time ``owner.name`` as ``stage``; the time of stages in ``minus`` spent inside it is not counted twice."""
        fn = getattr(owner, name)
        t = self.t

        def timed(*a, **k):
            inner0 = sum(t[s] for s in minus)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                t[stage] += time.perf_counter() - t0 - (sum(t[s] for s in minus) - inner0)

        setattr(owner, name, timed)
        self._undo.append((owner, name, fn))

    def __enter__(self):
        from msgstream_spark.source import apply, read, rows
        from msgstream_spark.source.options import ReadOptions

        self.wrap(ReadOptions, "client", "open")
        self.wrap(read, "_seek", "open")
        self.wrap(rows.RowsBuilder, "add", "arrow")
        self.wrap(rows.RowsBuilder, "flush", "arrow")
        self.wrap(apply.RowsHandler, "handle", "decode", minus=("arrow",))
        self._wrap_fetch()
        return self

    def _wrap_fetch(self) -> None:
        from msgstream_spark.mq.base import Client
        from msgstream_spark.mq.kafka.client import KafkaClient
        from msgstream_spark.mq.kafka.consumer import KafkaConsumer
        from msgstream_spark.mq.local.consumer import LocalConsumer

        for cls in (Client, KafkaClient):  # the readers' creation (Kafka's has its own)
            self.wrap(cls, "reader", "open")
        for cls in (LocalConsumer, KafkaConsumer):
            self.wrap(cls, "receive_batch", "fetch")

    def __exit__(self, *exc) -> None:
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)


def in_process(opts: dict, reps: int) -> dict:
    """Median stage seconds and CPU seconds of ``reps`` reads of every partition, in this process."""
    from msgstream_spark.spark.datasource import MsgStreamDataSource
    from msgstream_spark.spark.partitions import read_partition

    runs = []
    for _ in range(reps + 1):  # the first is a warm-up
        with _Timer() as tm:
            c0, t0, th0 = time.process_time(), time.perf_counter(), time.thread_time()
            p0 = time.perf_counter()
            ds = MsgStreamDataSource(opts)
            parts = ds.reader(ds.schema()).partitions()
            tm.t["plan"] = time.perf_counter() - p0
            n = sum(b.num_rows for p in parts for b in read_partition(p))
            wall, cpu, thread = time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - th0
        tm.t["other"] = wall - sum(v for k, v in tm.t.items() if k != "other")
        # the reading thread (our code, protobuf, Arrow) and the rest (a client library's own threads: librdkafka's)
        runs.append({"rows": n, "wall_s": wall, "cpu_s": cpu, "thread_cpu_s": thread,
                     "client_threads_cpu_s": cpu - thread, **tm.t})
    runs = runs[1:]
    return {k: median([r[k] for r in runs]) for k in runs[0]}


def _broker_cpu(pid: int | None) -> float:
    """CPU seconds the broker process (tansu, on the same cores) has used so far; 0 without one."""
    if pid is None:
        return 0.0
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def in_spark(spark, opts: dict, reps: int, broker_pid: int | None = None) -> dict:
    """Wall and CPU seconds per side of the msgstream read and the synthetic source, interleaved (with the broker's
    CPU seconds when ``broker_pid`` names its process)."""
    def ours():
        spark.read.format("msgstream").options(**opts).load().write.format("noop").mode("overwrite").save()

    def synth():
        spark.read.format("bench_synthetic").load().write.format("noop").mode("overwrite").save()

    got: dict[str, list] = {"synthetic": [], "msgstream": []}
    for fn in (synth, ours):
        fn()  # warm-up
    for _ in range(reps):
        for name, fn in (("synthetic", synth), ("msgstream", ours)):
            c0, b0, t0 = _cpu(), _broker_cpu(broker_pid), time.perf_counter()
            fn()
            wall, c1 = time.perf_counter() - t0, _cpu()
            got[name].append({"wall_s": wall, **{f"{s} cpu_s": c1[s] - c0[s] for s in SIDES},
                              "broker cpu_s": _broker_cpu(broker_pid) - b0})
    return {name: {k: median([r[k] for r in v]) for k in v[0]} for name, v in got.items()}


def run(rows: tuple[int, ...] = (100_000, 1_000_000), reps: int = 3, kafka: bool = False) -> dict:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    res: dict = {"load_start": load_average()}
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        backends = {"local": lambda n: ({"mq": {"type": "local"}, "local": {"path": f"{d}/r{n}.db"}},
                                        {"mq.type": "local", "local.path": f"{d}/r{n}.db"})}
        pids: dict[str, int | None] = {"local": None}
        if kafka:
            from tests.fixtures.tansu import TansuBroker

            broker = stack.enter_context(TansuBroker())
            boot, pids["kafka"] = broker.bootstrap, broker.proc.pid
            backends["kafka"] = lambda n: ({"mq": {"type": "kafka"}, "kafka": {"brokerList": boot}},
                                           {"mq.type": "kafka", "kafka.brokerList": boot})
        for n in rows:
            synthetic, _ = _sources(n, 128)
            spark.dataSource.register(synthetic)
            for be, conf in backends.items():
                cfg, base = conf(n)
                chans = [f"{c}-{n}" for c in CHANNELS] if be == "kafka" else CHANNELS
                publish(Config.from_dict(cfg), n, 128, text=True, channels=chans)
                opts = {**base, "channels": ",".join(chans)}
                r = {"in_process": in_process(opts, reps), "spark": in_spark(spark, opts, reps, pids[be]),
                     "load": load_average()}
                res[f"{be}_{n}"] = r
                _print(be, n, r)
    return res


def _print(be: str, n: int, r: dict) -> None:
    ip, sp = r["in_process"], r["spark"]
    print(f"-- {be}, {n:,} rows (load {r['load']})")
    print("  in one process: " + ", ".join(f"{k} {ip[k]:.3f}" for k in STAGES)
          + f" | wall {ip['wall_s']:.3f} s, CPU {ip['cpu_s']:.3f} s (the reading thread {ip['thread_cpu_s']:.3f}, the "
          f"client's threads {ip['client_threads_cpu_s']:.3f})")
    for name, v in sp.items():
        print(f"  Spark, {name:<9}: wall {v['wall_s']:.3f} s, " + ", ".join(f"{s} {v[f'{s} cpu_s']:.2f}" for s in SIDES)
              + f", broker {v['broker cpu_s']:.2f} CPU s")
    s, o = sp["synthetic"], sp["msgstream"]
    py = o["python workers cpu_s"] - s["python workers cpu_s"]
    tot = {k: sum(v[f"{side} cpu_s"] for side in (*SIDES, "broker")) for k, v in sp.items()}
    print(f"  ratio {s['wall_s'] / o['wall_s']:.2f}; Python workers' CPU {py:+.2f} s over the synthetic source, "
          f"JVM {o['jvm cpu_s'] - s['jvm cpu_s']:+.2f} s, broker {o['broker cpu_s']:.2f} s; all CPU s "
          f"{tot['synthetic']:.2f} vs {tot['msgstream']:.2f} (their ratio {tot['synthetic'] / tot['msgstream']:.2f})",
          flush=True)
    # the ceiling if the workers' CPU above the synthetic source were only the client's threads (measured in one
    # process): what the all-CPU ratio would be with our code costing nothing more than building the batches
    client = ip["client_threads_cpu_s"]
    ours = max(0.0, py - client)
    print(f"  of the workers' {py:+.2f} CPU s: the client's threads ~{client:.2f} (in one process), ours ~{ours:.2f}; "
          f"the all-CPU ratio without ours {tot['synthetic'] / max(1e-9, tot['msgstream'] - ours):.2f}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="100000,1000000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kafka", action="store_true")
    a = ap.parse_args()
    run(tuple(int(x) for x in a.rows.split(",")), a.reps, a.kafka)
