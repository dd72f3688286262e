"""Where the CPU of the database job's load goes (issue #44), next to one job over one collection of the same rows:
CPU seconds per stage, the driver's and the Python tasks' (not wall seconds: on a shared machine those are noise).

``python -m bench.profile_mirror_many [--collections N] [--rows N] [--format delta|iceberg] [--changes N]
[--out DIR]``: the logs of ``bench.bench_mirror_many`` (the load; with ``--changes``, then the changes phase
profiled the same way, each job resumed from its checkpoint); an untimed warm-up; then the database job and the
one-collection job, each profiled with cProfile timing by ``time.process_time`` (CPU, not wall): the driver
in this process (``--table-concurrency 1``: every table's steps in this thread), the Python tasks through
Spark's UDF and data source profilers (``spark.sql.pyspark.*.profiler=perf``) with the same CPU timer and a
writing task's tables one after another (``mirror_tasks._TaskTables._each`` in the task's thread, so every call
is in the profiled thread). A process's CPU clock counts its other threads too (Arrow's, the store's): what a
stage spends in them is counted in the stage that waits for it. The JVM's CPU is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

# the stages: (name, [(file suffix, function name)]) -- cumulative CPU of the first match of each, per process
TASK_STAGES = [
    ("source read (log read and decoded, rows built)", [("source/read.py", "read_range")]),
    ("  of which: pieces packed as Arrow IPC", [("source/multi.py", "_pieces"), ("source/multi.py", "_rows_batch")]),
    ("split by collection + pieces unpacked", [("spark/mirror_many_write.py", "split"),
                                              ("source/pieces.py", "split")]),
    ("task writer: collapse, files written (all)", [("mirror/write/layout.py", "add")]),
    ("  of which: collapse", [("mirror/collapse.py", "collapse")]),
    ("  of which: Parquet write", [("mirror/store/parquet.py", "write_table")]),
    ("files closed (Parquet footers, uploads)", [("mirror/store/parquet.py", "close")]),
    ("key index", [("mirror/write/keyindex.py", "save_index")]),
    ("changes files", [("mirror/write/taskplan.py", "add"), ("mirror/write/taskplan.py", "close")]),
    ("plan (keys looked up)", [("mirror/write/taskplan.py", "plan_share")]),
]
DRIVER_STAGES = [
    ("begin (lease, batch begun, spec)", [("spark/mirror_many_write.py", "_begin"), ("spark/mirror.py", "begin"),
                                         ("mirror/write/batch.py", "begin_write")]),
    ("live files (plan's fence)", [("formats/delta/table.py", "live_files"),
                                   ("formats/iceberg/table.py", "live_files")]),
    ("commit (Delta version / Iceberg snapshot)", [("formats/delta/table.py", "commit"),
                                                   ("formats/iceberg/table.py", "commit")]),
    ("  Iceberg: the catalog's table loads (refresh)", [("pyiceberg/table/__init__.py", "refresh")]),
    ("  Iceberg: data files' footers read (statistics)", [("formats/iceberg/files.py", "data_file")]),
    ("  Iceberg: position-delete files written", [("formats/iceberg/files.py", "write_position_deletes")]),
    ("  Iceberg: the catalog commit (transaction)", [("pyiceberg/table/__init__.py", "commit_transaction")]),
    ("write spec (begin, end)", [("formats/iceberg/table.py", "write_spec"),
                                 ("formats/delta/table.py", "write_spec")]),
    ("log refresh (next version looked for)", [("formats/delta/log.py", "refresh")]),
    ("delta-rs handle (update_incremental / open)", [("formats/delta/handle.py", "table_at"),
                                                      ("~", "<method 'update_incremental' of 'deltalake._internal"
                                                            ".RawDeltaTable' objects>")]),
    ("Spark jobs waited for (py4j)", [("py4j/java_gateway.py", "__call__")]),
    ("after the commit (observers, maintenance, metrics)", [("spark/mirror.py", "account"),
                                                            ("spark/mirror.py", "observe")]),
    ("  of which: the maintenance check", [("mirror/upkeep.py", "after_batch")]),
]

# the job's own thread (its start; the batches run in Spark's callback thread): a one-collection job's table
START_STAGES = [("schema inferred from the channels", [("source/schema.py", "infer_collection")]),
                ("table opened", [("mirror/table.py", "open_table")])]
DRIVER_STAGES.insert(0, ("tables opened (schema inferred from the channels, table opened)",
                         [("spark/mirror_many.py", "_mirrored"), ("spark/mirror_many.py", "_prepare")]))

_SITE = textwrap.dedent('''
    import cProfile, sys, time
    _P = cProfile.Profile
    class _CPU(_P):
        def __init__(self, timer=None, *a, **kw):
            super().__init__(timer or time.process_time, *a, **kw)
    cProfile.Profile = _CPU
    class _OneThread:
        def find_spec(self, name, path=None, target=None):
            if name != "msgstream_spark.spark.mirror_tasks":
                return None
            sys.meta_path.remove(self)
            import importlib.util
            spec = importlib.util.find_spec(name)
            real = spec.loader.exec_module
            def exec_module(module):
                real(module)
                module._TaskTables._each = lambda tables, fn, items: [fn(i) for i in items]  # in this thread
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _OneThread())
''')


def _stage_seconds(stats: pstats.Stats, stages: list) -> dict[str, float]:
    out = {}
    for name, funcs in stages:
        total = 0.0
        for suffix, fn in funcs:
            for (file, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
                if func == fn and _file(file, suffix) and not _nested(stats, (file, _line, func), funcs):
                    total += ct
        out[name] = round(total, 2)
    return out


def _nested(stats: pstats.Stats, key: tuple, funcs: list) -> bool:
    """Whether every caller of ``key`` is itself one of ``funcs`` (its time already counted by that one)."""
    callers = stats.stats[key][4]
    if not callers:
        return False
    return all(any(c[2] == fn and _file(c[0], sfx) for sfx, fn in funcs) for c in callers)


def _file(file: str, suffix: str) -> bool:
    """Whether a profile's file is ``suffix`` (Spark's worker profiles name a module's file by its base name)."""
    return file.endswith(suffix) or file == os.path.basename(suffix)


