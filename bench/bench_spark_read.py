"""Spark read throughput of the msgstream source on local[2], against same-run baselines.

(a) a synthetic in-memory Python source yielding Arrow batches of the same schema: the
    ceiling for any Python data source (goal: >= 0.8 of it);
(b) the same read yielding tuples instead of Arrow batches (goal: >= 4x of it).
Also: streaming end to end into a parquet sink, and the peak RSS of Spark's Python workers
while reading a larger log of (int64 pk, 8-dim vector) rows, which must stay bounded.

    python -m bench.bench_spark_read [--rows 1000000] [--mem-rows 10000000] [--kafka]   (defaults: as shown)

Writes bench/results/spark_read.json and bench/results/spark_read.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

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
REPS = 5  # interleaved runs per measure; the figures are ratios of medians, with their spread
GOALS = {"local": 0.8, "kafka": 0.7}  # issue #47
CHANNELS = ["bench_0", "bench_1"]


def publish(cfg: Config, rows: int, dim: int, text: bool, channels: list[str] | None = None) -> None:
    """``rows`` rows in 1000-row insert messages round robin over ``channels`` (default: two), a tick
    after each message."""
    channels = channels or CHANNELS
    client = build_client(cfg.mq_type, cfg)
    rng = np.random.default_rng(0)
    schemas = [field_schema_from_arrow("pk", pa.int64(), field_id=100, is_primary_key=True),
               field_schema_from_arrow("vec", pa.list_(pa.float32()), field_id=101, dim=dim)]
    if text:
        schemas.append(field_schema_from_arrow("text", pa.string(), field_id=102))
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(ROWS_PER_MSG * dim, dtype=np.float32)), dim)
    txt = pa.array([f"row-{i}-" + "x" * (i % 40) for i in range(ROWS_PER_MSG)])
    producers = {ch: client.create_producer(ch) for ch in channels}
    batch: dict[str, list] = {ch: [] for ch in channels}
    ts = 455000614502400000
    for k, start in enumerate(range(0, rows, ROWS_PER_MSG)):
        ch = channels[k % len(channels)]
        pk = pa.array(np.arange(start, start + ROWS_PER_MSG, dtype=np.int64))
        cols = [pk, vec] + ([txt] if text else [])
        fds = [arrow_to_field_data(c, s) for c, s in zip(cols, schemas)]
        ts += 1 << 18
        msg = InsertMsg.build(fields_data=fds, num_rows=ROWS_PER_MSG, timestamp=ts, collection_id=1, msg_id=k + 1)
        batch[ch].append(ProducerMessage(*codec.marshal(msg), timestamp=ts))
        batch[ch].append(ProducerMessage(*codec.marshal(TimeTickMsg.build(ts + 1)), timestamp=ts + 1))
        if len(batch[ch]) >= 100:
            producers[ch].send_batch(batch[ch])
            batch[ch] = []
    for ch, b in batch.items():
        if b:
            producers[ch].send_batch(b)
    for p in producers.values():
        p.close()
    client.close()


def _sources(rows: int, dim: int):
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from msgstream_spark.spark.datasource import MsgStreamDataSource
    from msgstream_spark.spark.partitions import read_partition

    class SyntheticReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(2)]

        def read(self, partition):
            from pyspark.sql.pandas.types import to_arrow_schema
            from pyspark.sql.types import StructType

            from msgstream_spark.msg.seq import seq_array

            schema = to_arrow_schema(StructType.fromJson(json.loads(self.schema_json)), timezone="UTC")
            rng = np.random.default_rng(partition.value)
            vals = pa.array(rng.random(ROWS_PER_MSG * dim, dtype=np.float32))
            offsets = pa.array(np.arange(0, (ROWS_PER_MSG + 1) * dim, dim, dtype=np.int32))
            n = ROWS_PER_MSG
            fixed = {
                "op": pa.repeat(pa.scalar("insert"), n),
                "vec": pa.ListArray.from_arrays(offsets, vals),
                "text": pa.array([f"row-{i}-" + "x" * (i % 40) for i in range(n)]),
                "_channel": pa.repeat(pa.scalar("bench_0"), n), "_shard": pa.repeat(pa.scalar("bench_0_1v0"), n),
                "_collection": pa.repeat(pa.scalar(1, pa.int64()), n),
                "_partition": pa.repeat(pa.scalar(0, pa.int64()), n),
                "_msg_id": pa.repeat(pa.scalar(b"\x01" * 8), n),
                "_position": pa.repeat(pa.scalar("CgdiZW5jaF8wEggBAAAAAAAAACD/////3pSfqAY="), n),
            }
            batches = []
            for start in range(partition.value * n, rows, 2 * n):
                ts = np.full(n, 455000614502400000 + start, dtype=np.int64)
                cols = dict(fixed, pk=pa.array(np.arange(start, start + n, dtype=np.int64)), _ts=pa.array(ts),
                            _event_time=pa.array((ts >> 18) * 1000, pa.timestamp("us", tz="UTC")),
                            _seq=seq_array(ts, "insert"))
                batches.append(pa.RecordBatch.from_arrays([cols[f.name].cast(f.type) for f in schema],
                                                          schema=schema))
                if len(batches) * n >= 8192:  # same batch size as the msgstream reader yields
                    yield pa.concat_batches(batches)
                    batches = []
            if batches:
                yield pa.concat_batches(batches)

    class Synthetic(DataSource):
        @classmethod
        def name(cls):
            return "bench_synthetic"

        def schema(self):
            from pyspark.sql import types as T

            from msgstream_spark.spark.structs import rows_struct

            return rows_struct([T.StructField("pk", T.LongType()), T.StructField("vec", T.ArrayType(T.FloatType())),
                                T.StructField("text", T.StringType())])

        def reader(self, schema):
            r = SyntheticReader()
            r.schema_json = json.dumps(schema.jsonValue())
            return r


    class Tuples(MsgStreamDataSource):
        @classmethod
        def name(cls):
            return "bench_msgstream_tuples"

        def reader(self, schema):
            inner = MsgStreamDataSource.reader(self, schema)

            class R(DataSourceReader):
                def partitions(self):
                    return inner.partitions()

                def read(self, partition):
                    for batch in read_partition(partition):
                        cols = [c.to_pylist() for c in batch.columns]
                        yield from zip(*cols)
            return R()

    return Synthetic, Tuples


class RssSampler:
    """Peak RSS of Spark's Python worker processes, sampled in a thread; also the peak of their
    anonymous memory (RSS minus file-backed pages such as the embedded log's memory-mapped file,
    which the kernel can drop at any time) - the part that would grow if a reader held data."""

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self.peak = 0
        self.peak_anon = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = self.psutil.Process()
        while not self._stop.is_set():
            total = anon = 0
            for p in me.children(recursive=True):
                try:
                    cmd = " ".join(p.cmdline())
                    if "pyspark" in cmd and ("daemon" in cmd or "worker" in cmd):
                        mi = p.memory_info()
                        total = max(total, mi.rss)
                        anon = max(anon, mi.rss - getattr(mi, "shared", 0))
                except self.psutil.Error:
                    continue
            self.peak = max(self.peak, total)
            self.peak_anon = max(self.peak_anon, anon)
            self._stop.wait(0.1)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(5)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(rows: int = 1_000_000, mem_rows: int = 10_000_000, kafka: bool = False, reps: int = REPS,
        out_dir: str | Path = "bench/results", warmup: bool = True) -> dict:
    """``out_dir``: where spark_read.json and spark_read.png go (relative: to the working directory); ``warmup``
    False: no untimed first reads (the first timed ones then carry Spark's start of its Python workers)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    synthetic, tuples = _sources(rows, 128)
    spark.dataSource.register(synthetic)
    spark.dataSource.register(tuples)
    res: dict = {"rows": rows, "mem_rows": mem_rows}
    with tempfile.TemporaryDirectory() as d:
        cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": f"{d}/bench.db"}})
        publish(cfg, rows, 128, text=True)
        opts = {"mq.type": "local", "local.path": cfg.get("local.path"), "channels": ",".join(CHANNELS)}

        def ours(**extra):
            spark.read.format("msgstream").options(**opts, **extra).load().write.format("noop").mode("overwrite") \
                .save()

        def synth():
            spark.read.format("bench_synthetic").load().write.format("noop").mode("overwrite").save()

        def tup():
            spark.read.format("bench_msgstream_tuples").options(**opts).load().write.format("noop") \
                .mode("overwrite").save()

        for f in (ours, synth) if warmup else ():  # warm up workers
            f()
        runs: dict[str, list[float]] = {"syn": [], "ours": [], "coll": []}
        for _ in range(reps):  # interleaved A/B/C; medians
            runs["syn"].append(_timed(synth))
            runs["ours"].append(_timed(ours))
            runs["coll"].append(_timed(lambda: ours(collection="1")))
        t_syn, t_ours, t_coll = (median(runs[k]) for k in ("syn", "ours", "coll"))
        t_tup = _timed(tup)
        fig = figure(runs["syn"], runs["ours"], GOALS["local"])
        res.update(synthetic_rows_s=rows / t_syn, local_rows_s=rows / t_ours, tuples_rows_s=rows / t_tup,
                   local_vs_synthetic=t_syn / t_ours, local_vs_tuples=t_tup / t_ours,
                   local_collection_opt_rows_s=rows / t_coll, local_collection_opt_vs_synthetic=t_syn / t_coll,
                   local_figure=fig, local_collection_opt_figure=figure(runs["syn"], runs["coll"]))
        lines = [("(a) synthetic Arrow source, same schema (ceiling)", rows / t_syn, None),
                 ("msgstream batch read, embedded log", rows / t_ours, t_syn / t_ours),
                 ("  same, option collection=1 (schema scan stops early)", rows / t_coll, t_syn / t_coll),
                 ("(b) same read yielding tuples", rows / t_tup, t_syn / t_tup)]
        if kafka:
            res.update(_kafka_read(spark, rows, synth, reps, lines))
        # streaming end to end into parquet
        out = Path(d) / "out"

        def streaming():
            q = (spark.readStream.format("msgstream").options(**opts).option("subscription", "bench").load()
                 .writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(Path(d) / "chk")).trigger(availableNow=True).start())
            q.awaitTermination(1800)
        def synth_parquet():
            spark.read.format("bench_synthetic").load().write.mode("overwrite").parquet(str(Path(d) / "syn"))
        t_syn_pq = _timed(synth_parquet)
        t_stream = _timed(streaming)
        res.update(streaming_parquet_rows_s=rows / t_stream, synthetic_parquet_rows_s=rows / t_syn_pq,
                   streaming_vs_synthetic_parquet=t_syn_pq / t_stream)
        lines.append(("(c) synthetic Arrow source -> parquet", rows / t_syn_pq, None))
        lines.append(("streaming -> parquet (AvailableNow), end to end", rows / t_stream, t_syn_pq / t_stream))
        if mem_rows > 0:
            res.update(_memory(spark, d, mem_rows))
    print(table(lines))
    print(f"embedded log read vs the synthetic Arrow source: {describe(res['local_figure'])}; "
          f"{res['local_vs_tuples']:.1f}x the tuple read (goal >= 4x)")
    if "kafka_figure" in res:
        print(f"Kafka read vs the synthetic Arrow source: {describe(res['kafka_figure'])}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "spark_read.json").write_text(json.dumps(res, indent=2))
    _chart(lines, out_dir / "spark_read.png")
    return res


def _memory(spark, d: str, mem_rows: int) -> dict:
    """Peak worker RSS reading a tenth of a larger log of small rows and all of it: must not grow."""
    cfg2 = Config.from_dict({"mq": {"type": "local"}, "local": {"path": f"{d}/mem.db"}})
    publish(cfg2, mem_rows, 8, text=False)
    opts2 = {"mq.type": "local", "local.path": cfg2.get("local.path"), "channels": ",".join(CHANNELS)}
    peaks, anon = {}, {}
    for n_msgs in (mem_rows // 10, mem_rows):
        part = {"endingTimestamp": str(455000614502400000 + (n_msgs // ROWS_PER_MSG) * (1 << 18))}
        with RssSampler() as s:
            spark.read.format("msgstream").options(**opts2).options(**part).load() \
                .write.format("noop").mode("overwrite").save()
        peaks[n_msgs], anon[n_msgs] = s.peak, s.peak_anon
    res = {"worker_peak_rss_mb": {str(k): round(v / 2**20, 1) for k, v in peaks.items()},
           "worker_peak_anon_mb": {str(k): round(v / 2**20, 1) for k, v in anon.items()}}
    print("peak Python worker RSS by rows read:", res["worker_peak_rss_mb"], "MB; of it anonymous (not file-backed):",
          res["worker_peak_anon_mb"], "MB")
    return res


def _kafka_read(spark, rows, synth, reps, lines) -> dict:
    """The same read from a tansu broker started for the benchmark (if the Kafka backend exists), interleaved
    with the synthetic source's read (``synth``) as its baseline."""
    try:
        from tests.fixtures.tansu import TansuBroker  # type: ignore[import-not-found]
    except ImportError:
        print("(Kafka read skipped: no tansu helper)")
        return {}
    with TansuBroker() as broker:
        cfg = Config.from_dict({"mq": {"type": "kafka"}, "kafka": {"brokerList": broker.bootstrap}})
        publish(cfg, rows, 128, text=True)
        opts = {"mq.type": "kafka", "kafka.brokerList": broker.bootstrap, "channels": ",".join(CHANNELS)}

        def read(**extra):
            spark.read.format("msgstream").options(**opts, **extra).load().write.format("noop").mode("overwrite") \
                .save()
        read()
        syn, ts, tc = [], [], []
        for _ in range(reps):
            syn.append(_timed(synth))
            ts.append(_timed(read))
            tc.append(_timed(lambda: read(collection="1")))
        t_syn, t, t_coll = median(syn), median(ts), median(tc)
        t_bare = _timed(lambda: _bare_kafka_fetch(broker.bootstrap))
    lines.append(("msgstream batch read, Kafka (tansu)", rows / t, t_syn / t))
    lines.append(("  same, option collection=1 (schema scan stops early)", rows / t_coll, t_syn / t_coll))
    lines.append(("  bound: bare confluent-kafka fetch of that log, no decode", rows / t_bare, t_syn / t_bare))
    return {"kafka_rows_s": rows / t, "kafka_vs_synthetic": t_syn / t, "kafka_figure": figure(syn, ts, GOALS["kafka"]),
            "kafka_collection_opt_figure": figure(syn, tc), "kafka_bare_fetch_rows_s": rows / t_bare,
            "kafka_bare_fetch_vs_synthetic": t_syn / t_bare, "kafka_collection_opt_rows_s": rows / t_coll,
            "kafka_collection_opt_vs_synthetic": t_syn / t_coll}


def _bare_kafka_fetch(bootstrap: str) -> None:
    """Every record of the benchmark's channels fetched with a bare confluent-kafka loop, one thread per
    channel (as local[2] reads one channel per task), same fetch size as the backend: the broker's ceiling."""
    from confluent_kafka import Consumer, TopicPartition

    def one(ch: str) -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bare-{ch}-{time.time()}",
                      "enable.auto.commit": False, "max.partition.fetch.bytes": 16 * 1024 * 1024})
        high = c.get_watermark_offsets(TopicPartition(ch, 0), timeout=30)[1]
        c.assign([TopicPartition(ch, 0, 0)])
        last = -1
        while last < high - 1:
            first = c.poll(10.0)
            if first is None:
                break
            for m in [first, *c.consume(num_messages=127, timeout=0)]:
                m.value()
                last = m.offset()
        c.close()

    threads = [threading.Thread(target=one, args=(ch,)) for ch in CHANNELS]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)


def _chart(lines, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, _, _ in lines]
    rates = [r for _, r, _ in lines]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) + 1.2))
    ax.barh(names[::-1], rates[::-1], color="#4472c4")
    ax.set_xlabel("rows/s (local[2])")
    ax.set_title("msgstream Spark read throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--mem-rows", type=int, default=10_000_000)
    ap.add_argument("--kafka", action="store_true")
    a = ap.parse_args()
    run(a.rows, a.mem_rows, a.kafka)
