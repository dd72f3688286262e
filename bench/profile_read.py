"""Where a Spark read task's time goes, without Spark: ``read_partition`` run in-process.

    python -m bench.profile_read [--rows 200000] [--kafka] [--profile]

Publishes the bench_spark_read log (1000-row inserts, int64 pk + 128-d vector + text) to the
embedded log (and a tansu broker with --kafka), then times each channel's ``read_partition`` -
the exact code a Python worker runs - next to a bare loop over the same channel (the backend's
``receive_raw`` plus ``codec.unmarshal`` and ``to_arrow``), and optionally prints a cProfile.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import tempfile
import time

from bench.bench_spark_read import CHANNELS, publish
from msgstream_spark.config import Config
from msgstream_spark.mq.registry import build_client
from msgstream_spark.msg import codec


def _partitions(opts: dict):
    from msgstream_spark.spark.datasource import MsgStreamDataSource

    ds = MsgStreamDataSource(opts)
    return ds.reader(ds.schema() if not isinstance(ds.schema(), str) else None).partitions()


def _read_all(parts) -> int:
    from msgstream_spark.spark.partitions import read_partition

    n = 0
    for p in parts:
        for b in read_partition(p):
            n += b.num_rows
    return n


def _bare(cfg: Config) -> int:
    """The floor: fetch every message in bulk, decode it, convert it to Arrow; nothing else."""
    client = build_client(cfg.mq_type, cfg)
    n = 0
    try:
        for ch in CHANNELS:
            c = client.reader(ch)
            c.seek(client.earliest_message_id(), inclusive=True)
            last = client.latest_message_id(ch)
            done = last is None
            while not done:
                batch = c.receive_raw(128, 5.0)
                done = not len(batch) or batch.id(len(batch) - 1) >= last
                for i, payload in enumerate(batch.payloads):
                    msg = codec.unmarshal(payload, batch.properties(i))
                    if msg.msg_type == 400:
                        n += msg.to_arrow().num_rows
            c.unsubscribe()
    finally:
        client.close()
    return n


def measure(name: str, cfg: Config, opts: dict, profile: bool) -> dict:
    parts = _partitions(opts)
    _read_all(parts)  # warm up
    t0 = time.perf_counter()
    rows = _read_all(parts)
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    bare_rows = _bare(cfg)
    t_bare = time.perf_counter() - t0
    print(f"{name}: read_partition {rows / t_read:,.0f} rows/s; bare fetch+decode+to_arrow "
          f"{bare_rows / t_bare:,.0f} rows/s; read_partition takes {t_read / t_bare:.2f}x the bare loop's time")
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        _read_all(parts)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    return {"read_partition_rows_s": rows / t_read, "bare_rows_s": bare_rows / t_bare,
            "read_partition_time_vs_bare": t_read / t_bare}


def _consumer_overrides() -> dict:
    """kafka.consumer.* settings to try, from BENCH_KAFKA_CONSUMER="key=value,key=value"."""
    import os

    pairs = [kv.split("=", 1) for kv in os.environ.get("BENCH_KAFKA_CONSUMER", "").split(",") if "=" in kv]
    return {"consumer": dict(pairs)} if pairs else {}


def _flat(d: dict) -> list[tuple[str, str]]:
    return [(f"consumer.{k}", v) for k, v in d.get("consumer", {}).items()]


def run(rows: int = 200_000, kafka: bool = False, profile: bool = False) -> dict:
    res = {}
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": f"{d}/p.db"}})
        publish(cfg, rows, 128, text=True)
        res["local"] = measure("embedded log", cfg, {"mq.type": "local", "local.path": f"{d}/p.db",
                                                     "channels": ",".join(CHANNELS)}, profile)
        if kafka:
            from tests.fixtures.tansu import TansuBroker

            bootstrap = stack.enter_context(TansuBroker()).bootstrap
            kafka = {"brokerList": bootstrap, **_consumer_overrides()}
            kcfg = Config.from_dict({"mq": {"type": "kafka"}, "kafka": kafka})
            publish(kcfg, rows, 128, text=True)
            opts = {"mq.type": "kafka", "kafka.brokerList": bootstrap, "channels": ",".join(CHANNELS),
                    **{f"kafka.{k}": v for k, v in _flat(_consumer_overrides())}}
            res["kafka"] = measure("kafka (tansu)", kcfg, opts, profile)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--kafka", action="store_true")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    run(a.rows, a.kafka, a.profile)
