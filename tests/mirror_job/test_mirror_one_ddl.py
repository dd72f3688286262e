"""``mirror run --collection NAME``: the one-collection job applies DropPartition and TruncateCollection.

On the embedded log, with the producers written from the docs (tests/mirror_job/many_log.py: 2.3-2.5's RootCoord
DropPartition on the collection's pchannels; tests/mirror_job/wal_log.py: 2.6's broadcast DropPartition and a
2.6.11+ TruncateCollection, each vchannel's copy at its own time). After each DDL the table (read by delta-rs,
not this project's table code) equals the rows the collection holds; a run with nothing new commits nothing.
"""

from __future__ import annotations

import json

import pytest

from tests.mirror_job.many_log import drop_partition_scenario, table_rows
from tests.mirror_job.wal_log import NEW, WalLog, shard_of
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def _run(spark, cfg: str, chans: list[str], table, name: str) -> dict:
    from msgstream_spark.jobs import mirror

    argv = ["--config", cfg, "--collection", name, "--table", str(table), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--max-rows-per-trigger", "1000",
            "--progress-interval", "1"]
    return mirror.run(mirror.build_parser().parse_args(argv), spark)


def _probe(spark, monkeypatch) -> list[dict]:
    """Per batch of the one-collection job: the Spark jobs its ``foreachBatch`` call ran (``all``), those the
    table's own batch ran inside it (``table``: write, plan, a removal's rework), and the RDDs cached while the
    table's batch ran beyond those cached before the call (``cached``)."""
    from msgstream_spark.spark.mirror import MirrorBatch
    from msgstream_spark.spark.removals import RemovingBatch

    sc, seen = spark.sparkContext, []
    outer, inner = RemovingBatch.__call__, MirrorBatch.__call__

    def jobs() -> set[int]:  # the streaming query's jobs carry its run id as their group
        return set(sc.statusTracker().getJobIdsForGroup(sc.getLocalProperty("spark.jobGroup.id")))

    def batch(self, df, batch_id):
        seen.append({"cached_before": len(sc._jsc.getPersistentRDDs())})
        before = jobs()
        outer(self, df, batch_id)
        seen[-1]["all"] = len(jobs() - before)

    def table(self, df, batch_id):
        seen[-1]["cached"] = len(sc._jsc.getPersistentRDDs()) - seen[-1].pop("cached_before")
        before = jobs()
        inner(self, df, batch_id)
        seen[-1]["table"] = len(jobs() - before)

    monkeypatch.setattr(RemovingBatch, "__call__", batch)
    monkeypatch.setattr(MirrorBatch, "__call__", table)
    return seen


def test_a_dropped_partition_s_rows_leave_the_one_collection_table(spark, local_env, tmp_path, monkeypatch, capsys):
    """2.3-2.5: RootCoord's DropPartition (its GC step, a copy on each pchannel): the partition's rows an earlier
    batch wrote and those of the same batch before the drop leave the table; rows after it stay. Each batch is
    read by the table's write tasks alone: nothing cached, no Spark job beside the table's (its removal rows
    come back from the write's tasks, and a batch with some is written again inside its own attempt)."""
    probe = _probe(spark, monkeypatch)
    cfg = config_file(local_env, tmp_path)
    table = tmp_path / "a"
    out, again = drop_partition_scenario(local_env, "onepart", ("default", "a", 41), table,
                                         lambda chans, _: _run(spark, cfg, chans, table, "a"))
    assert out["removals"] == 2 and out["merged_batches"] >= 1  # a copy per pchannel
    assert again["merged_batches"] == 0 and again["removals"] == 0
    assert len(probe) >= 2 and all(b["all"] == b["table"] > 0 and b["cached"] == 0 for b in probe), probe
    # the drop's batch was written twice in one attempt: the first write's files went with it
    from msgstream_spark.cli.main import main

    capsys.readouterr()
    assert main(["mirror", "orphans", "--table", str(table), "--table-format", "delta"]) == 0
    assert json.loads(capsys.readouterr().out)["left_by_writers"] == []


def test_a_26_drop_partition_and_truncate_in_the_one_collection_table(spark, local_env, tmp_path):
    """2.6.6+: a DropPartition broadcast (the control vchannel's copy and each vchannel's), then a
    TruncateCollection whose copies arrive in two runs: vchannel 1's rows go with its copy, vchannel 0's stay
    until its own copy; a row written after a copy stays."""
    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("onewal") for _ in range(2)]
    table = tmp_path / "b"
    v1 = [k for k in range(100, 160) if shard_of(k, 2) == 1][:3]  # keys of vchannel 1
    with local_env.client() as c:
        log = WalLog(c, chans)
        log.create("default", "b", 51, form=NEW)
        log.insert(51, range(0, 12))
        log.insert(51, range(20, 28), partition=511)
        log.tick()
        _run(spark, cfg, chans, table, "b")
        assert table_rows(table) == log.expected[51]
        log.insert(51, range(28, 30), partition=511)
        log.drop_partition(51, 511)
        log.insert(51, [20, 21], partition=512)  # after the drop: stays
        log.tick()
        dropped = dict(log.expected[51])  # after the drop
        assert 20 in dropped and 25 not in dropped
        log.insert(51, [40, 41])
        log.truncate(51, shards=[1], broadcast_id=901)  # the control copy and vchannel 1's
        log.insert(51, v1)  # on vchannel 1 after its copy: stays
        log.tick()
        first = _run(spark, cfg, chans, table, "b")  # the drop and vchannel 1's truncate copy in one run
        assert table_rows(table) == log.expected[51]
        assert set(v1) < set(log.expected[51]) and any(shard_of(k, 2) == 0 for k in log.expected[51])
        assert {k for k in dropped if shard_of(k, 2) == 0} <= set(log.expected[51])
        log.truncate(51, shards=[0], broadcast_id=901)  # vchannel 0's copy, later
        log.tick()
        second = _run(spark, cfg, chans, table, "b")
        log.close()
    assert sorted(log.expected[51]) == sorted(v1)
    assert table_rows(table) == log.expected[51]
    assert first["removals"] == 3 and second["removals"] == 1  # 2 DropPartition + 1 truncate copy; no control copy
