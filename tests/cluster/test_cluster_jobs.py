"""The jobs on a Spark standalone cluster, submitted from outside the repo, on Kafka (tansu).

The module's jobs run in one spark-submit application (tests/cluster/cluster_app.py, tests/cluster/job_runs.py: one
driver and executor, and one unpacking of the shipped environment by each, for all of them): publish through a
checkout's launch file (jobs/publish.py); ingest and replay, the files ``job-path`` prints in the unpacked
environment, as the README says without a checkout, each run as spark-submit runs a file; the mirror job's ``run``
(three tables, then a database job), into tables on the S3 server with no directory shared between the driver and
the Worker.

The worker's own Python has neither msgstream-spark nor its dependencies; the jobs run only
because ``spark-submit --archives <packed env>#environment`` ships them (tools/pack_env.py).
Each job's output is checked row by row against what the broker holds.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from msgstream_spark.cli.data import SYNTHETIC_CATEGORIES
from tests.cluster.cluster_app import driver_umask as driver_umask_of
from tests.fixtures.spark_cluster import SparkCluster
from tests.jobs.test_jobs import table
from tests.sink.helpers import config_file, deleted_keys, inserted_rows, read_all

# The application starts a driver and an executor and unpacks the archive on both: ~30 s on an idle 2-core
# machine, minutes on a loaded one; every step is bounded by ClusterApp.wait's own timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobs"
DIM = 8
# a file name with a uuid in it (data files, key indexes, Iceberg metadata and manifests; not a Delta log's number)
UNIQUE_NAME = r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


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


def test_the_worker_python_lacks_the_package(spark_cluster, cluster_submit):
    """The Worker's own interpreter cannot import msgstream_spark: the jobs below run only because the packed
    environment is shipped. Where executors find it, with and without that environment, is asked in the mirror
    test's last step (``{"probe": ...}``, :func:`check_probe`): one spark-submit fewer."""
    worker_python = getattr(spark_cluster, "worker_python", None)
    if worker_python is None:
        pytest.skip("an external cluster: its workers' Python is not known here")
    bare = subprocess.run([worker_python, "-c", "import msgstream_spark"], capture_output=True, text=True,
                          timeout=60, cwd=cluster_submit.cwd.parent)
    assert bare.returncode != 0 and "No module named 'msgstream_spark'" in bare.stderr


def check_probe(spark_cluster, proc: subprocess.CompletedProcess) -> None:
    """Executors run the shipped environment, unpacked in their own work directory, while the Worker's own
    interpreter without it cannot import the package (tests/cluster/job_runs.py's probe step's report)."""
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE "))
    probe = json.loads(line[len("PROBE "):])
    shipped, plain = probe["shipped"], probe["bare"]
    work = str(spark_cluster.work_dir)
    assert shipped["python"] == f"{shipped['cwd']}/environment/bin/python" and shipped["cwd"].startswith(work)
    assert shipped["realpath"] == spark_cluster.worker_python
    assert shipped["msgstream_spark"].startswith(f"{shipped['cwd']}/environment/lib/")
    assert plain["realpath"] == spark_cluster.worker_python
    assert plain["msgstream_spark"].startswith("ImportError") and "msgstream_spark" in plain["msgstream_spark"]


