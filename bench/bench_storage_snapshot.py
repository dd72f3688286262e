"""The mirror's snapshot from storage next to the query route and to a bare read of the same Parquet payloads.

``python -m bench.bench_storage_snapshot [--sizes 200000 2000000] [--dim 128]``: a real Milvus 2.3.5 (the test
suite's server, started here) gets a collection (int64 pk, a ``dim``-d float vector, 2 shards) filled
through pymilvus to each size in turn, flushed and loaded. At each size, in one Spark session (local[2]):
- query route: ``plan_ranges`` + queries by pk ranges at S in Spark tasks -> Parquet files (the job's
  ``--snapshot-source query`` read and write, without the table commit);
- storage route: flush, etcd plan (delete and stats logs), and one Spark job whose tasks read the binlogs and
  write one Parquet file each (``--snapshot-source storage``, without the table commit); beside it the same
  tasks' work run one after another in this process (no Spark), split into reading the binlogs, the Parquet
  write and its fsync, and the machine's load average;
- bare read: every insert binlog payload of the plan read with ``pyarrow.parquet`` alone in this process
  (the files' bytes already in memory): the storage's limit.
Rows/s each; ratios storage / query and storage / bare. Which part grows with the collection: the parts'
seconds at each size. Full size (200k and 2M rows of 128-d): 6 minutes on 2 loaded cores, of which ~3
filling the collection through pymilvus and ~1.5 the query route's 2M rows.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def _fill(col, start: int, stop: int, dim: int) -> None:
    rng = np.random.default_rng(start)
    for lo in range(start, stop, 5000):
        hi = min(stop, lo + 5000)
        col.insert([list(range(lo, hi)), rng.random((hi - lo, dim), dtype=np.float32)])


def _config(server) -> object:
    from msgstream_spark.config.loader import Config

    return Config.load(None, overrides={"milvus.address": server.uri.removeprefix("http://"),
                                        "etcd.endpoints": server.etcd, "etcd.rootPath": "by-dev",
                                        "common.storageType": "local", "localStorage.path": str(server.dir / "data")})


def _schema(dim: int):
    import pyarrow as pa

    from msgstream_spark.mirror.table import table_schema

    return table_schema(pa.schema([pa.field("pk", pa.int64(), False), pa.field("vec", pa.list_(pa.float32()))]),
                        "pk")


def _query_route(spark, server, name: str, work: Path, dim: int, rows: int) -> float:
    from dataclasses import replace

    from msgstream_spark.config.loader import Config
    from msgstream_spark.mirror.snapshot.handover import MilvusTarget, describe, query_target
    from msgstream_spark.mirror.snapshot.query.reader import RangeReader, plan_ranges, row_bytes
    from msgstream_spark.mirror.snapshot.query.rpc import Querier
    from msgstream_spark.spark.snapshot import write_snapshot

    address = server.uri.removeprefix("http://")
    t0 = time.perf_counter()
    info = describe(MilvusTarget(address, name), count=False)
    cfg = Config.from_dict({"mq": {"type": "milvus"}, "milvus": {
        "address": address, "requestTimeout": 120, "metadataPath": str(work / "meta.json")}})
    s = (int(time.time() * 1000) - 1000) << 18  # a Milvus time a second ago, as the job's S
    qt = replace(query_target(cfg, info, name), floor_ts=s)
    q = Querier(qt)
    try:
        ranges = plan_ranges(q, info.pk, info.pk_is_string, spark.sparkContext.defaultParallelism)
        width = row_bytes(q, info.pk, info.pk_is_string, ranges[0]) if ranges else 0
    finally:
        q.close()
    reader = RangeReader(qt, info.pk, info.pk_is_string, _schema(dim), s, row_bytes=width or 1024)
    files = write_snapshot(spark, reader, ranges, str(work / "q"), rows, 60)
    secs = time.perf_counter() - t0
    assert files.rows == rows, (files.rows, rows)
    return secs


def _storage_route(spark, server, name: str, work: Path, dim: int):
    from pymilvus import MilvusClient

    from msgstream_spark.mirror.snapshot.storage.snapshot import prepare
    from msgstream_spark.spark.storage_snapshot import write_storage_snapshot

    t0 = time.perf_counter()
    mc = MilvusClient(uri=server.uri)
    try:
        prep = prepare(_config(server), mc, name, _schema(dim), "pk")
    finally:
        mc.close()
    t1 = time.perf_counter()
    packing = prep.packing(spark.sparkContext.defaultParallelism)
    files = write_storage_snapshot(spark, prep.reader, packing, str(work / "s"), prep.plan.rows, 60)
    t2 = time.perf_counter()
    parts = {"flush_plan_s": round(t1 - t0, 2), "spark_s": round(t2 - t1, 2), "spark_tasks": len(packing.tasks),
             "key_pass": bool(packing.key_pass), **_in_process(prep, packing, work)}
    return t2 - t0, files.rows, prep, parts


def _in_process(prep, packing, work: Path) -> dict:
    """The Spark tasks' own work (read, keep, convert, write each task's Parquet file) run one after another in
    this process: the part of the Spark time that is not Spark's fixed cost, split into its parts (by the
    profiler: reading the binlogs, pyarrow's Parquet write, the fsync before the rename)."""
    import cProfile
    import pstats

    from msgstream_spark.mirror.snapshot.storage.reader import write_units

    out = work / "s-local"
    out.mkdir(parents=True)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i, units in enumerate(packing.tasks):
        write_units(prep.reader, units, str(out / f"{i}.parquet"))
    prof.disable()
    total = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats
    spent = {"write": 0.0, "fsync": 0.0, "read": 0.0}
    for (file, _, func), (_, _, tt, ct, _) in stats.items():
        if func == "write_table" and file.endswith("parquet/core.py"):
            spent["write"] += tt
        elif func == "<built-in method posix.fsync>":
            spent["fsync"] += tt
        elif func == "_column" and file.endswith("storage/reader.py"):
            spent["read"] += ct
    return {"in_process_s": round(total, 2), **{f"{k}_s": round(v, 2) for k, v in spent.items()}}


