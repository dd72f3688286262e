"""The mirror's per-batch cost against the table's size, on a local path and on an S3 server, and what readers pay
for merge-on-read.

``python -m bench.bench_mirror_scale [--small N] [--dim D] [--batch N] [--reps K] [--updates-table N]
[--update-batches K] [--formats delta,iceberg] [--stores local,s3] [--cache-mb M]``:
- batch cost, per store (``local``: a directory; ``s3``: a bucket on moto's S3 server, started here as the tests
  start it, bench/_s3.py): a table of ``small`` rows and one of 8 x ``small`` rows (``dim``-d float vectors, files
  of ``small // 4`` rows, at most 250k, written as a snapshot writes them: Parquet files in the table's store
  registered with ``add_files``). Into each, through the write path in one process (``apply_batch``: the steps
  the Spark tasks and the driver run): first the batch after the snapshot (it builds the files' key indexes),
  then ``reps`` rounds, the two tables interleaved, of a batch of ``batch`` changes (half new keys, 40% updates
  and 10% deletes of random existing keys) with a *cold* key-index cache (what a new executor has: its local
  block cache empty, nothing of the indexes in the process) and one with it *warm* (the next batch), then
  ``reps`` insert-only batches of ``batch`` new keys each. Ratio = cost at 8x / cost at 1x: time (best of the
  batches of a kind; also the CPU seconds of this process and of the S3 server, which a loaded machine
  stretches less than the wall time) and bytes fetched per batch (median): on S3 the GET bytes moto served
  (every client: the mirror's store, delta-rs's and pyiceberg's own reads) and what the mirror's store read
  (``step_bytes``' counter). Goals: time <= 1.5x (mixed), <= 1.2x (insert-only); bytes fetched <= 1.2x on S3.
- full read (local store): a table of ``updates_table`` rows after ``update_batches`` batches each updating
  10% of the keys, read whole with Polars, before and after ``compact`` (ratio = before / after).

moto holds objects over 5 MiB in temporary files (the 8M-row 64-d table is ~2.1 GB there) and handles one
request at a time, each GET copying the whole object out of its store even for a 1 MiB range: its own cost is
in the S3 figures. Iceberg on S3 uses the SQL catalog on a local SQLite file (``catalog_uri``).

Time, full size (``--small 1000000``, Delta and Iceberg, both stores) on the shared 2-core machine: building the
tables ~1.5 min per store and format (8M rows x 64-d: 2.1 GB of Parquet), the first batch 15-60 s at 8M rows on
S3, the other batches 0.2-3 s: about 20-25 minutes in all, 12 of them on S3; ``--stores local`` ~5 minutes.
Measured 2026-11-27 (load 4-22): ``--stores s3`` 4.5-7 minutes with ``--reps 5`` (the 8M-row tables written in
45-100 s), ``--small 125000 --stores s3`` 68 s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.maintenance import compact
from msgstream_spark.mirror.order import SEQ_TYPE
from msgstream_spark.mirror.store import COUNTS, io_since, open_store, parquet
from msgstream_spark.mirror.store.writer import writer_lock
from msgstream_spark.mirror.write import keycache, keyindex, layout
from msgstream_spark.mirror.write.layout import write_data_file

FORMATS = ("delta", "iceberg")
STORES = ("local", "s3")


def _fields(dim: int) -> pa.Schema:
    return pa.schema([pa.field("pk", pa.int64(), False), pa.field("vec", pa.list_(pa.float32()))])


def _vectors(rng, n: int, dim: int) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * dim, dim, dtype=np.int32)),
                                    pa.array(rng.random(n * dim, dtype=np.float32)))


def _seq(ts: int, n: int) -> pa.Array:
    return pa.array([ts << 64] * n, SEQ_TYPE) if n else pa.array([], SEQ_TYPE)


class Where:
    """Where the bench's tables live: a local directory, or a bucket on the S3 server (``s3``: a BenchS3)."""

    def __init__(self, work: Path, s3=None) -> None:
        self.work, self.s3 = work, s3
        self.bucket = s3.new_bucket("scale") if s3 is not None else None

    def location(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}" if self.s3 is not None else str(self.work / name)

    def options(self) -> dict | None:
        return self.s3.options() if self.s3 is not None else None

    def open(self, fmt: str, name: str, dim: int):
        extra = {}
        if self.s3 is not None:
            extra["storage_options"] = self.options()
            if fmt == "iceberg":  # a table in object storage names its catalog: SQLite on the local disk here
                extra["catalog_uri"] = f"sqlite:///{self.work / ('s3-' + name)}_catalog.sqlite"
        return open_table(fmt, self.location(name), collection="bench", pk="pk", arrow_schema=_fields(dim),
                          create=False, **extra)

    def cpu_s(self) -> float:
        """The S3 server's CPU seconds so far (0 on a local path)."""
        return self.s3.cpu_s() if self.s3 is not None else 0.0

    def served(self) -> dict | None:
        return self.s3.counts() if self.s3 is not None else None

    def drop(self, name: str) -> None:
        if self.s3 is None:
            shutil.rmtree(self.work / name, ignore_errors=True)
            return
        store = open_store(self.location(name), self.options())
        for m in list(store.list(self.location(name))):
            store.delete(m.uri)


