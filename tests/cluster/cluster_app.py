"""One spark-submit application for the jobs of tests/cluster/test_cluster_jobs.py: tests/cluster/job_runs.py,
started once for the module (``cluster_app``), each job a step the test sends and waits for.

Every application starts a driver and an executor and unpacks the shipped environment on both (~35 s of CPU on
a 2-core machine): the module's jobs (publish, ingest, replay, three mirror runs, a database job, the probe) share
one. What a job printed is its part of the app's output, cut at the ``JOB-END`` lines.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.spark_cluster import Submitter

JOB_RUNS = Path(__file__).with_name("job_runs.py")


class ClusterApp:
    """The running application: :meth:`step` sends a step and waits for its end; :meth:`send` / :meth:`wait` do
    it in two (a job the test interacts with while it runs); :meth:`stop_streams` ends a processing-time job."""

    def __init__(self, submit: Submitter, env: dict[str, str], umask: int, inbox: Path) -> None:
        self.submit, self.inbox, self.messages = submit, inbox, 0
        inbox.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(submit.command(JOB_RUNS, str(inbox)), cwd=submit.cwd, env={**submit.env(), **env},
                                     umask=umask, text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.out: list[str] = []
        self.err: list[str] = []
        self.ends: queue.Queue = queue.Queue()  # (index, exit code, the step's stdout lines)
        self.sent = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._pump_out, daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True).start()

    def _pump_out(self) -> None:
        part: list[str] = []
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.out.append(line)
            if line.startswith("JOB-END "):
                _, i, rc = line.split()
                self.ends.put((int(i), int(rc), part))
                part = []
            else:
                part.append(line)
        self.ends.put(None)

    @staticmethod
    def _pump(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def _write(self, message: dict) -> None:
        """A message for the app (job_runs.py): written, then renamed to the next ``msg-<n>.json``."""
        with self.lock:
            assert self.proc.poll() is None, f"the cluster app has exited\n{self.failure()}"
            tmp = self.inbox / f".msg-{self.messages}.tmp"
            tmp.write_text(json.dumps(message))
            os.replace(tmp, self.inbox / f"msg-{self.messages}.json")
            self.messages += 1

    def send(self, step: dict) -> int:
        """Send a step; its index (for :meth:`wait`)."""
        self._write(step)
        self.sent += 1
        return self.sent - 1

    def wait(self, index: int, timeout: float = 420) -> subprocess.CompletedProcess:
        """The step's end (bounded): its exit code and what it printed on stdout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.ends.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"step {index} of the cluster app did not end within {timeout:.0f} s\n{self.failure()}")
            assert got is not None, f"the cluster app ended before step {index}\n{self.failure()}"
            i, rc, lines = got
            if i >= index:  # an earlier step's end: one a failed test no longer awaited
                break
        assert i == index, f"step {i} ended while step {index} was awaited"
        return subprocess.CompletedProcess(self.proc.args, rc, "\n".join(lines), "")

    def step(self, step: dict, timeout: float = 420) -> subprocess.CompletedProcess:
        return self.wait(self.send(step), timeout)

    def job(self, file: str | Path, *args, env: dict[str, str] | None = None,
            timeout: float = 420) -> subprocess.CompletedProcess:
        """Run a job file as spark-submit runs it, in the app; fails the test unless it exits 0."""
        done = self.step({"file": str(file), "args": [str(a) for a in args], "env": env or {}}, timeout)
        assert done.returncode == 0, f"{file}: exit {done.returncode}\n{self.failure()}"
        return done

    def mirror(self, *args, env: dict[str, str] | None = None) -> int:
        """Send a run of the mirror job (``SUMMARY <json>`` in its output); its index."""
        return self.send({"mirror": [str(a) for a in args], "env": env or {}})

    def stop_streams(self) -> None:
        self._write({"stop": True})

    def running(self) -> None:
        """Raise when the app has exited (a wait's ``alive``)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"the cluster app exited {self.proc.returncode}\n{self.failure()}")

    def output(self) -> str:
        """Everything the app printed so far, stdout and stderr."""
        return "\n".join(self.out) + "\n" + "\n".join(self.err)

    def failure(self) -> str:
        return self.submit.failure(subprocess.CompletedProcess(self.proc.args, self.proc.poll(), "\n".join(self.out),
                                                               "\n".join(self.err)))

    def close(self, timeout: float = 120) -> None:
        if self.proc.poll() is None:
            self._write({"end": True})
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def driver_umask() -> tuple[int, int]:
    """(the Worker's umask, the driver's): the driver creates its files under a umask other than the Worker's, so
    who created a file shows in its mode."""
    worker = os.umask(0o022)
    os.umask(worker)
    return worker, 0o077 if worker != 0o077 else 0o022


@pytest.fixture(scope="module")
def cluster_app(spark_cluster, cluster_submit, s3_server, tmp_path_factory):
    """The module's application; its driver has the S3 server's credentials (AWS_* variables, as a user exports
    them) and shows Spark's log lines (MSGSTREAM_JOBS_QUIET=0); the Worker has neither."""
    app = ClusterApp(cluster_submit, {**s3_server.env(), "MSGSTREAM_JOBS_QUIET": "0"}, driver_umask()[1],
                     tmp_path_factory.mktemp("cluster-app-inbox"))
    try:
        yield app
    finally:
        app.close()
