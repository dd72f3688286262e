"""msgstream_spark/spark/daemon.py: Spark's Python daemon with msgstream's modules imported before it forks workers.

The suite's drivers run with it (``spark.python.daemon.module``, tests/conftest.py); here the daemon alone (a
process started as Spark starts it: it prints its port on stdout and ends when its stdin closes), its fallback to
pyspark's own daemon, the reseeding of a fork, and a session's task workers forked from it.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import textwrap

import pytest

DAEMON = "msgstream_spark.spark.daemon"


def start_daemon(tmp_path, timeout: float = 120, **env: str) -> subprocess.Popen:
    """``python -m msgstream_spark.spark.daemon pyspark.worker`` as Spark starts it (OMP_NUM_THREADS: Spark sets it
    to the task's cores), outside the repository; returned once it has written its port (4 bytes) on stdout, within
    ``timeout`` seconds."""
    proc = subprocess.Popen([sys.executable, "-m", DAEMON, "pyspark.worker"], cwd=tmp_path, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    port = proc.stdout.read(4) if ready else b""
    if len(port) != 4:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"the daemon wrote no port within {timeout} s: exit {proc.returncode}\n"
                             f"{proc.stderr.read().decode()[-3000:]}")
    return proc


def stop_daemon(proc: subprocess.Popen) -> str:
    """Close its stdin (Spark's way to end it: pyspark's daemon then exits with 1); its stderr."""
    proc.stdin.close()
    try:
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.stderr.read().decode()


def facts(pid: int) -> dict:
    """What /proc shows of a process: its command line, its threads, whether pyarrow's library is loaded."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = [a.decode() for a in f.read().split(b"\0") if a]
    with open(f"/proc/{pid}/maps") as f:
        arrow = "libarrow.so" in f.read()
    return {"cmd": cmd, "threads": len(os.listdir(f"/proc/{pid}/task")), "arrow": arrow}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_daemon_serves_with_the_modules_loaded_and_one_thread(tmp_path):
    proc = start_daemon(tmp_path)
    try:
        seen = facts(proc.pid)
    finally:
        err = stop_daemon(proc)
    assert seen["cmd"][1:] == ["-m", DAEMON, "pyspark.worker"], seen  # no fallback
    assert seen["arrow"] and seen["threads"] == 1, seen  # pyarrow imported, and no thread a fork would lose
    assert "threads after importing" not in err, err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_thread_left_by_the_imports_makes_it_run_pyspark_daemon_instead(tmp_path):
    # pyarrow's jemalloc with its background thread: a library that starts a thread when imported
    proc = start_daemon(tmp_path, JE_ARROW_MALLOC_CONF="background_thread:true")
    try:
        seen = facts(proc.pid)
    finally:
        err = stop_daemon(proc)
    assert seen["cmd"][1:] == ["-m", "pyspark.daemon", "pyspark.worker"], seen  # the same process, exec'd
    assert not seen["arrow"] and seen["threads"] == 1, seen  # nothing of the imports kept
    said = rf"{DAEMON}: [2-9] threads after importing msgstream's modules; .* running pyspark.daemon instead"
    assert re.search(said, err), err


def test_forked_workers_draw_their_own_random_numbers(tmp_path):
    """numpy's global generator is reseeded in each fork, as in a worker that imported numpy itself."""
    script = textwrap.dedent("""
        import os, sys
        from msgstream_spark.spark import daemon
        daemon.preload("pyspark.worker")
        os.register_at_fork(after_in_child=daemon._reseed_numpy)
        import numpy as np
        draws = []
        for _ in range(2):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, repr(float(np.random.random())).encode())
                os._exit(0)
            os.close(w)
            draws.append(os.read(r, 100).decode())
            os.waitpid(pid, 0)
        print(draws[0], draws[1])
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.split()
    assert first != second


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sessions_task_workers_fork_from_it(spark):
    if spark.conf.get("spark.python.daemon.module", None) != DAEMON:
        pytest.skip("the suite's Python daemon is off: SPARK_SUBMIT_OPTS was set without it (tests/conftest.py)")

    def report(batches):
        import os

        import pandas as pd

        for _ in batches:
            pass
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            cmd = [a.decode() for a in f.read().split(b"\0") if a]
        with open(f"/proc/{parent}/maps") as f:
            arrow = "libarrow.so" in f.read()
        yield pd.DataFrame({"daemon": [" ".join(cmd[1:])], "arrow": [arrow]})

    rows = spark.range(2, numPartitions=2).mapInPandas(report, "daemon string, arrow boolean").collect()
    assert {(r.daemon, r.arrow) for r in rows} == {(f"-m {DAEMON} pyspark.worker", True)}