def test_publish_ingest_replay_on_the_cluster(cluster_app, cluster_submit, kafka_env, tmp_path):
    """publish through the checkout's launch file; then ingest and replay, the files ``job-path`` prints in the
    unpacked environment, each run as spark-submit runs a file (steps of the module's application)."""
    from msgstream_spark.cli.commands import latest_position
    from msgstream_spark.cli.main import main as msgstream_cli

    cfg = config_file(kafka_env, tmp_path)
    chans = [kafka_env.new_channel("cl") for _ in range(2)]

    # publish: 300 synthetic rows sharded over two channels, then deletes of every 10th key
    proc = cluster_app.job(JOBS / "publish.py", "--config", cfg, "--channels", ",".join(chans),
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

    # positions saved now, then 100 rows published afterwards (by the CLI, no Spark): what replay reads
    with kafka_env.client() as c:
        saved = [latest_position(c, ch).to_json_dict() for ch in chans]
    pos_file = tmp_path / "pos.json"
    pos_file.write_text(json.dumps(saved))
    assert msgstream_cli(["publish", "--config", cfg, "--channels", ",".join(chans), "--synthetic", "100",
                          "--start", "300", "--dim", str(DIM), "--collection", "cluster", "--no-progress"]) == 0
    more, more_deletes = broker_rows(kafka_env, chans)
    new = {k: v for k, v in more.items() if k[1] >= 300}
    assert len(new) == 100 and more_deletes == deletes

    # ingest: the channels into a Parquet change log, equal to the broker's content row by row; replay: from
    # the saved positions, the 100 rows only
    ingest_file, replay_file = cluster_submit.job_path("ingest"), cluster_submit.job_path("replay")
    for f in (ingest_file, replay_file):
        assert Path(f).resolve().is_relative_to((cluster_submit.cwd / "environment").resolve())
    assert ingest_file.endswith("/site-packages/msgstream_spark/jobs/ingest.py")
    out, rout = tmp_path / "events", tmp_path / "replay"
    ingest_out = cluster_app.job(ingest_file, "--config", cfg, "--channels", ",".join(chans),
                                 "--output", str(out), "--checkpoint", str(tmp_path / "chk"),
                                 "--subscription", "cluster-ingest", "--progress-interval", "1")
    replay_out = cluster_app.job(replay_file, "--config", cfg, "--channels", ",".join(chans),
                                 "--output", str(rout), "--from", "@" + str(pos_file))
    for done in (ingest_out, replay_out):
        assert done.returncode == 0, cluster_app.failure()
    assert summary(ingest_out)["rows"] == 430
    assert table_rows(out) == (more, deletes)
    assert summary(replay_out)["rows"] == 100
    assert table_rows(rout) == (new, set())


def test_the_database_job_stages_on_the_store_on_the_cluster(cluster_app, cluster_submit, spark_cluster, kafka_env,
                                                             milvus_proxy, s3, tmp_path, monkeypatch):
    """The database job (``mirror run --database db1 --snapshot initial``, Kafka) on the cluster, tables and
    staging (``--staging s3://...``) on the S3 server: while db1.b's snapshot is held, b's batches are staged by
    the executors' tasks as objects (every file a ``staged.json`` lists is on the store), a's table takes a batch;
    after the handover each table equals the rows the test wrote (delta-rs), no batch recorded twice, b's staging
    gone; nothing was staged on the driver's disk (no staging directory in its checkpoint, no staged file's name
    on any local disk). tests/cluster/database_job.py."""
    from tests.cluster.database_job import A, B, held_snapshot_run, start_collections
    from tests.mirror_job.many_log import ManyLog
    from tests.mirror_job.test_mirror_many_beside import HOLD
    from tests.mirror_job.test_mirror_many_kills import Lake

    if not isinstance(spark_cluster, SparkCluster):
        pytest.skip("an external cluster: its workers' directories are not known here")
    lake, state = Lake(s3, tmp_path, monkeypatch), milvus_proxy.state
    state.databases |= {"db1"}
    chans = [kafka_env.new_channel("cldb") for _ in range(2)]
    cfg = lake.config(kafka_env, tmp_path, **{"milvus.address": milvus_proxy.address,
                                              "milvus.requesttimeout": 3 * HOLD})  # the held Query's bound
    argv = ["--config", cfg, "--database", "db1", *lake.args, "--snapshot", "initial", "--channels", ",".join(chans),
            "--num-snapshot-tasks", "1", "--snapshot-concurrency", "1", "--staging", s3.uri("staging"),
            "--trigger", "processing-time:500ms", "--timeout", "900"]
    seen: dict = {}
    with kafka_env.client() as c:
        log = ManyLog(c, chans)
        start_collections(log, state, chans)
        summary_ = held_snapshot_run(cluster_app, lake, log, state, argv, seen)
        log.close()
    assert "error" not in seen, seen.get("error")
    staged = seen["staged"]
    assert staged.marks and staged.files, staged
    assert all(size is not None and size > 0 for size in staged.files.values()), staged  # each listed file there
    assert summary_["handed_over"] == [A[2], B[2]], summary_
    lake.check(log)  # both tables equal to their rows, no batch recorded twice
    assert not [k for k in lake.s3.server.boto3().list_objects_v2(Bucket=s3.bucket, Prefix="staging/")
                .get("Contents", [])], "b's staging left behind"
    assert not (lake.chk / "staged").exists()  # nothing staged on the driver's disk
    names = {k.rsplit("/", 1)[1] for k in staged.files}
    assert not names & _local_names(spark_cluster.worker_root, cluster_submit.cwd, tmp_path), "a staged file on disk"


def _modes(paths) -> set[int]:
    return {Path(p).stat().st_mode & 0o777 for p in paths}


def _local_names(*roots: Path) -> set[str]:
    """The names of every file under ``roots`` (the unpacked environments' packages left out)."""
    names: set[str] = set()
    for root in roots:
        for _, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if x != "environment"]
            names.update(files)
    return names


