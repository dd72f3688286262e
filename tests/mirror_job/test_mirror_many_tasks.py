"""A many-collection batch spread over many collections gives each table a small share of it: that share is
written by one task (one data file per table and batch, one task's fixed costs), not by a task per partition of
the batch (issue #44's measure: 20 tables in one job); a large share keeps a task per partition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mirror_job.many_log import ManyLog
from tests.mirror_job.test_mirror_many import table_rows
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def data_files_per_batch(location: Path) -> dict[int, int]:
    """{stream batch id: data files its commit added} of a Delta table's mirror commits."""
    out = {}
    for f in sorted((location / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines()]
        txn = [a["txn"]["version"] for a in actions if "txn" in a]
        if txn:
            out[int(txn[0])] = sum(1 for a in actions if "add" in a and a["add"].get("dataChange", True))
    return out


def test_a_small_share_of_a_batch_is_written_by_one_task(spark, local_env, tmp_path, monkeypatch):
    from msgstream_spark.jobs import mirror
    from msgstream_spark.spark import mirror_many

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mtask") for _ in range(2)]
    root = tmp_path / "lake"
    with local_env.client() as c:
        log = ManyLog(c, chans)
        try:
            log.create("db1", "a", 41)
            log.create("db1", "b", 42)
            for lo in range(0, 40, 10):  # messages on both channels: a read task per channel
                log.insert(41, range(lo, lo + 10))
            log.insert(42, range(20))
            log.tick()
        finally:
            log.close()
    monkeypatch.setattr(mirror_many, "ONE_TASK_ROWS", 30)  # a's 40 rows: a task per partition; b's 20: one
    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--progress-interval", "60"]
    mirror.run(mirror.build_parser().parse_args(argv), spark)
    assert sorted(table_rows(root / "db1" / "a")) == list(range(40))
    assert sorted(table_rows(root / "db1" / "b")) == list(range(20))
    many, one = data_files_per_batch(root / "db1" / "a"), data_files_per_batch(root / "db1" / "b")
    assert many[0] > 1, many
    assert one == {0: 1}, one


def test_a_batch_is_read_once_for_what_the_driver_learns(spark, tmp_path):
    """The DDL rows and each touched collection's name, database and rows: one Spark job of one stage (no
    shuffle), the rows summed by the tasks."""
    from msgstream_spark.mirror.many import ManyState, Selection
    from msgstream_spark.source.multi import COLLECTIONS_DDL
    from msgstream_spark.spark.mirror_many import ManyBatch

    pieces = [("create", 7, "", "", 10, 0, b"schema", None, "ch_7v0"), ("rows", 7, "a", "", 11, 5, b"p1", 70, None),
              ("rows", 8, "b", "db2", 12, 3, b"p2", 80, None), ("rows", 7, "", "db1", 13, 4, b"p3", 70, None),
              ("drop", 9, "z", "", 14, 0, None, None, "ch_9v0")]
    df = spark.createDataFrame(pieces, COLLECTIONS_DDL)  # two partitions (local[2]), no shuffle
    state = ManyState(str(tmp_path / "collections.json"))
    mb = ManyBatch(lambda k, s: None, state, Selection(database="none"), mirrored={}, concurrency=1)
    sc = spark.sparkContext
    sc.setJobGroup("many-facts", "a batch's facts")
    try:
        mb(df, 0)
    finally:
        sc.setJobGroup("", "")
    jobs = sc.statusTracker().getJobIdsForGroup("many-facts")
    stages = [s for j in jobs for s in sc.statusTracker().getJobInfo(j).stageIds]
    assert len(jobs) == 1 and len(stages) == 1, (jobs, stages)
    from msgstream_spark.spark.mirror_many_facts import batch_facts

    assert [(r["_collection"], r["n"]) for r in batch_facts(df)[1]] == [(7, 9), (8, 3)]
    got = {cid: (k.name, k.db) for cid, k in state.known.items()}
    assert got[7] == ("a", "db1") and got[8] == ("b", "db2") and state.known[7].schema  # the create's schema kept


def test_the_small_shares_bins_are_written_by_a_task_each(spark, local_env, tmp_path, monkeypatch):
    """Four small tables on local[2]: two bins of small shares, written side by side by two tasks of the one
    writing job (Spark 4.1+ plans a union of frames of one partitioning partition by partition: the bins, each
    one partition, went into ONE task, written one after the other)."""
    from msgstream_spark.jobs import mirror
    from msgstream_spark.spark import mirror_many_write

    seen = tmp_path / "seen"
    seen.mkdir()
    real = mirror_many_write.split_fn

    def recorded(tables):
        class Recorded:  # defined here: pickled by value, the task records which collections it split
            def __init__(self, inner, where):
                self.inner, self.where = inner, where

            def __call__(self, b):
                from pyspark import TaskContext

                ctx = TaskContext.get()
                for cid, part in self.inner(b):
                    name = f"{ctx.stageId()}-{ctx.partitionId()}-{ctx.taskAttemptId()}-{cid}"
                    (self.where / name).touch()
                    yield cid, part

        return Recorded(real(tables), seen)

    monkeypatch.setattr(mirror_many_write, "split_fn", recorded)
    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mbins") for _ in range(2)]
    root = tmp_path / "lake"
    ids = {51: "a", 52: "b", 53: "c", 54: "d"}
    with local_env.client() as c:
        log = ManyLog(c, chans)
        try:
            for cid, name in ids.items():
                log.create("db1", name, cid)
                log.insert(cid, range(cid * 100, cid * 100 + 10))
            log.tick()
        finally:
            log.close()
    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--progress-interval", "60"]
    out = mirror.run(mirror.build_parser().parse_args(argv), spark)
    assert out["batches"] == 1, out
    assert spark.conf.get(mirror_many_write.UNION_PARTITIONING, None) is None  # the session's conf left as it was
    for cid, name in ids.items():
        assert sorted(table_rows(root / "db1" / name)) == list(range(cid * 100, cid * 100 + 10))
        assert data_files_per_batch(root / "db1" / name) == {0: 1}, name  # each share in one task
    tasks: dict[str, set[int]] = {}
    for f in seen.iterdir():
        stage, part, attempt, cid = f.name.split("-")
        tasks.setdefault(f"{stage}-{part}-{attempt}", set()).add(int(cid))
    assert len({t.split("-")[0] for t in tasks}) == 1, tasks  # one writing job's stage
    assert len(tasks) == 2 and all(len(c) == 2 for c in tasks.values()), tasks  # two bins, a task each
