"""Where the cores go when one long channel is read by 1 task and by 2 (the bound of ``bench_read_shape``'s split).

Runs the split case of ``bench_read_shape`` (one channel of M rows, local[2], noop sink; 1 task vs
``minPartitions=2``), interleaved, and for each run samples the CPU time of every process under this
one: the Spark JVM and the Python workers it starts. Prints, per case, wall seconds and the cores each
side kept busy (CPU seconds / wall seconds). On local[2] the two cases share a ceiling of 2 cores: a
1-task read that already keeps ~C cores busy can gain at most 2 / C from a second task.

    python -m bench.profile_split [--rows 2000000] [--dim 8] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import psutil

from bench._util import median

SIDES = ("jvm", "python workers")


def _side(p: psutil.Process) -> str | None:
    try:
        name = p.name()
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return None
    if name == "java" or "java" in name:
        return "jvm"
    if "pyspark" in cmd or "python" in name:
        return "python workers"
    return None


def _cpu() -> dict[str, float]:
    """CPU seconds (user + system, children that exited and were waited for included) per side."""
    out = dict.fromkeys(SIDES, 0.0)
    for p in psutil.Process(os.getpid()).children(recursive=True):
        side = _side(p)
        if side is None:
            continue
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[side] += t.user + t.system + t.children_user + t.children_system
    return out


def measure(fn) -> tuple[float, dict[str, float]]:
    before, t0 = _cpu(), time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    after = _cpu()
    return wall, {k: (after[k] - before[k]) / wall for k in SIDES}


def run(rows: int = 2_000_000, dim: int = 8, reps: int = 3, stop: bool = True, warmup: bool = True) -> dict:
    """``stop`` False: the SparkSession is left running (for a caller that goes on using it); ``warmup`` False: no
    untimed first read of each case."""
    from bench import bench_read_shape as shape
    from bench.bench_spark_read import publish
    from msgstream_spark.config import Config

    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/split.db"
        publish(Config.from_dict({"mq": {"type": "local"}, "local": {"path": path}}), rows, dim, text=False,
                channels=["long_0"])
        base = {"mq.type": "local", "local.path": path, "channels": "long_0"}
        cases = {"1 task": base, "2 tasks": {**base, "minPartitions": "2"}}
        spark = shape._spark()
        try:
            for o in cases.values() if warmup else ():
                shape._spark_read(spark, o)  # warm-up: workers started, plans stored
            got: dict[str, list] = {k: [] for k in cases}
            for _ in range(reps):
                for k, o in cases.items():
                    got[k].append(measure(lambda o=o: shape._spark_read(spark, o)))
        finally:
            if stop:
                spark.stop()
    res: dict = {}
    print(f"-- one channel of {rows:,} rows ({dim}-d), local[2], noop sink, median of {reps} interleaved runs")
    head = "".join(f"{s + ' cores':>22}" for s in SIDES)
    print(f"{'case':<10}{'wall s':>9}{'rows/s':>12}{head}{'all cores':>12}")
    for k, runs in got.items():
        wall = median([w for w, _ in runs])
        cores = {s: median([c[s] for _, c in runs]) for s in SIDES}
        res[k] = {"wall_s": wall, "rows_s": rows / wall, "cores": cores, "all_cores": sum(cores.values())}
        print(f"{k:<10}{wall:>9.2f}{rows / wall:>12,.0f}" + "".join(f"{cores[s]:>22.2f}" for s in SIDES)
              + f"{sum(cores.values()):>12.2f}")
    one = res["1 task"]["all_cores"]
    res["ratio"] = res["1 task"]["wall_s"] / res["2 tasks"]["wall_s"]
    res["ceiling"] = 2.0 / one if one > 0 else None
    print(f"2 tasks read at {res['ratio']:.2f}x one task's rate; one task already keeps {one:.2f} of the 2 cores "
          f"busy, so local[2] allows at most {res['ceiling']:.2f}x")
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    run(a.rows, a.dim, a.reps)
