"""Moving parts of the chaos tests: continuous producers, a killable driver process, bounded waits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.fixtures.login_env import login_env
from tests.spark.helpers import Publisher

DRIVER = Path(__file__).with_name("driver.py")


def wait_for(cond: Callable[[], bool], timeout: float, what: str, alive: Callable[[], None] | None = None,
             poll: float = 0.1) -> float:
    """Poll ``cond`` until true (returns the seconds it took) or fail after ``timeout`` naming ``what``."""
    t0 = time.monotonic()
    while not cond():
        if alive is not None:
            alive()
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)
    return time.monotonic() - t0


def commits(chk: Path) -> int:
    """Micro-batches the streaming query has committed (files in ``<chk>/commits``)."""
    d = chk / "commits"
    return len([p for p in d.iterdir() if p.name.isdigit()]) if d.is_dir() else 0


class Producers:
    """Keeps writing rounds (one insert per channel, then a tick on each) from a thread until stopped.

    Send failures (a broker restarting) are retried with the same round, so what ``published``
    lists was acknowledged exactly once by the backend.
    """

    def __init__(self, env, channels: list[str], rows: int = 10, pause: float = 0.1) -> None:
        self.env, self.channels, self.rows, self.pause = env, channels, rows, pause
        self.client = env.client()
        self.pub = Publisher(self.client, channels)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="chaos-producers")
        self.errors: list[str] = []
        self.rounds = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.pub.rounds(1, rows=self.rows)
                self.rounds += 1
            except Exception as exc:  # noqa: BLE001 - a broker fault; recorded, and the test decides
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                self._stop.wait(0.5)
                continue
            self._stop.wait(self.pause)

    def start(self) -> Producers:
        self._t.start()
        return self

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._t.join(60)
        self.pub.close()
        self.client.close()

    @property
    def inserted(self) -> list[int]:
        return [pk for op, pk, _ch in self.pub.published if op == "insert"]


class Driver:
    """``driver.py`` as its own process group, started from a directory outside the repo."""

    def __init__(self, spec: dict, logdir: Path, name: str) -> None:
        self.spec, self.logdir, self.name = spec, logdir, name
        self.proc: subprocess.Popen | None = None
        self.cwd = Path(tempfile.mkdtemp(prefix="chaos-driver-"))

    def start(self) -> Driver:
        env = login_env(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        env.pop("PYTHONPATH", None)
        self.log = open(self.logdir / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(self.spec)], cwd=self.cwd,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        return self

    def alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"driver {self.name} exited with {self.proc.returncode}: {self.tail()}")

    def tail(self, n: int = 3000) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.logdir / f"{self.name}.log").read_text(errors="replace")[-n:]

    def kill(self) -> None:
        """SIGKILL the driver's whole process group (its JVM and Python workers)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)
        self.log.close()

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"driver {self.name} did not finish within {timeout:.0f}s: {self.tail()}") from None
        self.log.close()
        return code
