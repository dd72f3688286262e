"""Installed like a library (issue #31): the wheel's only top-level import names are ``msgstream_spark`` and
``pyspark_msgstream``, and the jobs are ``msgstream`` commands that run the installed package's jobs from any
directory, one holding a ``jobs/`` package of its own (a data team's scripts folder) included."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.login_env import login_env
from tests.fixtures.wheel_env import REPO
from tests.jobs.test_jobs import table
from tests.sink.helpers import config_file

TOP_LEVEL = {"msgstream_spark", "pyspark_msgstream"}
JOB_MODULES = ("ingest", "replay", "publish", "mirror", "mirror_start", "demo", "_common")
# command words -> the job's module
COMMANDS = {("ingest",): "ingest", ("replay",): "replay", ("spark-publish",): "publish", ("demo",): "demo",
            ("mirror", "run"): "mirror"}


def test_the_wheel_installs_only_the_two_top_level_names(built_wheel, tmp_path):
    with zipfile.ZipFile(built_wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/RECORD")).rsplit("/", 1)[0]
        declared = set(z.read(f"{info}/top_level.txt").decode().split())
        scripts = z.read(f"{info}/entry_points.txt").decode()
    assert {n.split("/")[0] for n in names} - {info} == TOP_LEVEL
    assert declared == TOP_LEVEL
    assert {f"msgstream_spark/jobs/{m}.py" for m in JOB_MODULES} <= set(names)
    assert "msgstream = msgstream_spark.cli.main:main" in scripts
    # installed: the two packages, the metadata and the `msgstream` script, nothing else
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                           str(target), str(built_wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p.name for p in target.iterdir()} == TOP_LEVEL | {info, "bin"}
    assert [p.name for p in (target / "bin").iterdir()] == ["msgstream"]


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n.split("/")[0] for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}


@pytest.mark.slow
def test_the_cluster_wheel_ignores_a_build_directory_of_the_old_layout(tmp_path):
    """setuptools packs what build/lib holds: a checkout built before the move still has build/lib/jobs/."""
    spec = importlib.util.spec_from_file_location("pack_env", REPO / "tools" / "pack_env.py")
    pack_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pack_env)
    root = tmp_path / "checkout"
    shutil.copytree(REPO, root, ignore=pack_env.NOT_SOURCE)
    stale = root / "build" / "lib" / "jobs"
    stale.mkdir(parents=True)
    (stale / "__init__.py").write_text("")
    (stale / "ingest.py").write_text("STALE = True\n")
    wheel = pack_env.build_wheel(tmp_path / "wheel", root=root)
    assert _top_level(wheel) == TOP_LEVEL


def _their_project(root: Path) -> Path:
    """A directory with a ``jobs`` package whose every module (and the package itself) fails loudly."""
    (root / "jobs").mkdir(parents=True)
    (root / "jobs" / "__init__.py").write_text('raise SystemExit("their jobs package was imported")\n')
    for name in JOB_MODULES:
        (root / "jobs" / f"{name}.py").write_text(f'raise SystemExit("their jobs.{name} ran")\n')
    return root


def _env(python: Path) -> dict[str, str]:
    env = {k: v for k, v in login_env().items()
           if k not in ("PYTHONPATH", "SPARK_HOME", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    return env


def _run(cmd: list, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=_env(Path(cmd[0]).parent / "python"))


@pytest.mark.slow
def test_each_command_runs_the_installed_job_beside_a_jobs_package_of_their_own(wheel_python, local_env,
                                                                                  tmp_path):
    cwd = _their_project(tmp_path / "their-project")
    venv = wheel_python.parent.parent
    msgstream = wheel_python.parent / "msgstream"
    site_jobs = Path(_run([wheel_python, "-c", "import msgstream_spark.jobs as j; print(j.__path__[0])"],
                          cwd).stdout.strip())
    assert site_jobs.is_relative_to(venv)  # the wheel's, not this checkout's
    # what the issue was about: `python -m jobs.<name>` from their directory runs theirs
    assert "their jobs package was imported" in _run([wheel_python, "-m", "jobs.ingest", "--help"], cwd).stderr
    for words, mod in COMMANDS.items():
        for cmd in ([msgstream, *words], [wheel_python, "-m", f"msgstream_spark.jobs.{mod}"]):
            done = _run([*cmd, "--help"], cwd)
            assert done.returncode == 0 and "usage: " in done.stdout, (cmd, done.stderr[-2000:])
            assert "their jobs" not in done.stdout + done.stderr
        path = _run([msgstream, "job-path", " ".join(words[:1])], cwd)
        assert path.returncode == 0 and Path(path.stdout.strip()) == site_jobs / f"{mod}.py"
    # and one job runs to its summary from there: rows published by the Spark-free CLI, ingested through Spark
    cfg = config_file(local_env, tmp_path)
    pub = _run([msgstream, "publish", "--config", cfg, "--channels", "own-dml_0", "--synthetic", "120",
                "--dim", "4", "--no-progress"], cwd)
    assert pub.returncode == 0, pub.stderr[-3000:]
    out = tmp_path / "events"
    ing = _run([msgstream, "ingest", "--config", cfg, "--channels", "own-dml_0", "--output", out,
                "--checkpoint", tmp_path / "chk", "--master", "local[1]"], cwd, timeout=420)
    assert ing.returncode == 0, ing.stderr[-4000:]
    assert json.loads(ing.stdout[ing.stdout.index("{"):])["rows"] == 120
    assert sorted(table(out).column("pk").to_pylist()) == list(range(120))

