"""The mirror job on the embedded log, with 2.6 WAL messages from the independent producer
(tests/wal26/producer.py): a field added by AlterCollection becomes a new nullable column."""

from __future__ import annotations

import pytest

from tests.sink.helpers import config_file
from tests.spark import wal26_data as D
from tests.wal26 import producer as P

pytestmark = pytest.mark.slow


def run_mirror(spark, cfg, ch, table, fmt="delta"):
    from msgstream_spark.jobs import mirror

    return mirror.run(mirror.build_parser().parse_args([
        "--config", cfg, "--channels", ch, "--collection", "c26", "--table", str(table), "--table-format", fmt,
        "--snapshot", "never", "--progress-interval", "1"]), spark)


class _InProcess:
    """The S3 kill tests' runs: a job SIGKILLed by a failpoint in a process of its own (``killed_job``); the job
    and ``msgstream mirror`` commands nothing kills in this process, on the suite's Spark session (``job``,
    ``cli``), with the user's AWS_* variables (the credentials; the endpoint by --storage-option) set here as
    they are in the killed job's environment. Each checks that the S3 server's secret key is in none of what it
    printed or logged."""

    def __init__(self, spark, s3, monkeypatch, capfd, caplog):
        import logging

        self.spark, self.capfd, self.caplog = spark, capfd, caplog
        self.env = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}
        for k, v in self.env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        caplog.set_level(logging.INFO)  # the job's own log lines, as its process prints them

    def _secret_nowhere(self, text: str) -> None:
        from tests.fixtures.s3_server import SECRET_KEY

        assert SECRET_KEY not in text + self.caplog.text

    def killed_job(self, argv: list[str], cwd, **env: str):
        import os
        import subprocess
        import sys
        from pathlib import Path

        root = Path(__file__).resolve().parents[2]
        proc = subprocess.run([sys.executable, "-m", "msgstream_spark.jobs.mirror", *argv], cwd=cwd, timeout=900,
                              env={**os.environ, **self.env, "PYTHONPATH": str(root), "MSGSTREAM_JOBS_QUIET": "0",
                                   **env}, capture_output=True, text=True)
        self._secret_nowhere(proc.stdout + proc.stderr)
        assert proc.returncode == -9, proc.stderr[-4000:]  # SIGKILLed by its failpoint
        return proc

    def job(self, argv: list[str]) -> dict:
        """The mirror job as ``main`` runs it (its summary printed as JSON), exit 0; returns the summary."""
        import json

        from msgstream_spark.jobs import mirror
        from msgstream_spark.jobs._common import main_wrapper

        self.capfd.readouterr()
        rc = main_wrapper(mirror.build_parser(), lambda a: mirror.run(a, self.spark), argv)
        out = self.capfd.readouterr()
        self._secret_nowhere(out.out + out.err)
        assert rc == 0, out.err[-4000:] + self.caplog.text[-4000:]
        return json.loads(out.out[out.out.index("{"):])

    def cli(self, *words: str) -> str:
        """``msgstream mirror WORDS``, exit 0; returns what it printed."""
        from msgstream_spark.cli.main import main as msgstream_cli

        self.capfd.readouterr()
        rc = msgstream_cli(["mirror", *words])
        out = self.capfd.readouterr()
        self._secret_nowhere(out.out + out.err)
        assert rc == 0, out.err[-2000:]
        return out.out


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "lance"])
def test_a_field_added_by_alter_collection_becomes_a_nullable_column(spark, local_env, tmp_path, fmt):
    from msgstream_spark.mirror.table import open_table

    ch, tt, table = local_env.new_channel("mirror26"), D.TT, tmp_path / "t"
    cfg = config_file(local_env, tmp_path)
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1, 2]), P.delete(tt + 2, [2]), P.timetick(tt + 3)])
        first = run_mirror(spark, cfg, ch, table, fmt)
        t = open_table(fmt, str(table), collection="c26", pk="pk", create=False)
        assert "note" not in t.schema.names
        assert [(r["pk"], r["vec"]) for r in t.to_arrow().to_pylist()] == [(1, [1.0, -1.0])]
        P.write(prod, [P.alter_collection(tt + 4, "note"), P.insert(tt + 5, [3]), P.timetick(tt + 6)])
        second = run_mirror(spark, cfg, ch, table, fmt)
    assert first["schema_restarts"] == second["schema_restarts"] == 0  # the restarted job infers the new schema
    t = open_table(fmt, str(table), collection="c26", pk="pk", create=False)
    assert t.schema.field("note").nullable
    got = sorted((r["pk"], r["vec"], r["note"], r["_ts"]) for r in t.to_arrow().to_pylist())
    assert got == [(1, [1.0, -1.0], None, tt + 1), (3, [3.0, -3.0], None, tt + 5)]


