"""The Spark jobs as ``msgstream`` commands (issue #31): the job's own flags and errors under the command's name,
``job-path``, and a CLI that loads neither pyspark nor a job until a job command runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import msgstream_spark.jobs
from msgstream_spark.cli.main import main
from tests.fixtures.login_env import login_env

# command words -> module of msgstream_spark.jobs
COMMANDS = {("ingest",): "ingest", ("replay",): "replay", ("spark-publish",): "publish", ("demo",): "demo",
            ("mirror", "run"): "mirror"}
JOBS_DIR = Path(msgstream_spark.jobs.__file__).parent


def _run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120,
                          env=login_env(), cwd=cwd)


def _flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))


def _exit(capsys, run, argv: list[str]) -> tuple[int, str, str]:
    """``run(argv)`` in this process: its exit code (argparse exits) and what it printed."""
    capsys.readouterr()
    try:
        code = run(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("words", list(COMMANDS), ids=" ".join)
def test_a_job_command_has_the_jobs_flags_and_errors(words, capsys):
    """In-process: the command's parser is the job's own (what a process adds is
    test_the_command_and_the_job_module_run_as_processes's)."""
    import importlib

    job_main = importlib.import_module(f"msgstream_spark.jobs.{COMMANDS[words]}").main
    cmd_rc, cmd_out, cmd_err = _exit(capsys, main, [*words, "--help"])
    job_rc, job_out, job_err = _exit(capsys, job_main, ["--help"])
    assert cmd_rc == 0 and job_rc == 0, cmd_err + job_err
    assert cmd_out.startswith(f"usage: msgstream {' '.join(words)} [-h]")
    assert _flags(cmd_out) == _flags(job_out) and "--master" in _flags(cmd_out)
    bad_rc, _, bad_err = _exit(capsys, main, ["-v", *words, "--no-such-flag"])
    assert bad_rc == 2
    assert f"msgstream {' '.join(words)}: error: " in bad_err


def test_the_command_and_the_job_module_run_as_processes():
    """One job command as users run it: ``python -m msgstream_spark`` and the job's module as a script."""
    cmd = _run("msgstream_spark", "mirror", "run", "--help")
    job = _run("msgstream_spark.jobs.mirror", "--help")
    assert cmd.returncode == 0 and job.returncode == 0, cmd.stderr + job.stderr
    assert cmd.stdout.startswith("usage: msgstream mirror run [-h]")
    assert _flags(cmd.stdout) == _flags(job.stdout) and "--master" in _flags(cmd.stdout)
    bad = _run("msgstream_spark", "-v", "mirror", "run", "--no-such-flag")
    assert bad.returncode == 2 and "msgstream mirror run: error: " in bad.stderr


def test_publish_keeps_its_spark_free_meaning(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["publish", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: msgstream publish") and "--batch-rows" in out and "--master" not in out


def test_job_path_prints_the_installed_job_file(capsys):
    for name, mod in [("ingest", "ingest"), ("replay", "replay"), ("spark-publish", "publish"), ("demo", "demo"),
                      ("mirror", "mirror")]:
        assert main(["job-path", name]) == 0
        assert Path(capsys.readouterr().out.strip()) == JOBS_DIR / f"{mod}.py"
    with pytest.raises(SystemExit) as exc:
        main(["job-path", "publish"])  # the Spark-free publish has no job file
    assert exc.value.code == 2


def test_the_cli_loads_no_job_and_no_pyspark_until_a_job_command_runs(tmp_path):
    probe = ("import sys\nfrom msgstream_spark.cli.main import main\n"
             "for argv in (['--help'], ['mirror', '--help'], ['publish', '--help']):\n"
             "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "assert main(['job-path', 'mirror']) == 0\n"
             "print(sorted(m for m in sys.modules if m.startswith(('pyspark', 'msgstream_spark.jobs.'))))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env=login_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
