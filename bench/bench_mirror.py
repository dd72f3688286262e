"""Mirror throughput next to appending the same events to Parquet, and into a table on an S3 server next to the same
into a local path, measured in the same run.

``python -m bench.bench_mirror [--rows N] [--snapshot-rows N] [--skip-snapshot] [--stores local,s3] [--reps K]``:
- mirror: a synthetic collection (pk, category, score, 8-d vec) of ``rows`` inserts and 10% deletes
  on the embedded log (2 channels); the baseline is ``msgstream ingest`` appending every event to Parquet,
  against ``msgstream mirror run --snapshot never`` into Delta and into Iceberg (events/s; ratio = mirror /
  append), the table in a local directory.
- mirror on S3 (``--stores`` with ``s3``): the same job into ``s3://<bucket>/...`` on moto's S3 server (started
  here as the tests start it, bench/_s3.py; ``--storage-option`` settings, Spark's checkpoint on the local
  disk; Iceberg with its SQL catalog on a local SQLite file), against the same job into a local path; ratio =
  S3 events/s / local events/s (goal >= 0.7). ``reps`` pairs per format, the order alternating (local then S3,
  S3 then local); the ratio is of the medians. The S3 runs also report the job's ``step_bytes`` and what the
  server served.
- snapshot: with a real Milvus 2.3.5 (the test suite's server, started here; skipped when it
  cannot start), ``snapshot_rows`` rows are inserted through pymilvus and loaded; the baseline is
  ``msgstream ingest`` appending the collection's log (its inserts) to Parquet, against
  ``msgstream mirror run --snapshot initial`` (Strong queries by pk ranges in Spark tasks -> Parquet files ->
  the table's first version) in rows/s.
Each pair runs A/B in one Spark session; Spark's fixed costs per query are inside every figure.

Time, full size (1M rows, 200k snapshot rows, reps 2) on the shared 2-core machine: publishing the log ~1 min,
the append ~25 s, each mirror run 30-60 s locally and 40-90 s on S3 (2 formats x 2 stores x 2 reps), the
snapshot part ~3 min: about 15 minutes. Measured 2026-11-27 (load 15-17): ``--skip-snapshot`` 13 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from bench._util import median


def _ingest(spark, cfg: str, channels: str, out: Path, collection: str | None = None) -> float:
    from msgstream_spark.jobs import ingest

    args = ingest.build_parser().parse_args(["--config", cfg, "--channels", channels, "--table", str(out),
                                             "--subscription", f"bench-{out.name}", "--progress-interval", "60"])
    if collection:
        args.option = [f"collection={collection}"]
    t0 = time.perf_counter()
    ingest.run(args, spark)
    return time.perf_counter() - t0


def _mirror(spark, cfg: str, channels: str, table: Path | str, fmt: str, collection: str,
            *extra: str) -> tuple[float, dict]:
    from msgstream_spark.jobs import mirror

    args = mirror.build_parser().parse_args(["--config", cfg, "--channels", channels, "--collection", collection,
                                             "--table", str(table), "--table-format", fmt,
                                             "--progress-interval", "60", *extra])
    t0 = time.perf_counter()
    res = mirror.run(args, spark)
    return time.perf_counter() - t0, res


def _publish_log(spark, work: Path, rows: int) -> tuple[str, str]:
    from msgstream_spark.jobs import publish

    cfg = work / "local.yaml"
    cfg.write_text(yaml.safe_dump({"mq.type": "local", "local.path": str(work / "log.db")}))
    channels = "bench-mirror_0,bench-mirror_1"
    publish.run(publish.build_parser().parse_args([
        "--config", str(cfg), "--channels", channels, "--synthetic", str(rows), "--dim", "8",
        "--delete-fraction", "0.1", "--collection", "bench",
        # one write task per 50k rows: each task ends with a time tick, and a micro-batch ends only at a tick
        # (one task = one tick for 1M rows = a 770k-row first batch, past the driver's default 1 GiB heap)
        "--num-tasks", str(max(2, rows // 50_000))]), spark)
    return str(cfg), channels


def mirror_part(spark, work: Path, rows: int, cfg: str | None = None, channels: str | None = None,
                formats: tuple[str, ...] = ("delta", "iceberg")) -> dict:
    if cfg is None or channels is None:
        cfg, channels = _publish_log(spark, work, rows)
    events = rows + rows // 10
    out: dict = {"rows": rows, "events": events}
    base = _ingest(spark, cfg, channels, work / "append")
    out["append_events_per_s"] = round(events / base, 1)
    for fmt in formats:
        secs, _ = _mirror(spark, cfg, channels, work / f"mirror-{fmt}", fmt, "bench", "--snapshot", "never")
        out[f"mirror_{fmt}_events_per_s"] = round(events / secs, 1)
        out[f"mirror_{fmt}_ratio"] = round(base / secs, 3)
    return out


def _one_store(spark, work: Path, cfg: str, channels: str, fmt: str, name: str, s3=None, bucket: str = "") -> dict:
    """One mirror run of the whole log into a new table (a local path, or ``s3://bucket/name`` on ``s3``)."""
    from bench._s3 import served

    extra = ["--snapshot", "never", "--checkpoint", str(work / f"ckpt-{name}"), "--subscription", f"bench-{name}"]
    table: str | Path = work / name
    if s3 is not None:
        table = f"s3://{bucket}/{name}"
        for k, v in s3.options().items():
            extra += ["--storage-option", f"{k}={v}"]
        if fmt == "iceberg":
            extra += ["--catalog-uri", f"sqlite:///{work / name}_catalog.sqlite"]
    before = s3.counts() if s3 is not None else None
    secs, res = _mirror(spark, cfg, channels, table, fmt, "bench", *extra)
    out = {"seconds": round(secs, 2), "batches": res.get("merged_batches"), "step_bytes": res.get("step_bytes"),
           "step_seconds": res.get("step_seconds")}
    if s3 is not None:
        out["served"] = served(before, s3.counts())
        out["moto_rss_mb"] = round(s3.rss_mb())
    return out


def store_part(spark, work: Path, rows: int, cfg: str, channels: str, reps: int,
               formats: tuple[str, ...] = ("delta", "iceberg")) -> dict:
    """The job into a table on the S3 server vs into a local path, ``reps`` pairs per format, order alternating."""
    from bench._s3 import BenchS3, load_average

    events = rows + rows // 10
    out: dict = {"rows": rows, "events": events, "reps": reps, "load_average_start": load_average()}
    with BenchS3(work) as s3:
        bucket = s3.new_bucket("mirror")
        for fmt in formats:
            runs: dict[str, list[dict]] = {"local": [], "s3": []}
            try:
                for i in range(reps):
                    for store in (("local", "s3") if i % 2 == 0 else ("s3", "local")):
                        srv = s3 if store == "s3" else None
                        r = _one_store(spark, work, cfg, channels, fmt, f"{store}-{fmt}-{i}", srv, bucket)
                        runs[store].append(r)
                        print(f"  {fmt:8} {store:5} run {i}: {r['seconds']:.1f} s "
                              f"({events / r['seconds']:,.0f} events/s, {r['batches']} batches)", flush=True)
            except Exception as exc:  # noqa: BLE001 - e.g. a format the store does not take yet: say so, go on
                out[fmt] = {"error": f"not measured: {type(exc).__name__}: {exc}"[:500], "runs": runs}
                print(f"  {fmt:8} s3: {out[fmt]['error']}", flush=True)
                continue
            loc = median([r["seconds"] for r in runs["local"]])
            rem = median([r["seconds"] for r in runs["s3"]])
            out[fmt] = {"local_events_per_s": round(events / loc, 1), "s3_events_per_s": round(events / rem, 1),
                        "ratio": round(loc / rem, 3), "runs": runs}
        out["load_average_end"] = load_average()
    return out
def _milvus_stack():
    from tests.fixtures.kafka_shim import KafkaShim
    from tests.fixtures.tansu import TansuBroker, free_port
    from tests.milvus_real.server import MilvusServer

    port = free_port()
    broker = TansuBroker(advertised_port=port)
    shim = KafkaShim(("127.0.0.1", broker.port), port).start()
    broker.start()
    try:
        server = MilvusServer(f"127.0.0.1:{port}").start()
    except Exception:
        shim.stop()
        broker.kill()
        raise
    return broker, shim, server, f"127.0.0.1:{port}"


def snapshot_part(spark, work: Path, rows: int) -> dict:
    from pymilvus import connections

    from tests.milvus_real.workload import SHARDS

    broker, shim, server, kafka = _milvus_stack()
    try:
        from pymilvus import Collection, CollectionSchema, DataType, FieldSchema

        connections.connect("bench", uri=server.uri, timeout=60)
        schema = CollectionSchema([FieldSchema("pk", DataType.INT64, is_primary=True),
                                   FieldSchema("category", DataType.VARCHAR, max_length=32),
                                   FieldSchema("score", DataType.FLOAT),
                                   FieldSchema("vec", DataType.FLOAT_VECTOR, dim=8)])
        col = Collection("bench_snap", schema, using="bench", shards_num=SHARDS)
        from msgstream_spark.cli.data import synthetic_batches

        for b in synthetic_batches(rows, 8, 10_000):
            col.insert([b.column(i).to_pylist() for i in range(4)])
        col.flush()
        col.create_index("vec", {"index_type": "FLAT", "metric_type": "L2", "params": {}})
        col.load(timeout=300)
        connections.disconnect("bench")
        cfg = work / "milvus.yaml"
        cfg.write_text(yaml.safe_dump({"mq.type": "kafka", "kafka.brokerList": kafka,
                                       "milvus.address": server.uri.removeprefix("http://")}))
        channels = "by-dev-rootcoord-dml_0,by-dev-rootcoord-dml_1"
        base = _ingest(spark, str(cfg), channels, work / "snap-append", "bench_snap")
        secs, res = _mirror(spark, str(cfg), channels, work / "snap-delta", "delta", "bench_snap")
        return {"rows": rows, "append_rows_per_s": round(rows / base, 1),
                "snapshot_rows_per_s": round(rows / secs, 1), "snapshot_ratio": round(base / secs, 3),
                "snapshot_ranges": res["snapshot"].get("ranges")}
    finally:
        server.stop()
        server.cleanup()
        shim.stop()
        broker.kill()


def _snapshot_or_reason(spark, work: Path, snapshot_rows: int) -> dict:
    if snapshot_rows <= 0:
        return {"error": "not measured: --skip-snapshot"}
    try:
        return snapshot_part(spark, work, snapshot_rows)
    except Exception as exc:  # noqa: BLE001 - the real Milvus may be missing; report it, keep the rest
        return {"error": f"not measured: {type(exc).__name__}: {exc}"}


def run(rows: int = 1_000_000, snapshot_rows: int = 200_000, stores: tuple[str, ...] = ("local", "s3"),
        reps: int = 2, mirror_formats: tuple[str, ...] = ("delta", "iceberg")) -> dict:
    """``mirror_formats``: the formats of the mirror-vs-append part (the S3 part measures both)."""
    from msgstream_spark.jobs._common import spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-mirror-"))
    os.environ["MSGSTREAM_KEY_CACHE_DIR"] = str(work / "key-cache")  # before Spark starts its Python workers
    spark = spark_session("bench-mirror", "local[2]")
    try:
        cfg, channels = _publish_log(spark, work, rows)
        result = {"mirror": mirror_part(spark, work, rows, cfg, channels, mirror_formats)}
        if "s3" in stores:
            result["store"] = store_part(spark, work, rows, cfg, channels, reps)
        result["snapshot"] = _snapshot_or_reason(spark, work, snapshot_rows)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    _print(result)
    return result


def _print(r: dict) -> None:
    m = r["mirror"]
    print(f"mirror of {m['rows']} rows + 10% deletes ({m['events']} events), events/s (ratio to append):")
    print(f"  append to Parquet (ingest job)   {m['append_events_per_s']:>12,.0f}   1.00")
    for fmt in ("delta", "iceberg"):
        if f"mirror_{fmt}_ratio" in m:
            print(f"  mirror into {fmt:8s}              {m[f'mirror_{fmt}_events_per_s']:>12,.0f}   "
                  f"{m[f'mirror_{fmt}_ratio']:.2f}")
    st = r.get("store")
    if st:
        print(f"mirror into a table on the S3 server (moto) vs into a local path, events/s, median of {st['reps']} "
              f"(load average {st['load_average_start']} -> {st['load_average_end']}):")
        for fmt in ("delta", "iceberg"):
            f = st.get(fmt) or {}
            if "error" in f:
                print(f"  {fmt:8} {f['error']}")
            elif f:
                print(f"  {fmt:8} local {f['local_events_per_s']:>10,.0f}   s3 {f['s3_events_per_s']:>10,.0f}   "
                      f"ratio {f['ratio']:.2f} (goal >= 0.7)")
    s = r["snapshot"]
    if "error" in s:
        print(f"snapshot: {s['error']}")
    else:
        print(f"snapshot of {s['rows']} rows from a real Milvus 2.3.5, rows/s (ratio to append):")
        print(f"  append the log's inserts to Parquet {s['append_rows_per_s']:>10,.0f}   1.00")
        print(f"  snapshot into Delta ({s['snapshot_ranges']} ranges)  {s['snapshot_rows_per_s']:>10,.0f}   "
              f"{s['snapshot_ratio']:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="inserts in the mirrored log (10%% deletes follow)")
    ap.add_argument("--snapshot-rows", type=int, default=200_000, help="rows of the real-Milvus snapshot part")
    ap.add_argument("--skip-snapshot", action="store_true", help="measure the mirror part only")
    ap.add_argument("--stores", default="local,s3", help="local: the local-path figures only; local,s3: also on S3")
    ap.add_argument("--reps", type=int, default=2, help="local/S3 pairs per format")
    a = ap.parse_args(argv)
    run(rows=a.rows, snapshot_rows=0 if a.skip_snapshot else a.snapshot_rows, stores=tuple(a.stores.split(",")),
        reps=a.reps)


if __name__ == "__main__":
    main()
