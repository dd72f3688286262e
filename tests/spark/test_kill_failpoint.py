"""The test failpoint ``kill-executor-in-files`` kills only an executor JVM: how it finds one among a task's
ancestors in /proc (Linux), on real process trees shaped as Spark's (JVM -> pyspark.daemon -> worker). The kill
itself is tested on the standalone cluster (tests/cluster/test_cluster_jobs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.spark.failpoints import EXECUTOR_MAIN, executor_jvm

ROOT = Path(__file__).resolve().parents[2]
# the "worker": prints what executor_jvm finds among its ancestors; the "daemon": its parent
WORKER = ("import os\nfrom msgstream_spark.spark.failpoints import executor_jvm\n"
          "try:\n    print(executor_jvm(os.getpid()))\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
DAEMON = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {WORKER!r}], check=True)\n"


def _tree(main_class: str) -> tuple[int, str]:
    """A process named ``java`` with ``main_class`` in its arguments (a shell: ``exec -a``), whose child runs
    the daemon, whose child runs the worker; the java process's pid and the worker's output."""
    # "; exit" keeps the shell (it would exec a lone command and so stop being the "java" process)
    script = f'exec -a java bash -c \'"$0" -c "$1"; exit $?\' {sys.executable} "$DAEMON" {main_class} --executor-id 7'
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, DAEMON=DAEMON, PYTHONPATH=str(ROOT)))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return proc.pid, out.strip()


def test_the_executor_jvm_is_found_among_the_task_ancestors():
    pid, out = _tree(EXECUTOR_MAIN)
    assert out == str(pid)


def test_a_java_process_that_is_not_an_executor_is_never_chosen():
    _, out = _tree("org.apache.spark.deploy.SparkSubmit")  # the driver's JVM (local mode): refused
    assert out.startswith("MirrorError") and "no executor JVM" in out and " (java)" in out


def test_no_executor_jvm_fails_loudly():
    with pytest.raises(MirrorError, match="no executor JVM"):
        executor_jvm(os.getpid())
