"""Kill points of the many-collection job (``mirror run --include/--database --table-root s3://...``) on the S3
server: the driver SIGKILLed between two tables' commits of one batch, during the snapshot of a collection found
at a restart while another table already took batches, and between a CreateCollection and its table's first
commit. After each restart every table equals the rows the test wrote into its collection (ManyLog's
``expected``, not this project's decoder, read back by delta-rs), no table's Delta log records a batch twice, and
no file a killed writer left is in a table (a reader sees none; the restart removed the killed batch's files).

The killed runs are subprocesses (a group of their own: the SIGKILL takes the JVM too); the runs that finish
run in the suite's Spark session.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from tests.mirror_job.many_log import ManyLog
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


class Lake:
    """The job's tables under ``s3://<bucket>/lake``, its checkpoint on the driver's disk, and what the test reads
    of them straight from the bucket."""

    def __init__(self, s3, tmp_path: Path, monkeypatch) -> None:
        self.s3, self.root, self.chk = s3, s3.uri("lake"), tmp_path / "chk"
        for k, v in s3.env().items():  # the credentials as a user exports them; the endpoint by --storage-option
            if k != "AWS_ENDPOINT_URL":
                monkeypatch.setenv(k, v)
        self.args = ["--table-root", self.root, "--table-format", "delta", "--checkpoint", str(self.chk),
                     "--storage-option", f"aws_endpoint={s3.endpoint}", "--storage-option", "allow_http=true",
                     "--progress-interval", "1"]

    def table(self, db: str, name: str) -> str:
        return f"{self.root}/{db}/{name}"

    def keys(self, db: str, name: str, under: str = "") -> list[str]:
        b = self.s3.server.boto3()
        pages = b.get_paginator("list_objects_v2").paginate(Bucket=self.s3.bucket, Prefix=f"lake/{db}/{name}/{under}")
        return sorted(o["Key"] for p in pages for o in p.get("Contents", []))

    def rows(self, db: str, name: str) -> dict[int, dict]:
        dt = deltalake.DeltaTable(self.table(db, name), storage_options=self.s3.options())
        t = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT pk, s, fv FROM t").read_all())
        out: dict[int, dict] = {}
        for r in t.to_pylist():
            assert r["pk"] not in out, f"pk {r['pk']} twice in {self.table(db, name)}"
            out[r["pk"]] = r
        return out

    def commits(self, db: str, name: str) -> list[tuple[str, list[str]]]:
        """(log file, the kinds of its actions) of every commit of the table, in version order."""
        b, out = self.s3.server.boto3(), []
        for key in self.keys(db, name, "_delta_log/"):
            if key.endswith(".json"):
                body = b.get_object(Bucket=self.s3.bucket, Key=key)["Body"].read().decode()
                out.append((key.rsplit("/", 1)[1], [line for line in body.splitlines() if line.strip()]))
        return out

    def summary(self, db: str, name: str) -> list[str]:
        """Per commit: its file, operation and batch record (an assertion's message)."""
        out = []
        for f, lines in self.commits(db, name):
            acts = [json.loads(line) for line in lines]
            op = [a["commitInfo"].get("operation") for a in acts if "commitInfo" in a]
            txn = [(a["txn"]["appId"][:8], a["txn"]["version"]) for a in acts if "txn" in a]
            out.append(f"{f[:-5].lstrip('0') or '0'}: {op} txn {txn}")
        return out

    def query(self) -> str:
        """The job's Spark query id (the ``appId`` of its batch records; the writer lease's epochs have another)."""
        return json.loads((self.chk / "metadata").read_text().splitlines()[0])["id"]

    def batches(self, db: str, name: str) -> list[int]:
        """The stream batch ids the table's commits recorded (Delta ``txn`` actions of the job's query), in commit
        order."""
        qid = self.query()
        return [int(a["txn"]["version"]) for _, lines in self.commits(db, name) for a in map(json.loads, lines)
                if "txn" in a and a["txn"]["appId"] == qid]

    def left_by_writers(self, db: str, name: str) -> list[str]:
        """Files in the table's location no version of it ever referenced (``mirror orphans``' answer)."""
        from msgstream_spark.mirror.maintenance import classify_orphans, orphans
        from msgstream_spark.mirror.table import open_existing

        t = open_existing("delta", self.table(db, name), storage_options=self.s3.options())
        return classify_orphans(t, orphans(t)).left_by_writers

    def check(self, log: ManyLog, skip=()) -> None:
        """Every mirrored collection's table equals what the test wrote into it; none holds a batch twice."""
        for (db, name, cid), want in log.expected.items():
            if (db, name) in skip:
                continue
            assert self.rows(db, name) == want, f"table {self.table(db, name)} of collection {db}.{name} (id {cid})"
            ids = self.batches(db, name)
            assert len(ids) == len(set(ids)), (f"{db}.{name}", ids, self.summary(db, name))

    def config(self, env, tmp_path: Path, **values) -> str:
        """The log's config (``milvus.address`` only if given: else the job asks no Milvus)."""
        import yaml

        cfg = Path(config_file(env, tmp_path))
        got = {k: v for k, v in yaml.safe_load(cfg.read_text()).items() if k != "milvus.address"}
        cfg.write_text(yaml.safe_dump({**got, **values}))
        return str(cfg)

    def known(self) -> dict:
        return json.loads((self.chk / "collections.json").read_text())


def killed_job(tmp_path: Path, argv: list[str], failpoint: str = "", started=None) -> None:
    """The job in a process group of its own, until it is SIGKILLed (by ``failpoint``, or by the test through
    ``started(proc)``); fails if it ends another way."""
    from msgstream_spark.spark.mirror import FAILPOINT_ENV

    env = dict(os.environ, PYTHONPATH=str(ROOT), MSGSTREAM_JOBS_QUIET="0", **{FAILPOINT_ENV: failpoint})
    with open(tmp_path / "killed.log", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "msgstream_spark.jobs.mirror", *argv, "--master", "local[2]"],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        if started is not None:
            started(proc)
        try:
            code = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        err.seek(0)
        assert code == -signal.SIGKILL, err.read()[-4000:]
    try:  # what the group left (Spark's JVM, a worker), gone with it
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(spark, argv: list[str]) -> dict:
    from msgstream_spark.jobs import mirror

    return mirror.run(mirror.build_parser().parse_args(argv), spark)


def test_killed_between_two_tables_commits_of_one_batch(spark, local_env, s3, tmp_path, monkeypatch, capfd):
    """One table after the other (``--table-concurrency 1``): the driver dies right after db1.a's commit of the
    first batch with rows, before db2.c's. The restart (the job's command line: its exit code and JSON summary,
    run in this process) skips the batch on a (its record is there: the dead run's lease taken over) and applies
    it to c. (The same kill on a local table root was a test of its own in test_mirror_many.py: one driver JVM
    more for the same steps and assertions.)"""
    from msgstream_spark.jobs import mirror
    from msgstream_spark.jobs._common import main_wrapper

    lake = Lake(s3, tmp_path, monkeypatch)
    chans = [local_env.new_channel("mk1") for _ in range(2)]
    argv = ["--config", lake.config(local_env, tmp_path), "--include", r"db[12]\..*", *lake.args,
            "--snapshot", "never", "--channels", ",".join(chans), "--max-rows-per-trigger", "1000",
            "--table-concurrency", "1"]
    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create("db1", "a", 11)
        log.create("db2", "c", 13)
        log.insert(11, range(20))
        log.insert(13, range(100, 120))
        log.tick()
        log.delete(11, [0, 1])
        log.upsert(13, [105], gen=1)
        log.tick()
        log.close()
    killed_job(tmp_path, argv, "kill-after-commit:first")
    split = lake.batches("db1", "a")
    assert split and lake.batches("db2", "c") == []  # a took the batch, c (committed after a) did not
    capfd.readouterr()
    rc = main_wrapper(mirror.build_parser(), lambda a: mirror.run(a, spark), argv)
    printed = capfd.readouterr()
    assert rc == 0, printed.err[-4000:]
    again = json.loads(printed.out[printed.out.index("{"):])
    assert again["tables"]["db1.a"]["skipped"] == 1 and again["tables"]["db2.c"]["batches"] >= 1, again
    lake.check(log)
    assert all(lake.batches(db, name) for db, name in (("db1", "a"), ("db2", "c")))
    assert split[-1] in lake.batches("db2", "c")  # the batch the kill split: c took it on the restart
    for db, name in (("db1", "a"), ("db2", "c")):
        assert lake.left_by_writers(db, name) == []


def test_killed_between_a_create_collection_and_its_tables_first_commit(spark, local_env, s3, tmp_path,
                                                                        monkeypatch):
    """db1.a streams; db1.d is created on the stream with rows: its table is made from the CreateCollection's
    schema, its batch's files written, and the driver dies before d's first commit. The restart opens d's table
    from collections.json, removes the killed attempt's files and applies the batch once."""
    lake = Lake(s3, tmp_path, monkeypatch)
    chans = [local_env.new_channel("mk3") for _ in range(2)]
    argv = ["--config", lake.config(local_env, tmp_path), "--database", "db1", *lake.args, "--snapshot", "never",
            "--channels", ",".join(chans), "--max-rows-per-trigger", "1000"]
    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create("db1", "a", 11)
        log.insert(11, range(10))
        log.tick()
        first = run(spark, argv)
        assert list(first["tables"]) == ["db1.a"]
        log.create("db1", "d", 14)
        log.insert(14, range(50, 70))
        log.delete(14, [50, 51])
        log.upsert(14, [60], gen=1)
        log.tick()
        killed_job(tmp_path, argv, "kill-after-files:first")  # d is the only table with rows in the batch
        assert lake.known()["14"]["location"] == lake.table("db1", "d")  # made before the kill
        assert lake.batches("db1", "d") == [] and lake.rows("db1", "d") == {}
        assert lake.left_by_writers("db1", "d")  # the killed batch's files, in no version
        log.insert(11, [10])
        log.insert(14, [70])
        log.tick()
        again = run(spark, argv)
        log.close()
    assert again["tables"]["db1.d"]["batches"] >= 1 and again["tables"]["db1.d"]["skipped"] == 0, again
    lake.check(log)
    for name in ("a", "d"):
        assert lake.left_by_writers("db1", name) == []


@pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")
def test_killed_during_a_late_collections_snapshot_while_another_table_streams(spark, local_env, milvus_proxy, s3,
                                                                              tmp_path, monkeypatch):
    """db1.a is snapshotted at the job's start and then takes stream batches. db1.late is made in Milvus while the
    job is down (the log holds none of its messages): the restart snapshots it, and the driver is killed while
    that snapshot's tasks query its rows. The next restart snapshots it again (new S) and opens its table with the
    schema collections.json kept (before, it asked Milvus and the log again, and failed: neither knew it); the
    stream goes on: a is not set back, late holds what Milvus has and what the log brought after its S."""
    from tests.mirror_job.many_log import row, schema

    lake = Lake(s3, tmp_path, monkeypatch)
    chans = [local_env.new_channel("mk2") for _ in range(2)]
    cfg = lake.config(local_env, tmp_path, **{"milvus.address": milvus_proxy.address})
    state = milvus_proxy.state
    state.databases |= {"db1"}
    argv = ["--config", cfg, "--database", "db1", *lake.args, "--snapshot", "initial", "--channels",
            ",".join(chans), "--num-snapshot-tasks", "2"]

    def model(name: str, cid: int) -> None:
        log.models[cid] = state.add_model("db1", name, cid, chans, [log._vch(cid, i) for i in range(len(chans))],
                                          schema(name), [("_default", cid * 10)])

    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create("db1", "a", 31)
        model("a", 31)
        log.insert(31, range(10))
        log.tick()
        first = run(spark, argv)
        log.delete(31, [0])
        log.upsert(31, [1], gen=1)
        log.tick()
        second = run(spark, argv)
        assert first["tables"]["db1.a"]["changes"] == 0 and second["tables"]["db1.a"]["batches"] >= 1
        streamed = lake.batches("db1", "a")
        # db1.late: in Milvus with rows the log does not hold (neither its creation nor any row)
        log.colls[38], log.expected[("db1", "late", 38)] = ("db1", "late"), {}
        model("late", 38)
        old = [row("late", pk) for pk in range(10)]
        log.models[38].put(old, "_default", next(log._ts))
        log.expected[("db1", "late", 38)].update({r["pk"]: r for r in old})
        log.insert(31, [40])
        log.tick()
        reads: list = []
        job: list = []

        def kill_in_read(request) -> None:  # the plan's sample read, then the tasks' reads: the first of these
            if request.collection_name == "late" and list(request.output_fields) == ["*"]:
                reads.append(request.expr)
                if len(reads) == 2:
                    os.killpg(job[0].pid, signal.SIGKILL)

        state.on_query = kill_in_read
        try:
            killed_job(tmp_path, argv, started=job.append)
        finally:
            state.on_query = None
        assert len(reads) >= 2
        # late is pending (its snapshot runs beside the stream): no snapshot committed; a may have streamed meanwhile
        assert lake.known()["38"]["pending"] and lake.keys("db1", "late", "_delta_log/") == []
        assert lake.batches("db1", "a")[:len(streamed)] == streamed
        log.models[38].remove([0], next(log._ts))  # Milvus changes while the job is down
        del log.expected[("db1", "late", 38)][0]
        log.upsert(31, [2], gen=2)
        log.tick()
        # the log holds no message of late: the restart opens its table with the schema its snapshot had
        third = run(spark, argv)
        assert sorted(third["tables"]) == ["db1.a", "db1.late"], third
        assert "msgstream.snapshot_ts" in deltalake.DeltaTable(lake.table("db1", "late"),
                                                               storage_options=s3.options()).metadata().configuration
        lake.check(log)
        log.insert(38, [22])  # then the stream's rows of late, after its S
        log.delete(38, [1])
        log.tick()
        fourth = run(spark, argv)
        log.close()
    assert fourth["tables"]["db1.late"]["changes"] > 0, fourth
    lake.check(log)
    assert lake.batches("db1", "a")[:len(streamed)] == streamed
    assert lake.left_by_writers("db1", "a") == []
    # the killed snapshot's directory (snapshot-<S>-<id>), if its tasks wrote any, is in no version of the table
    assert all("/snapshot-" in p for p in lake.left_by_writers("db1", "late"))
