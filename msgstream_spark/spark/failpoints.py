"""Test failpoints a Spark task of the mirror runs (shipped from the driver: executors lack its environment).

``kill-worker-in-files:<batch>``: the Python worker SIGKILLs itself with its data file open;
``kill-executor-in-files:<batch>|first``: it SIGKILLs its executor JVM (found among its ancestors, checked to be
``java ... CoarseGrainedExecutorBackend``) after writing a marker into the executor's working directory.
"""

from __future__ import annotations

import json
import os
import signal

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.write.layout import TaskWriter


def worker_failpoint(w: TaskWriter, kill: str) -> None:
    """Tests: in the first attempt of the batch's first task, with its data file open (rows written, no
    footer), ``kill`` = "worker": the Python worker SIGKILLs itself; "executor": it SIGKILLs its executor JVM,
    then itself (as the pyspark daemon would kill it once the JVM is gone). Spark retries the task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None or ctx.partitionId() != 0 or ctx.attemptNumber() != 0 or not w.open_files():
        return
    if kill == "executor":
        jvm = executor_jvm(os.getpid())
        # the proof a test reads: a marker in the executor's working directory (standalone: work/<app>/<id>/)
        marker = os.path.realpath(f"/proc/{jvm}/cwd/{KILL_MARKER}")
        with open(marker, "w") as f:
            json.dump({"executor_pid": jvm, "file": w.open_files()[0], "partition": ctx.partitionId(),
                       "task": ctx.taskAttemptId()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.kill(jvm, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


KILL_MARKER = "msgstream-failpoint-kill-executor.json"
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _proc(pid: int) -> tuple[int, list[str]]:
    """The parent pid and the command line of ``pid``, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the name, in parentheses, may hold spaces
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    return ppid, argv


def executor_jvm(pid: int, depth: int = 4) -> int:
    """The pid of the executor JVM (``java ... CoarseGrainedExecutorBackend``) among the ancestors of ``pid``
    (a Python worker: its parent is the ``pyspark.daemon``, whose parent is the JVM); a MirrorError if none."""
    seen = []
    for _ in range(depth):
        try:
            pid = _proc(pid)[0]
            argv = _proc(pid)[1]
        except (OSError, ValueError, IndexError) as exc:
            raise MirrorError(f"failpoint kill-executor-in-files: cannot read /proc of pid {pid}'s parent: "
                              f"{exc}") from exc
        seen.append(f"{pid} ({os.path.basename(argv[0]) if argv else '?'})")  # no arguments: they may hold secrets
        if argv and os.path.basename(argv[0]) == "java" and EXECUTOR_MAIN in argv:
            return pid
        if pid <= 1:
            break
    raise MirrorError("failpoint kill-executor-in-files: no executor JVM (java ... " + EXECUTOR_MAIN + ") among "
                      "this task's ancestors (local mode has none; it runs on a cluster only): " + "; ".join(seen))
