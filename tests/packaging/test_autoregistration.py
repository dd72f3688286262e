"""format("msgstream") without register(), from a directory outside the repo, as installed by users.

pyspark registers Python data sources by listing the top-level ``pyspark_*`` modules on its worker's sys.path
(pyspark/sql/worker/lookup_data_sources.py). These tests run a user's program in a separate process from a temp
directory with the interpreter of each install kind: the editable install `make install` makes, and the built
wheel in a venv of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.login_env import login_env
from tests.fixtures.wheel_env import REPO

APP = Path(__file__).with_name("roundtrip_app.py")
EXPECTED = sorted(["insert", i, [float(i), float(i) + 0.5], f"n{i}"] for i in range(5))


def run_app(python: Path, cwd: Path) -> dict:
    env = {k: v for k, v in login_env().items()
           if k not in ("PYTHONPATH", "SPARK_HOME", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    try:
        done = subprocess.run([str(python), str(APP), str(cwd / "log.db"), "roundtrip-dml_0"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the program did not finish within 300 s\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _inside(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


@pytest.mark.slow
def test_editable_install_from_another_directory(tmp_path):
    out = run_app(Path(sys.executable), tmp_path)
    assert out["rows"] == EXPECTED
    assert Path(out["worker"][2]).resolve() == tmp_path.resolve()  # the workers ran outside the repo
    assert _inside(out["worker"][1], REPO)  # and still found the editable checkout's pyspark_msgstream


@pytest.mark.slow
def test_installed_wheel_in_a_fresh_venv(wheel_python, tmp_path):
    out = run_app(wheel_python, tmp_path)
    assert out["rows"] == EXPECTED
    venv = wheel_python.parent.parent
    for side in ("driver", "worker"):
        msgstream_file, pyspark_file, cwd = out[side]
        assert _inside(msgstream_file, venv) and _inside(pyspark_file, venv), out[side]  # the wheel, not the repo
        assert Path(cwd).resolve() == tmp_path.resolve()
    assert REPO.resolve() not in [Path(p).resolve() for p in out["sys_path"] if p]


@pytest.mark.slow
def test_shared_session_runs_outside_the_repo(spark):
    jvm_cwd = spark.sparkContext._jvm.System.getProperty("user.dir")
    worker_cwd = spark.sparkContext.parallelize([0], 1).map(lambda _: os.getcwd()).collect()[0]
    assert not _inside(jvm_cwd, REPO) and not _inside(worker_cwd, REPO), (jvm_cwd, worker_cwd)
