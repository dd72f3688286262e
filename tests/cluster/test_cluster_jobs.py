"""The jobs on a Spark standalone cluster, submitted from outside the repo, on Kafka (tansu).

ingest and replay are submitted as the README says without a checkout (the file ``job-path`` prints in the
unpacked environment), publish through a checkout's launch file (jobs/publish.py).

The worker's own Python has neither msgstream-spark nor its dependencies; the jobs run only
because ``spark-submit --archives <packed env>#environment`` ships them (tools/pack_env.py).
Each job's output is checked row by row against what the broker holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from msgstream_spark.cli.data import SYNTHETIC_CATEGORIES
from tests.fixtures.spark_cluster import SparkCluster
from tests.jobs.test_jobs import table
from tests.sink.helpers import config_file, deleted_keys, inserted_rows, read_all

# Each spark-submit starts a driver and an executor and unpacks the archive on both: ~30 s on an idle
# 2-core machine, minutes on a loaded one; every submit is bounded by Submitter.run's own timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobs"
DIM = 8


def summary(proc: subprocess.CompletedProcess) -> dict:
    """The JSON summary a job prints last on stdout."""
    # spark-submit merges the Python driver's stderr (log lines) into stdout; the summary is printed
    # with indent=2, so it starts and ends with a brace alone on a line.
    lines = proc.stdout.splitlines()
    start = max(i for i, ln in enumerate(lines) if ln == "{")
    end = lines.index("}", start)
    return json.loads("\n".join(lines[start:end + 1]))


def broker_rows(env, chans) -> tuple[dict, set]:
    """{(channel, pk): row} of every insert and {(channel, pk)} of every delete on the broker."""
    with env.client() as c:
        got = read_all(c, chans)
    inserts = {(ch, r["pk"]): r for ch in chans for r in inserted_rows(got[ch])}
    deletes = {(ch, k) for ch in chans for k in deleted_keys(got[ch])}
    return inserts, deletes


def table_rows(path) -> tuple[dict, set]:
    """The same shape from a job's output table (``op``, fields, ``_channel``)."""
    inserts, deletes = {}, set()
    for r in table(path).to_pylist():
        key = (r["_channel"], r["pk"])
        if r["op"] == "insert":
            assert key not in inserts, f"row {key} written twice"
            inserts[key] = {k: r[k] for k in ("pk", "category", "score", "vec")}
        else:
            assert r["op"] == "delete", r
            deletes.add(key)
    return inserts, deletes


def test_the_worker_python_lacks_the_package_and_executors_use_the_shipped_env(spark_cluster, cluster_submit):
    worker_python = getattr(spark_cluster, "worker_python", None)
    if worker_python is None:
        pytest.skip("an external cluster: its workers' Python is not known here")
    bare = subprocess.run([worker_python, "-c", "import msgstream_spark"], capture_output=True, text=True,
                          timeout=60, cwd=cluster_submit.cwd.parent)
    assert bare.returncode != 0 and "No module named 'msgstream_spark'" in bare.stderr
    proc = cluster_submit.run(ROOT / "tests" / "cluster" / "probe_app.py", worker_python)
    assert proc.returncode == 0, cluster_submit.failure(proc)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE "))
    probe = json.loads(line[len("PROBE "):])
    shipped, plain = probe["shipped"], probe["bare"]
    work = str(spark_cluster.work_dir)
    # Executors run the shipped environment, unpacked in their own work directory...
    assert shipped["python"] == f"{shipped['cwd']}/environment/bin/python" and shipped["cwd"].startswith(work)
    assert shipped["realpath"] == worker_python
    assert shipped["msgstream_spark"].startswith(f"{shipped['cwd']}/environment/lib/")
    # ...while the same interpreter without it cannot import the package.
    assert plain["realpath"] == worker_python
    assert plain["msgstream_spark"].startswith("ImportError") and "msgstream_spark" in plain["msgstream_spark"]


