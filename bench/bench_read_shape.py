"""Reads at Milvus's shape (issue #24): planning cost by log length, 16 channels against 2, and one
long channel split across tasks. Every figure is a ratio against a baseline of the same run,
the cases interleaved (A, B, A, B, ...), medians.

(1) planning: ``MsgStreamDataSource.schema()`` (inference, no ``collection`` option) plus the batch
    reader's ``partitions()`` - what the driver does before any task starts - on a 100k-row log and
    on a 10M-row log (1000-row inserts of an int64 pk, a tick after each, 2 channels), embedded log
    Kafka (tansu) and Pulsar (pulsar-lite); goal: the 10M-row plan within 1.2x of the 100k-row plan's time.
(2) channels: a Spark batch read (local[2], noop sink) of N rows on 16 channels against the same N
    rows on 2 channels; goal: >= 0.9 of the 2-channel rate.
(3) split: one channel of M rows read with ``minPartitions=2`` against the plain read (one task);
    goal: >= 1.5x the one-task rate.

    python -m bench.bench_read_shape [--plan-rows 100000,10000000] [--rows 1000000] [--split-rows 2000000]
                                     [--no-kafka] [--skip plan,channels,split]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from bench._util import describe, figure, median, table
from msgstream_spark.config import Config
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.mq.registry import build_client
from msgstream_spark.msg import codec
from msgstream_spark.msg.columns import arrow_to_field_data
from msgstream_spark.msg.schema import field_schema_from_arrow
from msgstream_spark.msg.types import InsertMsg, TimeTickMsg

ROWS_PER_MSG = 1000
REPS = 5
DIM = 8
PLAN_GOAL, CHANNELS_GOAL, SPLIT_GOAL = 1.2, 0.9, 1.5


def publish_pk(cfg: Config, rows: int, channels: list[str]) -> None:
    """``rows`` rows of an int64 pk in 1000-row inserts round robin over ``channels``, a tick after each
    (about 15 bytes a row: a 10M-row log is ~150 MB)."""
    client = build_client(cfg.mq_type, cfg)
    schema = field_schema_from_arrow("pk", pa.int64(), field_id=100, is_primary_key=True)
    producers = {ch: client.create_producer(ch) for ch in channels}
    pending: dict[str, list] = {ch: [] for ch in channels}
    ts = 455000614502400000
    try:
        for k, start in enumerate(range(0, rows, ROWS_PER_MSG)):
            ch = channels[k % len(channels)]
            fd = arrow_to_field_data(pa.array(np.arange(start, start + ROWS_PER_MSG, dtype=np.int64)), schema)
            ts += 1 << 18
            msg = InsertMsg.build(fields_data=[fd], num_rows=ROWS_PER_MSG, timestamp=ts, collection_id=1,
                                  msg_id=k + 1, shard_name=f"{ch}_1v0")
            pending[ch].append(ProducerMessage(*codec.marshal(msg), timestamp=ts))
            pending[ch].append(ProducerMessage(*codec.marshal(TimeTickMsg.build(ts + 1)), timestamp=ts + 1))
            if len(pending[ch]) >= 200:
                producers[ch].send_batch(pending[ch])
                pending[ch] = []
        for ch, b in pending.items():
            if b:
                producers[ch].send_batch(b)
    finally:
        for p in producers.values():
            p.close()
        client.close()


# -- (1) planning ------------------------------------------------------------------------------------
def _plan(opts: dict) -> int:
    """Schema inference plus the batch reader's partitions, as the driver runs them; the partition count."""
    from msgstream_spark.spark.datasource import MsgStreamDataSource

    ds = MsgStreamDataSource(opts)
    return len(ds.reader(ds.schema()).partitions())


def _interleaved(cases: dict, reps: int, setup: dict | None = None, runs_out: dict | None = None) -> dict[str, float]:
    """Median wall seconds of each case, run in turn ``reps`` times (``setup[case]`` runs untimed before it);
    ``runs_out`` receives every case's seconds, run by run."""
    runs: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(reps):
        for k, fn in cases.items():
            if setup and k in setup:
                setup[k]()
            t0 = time.perf_counter()
            fn()
            runs[k].append(time.perf_counter() - t0)
    if runs_out is not None:
        runs_out.update(runs)
    return {k: median(v) for k, v in runs.items()}


