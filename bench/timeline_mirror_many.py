"""The wall timeline of the database job's batches (issue #44), next to one job over one collection of the same rows:
per batch, the driver's phases (wall and the phase thread's CPU) and the Spark jobs it ran (from Spark's event log:
each job's submission and completion, its stages, its tasks' launch, deserialization and run times).

``python -m bench.timeline_mirror_many [--collections N] [--rows N] [--format delta|iceberg]
[--table-concurrency C] [--show BATCH]``: the logs of ``bench.bench_mirror_many`` (the load), an untimed warm-up,
then the database job and the one-collection job. Prints, per job, the medians over its batches (the first left
out: the tables' creation) of each phase's wall seconds (phases run by several threads at once: the union of their
intervals) and CPU seconds (summed over threads), the Spark jobs a batch ran and their wall, and the gap between
batches (Spark's own per-trigger work: offsets, planning the read, its commit log); ``--show`` prints one batch's
timeline in full. Wall times move with the machine's load: compare the counted events and CPU first.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

EVENTS: list[tuple[str, str, float, float, float]] = []  # (phase, thread, wall start, wall end, thread CPU)
_LOCK = threading.Lock()


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0, c0 = time.time(), time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            with _LOCK:
                EVENTS.append((name, threading.current_thread().name, t0, time.time(), time.thread_time() - c0))
    return wrapper


# (module, attribute path, phase): functions wrapped in place (module-level names as their callers see them)
PHASES = [
    ("msgstream_spark.spark.mirror_many", "ManyBatch.__call__", "batch"),
    ("msgstream_spark.spark.mirror", "MirrorBatch.__call__", "batch"),
    ("msgstream_spark.spark.mirror_many", "batch_facts", "facts job"),
    ("msgstream_spark.spark.mirror_many", "direct_facts", "facts job"),
    ("msgstream_spark.spark.mirror_many_write", "write_units", "write job"),
    ("msgstream_spark.spark.mirror_many", "ManyBatch._prepare", "tables prepared"),
    ("msgstream_spark.spark.mirror_many", "ManyBatch._mirrored", "tables looked up/opened"),
    ("msgstream_spark.mirror.many", "ManyState.save", "collections.json saved"),
    ("msgstream_spark.spark.mirror_many_write", "ManyWrite._begin", "begin (per table)"),
    ("msgstream_spark.spark.mirror_many_write", "ManyWrite._write", "write step"),
    ("msgstream_spark.spark.mirror_many_write", "collect_written", "write job"),
    ("msgstream_spark.spark.mirror_many_write", "collect_planned", "write job"),
    ("msgstream_spark.spark.mirror_many_write", "ManyWrite._files", "live files (per table)"),
    ("msgstream_spark.spark.mirror_many_write", "ManyWrite._plan", "plan step"),
    ("msgstream_spark.spark.mirror_many_write", "plan_targets", "plan job"),
    ("msgstream_spark.spark.mirror_many_write", "ManyWrite._commit", "commit step"),
    ("msgstream_spark.spark.mirror_many_write", "finish_batch", "finish (per table)"),
    ("msgstream_spark.mirror.write.batch", "commit_plan", "commit (per table)"),
    ("msgstream_spark.spark.mirror", "begin_batch", "begin_batch listing (per table)"),
    ("msgstream_spark.spark.mirror", "end_batch", "end_batch (per table)"),
    ("msgstream_spark.spark.mirror", "MirrorBatch.observe", "observers (per table)"),
    ("msgstream_spark.spark.mirror", "MirrorBatch.account", "account (per table)"),
    ("msgstream_spark.spark.mirror", "write_in_tasks", "write job"),
    ("msgstream_spark.spark.mirror", "plan_in_tasks", "plan job"),
    ("msgstream_spark.spark.mirror_many_direct", "DirectRead.tasks", "read tasks planned"),
    ("msgstream_spark.spark.mirror_many_direct", "DirectRead.facts", "facts job (tasks' read)"),
    ("msgstream_spark.mirror.many_ahead", "Ahead.stop", "read-ahead joined (its tables opened)"),
    ("msgstream_spark.mirror.many_ahead", "Ahead._run", "read-ahead thread (tables opened, leases, live files)"),
]


def install(py4j: bool = False) -> None:
    """The phases wrapped; ``py4j``: every call into the JVM too, a phase per method name (``py4j:<name>``)."""
    import importlib

    if py4j:
        from py4j.java_gateway import JavaMember

        real = JavaMember.__call__

        def call(self, *a):
            t0, c0 = time.time(), time.thread_time()
            try:
                return real(self, *a)
            finally:
                with _LOCK:
                    EVENTS.append((f"py4j:{self.name}", threading.current_thread().name, t0, time.time(),
                                   time.thread_time() - c0))

        JavaMember.__call__ = call

    for mod, path, name in PHASES:
        m = importlib.import_module(mod)
        owner, attr = (m, path) if "." not in path else (getattr(m, path.split(".")[0]), path.split(".")[1])
        if hasattr(owner, attr):
            setattr(owner, attr, _timed(name, getattr(owner, attr)))


def _union(iv: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for a, b in sorted(iv):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def spark_events(path: Path) -> dict:
    """Spark's event log: jobs (submitted, completed, stages), stages' tasks (launch, finish, times)."""
    jobs: dict[int, dict] = {}
    stage_job: dict[int, int] = {}
    for f in sorted(p for p in path.rglob("events_*") if p.is_file()):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            ev = e.get("Event")
            if ev == "SparkListenerJobStart":
                j = jobs[e["Job ID"]] = {"start": e["Submission Time"] / 1000, "tasks": [], "stages": e["Stage IDs"]}
                for s in e["Stage IDs"]:
                    stage_job[s] = e["Job ID"]
                j["call"] = (e.get("Properties") or {}).get("callSite.short", "")
            elif ev == "SparkListenerJobEnd":
                jobs[e["Job ID"]]["end"] = e["Completion Time"] / 1000
            elif ev == "SparkListenerTaskEnd":
                ti, tm = e["Task Info"], e.get("Task Metrics") or {}
                j = jobs.get(stage_job.get(e["Stage ID"]))
                if j is not None:
                    j["tasks"].append({"launch": ti["Launch Time"] / 1000, "finish": ti["Finish Time"] / 1000,
                                       "deser": tm.get("Executor Deserialize Time", 0) / 1000,
                                       "run": tm.get("Executor Run Time", 0) / 1000,
                                       "cpu": tm.get("Executor CPU Time", 0) / 1e9})
    return jobs


def per_batch(jobs: dict, events: list) -> list[dict]:
    batches = sorted((e for e in events if e[0] == "batch"), key=lambda e: e[2])
    out = []
    prev_end = None
    for b in batches:
        t0, t1 = b[2], b[3]
        ph: dict[str, list] = {}
        for e in events:
            if e[0] != "batch" and t0 <= e[2] <= t1:
                ph.setdefault(e[0], []).append(e)
        js = [j for j in jobs.values() if t0 - 0.05 <= j["start"] <= t1 and "end" in j]
        row = {"wall": t1 - t0, "gap_before": (t0 - prev_end) if prev_end else None, "start": t0,
               "phases": {k: {"wall": _union([(e[2], e[3]) for e in v]), "cpu": sum(e[4] for e in v), "n": len(v),
                              "from": min(e[2] for e in v) - t0, "to": max(e[3] for e in v) - t0}
                          for k, v in ph.items()},
               "spark_jobs": [{"call": j["call"], "wall": j["end"] - j["start"], "at": j["start"] - t0,
                               "tasks": len(j["tasks"]), "stages": len(j["stages"]),
                               "first_launch": (min(t["launch"] for t in j["tasks"]) - j["start"]) if j["tasks"] else 0,
                               "task_run": sum(t["run"] for t in j["tasks"]),
                               "task_jvm_cpu": sum(t["cpu"] for t in j["tasks"]),
                               "task_deser": sum(t["deser"] for t in j["tasks"]),
                               "after_last_task": (j["end"] - max(t["finish"] for t in j["tasks"]))
                               if j["tasks"] else 0}
                              for j in sorted(js, key=lambda j: j["start"])]}
        row["spark_job_wall"] = _union([(j["start"], j["end"]) for j in js])
        out.append(row)
        prev_end = t1
    return out


def summary(rows: list[dict]) -> dict:
    rows = rows[1:] if len(rows) > 2 else rows
    names = sorted({k for r in rows for k in r["phases"]})
    med = {k: {m: round(median([r["phases"].get(k, {}).get(m, 0.0) for r in rows]), 3) for m in ("wall", "cpu")}
           for k in names}
    return {"batches": len(rows), "batch_wall": round(median([r["wall"] for r in rows]), 3),
            "gap_before": round(median([r["gap_before"] or 0 for r in rows]), 3),
            "spark_jobs": median([len(r["spark_jobs"]) for r in rows]),
            "spark_job_wall": round(median([r["spark_job_wall"] for r in rows]), 3),
            "outside_spark_jobs": round(median([r["wall"] - r["spark_job_wall"] for r in rows]), 3),
            "py4j_calls": median([sum(v["n"] for k, v in r["phases"].items() if k.startswith("py4j:")) for r in rows]),
            "phases": med}


def _ends(rows: list[dict], span: tuple[float, float]) -> dict:
    """Where a job's wall went outside its batches: its start before the first batch, the batches (summed), the
    gaps between them (Spark's per-trigger work), its end after the last."""
    if not rows:
        return {}
    last = rows[-1]["start"] + rows[-1]["wall"]
    return {"before_first_batch": round(rows[0]["start"] - span[0], 3),
            "first_batch": round(rows[0]["wall"], 3),
            "batches_summed": round(sum(r["wall"] for r in rows), 3),
            "gaps_summed": round(sum(r["gap_before"] or 0 for r in rows), 3),
            "after_last_batch": round(span[1] - last, 3)}


def _before(events: list, rows: list[dict], span: tuple[float, float]) -> dict:
    """The phases that began before the job's first batch (the read-ahead thread's): wall, CPU, and when each ended
    after the first batch began (negative: before it)."""
    first = rows[0]["start"] if rows else span[1]
    out: dict = {}
    for e in events:
        if e[0] != "batch" and e[2] < first:
            got = out.setdefault(e[0], {"wall": 0.0, "cpu": 0.0, "ends_after_first_batch": -1e9})
            got["wall"] += e[3] - e[2]
            got["cpu"] += e[4]
            got["ends_after_first_batch"] = max(got["ends_after_first_batch"], e[3] - first)
    return {k: {m: round(v, 3) for m, v in d.items()} for k, d in out.items()}


def _show(rows: list[dict], i: int) -> None:
    if i >= len(rows):
        return
    r = rows[i]
    print(f"  batch #{i}: {r['wall']:.3f} s, {len(r['spark_jobs'])} Spark jobs ({r['spark_job_wall']:.3f} s)")
    for j in r["spark_jobs"]:
        print(f"    +{j['at']:.3f} job {j['call'][:40]:40} {j['wall']:.3f} s, {j['stages']} stages, {j['tasks']} tasks "
              f"(first launch +{j['first_launch']:.3f}, run {j['task_run']:.3f}, "
              f"JVM CPU {j['task_jvm_cpu']:.3f}, deser {j['task_deser']:.3f}, "
              f"end after last task {j['after_last_task']:.3f})")
    for k, v in sorted(r["phases"].items(), key=lambda kv: kv[1]["from"]):
        print(f"    +{v['from']:.3f}..+{v['to']:.3f} {k:34} wall {v['wall']:.3f} cpu {v['cpu']:.3f} x{v['n']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="timeline_mirror_many", description=__doc__.splitlines()[0])
    ap.add_argument("--collections", type=int, default=20)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--format", default="delta", choices=["delta", "iceberg"])
    ap.add_argument("--table-concurrency", type=int, default=4)
    ap.add_argument("--show", type=int, default=3, help="a batch whose timeline is printed in full")
    ap.add_argument("--py4j", action="store_true", help="each call into the JVM timed too")
    ap.add_argument("--batch-read", default="tasks", choices=["tasks", "stream"],
                    help="the database job's --batch-read (default tasks)")
    ap.add_argument("--changes", type=int, default=0,
                    help="after the load, this many changes (as bench_mirror_many's) and both jobs again")
    a = ap.parse_args(argv)
    import bench.bench_mirror_many as b
    from bench._util import load_average

    work = Path(tempfile.mkdtemp(prefix="timeline-many-"))
    os.environ["MSGSTREAM_KEY_CACHE_DIR"] = str(work / "key-cache")
    logs = work / "eventlog"
    logs.mkdir()
    from pyspark.sql import SparkSession
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        os.environ.setdefault(var, sys.executable)
    (SparkSession.builder.master("local[2]").config("spark.eventLog.enabled", "true")
     .config("spark.eventLog.dir", str(logs)).config("spark.eventLog.compress", "false")
     .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark = b._spark()
    install(a.py4j)
    b._warm(spark, work, (a.format,))
    (work / a.format).mkdir()
    s = b._Setup(work / a.format, a.collections, a.format, a.table_concurrency)
    s.batch_read = a.batch_read
    b.write_load(s.log, s.names, s.many_ch, a.rows)
    b.write_load(s.log, ["big"], s.one_ch, a.rows * a.collections)
    EVENTS.clear()
    load0 = load_average()
    res = {}
    runs = [("database", s.database()), ("one", s.one())]
    if a.changes:
        runs += [("database changes", s.database()), ("one changes", s.one())]
    for name, argv_ in runs:
        if name == "database changes":
            b.write_changes(s.log, s.names, s.many_ch, a.rows, a.changes)
            b.write_changes(s.log, ["big"], s.one_ch, a.rows * a.collections, a.changes)
        n0, t0 = len(EVENTS), time.time()
        wall, r = b._job(spark, argv_)
        res[name] = {"wall": round(wall, 2), "driver_cpu_s": r["driver_cpu_s"], "events": EVENTS[n0:],
                     "span": (t0, time.time())}
    spark.stop()
    jobs = spark_events(logs)
    out = {"load_start": load0, "load_end": load_average()}
    for name, r in res.items():
        rows = per_batch(jobs, r["events"])
        print(f"{name}: {r['wall']} s, driver CPU {r['driver_cpu_s']} s, {len(rows)} batches")
        _show(rows, a.show if "changes" not in name else 0)
        out[name] = {"wall_s": r["wall"], "driver_cpu_s": r["driver_cpu_s"], **_ends(rows, r["span"]), **summary(rows),
                     "before_first_batch_phases": _before(r["events"], rows, r["span"])}
    print(json.dumps(out, indent=1), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