def _snapshot_table(where: Where, fmt: str, name: str, rows: int, dim: int, file_rows: int) -> object:
    """A table of ``rows`` keys 0..rows-1 at ts 1, as the snapshot writes one: files in the table's store (no key
    index: a snapshot's files get theirs at their first lookup), then add_files."""
    rng = np.random.default_rng(1)
    schema = table_schema(_fields(dim), "pk")
    loc = where.location(name)
    store = open_store(loc, where.options())
    paths = []
    for lo in range(0, rows, file_rows):
        n = min(file_rows, rows - lo)
        t = pa.Table.from_arrays([pa.array(np.arange(lo, lo + n, dtype=np.int64)), _vectors(rng, n, dim),
                                  pa.array(np.ones(n, np.int64)), _seq(1, n), pa.array(np.zeros(n, np.int64))],
                                 schema=schema)
        paths.append(store.join("snapshot-1", f"part-{lo}.parquet"))
        write_data_file(t, paths[-1], store)
    t = where.open(fmt, name, dim)
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


def new_executor(cache_dir: Path) -> None:
    """Forget what this process knows of the key indexes and point it at an empty block cache: a lookup then
    costs what it costs a new executor (the driver's log state is kept, as a running job's driver keeps it)."""
    keyindex._OPEN.clear()
    keyindex._VERIFIED.clear()
    keycache._CACHE.clear()
    parquet._FOOTERS.clear()
    layout._SORTED[:] = [None, None]
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.environ[keycache.CACHE_DIR_ENV] = str(cache_dir)


class Sized:
    """One table and its next batch: its id, its first new key, and the rng of its changes."""

    def __init__(self, table, rows: int, batch: int, dim: int) -> None:
        self.table, self.rows, self.batch, self.dim = table, rows, batch, dim
        self.next_id, self.next_key, self.rng = 0, rows, np.random.default_rng(7)

    def run(self, where: Where, mix: bool) -> dict:
        """One batch through ``apply_batch``: seconds, what the mirror's store read, what the S3 server served."""
        ch = _changes(self.rng, self.rows, self.next_key, self.batch, self.dim, 10 + self.next_id, mix)
        self.next_key += self.batch
        c0, s0, m0 = COUNTS.totals(), where.served(), where.cpu_s()
        t0, p0 = time.perf_counter(), time.process_time()
        assert apply_batch(self.table, ch, "pk", "bench", self.next_id)
        out = {"s": time.perf_counter() - t0, "cpu_s": time.process_time() - p0 + where.cpu_s() - m0,
               "store_read": io_since(c0)["read"]}
        self.next_id += 1
        if s0 is not None:
            from bench._s3 import served

            out.update(served(s0, where.served()))
        return out


def _summary(runs: list[dict]) -> dict:
    """Best time, median bytes over the batches of one kind."""
    out = {"s": round(min(r["s"] for r in runs), 3), "cpu_s": round(min(r["cpu_s"] for r in runs), 3),
           "batches": len(runs)}
    for k in ("store_read", "get_bytes", "gets", "requests"):
        if k in runs[0]:
            out[k] = int(statistics.median(r[k] for r in runs))
    if "get_bytes_by_kind" in runs[0]:
        kinds = sorted({k for r in runs for k in r["get_bytes_by_kind"]})
        out["get_bytes_by_kind"] = {k: int(statistics.median(r["get_bytes_by_kind"].get(k, 0) for r in runs))
                                    for k in kinds}
    return out