def _forget_scan(cfg: Config, channels: list[str]) -> None:
    """Drop the stored schema-scan state of ``channels``: the next plan is a first one (source/scancache.py)."""
    from msgstream_spark.source import scancache

    client = build_client(cfg.mq_type, cfg)
    try:
        client.put_metadata(scancache.state_key(None, channels), "")
    finally:
        client.close()


def planning(name: str, cfg: Config, base_opts: dict, sizes: list[int], reps: int) -> dict:
    """Publish a log of each size (its own 2 channels) and time planning a read of each, interleaved:
    a first plan (no stored scan state) and a later one (the state of the previous plan kept)."""
    opts, chans = {}, {}
    for n in sizes:
        chans[n] = [f"plan{n}_0", f"plan{n}_1"]
        t0 = time.perf_counter()
        publish_pk(cfg, n, chans[n])
        print(f"  ({name}: published {n:,} rows in {time.perf_counter() - t0:.0f}s)", flush=True)
        opts[n] = {**base_opts, "channels": ",".join(chans[n])}
    for n in sizes:
        _plan(opts[n])  # warm up (imports, connections)
    cases = {f"{kind}{n}": (lambda n=n: _plan(opts[n])) for kind in ("first", "later") for n in sizes}
    setup = {f"first{n}": (lambda n=n: _forget_scan(cfg, chans[n])) for n in sizes}
    t = _interleaved(cases, reps, setup)
    small, big = sizes[0], sizes[-1]
    res = {f"{k}_rows_seconds": v for k, v in t.items()}
    res["ratio_first"] = t[f"first{big}"] / t[f"first{small}"]
    res["ratio"] = t[f"later{big}"] / t[f"later{small}"]
    lines = []
    for kind, label in (("first", "first plan"), ("later", "a later plan")):
        for n in sizes:
            base = t[f"{kind}{small}"]
            lines.append((f"{name}: {label}, {n:,} rows", 1000 * t[f"{kind}{n}"],
                          None if n == small else t[f"{kind}{n}"] / base))
    print(table(lines, unit="ms"))
    print(f"{name}: planning {big:,} rows takes {res['ratio']:.2f}x the time of {small:,} once the channels were "
          f"scanned (goal <= {PLAN_GOAL}); a first plan {res['ratio_first']:.2f}x", flush=True)
    for n in sizes[1:-1]:  # a log already longer than the first scan's budget: is the cost flat from there?
        res[f"ratio_first_vs_{n}"] = t[f"first{big}"] / t[f"first{n}"]
        print(f"{name}: a first plan of {big:,} rows takes {res[f'ratio_first_vs_{n}']:.2f}x that of {n:,}", flush=True)
    return res


# -- (2), (3) Spark reads ----------------------------------------------------------------------------
def _spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-read-shape")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _spark_read(spark, opts: dict) -> None:
    spark.read.format("msgstream").options(**opts).load().write.format("noop").mode("overwrite").save()