def test_the_job_into_s3_survives_its_kills_and_resumes(spark, local_env, tmp_path, s3, monkeypatch, capfd, caplog):
    """The mirror job into ``s3://`` (Delta on the S3 server): credentials from the user's AWS_* variables, the
    endpoint by --storage-option, Spark's checkpoint on the driver's disk. Its first run has a Python worker
    SIGKILLed mid-file (batch 0, retried by Spark) and the driver SIGKILLed between the table's commit of that
    batch and Spark's; the next run takes the dead run's lease over at once, skips batch 0 (in the table) and goes
    on. The table equals the published collection as delta-rs, Polars and DuckDB read it from the bucket, no
    object is left unreferenced (a killed multipart upload publishes nothing), ``mirror status`` reads it, the
    summary counts what each step moved, and the secret appears in no output.

    The killed run is a process of its own (SIGKILLed); the next run and the commands, which nothing kills, run
    in this process (the suite's Spark session: another JVM than the killed driver's, its task workers without
    the AWS_* variables, so what the tasks reach the bucket with is what the driver ships)."""
    import json

    import deltalake
    import polars as pl
    import pyarrow as pa

    from msgstream_spark.spark.mirror import FAILPOINT_ENV
    from tests.fixtures.plain_readers import duckdb_on_s3
    from tests.fixtures.s3_server import SECRET_KEY
    from tests.mirror_job.synthetic_mirror import PUBLISHES, as_rows, expected
    from tests.mirror_job.test_mirror_kills import _published

    cfg, chans = _published(local_env, tmp_path, "mks3")
    table, chk = s3.uri("lake", "t"), str(tmp_path / "chk")
    opts = s3.options()
    where = ["--table", table, "--storage-option", f"aws_endpoint={opts['aws_endpoint']}",
             "--storage-option", "allow_http=true"]
    argv = ["--config", cfg, "--collection", "mks3", *where, "--table-format", "delta", "--checkpoint", chk,
            "--snapshot", "never", "--channels", ",".join(chans), "--master", "local[2,4]",
            "--max-rows-per-trigger", "150", "--progress-interval", "2"]
    run = _InProcess(spark, s3, monkeypatch, capfd, caplog)

    first = run.killed_job(argv, tmp_path, **{FAILPOINT_ENV: "kill-worker-in-files:0,kill-after-commit:0"})
    assert "Python worker exited unexpectedly (crashed)" in first.stderr  # Spark retried the killed task
    summary = run.job(argv)
    assert summary["skipped_batches"] == 1 and summary["merged_batches"] >= 1
    assert set(summary["step_bytes"]) == {"write", "plan", "commit"}
    assert summary["step_bytes"]["write"]["written"] > 0 and summary["step_bytes"]["commit"]["written"] > 0

    want = expected(PUBLISHES)
    dt = deltalake.DeltaTable(table, storage_options=opts)
    assert as_rows(pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())) == want
    assert as_rows(pl.read_delta(table, storage_options=opts).to_arrow()) == want
    assert as_rows(duckdb_on_s3(opts).execute(f"SELECT * FROM delta_scan('{table}')").fetch_arrow_table()) == want

    assert json.loads(run.cli("orphans", *where))["left_by_writers"] == []  # (compactions leave expired history)
    status = json.loads(run.cli("status", "--config", cfg, "--checkpoint", chk, *where))
    assert status["table"] == table and set(status["channels"]) == set(chans) and status["backlog_rows"] == 0
    assert SECRET_KEY not in json.dumps(summary)