def _ratios(a: dict, b: dict) -> dict:
    out = {"time": round(b["s"] / a["s"], 2), "cpu": round(b["cpu_s"] / a["cpu_s"], 2) if a["cpu_s"] else None}
    for k in ("get_bytes", "store_read"):
        if k in a:
            out[k] = round(b[k] / a[k], 2) if a[k] else None
    return out


def _batches(where: Where, tables: dict, runs: dict, cache: Path, reps: int) -> None:
    """The first batch into each table, then ``reps`` rounds of a cold and a warm mixed batch, then ``reps``
    insert-only batches, the tables taking turns."""
    for k in tables:
        new_executor(cache)
        runs[k]["first"].append(tables[k].run(where, True))
    for _ in range(reps):
        for k in tables:
            new_executor(cache)
            runs[k]["cold"].append(tables[k].run(where, True))
            runs[k]["warm"].append(tables[k].run(where, True))
    for _ in range(reps):
        for k in tables:
            runs[k]["insert_only"].append(tables[k].run(where, False))


def store_cost(fmt: str, where: Where, small: int, dim: int, batch: int, reps: int) -> dict:
    """The batch kinds at 1x and 8x rows in ``where``, the two tables' batches interleaved."""
    sizes = {"small": small, "large": 8 * small}
    tables = {}
    try:
        for k, rows in sizes.items():
            t0 = time.perf_counter()
            tables[k] = Sized(_snapshot_table(where, fmt, f"{fmt}-{k}", rows, dim, max(1, min(rows // 4, 250_000))),
                              rows, batch, dim)
            print(f"  {fmt} {rows:,}-row table written in {time.perf_counter() - t0:.1f} s"
                  + (f" (moto RSS {where.s3.rss_mb():,.0f} MiB)" if where.s3 else ""), flush=True)
        cache = where.work / "key-cache"
        runs: dict[str, dict[str, list]] = {k: {"first": [], "cold": [], "warm": [], "insert_only": []} for k in sizes}
        with contextlib.ExitStack() as held:  # each table's writer lease held throughout, as the job holds it
            for k in sizes:
                held.enter_context(writer_lock(tables[k].table.store, tables[k].table.location, "bench_mirror_scale"))
            _batches(where, tables, runs, cache, reps)
    finally:
        for k in tables:
            where.drop(f"{fmt}-{k}")
    kinds = {}
    for kind in ("first", "cold", "warm", "insert_only"):
        a, b = _summary(runs["small"][kind]), _summary(runs["large"][kind])
        kinds[kind] = {"small": a, "large": b, "ratio": _ratios(a, b)}
    # the time ratios under the names earlier runs reported them (a mixed batch with the indexes known, an
    # insert-only batch), and every kind of batch with its bytes under "batches"
    return {"batches": kinds,
            **{name: {"small_s": kinds[kind]["small"]["s"], "large_s": kinds[kind]["large"]["s"],
                      "ratio": kinds[kind]["ratio"]["time"]}
               for name, kind in (("mixed", "warm"), ("insert_only", "insert_only"))}}


def _kib(r: dict) -> str:
    return ", ".join(f"{k} {v / 1024:,.0f}" for k, v in r.get("get_bytes_by_kind", {}).items() if v)


def _print_store(store: str, fmt: str, r: dict, small: int) -> None:
    for kind, goal in (("first", None), ("cold", 1.5), ("warm", 1.5), ("insert_only", 1.2)):
        k = r["batches"][kind]
        a, b, q = k["small"], k["large"], k["ratio"]
        mb = ""
        if "get_bytes" in a:
            mb = (f"   fetched {a['get_bytes'] / 2**20:8.2f} -> {b['get_bytes'] / 2**20:8.2f} MiB"
                  f" ({q['get_bytes'] if q['get_bytes'] is not None else '-'}x), store read "
                  f"{a['store_read'] / 2**20:.2f} -> {b['store_read'] / 2**20:.2f} MiB, "
                  f"GETs {a['gets']} -> {b['gets']}")
            mb += f"\n{'':24} by kind (KiB) {_kib(a)}  ->  {_kib(b)}"
        g = f" (goal <= {goal})" if goal else ""
        print(f"{store:5} {fmt:8} {kind:11} {small:>9,} rows {a['s']:7.3f} s   {8 * small:>10,} rows {b['s']:7.3f} s"
              f"   time {q['time']:5.2f}x{g}, CPU {a['cpu_s']:.3f} -> {b['cpu_s']:.3f} s ({q['cpu'] or '-'}x){mb}",
              flush=True)


def read_cost(fmt: str, work: Path, rows: int, dim: int, batches: int) -> dict:
    import polars as pl

    where = Where(work)
    t = _snapshot_table(where, fmt, f"{fmt}-reads", rows, dim, max(1, rows // 4))
    loc = where.location(f"{fmt}-reads")
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
                got = pl.read_delta(loc).height
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
    where.drop(f"{fmt}-reads")
    return {"rows": rows, "batches": batches, "read_before_s": round(before, 3), "read_after_s": round(after, 3),
            "files_before": files_before,
            "files_after": files_after, "read_ratio": round(before / after, 2)}


def run(small: int = 125_000, dim: int = 64, batch: int = 10_000, reps: int = 3, updates_table: int = 100_000,
        update_batches: int = 50, formats: tuple[str, ...] = FORMATS, stores: tuple[str, ...] = STORES,
        cache_mb: float | None = None) -> dict:
    """``cache_mb``: the executor's key-index block cache bound (``MSGSTREAM_KEY_CACHE_MB``; default its own,
    1024): one smaller than the large table's index (32 bytes a row) shows a batch once the cache cannot hold it."""
    from bench._s3 import load_average

    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")
    if cache_mb is not None:
        os.environ[keycache.CACHE_MB_ENV] = str(cache_mb)
    work = Path(tempfile.mkdtemp(prefix="bench-mirror-scale-"))
    out: dict = {"small_rows": small, "large_rows": 8 * small, "dim": dim, "batch": batch, "reps": reps,
                 "key_cache_mb": float(os.environ.get(keycache.CACHE_MB_ENV) or keycache.DEFAULT_CACHE_MB),
                 "load_average_start": load_average()}
    print(f"a {batch:,}-change batch into {small:,} vs {8 * small:,} rows x {dim}-d; key index cache "
          f"{out['key_cache_mb']:,.0f} MiB; load average {out['load_average_start']}", flush=True)
    try:
        with contextlib.ExitStack() as stack:
            for store in stores:
                where = Where(work)
                if store == "s3":
                    from bench._s3 import BenchS3

                    where = Where(work, stack.enter_context(BenchS3(work)))
                dest = out if store == "local" else out.setdefault(store, {})
                for fmt in formats:
                    try:
                        r = store_cost(fmt, where, small, dim, batch, reps)
                    except Exception as exc:  # noqa: BLE001 - e.g. a format the store does not take yet: say so
                        if store == "local":
                            raise
                        dest[fmt] = {"error": f"not measured: {type(exc).__name__}: {exc}"[:500]}
                        print(f"{store:5} {fmt:8} {dest[fmt]['error']}", flush=True)
                        continue
                    _print_store(store, fmt, r, small)
                    if store == "local":
                        r["reads"] = read_cost(fmt, work, updates_table, dim, update_batches)
                        rd = r["reads"]
                        print(f"{fmt:8} full read after {update_batches} batches of 10% updates "
                              f"{rd['read_before_s']:.3f} s, after compaction {rd['read_after_s']:.3f} s "
                              f"({rd['read_ratio']:.2f}x)", flush=True)
                    dest[fmt] = r
                if where.s3 is not None:
                    dest["moto_rss_mb"] = round(where.s3.rss_mb())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["load_average_end"] = load_average()
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
    p.add_argument("--stores", default=",".join(STORES))
    p.add_argument("--cache-mb", type=float, help="the key-index block cache's bound (MSGSTREAM_KEY_CACHE_MB)")
    a = p.parse_args()
    run(a.small, a.dim, a.batch, a.reps, a.updates_table, a.update_batches, tuple(a.formats.split(",")),
        tuple(a.stores.split(",")), a.cache_mb)


if __name__ == "__main__":
    main()
