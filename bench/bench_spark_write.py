"""Spark sink throughput next to the backend's bare batched produce of the same messages.

``python -m bench.bench_spark_write [rows] [dim]``: a synthetic collection (pk, category,
score, vec) is (a) encoded once by the sink's encoder and produced with
``Producer.send_batch`` straight into a fresh channel set (the baseline), and (b) written with
``df.write.format("msgstream")`` from a cached DataFrame into another channel set. Prints
rows/s for both and the ratio of the medians over ``reps`` interleaved runs, with
its spread (goals: >= 0.7 embedded, >= 0.85 Kafka). Runs on the embedded log, and on Kafka when
``MSGSTREAM_TEST_KAFKA`` names a broker.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

from bench._util import describe, figure, median

GOALS = {"local": 0.7, "kafka": 0.85}  # issue #47


def _bare_produce(config, channels: list[str], rows: int, dim: int) -> float:
    """Seconds to produce the pre-encoded messages with send_batch (encoding not timed)."""
    from msgstream_spark.cli.data import synthetic_batches, synthetic_schema
    from msgstream_spark.mq.base import ProducerMessage
    from msgstream_spark.mq.registry import build_client
    from msgstream_spark.sink.options import parse_sink_options
    from msgstream_spark.sink.plan import plan_write
    from msgstream_spark.sink.task import TaskWriter

    opts = parse_sink_options({"config": config, "channels": ",".join(channels)})
    tw = TaskWriter(opts, plan_write(synthetic_schema(dim), opts))
    per_channel: dict[str, list] = {ch: [] for ch in channels}
    for b in synthetic_batches(rows, dim, 10_000):
        for m in tw.encoder.encode(b):
            per_channel[channels[m.shard]].append(ProducerMessage(m.payload, {"msg_type": "Insert"}, m.timestamp))
    from msgstream_spark.config import Config

    cfg = Config.load(config)
    with build_client(cfg.mq_type, cfg) as client:
        producers = {ch: client.create_producer(ch) for ch in channels}
        t0 = time.perf_counter()
        for ch, msgs in per_channel.items():
            producers[ch].send_batch(msgs)
        for p in producers.values():
            p.close()
        return time.perf_counter() - t0


def _spark_write(spark, config: str, channels: list[str], df) -> float:
    t0 = time.perf_counter()
    df.write.format("msgstream").option("config", config).option("channels", ",".join(channels)).mode(
        "append").save()
    return time.perf_counter() - t0


def _spark_handoff(df) -> float:
    """Seconds Spark needs just to hand the rows to Python Arrow workers (the sink's floor)."""
    import pyarrow as pa

    def count(batches):
        n = 0
        for b in batches:
            n += b.num_rows
        yield pa.RecordBatch.from_pydict({"n": [n]})

    t0 = time.perf_counter()
    df.mapInArrow(count, "n long").collect()
    return time.perf_counter() - t0


def _backends(tmp: Path, stack: contextlib.ExitStack, with_kafka: bool = True) -> dict[str, str]:
    """Config files: the embedded log, and Kafka (MSGSTREAM_TEST_KAFKA, else a tansu broker) unless not
    ``with_kafka``."""
    out = {}
    local = tmp / "local.yaml"
    local.write_text(yaml.safe_dump({"mq.type": "local", "local.path": str(tmp / "bench.db")}))
    out["local"] = str(local)
    if not with_kafka:
        return out
    kafka = os.environ.get("MSGSTREAM_TEST_KAFKA")
    if not kafka:
        try:
            from tests.fixtures.tansu import TansuBroker

            kafka = stack.enter_context(TansuBroker()).bootstrap
        except Exception as exc:  # noqa: BLE001 - Kafka is optional for this benchmark
            print(f"kafka: skipped ({type(exc).__name__}: {exc})", flush=True)
    if kafka:
        p = tmp / "kafka.yaml"
        p.write_text(yaml.safe_dump({"mq.type": "kafka", "kafka.brokerList": kafka}))
        out["kafka"] = str(p)
    return out


def run(rows: int = 100_000, dim: int = 128, reps: int = 5, kafka: bool = True) -> dict:
    """``kafka`` False: the embedded log only."""
    from msgstream_spark.jobs._common import spark_session
    from msgstream_spark.jobs.publish import synthetic_df

    spark = spark_session("bench-spark-write", os.environ.get("BENCH_SPARK_MASTER", "local[2]"))
    df = synthetic_df(spark, rows, dim, partitions=2).cache()
    df.count()
    results: dict = {"rows": rows, "dim": dim}
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        for name, cfg in _backends(Path(d), stack, kafka).items():
            _spark_write(spark, cfg, [f"bench-warm-{uuid.uuid4().hex[:6]}_{i}" for i in range(2)], df.limit(1000))
            bare, sp, hand = [], [], []
            for _ in range(reps):  # interleaved A/B/C; ratios of medians, each with its spread over the pairs
                tag = uuid.uuid4().hex[:6]
                bare.append(_bare_produce(cfg, [f"bench-bare-{tag}_0", f"bench-bare-{tag}_1"], rows, dim))
                sp.append(_spark_write(spark, cfg, [f"bench-spark-{tag}_0", f"bench-spark-{tag}_1"], df))
                hand.append(_spark_handoff(df))
            fig, hfig = figure(bare, sp, GOALS[name]), figure(bare, hand)
            wfig = figure(hand, sp)  # the write against its floor: what of the gap is this project's
            r = {"bare_produce_rows_per_s": round(rows / median(bare)),
                 "spark_write_rows_per_s": round(rows / median(sp)),
                 "ratio": fig["ratio"], "figure": fig, "reps": reps,
                 "spark_handoff_only_rows_per_s": round(rows / median(hand)),
                 "handoff_only_ratio": hfig["ratio"], "handoff_figure": hfig, "write_vs_handoff_figure": wfig}
            results[name] = r
            print(f"{name:6s} bare send_batch {r['bare_produce_rows_per_s']:>10,} rows/s | spark write "
                  f"{r['spark_write_rows_per_s']:>10,} rows/s | ratio {describe(fig)} | Spark->Python "
                  f"handoff alone {r['spark_handoff_only_rows_per_s']:,} rows/s (ratio {describe(hfig)}); the write vs "
                  f"the hand-over alone: {describe(wfig)}", flush=True)
    df.unpersist()
    return results


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    run(*args)
