"""The jobs end to end on the embedded backend: publish, ingest, replay, the demo, arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.dataset as ds
import pytest

from tests.fixtures.login_env import login_env
from tests.sink.helpers import config_file, deleted_keys, inserted_rows, read_all

pytestmark = pytest.mark.slow


def ns(**kw):
    base = dict(config=None, master=None, option=[], format=None)
    base.update(kw)
    return SimpleNamespace(**base)


def publish_args(cfg, chans, rows, start=0, delete_fraction=0.0, dim=8):
    """The job's own parser builds them, as from a command line (every other option at its default)."""
    from msgstream_spark.jobs import publish

    return publish.build_parser().parse_args([
        "--config", cfg, "--channels", ",".join(chans), "--synthetic", str(rows), "--dim", str(dim),
        "--start", str(start), "--num-tasks", "2", "--delete-fraction", str(delete_fraction), "--collection", "jobs"])


def table(path):
    return ds.dataset(str(path), format="parquet").to_table()


def test_publish_job_writes_synthetic_rows_and_deletes(spark, backend, tmp_path):
    from msgstream_spark.jobs import publish

    local_env = backend
    chans = [local_env.new_channel("pub") for _ in range(2)]
    summary = publish.run(publish_args(config_file(local_env, tmp_path), chans, 500, delete_fraction=0.1), spark)
    assert summary["inserted"] == 500 and summary["deleted"] == 50
    with local_env.client() as c:
        got = read_all(c, chans)
    rows = [r for ch in chans for r in inserted_rows(got[ch])]
    assert sorted(r["pk"] for r in rows) == list(range(500))
    assert {len(r["vec"]) for r in rows} == {8}
    assert sorted(k for ch in chans for k in deleted_keys(got[ch])) == list(range(0, 500, 10))


def test_ingest_then_replay_from_a_saved_position(spark, backend, tmp_path):
    local_env = backend
    from msgstream_spark.cli.commands import latest_position
    from msgstream_spark.jobs import ingest, publish, replay

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("ing") for _ in range(2)]
    publish.run(publish_args(cfg, chans, 300, delete_fraction=0.1), spark)
    out, chk = tmp_path / "events", tmp_path / "chk"
    iargs = ns(config=cfg, channels=",".join(chans), output=str(out), format="parquet", checkpoint=str(chk),
               subscription="it-ingest", starting="earliest", trigger="available-now", max_rows_per_trigger=None,
               dedupe=False, partition_by=None, timeout=None, progress_interval=1.0)
    s1 = ingest.run(iargs, spark)
    t = table(out)
    ops = t.column("op").to_pylist()
    assert ops.count("insert") == 300 and ops.count("delete") == 30 and s1["rows"] == 330
    assert {"_channel", "_ts"} <= set(t.column_names)
    with local_env.client() as c:
        saved = [latest_position(c, ch) for ch in chans]
    pos_file = tmp_path / "pos.json"
    pos_file.write_text(json.dumps([p.to_json_dict() for p in saved]))
    publish.run(publish_args(cfg, chans, 100, start=300), spark)
    s2 = ingest.run(iargs, spark)  # incremental: only the new rows
    assert s2["rows"] == 100 and table(out).num_rows == 430
    rout = tmp_path / "replay"
    r = replay.run(ns(config=cfg, channels=",".join(chans), output=str(rout), format="parquet", mode="overwrite",
                      start="@" + str(pos_file), from_ts=None, end=None, to_ts=None, dedupe=False), spark)
    assert r["rows"] == 100
    assert sorted(table(rout).column("pk").to_pylist()) == list(range(300, 400))


def test_demo_runs_green_with_small_sizes(tmp_path, python_forks):
    msgstream = Path(sys.executable).parent / "msgstream"  # the installed command (make demo: its python -m form)
    proc = subprocess.run([str(msgstream), "demo", "--num-rows", "3000", "--num-more-rows", "1000", "--dim", "16",
                           "--workdir", str(tmp_path / "demo")], capture_output=True, text=True, timeout=540,
                          env=login_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "checks: OK" in proc.stdout and "deprecated" not in proc.stderr  # the demo's own calls: new spellings
    events = table(tmp_path / "demo" / "lake" / "events")
    assert events.num_rows == 3000 + 1000 + 150 + 50  # 5% of the keys deleted


@pytest.mark.parametrize("job", ["ingest", "replay", "publish", "demo", "mirror"])
def test_help_and_usage_errors(job, capsys, monkeypatch):
    """The checkout's launch files (jobs/<name>.py) keep working, run in-process as ``python -m jobs.<name>`` runs
    them (runpy; test_a_launch_file_runs_as_a_process: one as a process); the commands:
    tests/cli/test_job_commands.py."""
    import runpy

    for argv, code in ((["--help"], 0), (["--no-such-flag"], 2)):
        monkeypatch.setattr(sys, "argv", [f"jobs/{job}.py", *argv])
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            runpy.run_module(f"jobs.{job}", run_name="__main__", alter_sys=True)
        out = capsys.readouterr()
        assert exc.value.code == code and "usage:" in (out.out if code == 0 else out.err), (argv, out)


def test_a_launch_file_runs_as_a_process():
    ok = subprocess.run([sys.executable, "-m", "jobs.mirror", "--help"], capture_output=True, text=True, timeout=120,
                        env=login_env())
    assert ok.returncode == 0 and "usage:" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "jobs.mirror", "--no-such-flag"], capture_output=True, text=True,
                         timeout=120, env=login_env())
    assert bad.returncode == 2 and "usage:" in bad.stderr


def test_bad_trigger_is_a_usage_error():
    bad = subprocess.run([sys.executable, "-m", "msgstream_spark", "ingest", "--channels", "a", "--table", "/tmp/x",
                          "--trigger", "sometimes"], capture_output=True, text=True, timeout=120,
                         env=login_env())
    assert bad.returncode == 2 and "msgstream ingest: error: --trigger must be" in bad.stderr


def test_publish_runs_under_spark_submit(local_env, tmp_path, capsys):
    """The job's installed file, as ``msgstream job-path`` prints it (README "Running on a cluster")."""
    from msgstream_spark.cli.main import main as msgstream_cli

    assert msgstream_cli(["job-path", "spark-publish"]) == 0
    job_file = capsys.readouterr().out.strip()
    venv_bin = Path(sys.executable).parent
    submit = venv_bin / "spark-submit"
    if not submit.exists():
        pytest.skip("spark-submit is not installed next to the interpreter")
    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("ss") for _ in range(2)]
    env = login_env(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([str(submit), "--master", "local[2]", job_file,
                           "--config", cfg, "--channels", ",".join(chans), "--synthetic", "400", "--dim", "4"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert json.loads(out[out.index("{"):out.rindex("}") + 1])["inserted"] == 400
    with local_env.client() as c:
        got = read_all(c, chans)
    assert sorted(r["pk"] for ch in chans for r in inserted_rows(got[ch])) == list(range(400))