def test_publish_ingest_replay_on_the_cluster(cluster_submit, kafka_env, tmp_path):
    from msgstream_spark.cli.commands import latest_position
    from msgstream_spark.cli.main import main as msgstream_cli

    cfg = config_file(kafka_env, tmp_path)
    chans = [kafka_env.new_channel("cl") for _ in range(2)]

    # publish: 300 synthetic rows sharded over two channels, then deletes of every 10th key
    proc = cluster_submit.run(JOBS / "publish.py", "--config", cfg, "--channels", ",".join(chans),
                              "--synthetic", "300", "--dim", str(DIM), "--delete-fraction", "0.1",
                              "--partitions", "2", "--collection", "cluster")
    assert proc.returncode == 0, cluster_submit.failure(proc)
    assert (summary(proc)["inserted"], summary(proc)["deleted"]) == (300, 30)
    inserts, deletes = broker_rows(kafka_env, chans)
    assert sorted(pk for _, pk in inserts) == list(range(300))
    for (_, pk), row in inserts.items():
        assert row["category"] == SYNTHETIC_CATEGORIES[pk % len(SYNTHETIC_CATEGORIES)]
        assert row["score"] == pytest.approx((pk % 1000) / 10.0) and len(row["vec"]) == DIM
    assert sorted(pk for _, pk in deletes) == list(range(0, 300, 10))

    # ingest: the channels into a Parquet change log, equal to the broker's content row by row
    ingest_file = cluster_submit.job_path("ingest")
    assert Path(ingest_file).resolve().is_relative_to((cluster_submit.cwd / "environment").resolve())
    assert ingest_file.endswith("/site-packages/msgstream_spark/jobs/ingest.py")
    out = tmp_path / "events"
    proc = cluster_submit.run(ingest_file, "--config", cfg, "--channels", ",".join(chans),
                              "--output", str(out), "--checkpoint", str(tmp_path / "chk"),
                              "--subscription", "cluster-ingest", "--progress-interval", "1")
    assert proc.returncode == 0, cluster_submit.failure(proc)
    assert summary(proc)["rows"] == 330
    assert table_rows(out) == (inserts, deletes)

    # replay: from positions saved now, over 100 rows published afterwards (by the CLI, no Spark)
    with kafka_env.client() as c:
        saved = [latest_position(c, ch).to_json_dict() for ch in chans]
    pos_file = tmp_path / "pos.json"
    pos_file.write_text(json.dumps(saved))
    assert msgstream_cli(["publish", "--config", cfg, "--channels", ",".join(chans), "--synthetic", "100",
                          "--start", "300", "--dim", str(DIM), "--collection", "cluster", "--no-progress"]) == 0
    more, _ = broker_rows(kafka_env, chans)
    new = {k: v for k, v in more.items() if k[1] >= 300}
    assert len(new) == 100
    rout = tmp_path / "replay"
    proc = cluster_submit.run(cluster_submit.job_path("replay"), "--config", cfg, "--channels", ",".join(chans),
                              "--output", str(rout), "--from", "@" + str(pos_file))
    assert proc.returncode == 0, cluster_submit.failure(proc)
    assert summary(proc)["rows"] == 100
    assert table_rows(rout) == (new, set())


def _modes(paths) -> set[int]:
    return {Path(p).stat().st_mode & 0o777 for p in paths}


