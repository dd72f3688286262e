"""The mirror's per-batch cost against the table's size, and what readers pay for merge-on-read.

``python -m bench.bench_mirror_scale [--small N] [--dim D] [--batch N] [--updates-table N] [--update-batches K]``:
- batch cost: a table of ``small`` rows and one of 8 x ``small`` rows (``dim``-d float vectors, files of
  ``small // 4`` rows, written as a snapshot is: Parquet files registered with ``add_files``); into each, a
  batch of ``batch`` changes (half new keys, 40% updates and 10% deletes of random existing keys) and an
  insert-only batch of ``batch`` new keys, through the write path (``apply_batch``: the same steps the
  Spark tasks and the driver run, in one process). Ratio = cost at 8x / cost at 1x (goals: <= 1.5, <= 1.2).
  Best of ``reps`` batches per size (each a new batch id: the table grows by the batch).
- full read: a table of ``updates_table`` rows after ``update_batches`` batches each updating 10% of the
  keys, read whole with Polars, before and after ``compact`` (ratio = before / after).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.maintenance import compact
from msgstream_spark.mirror.order import SEQ_TYPE

FORMATS = ("delta", "iceberg")


def _fields(dim: int) -> pa.Schema:
    return pa.schema([pa.field("pk", pa.int64(), False), pa.field("vec", pa.list_(pa.float32()))])


def _vectors(rng, n: int, dim: int) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * dim, dim, dtype=np.int32)),
                                    pa.array(rng.random(n * dim, dtype=np.float32)))


def _seq(ts: int, n: int) -> pa.Array:
    return pa.array([ts << 64] * n, SEQ_TYPE) if n else pa.array([], SEQ_TYPE)


def _snapshot_table(fmt: str, loc: Path, rows: int, dim: int, file_rows: int) -> object:
    """A table of ``rows`` keys 0..rows-1 at ts 1, as the snapshot writes one: files, then add_files."""
    rng = np.random.default_rng(1)
    schema = table_schema(_fields(dim), "pk")
    out = loc / "snapshot-1"
    out.mkdir(parents=True)
    paths = []
    for lo in range(0, rows, file_rows):
        n = min(file_rows, rows - lo)
        t = pa.Table.from_arrays([pa.array(np.arange(lo, lo + n, dtype=np.int64)), _vectors(rng, n, dim),
                                  pa.array(np.ones(n, np.int64)), _seq(1, n), pa.array(np.zeros(n, np.int64))],
                                 schema=schema)
        paths.append(str(out / f"part-{lo}.parquet"))
        pq.write_table(t, paths[-1])
    t = open_table(fmt, str(loc), collection="bench", pk="pk", arrow_schema=_fields(dim), create=False)
    t.add_files(paths, properties={"msgstream.snapshot_ts": "1"})
    return t


def _changes(rng, existing: int, new_from: int, n: int, dim: int, ts: int, mix: bool) -> pa.Table:
    """``n`` changes: all new keys (``mix`` False), or half new, 40% updates, 10% deletes of random keys."""
    n_new = n if not mix else n // 2
    n_upd = 0 if not mix else n * 2 // 5
    n_del = 0 if not mix else n - n_new - n_upd
    old = rng.choice(existing, n_upd + n_del, replace=False).astype(np.int64)
    keys = np.concatenate([np.arange(new_from, new_from + n_new, dtype=np.int64), old])
    ops = ["insert"] * (n_new + n_upd) + ["delete"] * n_del
    m = len(keys)
    return pa.table({"op": pa.array(ops), "pk": pa.array(keys), "vec": _vectors(rng, m, dim),
                     "_ts": pa.array(np.full(m, ts, np.int64)), "_seq": _seq(ts, m),
                     "_partition": pa.array(np.zeros(m, np.int64))})


def batch_cost(fmt: str, work: Path, rows: int, dim: int, batch: int, reps: int, mix: bool) -> float:
    loc = work / f"{fmt}-{rows}-{'mix' if mix else 'ins'}"
    t = _snapshot_table(fmt, loc, rows, dim, max(1, rows // 4 if rows <= 1_000_000 else 250_000))
    rng = np.random.default_rng(7)
    best = float("inf")
    for i in range(reps):
        ch = _changes(rng, rows, rows + i * batch, batch, dim, 10 + i, mix)
        t0 = time.perf_counter()
        assert apply_batch(t, ch, "pk", "bench", i)
        best = min(best, time.perf_counter() - t0)
    shutil.rmtree(loc, ignore_errors=True)
    return best


def read_cost(fmt: str, work: Path, rows: int, dim: int, batches: int) -> dict:
    import polars as pl

    loc = work / f"{fmt}-reads"
    t = _snapshot_table(fmt, loc, rows, dim, max(1, rows // 4))
    rng = np.random.default_rng(3)
    for i in range(batches):
        keys = rng.choice(rows, rows // 10, replace=False).astype(np.int64)
        n = len(keys)
        ch = pa.table({"op": pa.array(["insert"] * n), "pk": pa.array(keys), "vec": _vectors(rng, n, dim),
                       "_ts": pa.array(np.full(n, 10 + i, np.int64)), "_seq": _seq(10 + i, n),
                       "_partition": pa.array(np.zeros(n, np.int64))})
        assert apply_batch(t, ch, "pk", "bench", i)

    def read() -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            if fmt == "delta":
                got = pl.read_delta(str(loc)).height
            else:
                tbl = t._table()
                tbl.refresh()
                got = pl.scan_iceberg(tbl).collect().height
            assert got == rows, (got, rows)
            best = min(best, time.perf_counter() - t0)
        return best

    before = read()
    files_before = len(t.live_files())
    compact(t)
    after = read()
    files_after = len(t.live_files())
    shutil.rmtree(loc, ignore_errors=True)
    return {"rows": rows, "batches": batches, "read_before_s": round(before, 3), "read_after_s": round(after, 3),
            "files_before": files_before,
            "files_after": files_after, "read_ratio": round(before / after, 2)}


def run(small: int = 125_000, dim: int = 64, batch: int = 10_000, reps: int = 3, updates_table: int = 100_000,
        update_batches: int = 50, formats: tuple[str, ...] = FORMATS) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-mirror-scale-"))
    out: dict = {"small_rows": small, "large_rows": 8 * small, "dim": dim, "batch": batch}
    try:
        for fmt in formats:
            r = {}
            for mix in (True, False):
                kind = "mixed" if mix else "insert_only"
                a = batch_cost(fmt, work, small, dim, batch, reps, mix)
                b = batch_cost(fmt, work, 8 * small, dim, batch, reps, mix)
                r[kind] = {"small_s": round(a, 3), "large_s": round(b, 3), "ratio": round(b / a, 2)}
                print(f"{fmt:8} {kind:12} {small:>9,} rows {a:7.3f} s   {8 * small:>10,} rows {b:7.3f} s   "
                      f"ratio {b / a:5.2f}x (goal <= {1.5 if mix else 1.2})", flush=True)
            r["reads"] = read_cost(fmt, work, updates_table, dim, update_batches)
            print(f"{fmt:8} full read after {update_batches} batches of 10% updates "
                  f"{r['reads']['read_before_s']:.3f} s, after compaction {r['reads']['read_after_s']:.3f} s "
                  f"({r['reads']['read_ratio']:.2f}x)", flush=True)
            out[fmt] = r
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=125_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--updates-table", type=int, default=100_000)
    p.add_argument("--update-batches", type=int, default=50)
    p.add_argument("--formats", default=",".join(FORMATS))
    a = p.parse_args()
    run(a.small, a.dim, a.batch, a.reps, a.updates_table, a.update_batches, tuple(a.formats.split(",")))


if __name__ == "__main__":
    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")
    main()