def _total(stats: pstats.Stats) -> float:
    return round(stats.total_tt, 2)


class _Batches:
    """The driver's part of every batch (the ``foreachBatch`` functions, which Spark calls in a thread of its own)
    under one cProfile timing by the CPU clock."""

    def __init__(self) -> None:
        import cProfile
        import time

        from msgstream_spark.spark.mirror import MirrorBatch
        from msgstream_spark.spark.mirror_many import ManyBatch

        self.prof = cProfile.Profile(time.process_time)
        self.cpu = 0.0
        for cls in (MirrorBatch, ManyBatch):
            real = cls.__call__

            def call(obj, df, batch_id, _real=real):
                t0 = time.process_time()
                self.prof.enable()
                try:
                    return _real(obj, df, batch_id)
                finally:
                    self.prof.disable()
                    self.cpu += time.process_time() - t0

            cls.__call__ = call


def profile_job(spark, argv: list[str], out: Path, name: str) -> dict:
    import cProfile
    import time

    from bench.bench_mirror_many import _job

    spark.profile.clear()
    BATCHES.prof, BATCHES.cpu = cProfile.Profile(time.process_time), 0.0
    prof = BATCHES.prof
    main = cProfile.Profile(time.process_time)  # the job's thread: its start (a one-collection job's table opened)
    cpu0 = time.process_time()
    main.enable()
    wall, res = _job(spark, argv)
    main.disable()
    process_cpu = time.process_time() - cpu0
    driver_cpu = BATCHES.cpu
    (out / name).mkdir(parents=True, exist_ok=True)
    prof.dump_stats(str(out / name / "driver.pstats"))
    spark.profile.dump(str(out / name / "tasks"))
    tasks = [str(p) for p in (out / name / "tasks").glob("*.pstats")]
    task_stats = pstats.Stats(*tasks) if tasks else None
    drv = pstats.Stats(str(out / name / "driver.pstats"))
    main.dump_stats(str(out / name / "job_thread.pstats"))
    start = _stage_seconds(pstats.Stats(str(out / name / "job_thread.pstats")), START_STAGES)
    return {"wall_s": round(wall, 2), "batches": res.get("batches"), "driver_process_cpu_s": round(process_cpu, 2),
            "job_thread_start": start, "batch_thread_cpu_s": round(driver_cpu, 2),
            "driver": _stage_seconds(drv, DRIVER_STAGES),
            "tasks_cpu_s": _total(task_stats) if task_stats else 0.0,
            "tasks": _stage_seconds(task_stats, TASK_STAGES) if task_stats else {},
            "table_batch_medians": res.get("table_batch_medians")}