def test_mirror_on_the_cluster_with_no_shared_directory(spark_cluster, cluster_app, cluster_submit, kafka_env, s3,
                                                        tmp_path, capsys):
    """The mirror job on the cluster (``--snapshot never``, Kafka), three runs (steps of the module's application,
    then its probe): a Delta table and an Iceberg table on the S3 server, then a local Delta table.

    No directory is shared (tests/fixtures/spark_cluster.py): the Worker and its executors have their own work,
    local and temp dirs, and an environment without the driver's AWS_* settings (with a machine's own that send
    requests elsewhere); the driver has the credentials (AWS_* variables), Spark's checkpoints and the Iceberg
    catalog (SQLite) on its disk. The Delta run's first batch's first task SIGKILLs its executor JVM mid-file
    (``kill-executor-in-files:first``): the Worker relaunches an executor, Spark reruns the lost tasks, the dead
    attempt's object is never published (a multipart upload never completed). Both tables, read from the bucket by
    delta-rs, Polars, DuckDB and pyiceberg, equal the published rows; no file is referenced twice; ``mirror
    orphans`` finds nothing in either; no file of the tables is on any local disk. The local table shows the other
    case, a table on a disk the driver and the executors both see (a shared mount): its data files are created by
    the executors (the Worker's umask), its log commits by the driver (its own). A run that resumes from its
    checkpoint is tests/mirror_job/test_mirror_checkpoint.py's and tests/jobs/test_mirror_job.py's, in-process."""
    import re

    import deltalake
    import polars as pl
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from msgstream_spark.cli.main import main as msgstream_cli
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.mirror.store.settings import for_pyiceberg
    from msgstream_spark.spark.failpoints import KILL_MARKER
    from msgstream_spark.spark.mirror import FAILPOINT_ENV
    from tests.fixtures.plain_readers import duckdb_on_s3
    from tests.fixtures.s3_server import SECRET_KEY
    from tests.fixtures.spark_cluster import WORKER_STORE_ENV
    from tests.mirror_job.synthetic_mirror import PUBLISHES, as_rows, expected, publish_argv, read_delta

    if not isinstance(spark_cluster, SparkCluster):
        pytest.skip("an external cluster: its workers' directories and environment are not known here")
    cfg = config_file(kafka_env, tmp_path)
    chans = [kafka_env.new_channel("clm") for _ in range(2)]
    # 200 rows, every 10th deleted; 50..69 again (updated vectors); 200..229 (new keys); 100..109 again, deleted
    publishes = [*PUBLISHES[:2], (200, 30, 0.0), PUBLISHES[2]]
    for p in publishes:
        assert msgstream_cli(publish_argv(cfg, chans, "clmirror", *p)) == 0
    want = expected(publishes)
    delta_t, ice_t, local_t = s3.uri("lake", "delta"), s3.uri("lake", "ice"), tmp_path / "local"
    catalog_db = tmp_path / "lake-catalog.sqlite"  # the Iceberg catalog: on the driver's disk
    common = ["--config", cfg, "--collection", "clmirror", "--snapshot", "never", "--channels", ",".join(chans),
              "--max-rows-per-trigger", "150", "--progress-interval", "2"]
    runs = [[*common, "--table", delta_t, "--table-format", "delta", "--checkpoint", str(tmp_path / "chk-delta")],
            [*common, "--table", ice_t, "--catalog", "lake", "--checkpoint", str(tmp_path / "chk-ice")],
            [*common, "--table", str(local_t), "--table-format", "delta", "--checkpoint", str(tmp_path / "chk-local"),
             "--maintenance", "enabled=false"]]  # who writes the batches' files: no compaction (the driver's) rewrites
    # the Iceberg catalog's settings for every run (the driver's), the failpoint for the first run only
    driver_env = {"PYICEBERG_HOME": str(tmp_path), "PYICEBERG_CATALOG__LAKE__TYPE": "sql",
                  "PYICEBERG_CATALOG__LAKE__URI": f"sqlite:///{catalog_db}"}
    # the driver creates its files 0600 (the app's umask); the executors, children of the Worker, under the Worker's
    worker_umask, driver_umask = driver_umask_of()
    seen_before = (len(cluster_app.out), len(cluster_app.err))  # the app's output until now: the other tests' steps
    ends = [cluster_app.mirror(*r, env={**driver_env, **({FAILPOINT_ENV: "kill-executor-in-files:first"}
                                                          if i == 0 else {})}) for i, r in enumerate(runs)]
    ends.append(cluster_app.send({"probe": spark_cluster.worker_python}))  # last: it points at the bare Python
    done = [cluster_app.wait(i) for i in ends]
    assert all(d.returncode == 0 for d in done), cluster_app.failure()
    proc = subprocess.CompletedProcess(done[0].args, 0, "\n".join(d.stdout for d in done), "\n".join(cluster_app.err))
    check_probe(spark_cluster, proc)
    assert SECRET_KEY not in cluster_app.output()
    summaries = [json.loads(ln[len("SUMMARY "):]) for ln in proc.stdout.splitlines() if ln.startswith("SUMMARY ")]
    assert len(summaries) == 3
    for run in summaries:
        assert run["merged_batches"] >= 2 and run["stream_rows"] == 290 and run["skipped_batches"] == 0
    for run in summaries[:2]:  # the executors' tasks wrote the batches' files to the bucket
        assert run["step_bytes"]["write"]["written"] > 0

    # Delta on S3: delta-rs, Polars, DuckDB with the same settings
    opts = s3.options()
    dt = deltalake.DeltaTable(delta_t, storage_options=opts)
    assert as_rows(pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())) == want
    assert as_rows(pl.read_delta(delta_t, storage_options=opts).to_arrow()) == want
    assert as_rows(duckdb_on_s3(opts).execute(f"SELECT * FROM delta_scan('{delta_t}')").fetch_arrow_table()) == want
    live = [p if "://" in p else f"{delta_t}/{p}" for p in dt.get_add_actions(flatten=True).column("path").to_pylist()]
    assert len(live) == len(set(live)) and all(p.startswith(f"{delta_t}/data/") for p in live)
    batches = [(h.get("msgstream.query_id"), h.get("msgstream.batch_id")) for h in dt.history()
               if h.get("msgstream.batch_id") is not None]
    assert len(batches) == len(set(batches)) == summaries[0]["merged_batches"]
    # mirror orphans on each table in the bucket (the dead attempt left nothing: no file no version referenced)
    storage = [f"--storage-option={k}={v}" for k, v in opts.items()]
    catalog = ["--catalog", "lake", "--catalog-option", "type=sql", "--catalog-option", f"uri=sqlite:///{catalog_db}"]
    for where in (["--table", delta_t, "--table-format", "delta"], ["--table", ice_t, *catalog]):
        capsys.readouterr()
        assert msgstream_cli(["mirror", "orphans", *where, *storage]) == 0
        assert json.loads(capsys.readouterr().out)["left_by_writers"] == []  # (in-job compactions: expired history)

    # Iceberg on S3, registered in the driver's SQLite catalog: pyiceberg with the same settings
    tbl = load_catalog("lake", type="sql", uri=f"sqlite:///{catalog_db}", **for_pyiceberg(opts)).load_table(
        ("msgstream", "ice"))
    assert tbl.location() == ice_t and tbl.metadata_location.startswith(f"{ice_t}/metadata/")
    assert as_rows(tbl.scan().to_arrow()) == want
    ice_files = [t.file.file_path for t in tbl.scan().plan_files()]
    assert len(ice_files) == len(set(ice_files)) and all(p.startswith(f"{ice_t}/data/") for p in ice_files)

    # the kill, seen from the Worker's side: the executor's marker; the file its task had open never published
    markers = list(spark_cluster.work_dir.glob(f"app-*/*/{KILL_MARKER}"))
    assert len(markers) == 1, f"the executor was not killed: no marker\n{cluster_app.failure()}"
    killed = json.loads(markers[0].read_text())
    app = markers[0].parent.parent
    assert len([d for d in spark_cluster.executor_dirs() if d.parent == app]) >= 2  # the Worker relaunched one
    since = cluster_app.out[seen_before[0]:] + cluster_app.err[seen_before[1]:]  # this test's runs' output
    assert "Lost executor" in "\n".join(since)  # the driver saw its executor die
    assert killed["file"].startswith(f"{delta_t}/data/") and killed["file"] not in live
    assert open_store(delta_t, opts, env={}).head(killed["file"]) is None

    # no shared directory: the Worker's machine had none of the driver's settings, the tables' files are in the
    # bucket only, the checkpoints and the catalog on the driver's disk, apart from the Worker's directories
    wenv = spark_cluster.worker_environ()
    assert not {k for k in wenv if k.startswith("AWS_")} - set(WORKER_STORE_ENV)
    assert {k: wenv[k] for k in WORKER_STORE_ENV} == WORKER_STORE_ENV
    assert {k: wenv[k] for k in spark_cluster.worker_dirs()} == {k: str(v) for k, v in
                                                                 spark_cluster.worker_dirs().items()}
    root = spark_cluster.worker_root
    assert all(d.is_relative_to(root) for d in spark_cluster.executor_dirs())
    for driver_side in (tmp_path, cluster_submit.cwd):
        assert not driver_side.is_relative_to(root) and not root.is_relative_to(driver_side)
    for chk in ("chk-delta", "chk-ice"):
        assert (tmp_path / chk / "offsets" / "0").is_file() and (tmp_path / chk / "commits" / "0").is_file()
    assert catalog_db.is_file()
    keys = [o["Key"] for page in s3.server.boto3().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket)
            for o in page.get("Contents", [])]
    assert all(k.startswith(("lake/delta/", "lake/ice/")) for k in keys)
    written = {k.rsplit("/", 1)[1] for k in keys if re.search(UNIQUE_NAME, k.rsplit("/", 1)[1])}
    assert sum(n.endswith(".parquet") for n in written) >= 4  # both tables' data files, named uniquely
    assert not written & _local_names(root, cluster_submit.cwd, tmp_path), "a table file on a local disk"
    caches = list((root / "tmp").glob("msgstream-key-cache-*"))  # the executors' key-index cache: their own disk
    assert caches and not list(cluster_submit.driver_local.glob("msgstream-key-cache-*"))

    # the local table (a shared mount's case): written by the executors' tasks, committed by the driver
    assert read_delta(str(local_t)) == want
    data = [local_t / f for f in deltalake.DeltaTable(str(local_t)).get_add_actions(flatten=True)
            .column("path").to_pylist()]
    assert len(data) == len(set(data))
    assert _modes(data) == {0o666 & ~worker_umask}, "data files not written by the executors"
    assert _modes(local_t.glob("_delta_log/*.json")) == {0o666 & ~driver_umask}, "log commits not by the driver"