def _bare(server, prep) -> float:
    """Every payload of the plan's insert binlogs through pyarrow.parquet alone (bytes read beforehand)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from msgstream_spark.mirror.snapshot.storage.binlog import EVENT_TS, HEADER

    blobs = []
    for task in prep.plan.tasks:
        for _, rel in task.files:
            data = (server.dir / "data" / rel).read_bytes()
            _, _, dlen, _ = HEADER.unpack_from(data, 4)
            _, _, elen, _ = HEADER.unpack_from(data, 4 + dlen)
            blobs.append(pa.py_buffer(data[4 + dlen + HEADER.size + EVENT_TS.size:4 + dlen + elen]))
    t0 = time.perf_counter()
    for b in blobs:
        pq.read_table(pa.BufferReader(b))
    return time.perf_counter() - t0


def _measure(spark, server, name: str, rows: int, work: Path, dim: int) -> dict:
    q = _query_route(spark, server, name, work / f"{rows}", dim, rows)
    s, got, prep, parts = _storage_route(spark, server, name, work / f"{rows}", dim)
    b = _bare(server, prep)
    assert got == rows, (got, rows)
    return {"rows": rows, "query_rows_per_s": round(rows / q, 1), "storage_rows_per_s": round(rows / s, 1),
            "bare_rows_per_s": round(rows / b, 1), "storage_vs_query": round(q / s, 2),
            "storage_vs_bare": round(b / s, 3), "tasks": len(prep.plan.tasks), "segments": len(prep.plan.segments),
            **parts}


def run(sizes: tuple[int, ...] = (200_000, 2_000_000), dim: int = 128) -> dict:
    from pymilvus import Collection, CollectionSchema, DataType, FieldSchema, connections

    from bench.bench_mirror import _milvus_stack
    from msgstream_spark.jobs._common import spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-storage-snap-"))
    spark = spark_session("bench-storage-snapshot", "local[2]")
    broker, shim, server, _ = _milvus_stack()
    out: dict = {"dim": dim, "sizes": [], "load_before": [round(x, 2) for x in os.getloadavg()]}
    try:
        connections.connect("bench", uri=server.uri, timeout=60)
        schema = CollectionSchema([FieldSchema("pk", DataType.INT64, is_primary=True),
                                   FieldSchema("vec", DataType.FLOAT_VECTOR, dim=dim)])
        col = Collection("bench_storage", schema, using="bench", shards_num=2)
        have = 0
        for rows in sorted(sizes):
            _fill(col, have, rows, dim)
            have = rows
            col.flush()
            if not col.has_index():
                col.create_index("vec", {"index_type": "FLAT", "metric_type": "L2", "params": {}})
                col.load(timeout=300)
            out["sizes"].append(_measure(spark, server, "bench_storage", rows, work, dim))
        connections.disconnect("bench")
    finally:
        server.stop()
        server.cleanup()
        shim.stop()
        broker.kill()
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    _print(out)
    return out


def _print(r: dict) -> None:
    print(f"snapshot of a real Milvus 2.3.5 collection (int64 pk, {r['dim']}-d float vector), rows/s:")
    print(f"  {'rows':>8} {'query':>10} {'storage':>10} {'bare read':>10} {'storage/query':>14} {'storage/bare':>13}")
    for s in r["sizes"]:
        print(f"  {s['rows']:>8,} {s['query_rows_per_s']:>10,.0f} {s['storage_rows_per_s']:>10,.0f} "
              f"{s['bare_rows_per_s']:>10,.0f} {s['storage_vs_query']:>14.2f} {s['storage_vs_bare']:>13.3f}   "
              f"({s['tasks']} binlog groups, {s['segments']} segments, {s['spark_tasks']} Spark tasks, key pass "
              f"{'yes' if s['key_pass'] else 'no'}; flush + plan {s['flush_plan_s']} s, Spark {s['spark_s']} s, "
              f"the tasks' work in one process {s['in_process_s']} s: reading the binlogs {s['read_s']} s, "
              f"Parquet write {s['write_s']} s, fsync {s['fsync_s']} s)")
    print(f"  load average (1, 5, 15 min) before {r['load_before']}, after {r['load_after']} on {os.cpu_count()} cores")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[200_000, 2_000_000])
    ap.add_argument("--dim", type=int, default=128)
    a = ap.parse_args(argv)
    run(tuple(a.sizes), a.dim)


if __name__ == "__main__":
    main()
