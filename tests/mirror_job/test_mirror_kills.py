"""Kill points of the mirror's write path on the embedded log (nothing here depends on Milvus itself):

- a Python worker SIGKILLed while its task writes a micro-batch's data file: Spark retries the task, the table
  equals the published collection, no data file is referenced twice, the dead attempt's file was never
  published (a temporary file on a local store: an orphan once old, which ``vacuum`` removes);
- ``msgstream mirror compact`` SIGKILLed while it writes its files, before its commit and after it: the re-run
  compacts once, the table equals the collection before and after, the killed process's writer lease does not
  block the re-run, orphans are listed and vacuumed.

The job whose worker is killed is a process of its own; the ``msgstream`` commands after it run in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.mirror_job.synthetic_mirror import PUBLISHES, delta_files, expected, publish_argv, read_delta
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _cli(capfd, *argv: str) -> tuple[int, str, str]:
    """``msgstream ARGV`` in this process (nothing here kills it): its exit code, what it printed."""
    from msgstream_spark.cli.main import main as msgstream_cli

    capfd.readouterr()
    rc = msgstream_cli(list(argv))
    out = capfd.readouterr()
    return rc, out.out, out.err


def _published(local_env, tmp_path, name: str) -> tuple[str, list[str]]:
    from msgstream_spark.cli.main import main as msgstream_cli

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel(name) for _ in range(2)]
    for p in PUBLISHES:  # three publishes, each ending with a time tick: micro-batches end there
        assert msgstream_cli(publish_argv(cfg, chans, name, *p)) == 0
    return cfg, chans


def _orphans(capfd, table: Path, fmt: str = "delta", kind: str = "orphans") -> list[str]:
    """``mirror orphans``' data files of ``kind`` (``orphans``: all; ``left_by_writers``: no version referenced)."""
    rc, out, err = _cli(capfd, "mirror", "orphans", "--table", str(table), "--table-format", fmt)
    assert rc == 0, err[-2000:]
    return [p for p in json.loads(out)[kind] if p.endswith(".parquet")]


def test_a_python_worker_killed_while_writing_a_batch_is_retried_once(local_env, tmp_path, capfd, python_forks):
    from msgstream_spark.spark.mirror import FAILPOINT_ENV

    cfg, chans = _published(local_env, tmp_path, "mkw")
    table = tmp_path / "t"
    # local[2,4]: tasks retried up to 4 times (local[2] fails the job on the first task failure)
    argv = ["--config", cfg, "--collection", "mkw", "--table", str(table), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--master", "local[2,4]",
            "--max-rows-per-trigger", "150", "--progress-interval", "2"]
    env = dict(os.environ, **{FAILPOINT_ENV: "kill-worker-in-files:0", "MSGSTREAM_JOBS_QUIET": "0"},
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "msgstream_spark.jobs.mirror", *argv], cwd=tmp_path, env=env,
                          timeout=900, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Python worker exited unexpectedly (crashed)" in proc.stderr  # Spark saw the SIGKILL, retried the task
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["merged_batches"] >= 2 and summary["skipped_batches"] == 0

    want = expected(PUBLISHES)
    assert read_delta(str(table)) == want
    files = delta_files(str(table))
    assert len(files) == len(set(files))  # no data file referenced twice
    # the killed attempt published no data file (the job's compactions leave expired history, vacuumed later)
    assert _orphans(capfd, table, kind="left_by_writers") == []
    dead = [os.path.join(d, n) for d, _, ns in os.walk(table / "data") for n in ns if n.endswith(".tmp")]
    assert len(dead) == 1  # its half-written file stayed a temporary one (rows written, no footer)
    with pytest.raises(Exception, match="(?i)parquet"):
        pq.read_metadata(dead[0])
    os.utime(dead[0], (time.time() - 7200, time.time() - 7200))  # an hour later: an orphan, then vacuumed

    rc, out, err = _cli(capfd, "mirror", "vacuum", "--table", str(table), "--table-format", "delta",
                        "--retain-hours", "0")
    assert rc == 0, err[-2000:]
    assert dead[0] in json.loads(out)["removed"] and not os.path.exists(dead[0])
    assert _orphans(capfd, table) == [] and read_delta(str(table)) == want
