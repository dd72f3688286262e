"""A collection with no rows at its snapshot's S (created, nothing inserted yet: common in a ``--database`` job)
is snapshotted into an empty table that records S and its positions, and then takes the stream's rows after S.
Before, the snapshot's commit failed with "add_files needs at least one data file" and the job stopped."""

from __future__ import annotations

import deltalake
import pytest

from tests.mirror_job.many_log import ManyLog, database_job, table_rows

pytestmark = pytest.mark.slow


def test_a_collection_empty_at_its_snapshot_gets_an_empty_table_and_then_its_stream(spark, local_env, milvus_proxy,
                                                                                   tmp_path):
    from msgstream_spark.jobs import mirror

    job = database_job(local_env, milvus_proxy, tmp_path, "empty")
    root, argv = job.root, job.argv
    with local_env.client() as c:
        log = ManyLog(c, job.chans)
        for name, cid in (("a", 41), ("e", 42)):
            log.create("db1", name, cid)
            log.listed(job.state, "db1", name, cid)
        log.insert(41, range(5))  # e: created, no row
        log.tick()
        first = mirror.run(mirror.build_parser().parse_args(argv), spark)
        assert sorted(first["tables"]) == ["db1.a", "db1.e"], first
        assert table_rows(root / "db1" / "e") == {}
        conf = deltalake.DeltaTable(str(root / "db1" / "e")).metadata().configuration
        assert "msgstream.snapshot_ts" in conf and "msgstream.mirror.start" in conf, conf
        log.insert(42, range(3))  # after e's S: from the stream
        log.delete(42, [0])
        log.tick()
        again = mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.close()
    assert again["tables"]["db1.e"]["changes"] > 0, again
    for name, cid in (("a", 41), ("e", 42)):
        assert table_rows(root / "db1" / name) == log.expected[("db1", name, cid)]
