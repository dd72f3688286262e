"""The driver's per-table commit step of the database job on an Iceberg table, Spark-free (issue #44): what one
table's commit costs the driver per batch, in CPU seconds, and where it goes (cProfile), with the catalog's table
loads (``load_table``: a metadata file read and parsed each) and metadata files written counted.

Each of ``tables`` local Iceberg tables (the default SQLite catalog beside each) is grown by ``history`` batches,
then ``batches`` more are measured. A batch of a table runs the database job's driver steps in order (its
writing and planning tasks here in this process, not measured): begin (``begin_write``, under the table's lease
held across batches as the job holds it), the tasks' files, the plan (the table's live files, the lookup), then
the measured **commit step**: ``finish_batch``'s commit (``commit_plan``: collection check, lease check, the
fenced commit with the batch record), the end's ``write_spec`` and the job's maintenance check
(``Upkeep.after_batch``, default policy). ``--threads T`` commits the tables' batches T at once (as
``--table-concurrency``), each in its own thread; the CPU figure is the sum of the threads' CPU (per table
commit: the median and the mean, which carries the maintenance runs: an expiry every 10 batches).

    python -m bench.profile_iceberg_commit [--tables 4] [--history 15] [--batches 10] [--rows 200]
        [--threads 1] [--profile out.pstats]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

SEQ_TYPE = pa.decimal128(38, 0)
FIELDS = pa.schema([pa.field("pk", pa.int64()), pa.field("v", pa.string())])


def _changes(keys: np.ndarray, ts: int) -> pa.Table:
    n = len(keys)
    return pa.table({"op": ["insert"] * n, "pk": pa.array(keys, pa.int64()), "v": [f"v{ts}"] * n,
                     "_ts": pa.array(np.full(n, ts, np.int64)), "_seq": pa.array([ts << 64] * n, SEQ_TYPE),
                     "_partition": pa.array(np.zeros(n, np.int64))})


class Counts:
    """Catalog table loads and metadata files written, counted per thread of the measured step."""

    def __init__(self) -> None:
        self.loads = 0
        self.read = 0
        self.written = 0
        self.on = threading.local()
        self._lock = threading.Lock()

    def install(self) -> None:
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.serializers import FromInputFile

        load, write, parse = SqlCatalog.load_table, SqlCatalog._write_metadata, FromInputFile.table_metadata
        counts = self

        def table_metadata(input_file, *a, **kw):
            counts.add("read")
            return parse(input_file, *a, **kw)

        def load_table(cat, identifier):
            counts.add("loads")
            return load(cat, identifier)

        def write_metadata(metadata, io, metadata_path):
            counts.add("written")
            return write(metadata, io, metadata_path)

        SqlCatalog.load_table = load_table
        SqlCatalog._write_metadata = staticmethod(write_metadata)
        FromInputFile.table_metadata = staticmethod(table_metadata)

    def add(self, what: str) -> None:
        if getattr(self.on, "yes", False):
            with self._lock:
                setattr(self, what, getattr(self, what) + 1)


class Bench:
    def __init__(self, work: Path, tables: int, rows: int) -> None:
        from msgstream_spark.mirror import open_table
        from msgstream_spark.mirror.policy import MaintenancePolicy
        from msgstream_spark.mirror.store.writer import hold_lease
        from msgstream_spark.mirror.upkeep import Upkeep

        self.rows = rows
        self.tables = [open_table("iceberg", str(work / f"t{i}"), collection=f"c{i}", pk="pk", arrow_schema=FIELDS)
                       for i in range(tables)]
        self.holds = [hold_lease(t.store, t.location, "the bench") for t in self.tables]
        self.upkeep = [Upkeep(t, MaintenancePolicy()) for t in self.tables]
        self.next = [0] * tables
        self.batch = 0
        self.walls: list[float] = []  # each measured commit step's wall seconds

    def close(self) -> None:
        for _, release in self.holds:
            release()

    def prepared(self, i: int):
        """Table ``i``'s batch up to its commit: begun, written, planned (the plan and runner)."""
        from msgstream_spark.mirror.collapse import collapse
        from msgstream_spark.mirror.store.writer import writer_lock
        from msgstream_spark.mirror.write.batch import LocalRunner, begin_write

        t, (hold, _) = self.tables[i], self.holds[i]
        rng = np.random.default_rng(self.batch * 100 + i)
        n = self.next[i]
        old = rng.choice(n, size=min(self.rows // 20, n), replace=False) if n else np.zeros(0, np.int64)
        keys = np.concatenate([old.astype(np.int64), np.arange(n, n + self.rows)])
        self.next[i] += self.rows
        runner = LocalRunner(collapse(_changes(keys, self.batch + 1), "pk", t.location))
        with writer_lock(t.store, t.location, "the bench", share=hold):
            spec = begin_write(t, runner, query_id="q", batch_id=self.batch, hold=hold)
            written = runner.write(spec)
            p, ids = runner.plan(t, written)
        return p, ids

    def commit(self, i: int, p, ids) -> None:
        """The measured step: the database job's commit of table ``i`` (``ManyWrite._commit``'s ``one``)."""
        from msgstream_spark.mirror.store.writer import writer_lock
        from msgstream_spark.mirror.write.batch import commit_plan

        t, (hold, _) = self.tables[i], self.holds[i]
        with writer_lock(t.store, t.location, "the bench", share=hold):
            assert commit_plan(t, p, ids, query_id="q", batch_id=self.batch, hold=hold) is not None
            t.write_spec()  # the end's (end_batch)
            self.upkeep[i].after_batch(None, hold)

    def round(self, threads: int, counts: Counts | None, prof: list | None) -> tuple[float, float]:
        """One batch into every table: (CPU seconds of the commit steps summed, wall seconds of them all)."""
        self.batch += 1
        got = [self.prepared(i) for i in range(len(self.tables))]
        cpu: list[float] = []
        walls = self.walls
        lock = threading.Lock()

        def one(i: int) -> None:
            p = cProfile.Profile(time.thread_time) if prof is not None else None  # CPU, not wall
            if counts is not None:
                counts.on.yes = True
            c0, w0 = time.thread_time(), time.perf_counter()
            if p is not None:
                p.enable()
            try:
                self.commit(i, *got[i])
            finally:
                if p is not None:
                    p.disable()
                c, w = time.thread_time() - c0, time.perf_counter() - w0
                if counts is not None:
                    counts.on.yes = False
                with lock:
                    cpu.append(c)
                    walls.append(w)
                    if p is not None:
                        prof.append(p)

        t0 = time.perf_counter()
        if threads <= 1:
            for i in range(len(self.tables)):
                one(i)
        else:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                list(pool.map(one, range(len(self.tables))))
        return sum(cpu), time.perf_counter() - t0


def run(tables: int = 4, history: int = 15, batches: int = 10, rows: int = 200, threads: int = 1,
        profile: str | None = None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-icecommit-"))
    counts = Counts()
    counts.install()
    b = Bench(work, tables, rows)
    try:
        for _ in range(history):
            b.round(1, None, None)
        prof: list = [] if profile else None
        cpu, wall = [], []
        b.walls.clear()
        for _ in range(batches):
            c, w = b.round(threads, counts, prof)
            cpu.append(c / tables)
            wall.append(w)
    finally:
        b.close()
        shutil.rmtree(work, ignore_errors=True)
    n = batches * tables
    out = {"tables": tables, "history": history, "batches": batches, "rows": rows, "threads": threads,
           "cpu_per_table_commit_ms": {"median": round(1000 * statistics.median(cpu), 1),
                                       "mean": round(1000 * statistics.mean(cpu), 1),
                                       "min": round(1000 * min(cpu), 1), "max": round(1000 * max(cpu), 1)},
           "wall_per_table_commit_ms_median": round(1000 * statistics.median(b.walls), 1),
           "wall_per_round_ms_median": round(1000 * statistics.median(wall), 1),
           "catalog_loads_per_table_commit": round(counts.loads / n, 2),
           "metadata_files_read_per_table_commit": round(counts.read / n, 2),
           "metadata_files_written_per_table_commit": round(counts.written / n, 2)}
    if profile:
        st = pstats.Stats(prof[0])
        for p in prof[1:]:
            st.add(p)
        st.dump_stats(profile)
        s = io.StringIO()
        pstats.Stats(profile, stream=s).sort_stats("cumulative").print_stats(45)
        print(s.getvalue())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--history", type=int, default=15, help="batches into each table before the measured ones")
    p.add_argument("--batches", type=int, default=10, help="measured batches per table")
    p.add_argument("--rows", type=int, default=200, help="new keys per table per batch (and 1/20 as many upserts)")
    p.add_argument("--threads", type=int, default=1, help="tables committed at once (as --table-concurrency)")
    p.add_argument("--profile", help="write the commit steps' cProfile stats here (and print the top)")
    a = p.parse_args()
    print(json.dumps(run(a.tables, a.history, a.batches, a.rows, a.threads, a.profile), indent=2))


if __name__ == "__main__":
    main()
