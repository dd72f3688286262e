"""The mirror job's snapshot against what Milvus serves, on a real Milvus 2.3.5 (issues #28, #40).

``python -m bench.bench_snapshot [--rows128 N] [--rows768 N] [--reps N]``: a collection of ``pk`` Int64 +
``category`` VarChar + ``vec`` FloatVector (128-d, then 768-d), 2 shards, inserted through pymilvus, flushed
and loaded. Then, interleaved (each repetition in a rotated order), each timed by Milvus's own count of
``Query`` calls (the proxy's ``/metrics`` counter ``milvus_proxy_req_count{function_name="Query"}``, polled:
the window runs from the first call the proxy received to the last it answered):

- bare loop, the baseline: four ``Query`` calls of a quarter of the rows each (keys known beforehand),
  Strong consistency, one after another through pymilvus's gRPC stub, each answer decoded with
  pyarrow/numpy only (what Milvus serves); beside it the same loop reading at S (``guarantee_timestamp``,
  consistency Customized), as the job reads;
- the job: ``msgstream mirror run --snapshot initial`` into a new Delta table, each time in a process of its own
  (``--master local[2]``, a new Spark session, as users run it): its window covers the plan, the Spark job's
  start and every task's calls. Goal: >= 0.8 of the bare loop, and at most ranges + 10 calls for the plan
  (from the job's summary);
- the reader alone: :class:`RangeReader` in this process over the plan's ranges (the figure issue #28
  measured; no Spark, no table).

Ratios are bare loop seconds / subject seconds (1.0 = as fast as the bare loop): the median of the
repetitions' ratios, each repetition's subject against the same repetition's baseline. Full size (200k x
128-d, 20k x 768-d, 3 repetitions): 6 minutes on 2 loaded cores, of which ~1 filling the collections and
~4 the six job runs (each a new JVM and Spark session).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from bench._util import median

_COUNTER = re.compile(r'^milvus_proxy_req_count\{function_name="Query",node_id="\d+",status="(\w+)"\} (\S+)$', re.M)


class QueryWindow:
    """The first to the last ``Query`` call a Milvus proxy counted while this context was open, from its
    ``/metrics`` (polled every ``interval`` s; each end is placed midway between the scrape before the change and
    the scrape that saw it, so the window is right to about ``interval`` / 2 at each end)."""

    def __init__(self, metrics_port: int, interval: float = 0.2) -> None:
        self.url, self.interval = f"http://127.0.0.1:{metrics_port}/metrics", interval
        self.calls, self.seconds = 0, 0.0
        self._stop = threading.Event()
        self._seen: list[tuple[float, int, int]] = []  # (time, received, answered)

    def _scrape(self) -> tuple[float, int, int]:
        t0 = time.perf_counter()
        with urllib.request.urlopen(self.url, timeout=10) as resp:
            text = resp.read().decode()
        got = {status: float(v) for status, v in _COUNTER.findall(text)}
        done = sum(v for s, v in got.items() if s != "total")
        return (t0 + time.perf_counter()) / 2, int(got.get("total", 0)), int(done)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._seen.append(self._scrape())

    def __enter__(self) -> QueryWindow:
        self._seen.append(self._scrape())
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._seen.append(self._scrape())
        first_total, first_done = self._seen[0][1], self._seen[0][2]
        self.calls = self._seen[-1][1] - first_total
        start = next(i for i, s in enumerate(self._seen) if s[1] > first_total) if self.calls else 0
        end = next(i for i, s in enumerate(self._seen) if s[2] == self._seen[-1][2]) if self.calls else 0
        if self.calls:
            mid = [(self._seen[i - 1][0] + self._seen[i][0]) / 2 for i in (start, end)]
            self.seconds = max(1e-3, mid[1] - mid[0])
        if self._seen[-1][2] - first_done != self.calls:
            raise RuntimeError(f"{self.calls} Query calls received, {self._seen[-1][2] - first_done} answered")


def _collection(uri: str, name: str, rows: int, dim: int) -> str:
    """Create, fill, flush and load; the collection's physical channels (for the job's ``--channels``)."""
    from pymilvus import Collection, CollectionSchema, DataType, FieldSchema, connections

    from tests.milvus_real.stack import pchannels

    connections.connect("bench", uri=uri, timeout=60)
    try:
        schema = CollectionSchema([FieldSchema("pk", DataType.INT64, is_primary=True),
                                   FieldSchema("category", DataType.VARCHAR, max_length=32),
                                   FieldSchema("vec", DataType.FLOAT_VECTOR, dim=dim)])
        col = Collection(name, schema, using="bench", shards_num=2)
        rng = np.random.default_rng(dim)
        step = max(1000, min(20_000, 16_000_000 // (dim * 4 + 64)))
        for lo in range(0, rows, step):
            n = min(step, rows - lo)
            col.insert([list(range(lo, lo + n)), [f"c{i % 7}" for i in range(lo, lo + n)],
                        rng.standard_normal((n, dim), dtype=np.float32)])
        col.flush()
        col.create_index("vec", {"index_type": "FLAT", "metric_type": "L2", "params": {}})
        col.load(timeout=600)
        return ",".join(pchannels("bench", name))
    finally:
        connections.disconnect("bench")


def _bare_loop(address: str, name: str, rows: int, dim: int, at: int = 0) -> int:
    """Four Query calls of a quarter of the keys each through pymilvus's stub; columns with pyarrow/numpy only.
    ``at`` > 0: read at that time or later (Customized), else Strong."""
    import grpc
    from pymilvus.grpc_gen import common_pb2, milvus_pb2, milvus_pb2_grpc

    from msgstream_spark.mirror.snapshot.query.ranges import PkRange

    cuts = [None, rows // 4, rows // 2, 3 * rows // 4, None]
    level = common_pb2.ConsistencyLevel.Customized if at else common_pb2.ConsistencyLevel.Strong
    ch = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)])
    stub = milvus_pb2_grpc.MilvusServiceStub(ch)
    got = 0
    try:
        for lo, hi in zip(cuts, cuts[1:]):
            req = milvus_pb2.QueryRequest(collection_name=name, expr=PkRange(lo, hi).expr("pk", False),
                                          output_fields=["*"], consistency_level=level, guarantee_timestamp=at,
                                          use_default_consistency=False)
            resp = stub.Query(req, timeout=120)
            cols = {}
            for fd in resp.fields_data:
                if fd.field_name == "vec":
                    flat = np.array(fd.vectors.float_vector.data, dtype=np.float32)
                    cols["vec"] = pa.FixedSizeListArray.from_arrays(pa.array(flat), dim)
                elif fd.field_name == "pk":
                    cols["pk"] = pa.array(np.array(fd.scalars.long_data.data, dtype=np.int64))
                else:
                    cols[fd.field_name] = pa.array(list(fd.scalars.string_data.data), pa.string())
            got += len(cols.get("pk", []))
    finally:
        ch.close()
    return got


def _job(cfg: Path, channels: str, work: Path, name: str, run: int) -> tuple[int, dict]:
    """``msgstream mirror run --snapshot initial`` in a process of its own (a new Spark session, as users run it:
    the snapshot's tasks start their Python workers cold); its summary's snapshot part."""
    table = work / f"{name}-job-{run}"
    cmd = [sys.executable, "-m", "msgstream_spark", "mirror", "run", "--config", str(cfg), "--channels", channels,
           "--collection", name, "--table", str(table), "--table-format", "delta", "--progress-interval", "60",
           "--master", "local[2]"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=work)
    if done.returncode:
        raise RuntimeError(f"mirror run failed ({done.returncode}): {done.stderr[-3000:]}")
    summary = json.loads(done.stdout[done.stdout.index("\n{") + 1:] if not done.stdout.startswith("{")
                         else done.stdout)
    for line in done.stderr.splitlines():
        if "snapshot of" in line and "planned with" in line:
            print(f"  {line.strip()[:200]}")
    return summary["snapshot"]["rows"], summary["snapshot"]


def _reader(address: str, work: Path, name: str, dim: int, at: int) -> tuple[int, dict]:
    """The snapshot's reader alone, over the plan's ranges (2 tasks' worth), in this process."""
    from msgstream_spark.config.loader import Config
    from msgstream_spark.mirror.common import table_schema
    from msgstream_spark.mirror.snapshot.query.reader import RangeReader, plan_ranges, row_bytes
    from msgstream_spark.mirror.snapshot.query.rpc import Querier, QueryTarget
    from msgstream_spark.mq.milvus.settings import MilvusSettings

    settings = MilvusSettings(Config.from_dict({"mq": {"type": "milvus"}, "milvus": {
        "address": address, "requestTimeout": 120, "metadataPath": str(work / "meta.json")}}))
    q = Querier(QueryTarget(settings, name, _collection_id(address, name), floor_ts=at))
    try:
        ranges = plan_ranges(q, "pk", False, 2)
        width = row_bytes(q, "pk", False, ranges[0])
    finally:
        q.close()
    schema = table_schema(pa.schema([pa.field("pk", pa.int64()), pa.field("category", pa.string()),
                                     pa.field("vec", pa.list_(pa.float32()))]), "pk")
    reader = RangeReader(q.target, "pk", False, schema, 1, row_bytes=width)
    return sum(b.num_rows for b in reader.read(ranges)), {"plan_calls": q.calls}


def _collection_id(address: str, name: str) -> int:
    from pymilvus import MilvusClient

    mc = MilvusClient(uri=f"http://{address}", timeout=60)
    try:
        return int(mc.describe_collection(name)["collection_id"])
    finally:
        mc.close()


def _now_ts() -> int:
    """A Milvus time a second ago (the collection was written and loaded long before)."""
    return (int(time.time() * 1000) - 1000) << 18


def measure(server, kafka: str, work: Path, name: str, rows: int, dim: int, reps: int = 3) -> dict:
    channels = _collection(server.uri, name, rows, dim)
    address = server.uri.removeprefix("http://")
    cfg = work / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({"mq.type": "kafka", "kafka.brokerList": kafka, "milvus.address": address}))
    runs = {"bare": lambda r: (_bare_loop(address, name, rows, dim), {}),
            "bare_at_s": lambda r: (_bare_loop(address, name, rows, dim, _now_ts()), {}),
            "job": lambda r: _job(cfg, channels, work, name, r),
            "reader": lambda r: _reader(address, work, name, dim, _now_ts())}
    runs["bare"](0)  # warm-up: the first read of a collection loads what later ones find ready
    secs: dict[str, list[float]] = {k: [] for k in runs}
    extra: dict[str, dict] = {}
    out = {"rows": rows, "dim": dim, "reps": reps, "load_before": [round(x, 2) for x in os.getloadavg()]}
    for rep in range(reps):
        order = list(runs)[rep % len(runs):] + list(runs)[:rep % len(runs)]
        for label in order:
            with QueryWindow(server.metrics_port) as w:
                t0 = time.perf_counter()
                n, info = runs[label](rep)
                wall = time.perf_counter() - t0
            if n != rows:
                raise RuntimeError(f"{label}: read {n} rows of {rows}")
            secs[label].append(w.seconds)
            extra[label] = {**info, "calls": w.calls, "wall_s": round(wall, 2)}
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    for label, xs in secs.items():
        out[f"{label}_window_s"] = [round(x, 3) for x in xs]
        out[f"{label}_rows_per_s"] = round(rows / median(xs), 1)
        out[f"{label}_calls"] = extra[label]["calls"]
        if label != "bare":
            out[f"{label}_vs_bare"] = round(median([b / s for b, s in zip(secs["bare"], xs)]), 3)
    out["job_vs_bare_at_s"] = round(median([b / s for b, s in zip(secs["bare_at_s"], secs["job"])]), 3)
    snap = extra["job"]
    out.update(job_plan_calls=snap.get("plan_calls"), job_read_calls=snap.get("read_calls"),
               job_ranges=snap.get("ranges"), job_plan_s=snap.get("plan_seconds"), job_wall_s=snap["wall_s"])
    return out


def run(rows128: int = 200_000, rows768: int = 20_000, reps: int = 3) -> dict:
    from bench.bench_mirror import _milvus_stack

    broker, shim, server, kafka = _milvus_stack()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = {"d128": measure(server, kafka, Path(tmp), "bench_snap128", rows128, 128, reps),
                      "d768": measure(server, kafka, Path(tmp), "bench_snap768", rows768, 768, reps)}
    finally:
        server.stop()
        server.cleanup()
        shim.stop()
        broker.kill()
    _print(result)
    return result


def _print(result: dict) -> None:
    from bench._util import table

    for r in result.values():
        print(f"\n{r['rows']} rows x {r['dim']}-d, real Milvus 2.3.5: first to last Query call as the proxy counts "
              f"them (median of {r['reps']} interleaved runs; load average {r['load_before']} -> {r['load_after']}, "
              f"{os.cpu_count()} cores)")
        print(table([("bare loop: 4 Strong Query calls + pyarrow", r["bare_rows_per_s"], None),
                     ("bare loop reading at S (Customized)", r["bare_at_s_rows_per_s"], r["bare_at_s_vs_bare"]),
                     (f"mirror job's snapshot, goal >= 0.8 ({r['job_calls']} calls)", r["job_rows_per_s"],
                      r["job_vs_bare"]),
                     (f"reader alone, no Spark ({r['reader_calls']} calls)", r["reader_rows_per_s"],
                      r["reader_vs_bare"])]))
        print(f"job: {r['job_ranges']} ranges planned with {r['job_plan_calls']} Query calls in {r['job_plan_s']} s "
              f"(goal <= ranges + 10), {r['job_read_calls']} calls in the tasks; vs the bare loop at S "
              f"{r['job_vs_bare_at_s']}; whole job {r['job_wall_s']} s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows128", type=int, default=200_000)
    ap.add_argument("--rows768", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    run(a.rows128, a.rows768, a.reps)


if __name__ == "__main__":
    main()