BATCHES: _Batches | None = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="profile_mirror_many", description=__doc__.splitlines()[0])
    ap.add_argument("--collections", type=int, default=20)
    ap.add_argument("--rows", type=int, default=5_000, help="rows per collection")
    ap.add_argument("--format", default="delta", choices=["delta", "iceberg"], help="the tables' format")
    ap.add_argument("--changes", type=int, default=0, help="changes (upserts and deletes) profiled after the load")
    ap.add_argument("--out", default="", help="where the .pstats files go (default: a temporary directory)")
    a = ap.parse_args(argv)
    site = Path(tempfile.mkdtemp(prefix="profile-site-"))
    (site / "sitecustomize.py").write_text(_SITE)
    # the Python workers (Spark gives them a PYTHONPATH of its own): the sitecustomize, this checkout first
    wrapper = site / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}{os.pathsep}{os.getcwd()}{os.pathsep}$PYTHONPATH" '
                       f'exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    os.environ["PYSPARK_PYTHON"] = str(wrapper)
    out = Path(a.out or tempfile.mkdtemp(prefix="profile-many-"))
    import bench.bench_mirror_many as b
    from bench._util import load_average

    work = Path(tempfile.mkdtemp(prefix="profile-many-work-"))
    os.environ["MSGSTREAM_KEY_CACHE_DIR"] = str(work / "key-cache")
    spark = b._spark()
    global BATCHES
    BATCHES = _Batches()
    spark.conf.set("spark.sql.pyspark.udf.profiler", "perf")
    spark.conf.set("spark.sql.pyspark.dataSource.profiler", "perf")
    b._warm(spark, work, (a.format,))
    (work / a.format).mkdir()
    s = b._Setup(work / a.format, a.collections, a.format, 1)
    b.write_load(s.log, s.names, s.many_ch, a.rows)
    b.write_load(s.log, ["big"], s.one_ch, a.rows * a.collections)
    result = {"format": a.format, "collections": a.collections, "rows_per_collection": a.rows,
              "load_start": load_average(), "database": profile_job(spark, s.database(), out, "database"),
              "one": profile_job(spark, s.one(), out, "one")}
    if a.changes:
        b.write_changes(s.log, s.names, s.many_ch, a.rows, a.changes)
        b.write_changes(s.log, ["big"], s.one_ch, a.rows * a.collections, a.changes)
        result["changes"] = a.changes
        result["changes_database"] = profile_job(spark, s.database(), out, "changes_database")
        result["changes_one"] = profile_job(spark, s.one(), out, "changes_one")
    result.update({"load_end": load_average(), "pstats": str(out)})
    print(json.dumps(result, indent=1), flush=True)
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)  # the logs and tables (the profiles stay in ``out``)
    shutil.rmtree(site, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