def test_mirror_run_into_an_iceberg_table_on_s3_through_a_postgresql_catalog(spark, local_env, s3, postgres_db,
                                                                             tmp_path, monkeypatch):
    """``mirror run --table mirror.c26 --catalog lake --storage-option ...``: the SQL catalog on PostgreSQL places
    the table in its warehouse on the S3 server; Spark's tasks write the data and delete files there, the driver
    commits through the catalog, the writer lease lives beside the table; a plain pyiceberg catalog reads the
    collection back; the second run's delete is a position-delete file in the bucket."""
    from pyiceberg.catalog import load_catalog

    from msgstream_spark.jobs import mirror
    from msgstream_spark.mirror.store.settings import for_pyiceberg

    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", postgres_db)
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", s3.uri("wh"))
    ch, tt = local_env.new_channel("mirror-s3"), D.TT
    cfg = config_file(local_env, tmp_path)
    argv = ["--config", cfg, "--channels", ch, "--collection", "c26", "--table", "mirror.c26", "--catalog", "lake",
            "--checkpoint", str(tmp_path / "cp"), "--snapshot", "never", "--progress-interval", "1",
            *[f"--storage-option={k}={v}" for k, v in s3.options().items()]]
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1, 2, 3]), P.timetick(tt + 2)])
        first = mirror.run(mirror.build_parser().parse_args(argv), spark)
        P.write(prod, [P.delete(tt + 3, [2]), P.insert(tt + 4, [4]), P.timetick(tt + 5)])
        second = mirror.run(mirror.build_parser().parse_args(argv), spark)  # resumes from its checkpoint
    assert first["format"] == "iceberg" and first["merged_batches"] >= 1 and second["merged_batches"] >= 1
    tbl = load_catalog("lake", type="sql", uri=postgres_db, **for_pyiceberg(s3.options())).load_table(
        ("mirror", "c26"))
    assert tbl.location() == s3.uri("wh", "mirror", "c26")
    assert sorted(r["pk"] for r in tbl.scan().to_arrow().to_pylist()) == [1, 3, 4]
    keys = [o["Key"] for o in s3.server.boto3().list_objects_v2(Bucket=s3.bucket)["Contents"]]
    assert any(k.startswith("wh/mirror/c26/data/delete-") for k in keys)  # key 2's delete: by position
    assert all(k.startswith("wh/mirror/c26/") for k in keys) and "wh/mirror/c26/_msgstream_writer.lease" in keys
    assert s3.options()["aws_secret_access_key"] not in str(first) + str(second)


def test_the_job_into_a_lance_table_on_s3_survives_its_kills_and_resumes(spark, local_env, tmp_path, s3, monkeypatch,
                                                                         capfd, caplog):
    """The mirror job with ``--table-format lance`` into ``s3://``: its first run has a Python worker SIGKILLed
    mid-file (batch 0, retried by Spark) and the driver SIGKILLed between the table's commit of that batch and
    Spark's; the next run skips batch 0 (its record is in the table's Lance version) and goes on. The table
    equals the published collection as ``lance`` and DuckDB (through Arrow) read it from the bucket, each batch
    is one Lance version, no file is left unreferenced, ``mirror status`` reads it, the secret appears nowhere.
    The killed run is a process of its own, the next run and the commands run in this one (as above)."""
    import json

    import duckdb
    import lance

    from msgstream_spark.spark.mirror import FAILPOINT_ENV
    from tests.fixtures.s3_server import SECRET_KEY
    from tests.mirror_job.synthetic_mirror import PUBLISHES, as_rows, expected
    from tests.mirror_job.test_mirror_kills import _published

    cfg, chans = _published(local_env, tmp_path, "mkl3")
    table, chk = s3.uri("lake", "t"), str(tmp_path / "chk")
    opts = s3.options()
    where = ["--table", table, "--table-format", "lance", "--storage-option",
             f"aws_endpoint={opts['aws_endpoint']}", "--storage-option", "allow_http=true"]
    argv = ["--config", cfg, "--collection", "mkl3", *where, "--checkpoint", chk, "--snapshot", "never",
            "--channels", ",".join(chans), "--master", "local[2,4]", "--max-rows-per-trigger", "150",
            "--progress-interval", "2"]
    run = _InProcess(spark, s3, monkeypatch, capfd, caplog)

    run.killed_job(argv, tmp_path, **{FAILPOINT_ENV: "kill-worker-in-files:0,kill-after-commit:0"})
    summary = run.job(argv)
    assert summary["skipped_batches"] == 1 and summary["merged_batches"] >= 1

    want = expected(PUBLISHES)
    ds = lance.dataset(table, storage_options={**opts, "allow_http": "true"})
    rows = ds.to_table()
    assert as_rows(rows) == want
    assert as_rows(duckdb.sql("SELECT * FROM rows").fetch_arrow_table()) == want
    import pyarrow as pa

    assert pa.types.is_fixed_size_list(ds.schema.field("vec").type)  # a Lance vector index can be built on it
    batches = [v for v in range(1, ds.version + 1) if "msgstream.batch_id" in
               (ds.read_transaction(v).transaction_properties or {})]
    assert len(batches) == 1 + summary["merged_batches"]  # one version per batch (batch 0 by the killed run)

    orphans = json.loads(run.cli("orphans", *where))  # (in-job compactions leave expired history, vacuum removes)
    assert orphans["left_by_writers"] == [], json.dumps(orphans, indent=1)
    status = json.loads(run.cli("status", "--config", cfg, "--checkpoint", chk, *where))
    assert status["table"] == table and set(status["channels"]) == set(chans) and status["backlog_rows"] == 0
    assert SECRET_KEY not in json.dumps(summary)