def test_mirror_on_the_cluster_its_tasks_write_the_table(spark_cluster, cluster_submit, kafka_env, tmp_path):
    """The mirror job (``job-path mirror``) on the cluster, ``--snapshot never`` on Kafka: the batches' data files
    are written by the executors' tasks (created under the Worker's umask, the driver's log commits under the
    driver's own), and the table read by delta-rs alone equals the published rows (inserts, updates, deletes),
    with nothing added twice, although the first batch's first task SIGKILLs its executor JVM mid-file
    (``kill-executor-in-files:first``): the Worker relaunches an executor, Spark reruns the lost tasks, the dead
    attempt's file is never published (a temporary file on this local table). One run (one spark-submit): a run
    that resumes from its checkpoint reading only what came after is tests/mirror_job/test_mirror_checkpoint.py's,
    in-process (docs/testing.md, "Moves")."""
    from msgstream_spark.cli.main import main as msgstream_cli
    from msgstream_spark.spark.failpoints import KILL_MARKER
    from msgstream_spark.spark.mirror import FAILPOINT_ENV
    from tests.mirror_job.synthetic_mirror import PUBLISHES, delta_files, expected, publish_argv, read_delta

    cfg = config_file(kafka_env, tmp_path)
    chans = [kafka_env.new_channel("clm") for _ in range(2)]
    # 200 rows, every 10th deleted; 50..69 again (updated vectors); 200..229 (new keys); 100..109 again, deleted
    publishes = [*PUBLISHES[:2], (200, 30, 0.0), PUBLISHES[2]]
    for p in publishes:
        assert msgstream_cli(publish_argv(cfg, chans, "clmirror", *p)) == 0
    table = tmp_path / "t"
    mirror = cluster_submit.job_path("mirror")
    assert mirror.endswith("/site-packages/msgstream_spark/jobs/mirror.py")
    argv = ["--config", cfg, "--collection", "clmirror", "--table", str(table), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--max-rows-per-trigger", "150",
            "--progress-interval", "2"]
    # the driver creates its files 0600; the executors, children of the Worker, under the Worker's umask
    worker_umask = os.umask(0o022)
    os.umask(worker_umask)
    driver_umask = 0o077 if worker_umask != 0o077 else 0o022
    proc = cluster_submit.run(mirror, *argv, umask=driver_umask,
                              env={FAILPOINT_ENV: "kill-executor-in-files:first", "MSGSTREAM_JOBS_QUIET": "0"})
    assert proc.returncode == 0, cluster_submit.failure(proc)
    run = summary(proc)
    assert run["merged_batches"] >= 2 and run["stream_rows"] == 290 and run["skipped_batches"] == 0
    assert read_delta(str(table)) == expected(publishes)
    files = delta_files(str(table))
    assert len(files) == len(set(files))  # no data file referenced twice
    data = [table / f for f in files]
    commits = list((table / "_delta_log").glob("*.json"))
    if isinstance(spark_cluster, SparkCluster):  # the Worker's umask is known: it was started here
        assert _modes(data) == {0o666 & ~worker_umask}, "data files not written by the executors"
        assert _modes(commits) == {0o666 & ~driver_umask}, "log commits not written by the driver"
    import deltalake

    batches = [(h.get("msgstream.query_id"), h.get("msgstream.batch_id")) for h in
               deltalake.DeltaTable(str(table)).history() if h.get("msgstream.batch_id") is not None]
    assert len(batches) == len(set(batches)) == run["merged_batches"]

    done = subprocess.run([sys.executable, "-m", "msgstream_spark", "mirror", "orphans", "--table", str(table),
                           "--table-format", "delta"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    orphans = {os.path.realpath(p) for p in json.loads(done.stdout)["orphans"]}
    live = {os.path.realpath(table / f) for f in files}
    if isinstance(spark_cluster, SparkCluster):  # the kill, seen from the Worker's side
        markers = list(spark_cluster.work_dir.glob(f"app-*/*/{KILL_MARKER}"))
        assert len(markers) == 1, f"the executor was not killed: no marker\n{cluster_submit.failure(proc)}"
        killed = json.loads(markers[0].read_text())
        app = markers[0].parent.parent
        assert len([d for d in spark_cluster.executor_dirs() if d.parent == app]) >= 2  # the Worker relaunched one
        assert "Lost executor" in proc.stdout + proc.stderr  # the driver saw its executor die
        dead = os.path.realpath(killed["file"])
        assert not os.path.exists(dead) and dead not in orphans | live  # the killed attempt published nothing:
        tmp = list(Path(dead).parent.glob(f".{Path(dead).name}.*.tmp"))  # its half-written temporary file
        assert len(tmp) == 1
        with pytest.raises(Exception, match="(?i)parquet"):
            pq.read_metadata(tmp[0])  # rows written, no footer
    assert not orphans & live
