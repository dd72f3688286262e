"""Fault 3: Python workers of a Spark session (local[2] with task retries) SIGKILLed by pid mid-task, during
a batch read, a streaming read and a streaming write with the msgstream sink: the results are exact."""

from __future__ import annotations

import re
import time

import psutil
import pytest

from tests.chaos.harness import Driver
from tests.chaos.knobs import Figures, rng, size
from tests.spark.helpers import Publisher, spark_options

DRIVER_S = 480  # the driver runs its three phases with its kills: a bound below pytest-timeout's 600 s
PHASES = ("batch", "stream-read", "stream-write")


# Spark's Python daemons: pyspark's own, and the suite's (``spark.python.daemon.module``, tests/conftest.py)
DAEMONS = ("pyspark.daemon", "msgstream_spark.spark.daemon")


def _daemon_module(cmd: list[str]) -> str | None:
    """The worker module a ``python -m <daemon> [module]`` process serves, None for other processes."""
    daemon = next((d for d in DAEMONS if d in cmd), None)
    if daemon is None:
        return None
    rest = cmd[cmd.index(daemon) + 1:]
    return rest[0] if rest else "pyspark.worker"


def python_workers(driver_pid: int) -> list[psutil.Process]:
    """Task workers (``pyspark.worker``) forked by the daemon under the driver process. The daemons that serve
    the driver's own calls (planning, the streaming source and sink runners) are left alone: not tasks."""
    out: list[psutil.Process] = []
    try:
        procs = psutil.Process(driver_pid).children(recursive=True)
    except psutil.Error:
        return out
    for p in procs:
        try:
            if _daemon_module(p.cmdline()) == "pyspark.worker" and _daemon_module(p.parent().cmdline()) is None:
                out += p.children()  # the daemon's forks are the workers
        except psutil.Error:
            continue
    return out


def _phase(log: str) -> str | None:
    started = re.findall(r"phase (\S+) start", log)
    done = re.findall(r"phase (\S+) done", log)
    return started[-1] if started and (not done or done[-1] != started[-1]) else None


@pytest.mark.slow
def test_python_worker_killed_mid_task_results_exact(spark, local_env, tmp_path):
    env, rnd = local_env, rng("worker-kill")
    src, dst = [env.new_channel("wsrc"), env.new_channel("wsrc")], [env.new_channel("wdst"), env.new_channel("wdst")]
    client = env.client()
    pub = Publisher(client, src)
    pub.rounds(40, rows=150)  # 12,000 rows: tasks long enough to be hit
    pub.close()
    client.close()
    expected = [pk for op, pk, _ in pub.published if op == "insert"]
    spec = {"mode": "phases", "master": "local[2,4]", "root": str(tmp_path), "max_rows": 3000,
            "options": {**spark_options(env), "channels": ",".join(src), "startingPositions": "earliest",
                        "schema": "op string, pk bigint, vec array<float>, name string"},
            "sink_options": {**spark_options(env), "channels": ",".join(dst), "writerId": "chaos-worker",
                             "collection": "chaos", "primaryKey": "pk"}}
    d = Driver(spec, tmp_path, "worker-kill").start()
    killed = {p: 0 for p in PHASES}
    deadline = time.monotonic() + DRIVER_S
    try:
        while d.proc.poll() is None:
            assert time.monotonic() < deadline, f"the worker-kill driver did not end within {DRIVER_S} s\n{d.tail()}"
            phase = _phase(d.tail(100_000))
            workers = python_workers(d.proc.pid)
            if phase and workers and killed[phase] < size()["worker_kills"]:
                delay = rnd.uniform(0.0, 1.0)
                time.sleep(delay)  # the random moment, not a synchronisation
                victim = rnd.choice(workers)
                try:
                    victim.kill()
                    killed[phase] += 1
                    print(f"[chaos] worker-kill: {phase}: SIGKILL worker pid {victim.pid} {delay:.2f}s after seen",
                          flush=True)
                except psutil.Error:
                    pass
            time.sleep(0.05)
        assert d.wait(60) == 0, d.tail()
    finally:
        d.kill()
    log = d.tail(10_000_000)
    lost_tasks = len(re.findall(r"Lost task", log))
    for phase, got in (("batch", spark.read.parquet(str(tmp_path / "batch"))),
                       ("stream-read", spark.read.parquet(str(tmp_path / "stream"))),
                       ("stream-write", spark.read.format("msgstream").options(**spark_options(env))
                        .option("channels", ",".join(dst)).option("dedupe", "true")
                        .option("schema", "op string, pk bigint").load())):
        fig = Figures(f"worker-kill-{phase}", "local", injected=killed[phase])
        fig.count(expected, [r.pk for r in got.select("pk").collect()])
        fig.extra["spark_lost_task_lines_total"] = lost_tasks
        fig.save()
        assert (fig.rows_lost, fig.rows_duplicated, fig.extra["rows_unexpected"]) == (0, 0, 0), phase
    assert sum(killed.values()) >= 1