def spark_cases(d: str, rows: int, split_rows: int, reps: int, which: set[str], dim: int = DIM) -> dict:
    from bench.bench_spark_read import publish

    path = f"{d}/shape.db"
    cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": path}})
    base = {"mq.type": "local", "local.path": path}
    cases: dict[str, dict] = {}
    if "channels" in which:
        for n in (2, 16):
            chans = [f"ch{n}_{i}" for i in range(n)]
            publish(cfg, rows, dim, text=False, channels=chans)
            cases[f"{n}ch"] = {**base, "channels": ",".join(chans)}
    if "split" in which:
        publish(cfg, split_rows, dim, text=False, channels=["long_0"])
        cases["1task"] = {**base, "channels": "long_0"}
        cases["2tasks"] = {**base, "channels": "long_0", "minPartitions": "2"}
    if not cases:
        return {}
    spark = _spark()
    try:
        for o in cases.values():
            _spark_read(spark, o)  # warm up the workers
        runs: dict[str, list[float]] = {}
        t = _interleaved({k: (lambda o=o: _spark_read(spark, o)) for k, o in cases.items()}, reps, runs_out=runs)
        parts = {k: _plan(o) for k, o in cases.items()}
    finally:
        spark.stop()
    res: dict = {}
    lines = []
    if "2ch" in t:
        res["channels"] = {"rows": rows, "rows_s_2": rows / t["2ch"], "rows_s_16": rows / t["16ch"],
                           "ratio": t["2ch"] / t["16ch"], "partitions_2": parts["2ch"], "partitions_16": parts["16ch"],
                           "figure": figure(runs["2ch"], runs["16ch"], CHANNELS_GOAL)}
        lines += [(f"{rows:,} rows on 2 channels", rows / t["2ch"], None),
                  ("same rows on 16 channels", rows / t["16ch"], t["2ch"] / t["16ch"])]
    if "1task" in t:
        res["split"] = {"rows": split_rows, "rows_s_1": split_rows / t["1task"],
                        "rows_s_2": split_rows / t["2tasks"], "ratio": t["1task"] / t["2tasks"],
                        "partitions_1": parts["1task"], "partitions_2": parts["2tasks"],
                        "figure": figure(runs["1task"], runs["2tasks"], SPLIT_GOAL)}
        lines += [(f"one channel, {split_rows:,} rows, 1 task", split_rows / t["1task"], None),
                  (f"same, minPartitions=2 ({parts['2tasks']} tasks)", split_rows / t["2tasks"],
                   t["1task"] / t["2tasks"])]
    print(f"-- Spark batch reads, local[2], noop sink, median of {reps} interleaved runs")
    print(table(lines))
    if "channels" in res:
        print(f"16 channels vs 2, rate: {describe(res['channels']['figure'])}")
    if "split" in res:
        print(f"a split channel vs one task, rate: {describe(res['split']['figure'])}", flush=True)
    return res


def run(plan_rows: list[int] | None = None, rows: int = 1_000_000, split_rows: int = 2_000_000, kafka: bool = True,
        reps: int = REPS, skip: tuple[str, ...] = (), pulsar: bool = True, dim: int = DIM) -> dict:
    """``dim``: the vector dimension of the Spark cases' rows (#47's channel figure: 64)."""
    plan_rows = plan_rows or [100_000, 10_000_000]
    res: dict = {"goals": {"plan": PLAN_GOAL, "channels": CHANNELS_GOAL, "split": SPLIT_GOAL}}
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        if "plan" not in skip:
            cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": f"{d}/plan.db"}})
            res["plan_local"] = planning("embedded log", cfg, {"mq.type": "local", "local.path": f"{d}/plan.db"},
                                         plan_rows, reps)
            if kafka:
                from tests.fixtures.tansu import TansuBroker

                bootstrap = stack.enter_context(TansuBroker()).bootstrap
                kcfg = Config.from_dict({"mq": {"type": "kafka"}, "kafka": {"brokerList": bootstrap}})
                res["plan_kafka"] = planning("Kafka (tansu)", kcfg, {"mq.type": "kafka", "kafka.brokerList": bootstrap},
                                             plan_rows, reps)
                stack.close()  # the broker's memory back before Spark starts
            if pulsar:
                from tests.fixtures.pulsar_lite import PulsarLiteBroker

                broker = stack.enter_context(PulsarLiteBroker())
                pkeys = {"address": broker.url, "webport": broker.web_port}
                pcfg = Config.from_dict({"mq": {"type": "pulsar"}, "pulsar": pkeys})
                res["plan_pulsar"] = planning("Pulsar (pulsar-lite)", pcfg, {"mq.type": "pulsar",
                                              **{f"pulsar.{k}": str(v) for k, v in pkeys.items()}}, plan_rows, reps)
                stack.close()
        res.update(spark_cases(d, rows, split_rows, reps, {"channels", "split"} - set(skip), dim))
    res["dim"] = dim
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan-rows", default="100000,10000000")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--split-rows", type=int, default=2_000_000)
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--no-kafka", action="store_true")
    ap.add_argument("--no-pulsar", action="store_true")
    ap.add_argument("--skip", default="")
    ap.add_argument("--dim", type=int, default=DIM, help="vector dimension of the Spark cases' rows")
    a = ap.parse_args()
    run([int(x) for x in a.plan_rows.split(",")], a.rows, a.split_rows, not a.no_kafka, a.reps,
        tuple(x for x in a.skip.split(",") if x), not a.no_pulsar, a.dim)
