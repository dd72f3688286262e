"""``mirror run --include/--database/--collections --table-root``: many collections, one read, on the embedded log.

Three collections in two databases written as Milvus 2.3-2.5 writes them (tests/mirror_job/many_log.py), a fourth
created in a later batch, one dropped, its name created again (a new id); inserts, upserts and deletes
throughout. Each table must equal its collection (read by delta-rs, not this project's table code); the dropped
one keeps its last state and carries the drop's time; a restart from the checkpoint applies only what came after.
(The driver killed between two tables' commits of one batch: tests/mirror_job/test_mirror_many_kills.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from msgstream_spark.mirror.many import PROP_DROPPED_TS
from tests.mirror_job.many_log import ManyLog, database_job, drop_partition_scenario, proxied_config, table_rows
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def batches_committed(location: Path) -> list[int]:
    """The stream batch ids the table's commits recorded (Delta ``txn`` actions), in commit order."""
    out = []
    for f in sorted((location / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            a = json.loads(line)
            if "txn" in a:
                out.append(int(a["txn"]["version"]))
    return out


def assert_tables(root: Path, log: ManyLog, skip: set = frozenset()) -> None:
    for (db, name, cid), rows in log.expected.items():
        if (db, name, cid) in skip or db not in ("db1", "db2"):  # x.z is not selected
            continue
        where = root / db / (name if (db, name, cid) != ("db1", "b", 15) else "b__15")
        assert table_rows(where) == rows, f"table {where} of collection {db}.{name} (id {cid})"


def first_steps(log: ManyLog) -> None:
    """db1.a, db1.b, db2.c; then db2.d created (a later batch) while b is dropped; another collection, x.z, too."""
    log.create("db1", "a", 11)
    log.create("db1", "b", 12)
    log.create("db2", "c", 13)
    log.create("x", "z", 19)  # not selected
    log.insert(11, range(0, 30))
    log.insert(12, range(0, 10))
    log.insert(13, range(100, 120))
    log.insert(19, range(5))
    log.tick()
    log.delete(11, [1, 2, 3])
    log.upsert(13, [100, 101], gen=1)
    log.insert(12, [10, 11])
    log.tick()
    log.create("db2", "d", 14)
    log.insert(14, range(50, 60))
    log.delete(12, [0])
    log.tick()
    log.drop(12)
    log.upsert(11, [4, 5, 40], gen=2)
    log.delete(14, [50])
    log.tick()


def _argv(cfg: str, chans: list[str], root: Path, *more: str) -> list[str]:
    return ["--config", cfg, "--include", r"db[12]\..*", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--max-rows-per-trigger", "25",
            "--progress-interval", "1", *more]


def test_a_job_mirrors_collections_of_two_databases_as_they_come_and_go(spark, local_env, tmp_path):
    from msgstream_spark.jobs import mirror

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("many") for _ in range(2)]
    root = tmp_path / "lake"
    with local_env.client() as c:
        log = ManyLog(c, chans)
        first_steps(log)
        out = mirror.run(mirror.build_parser().parse_args(_argv(cfg, chans, root)), spark)
        assert sorted(out["tables"]) == ["db1.a", "db1.b", "db2.c", "db2.d"], out
        assert out["batches"] >= 3  # several micro-batches: d's CreateCollection came in a later one than a's
        assert_tables(root, log)
        dropped = deltalake.DeltaTable(str(root / "db1" / "b")).metadata().configuration
        assert dropped[PROP_DROPPED_TS] == str(out["tables"]["db1.b"]["dropped_ts"])
        assert not (root / "x").exists()  # x.z is not selected
        # more changes, the name b created again (a new id: a new table), then the job started again
        log.create("db1", "b", 15)
        log.insert(15, range(7))
        log.insert(13, [200])
        log.delete(14, [51, 52])
        log.tick()
        again = mirror.run(mirror.build_parser().parse_args(_argv(cfg, chans, root)), spark)
        log.close()
    assert_tables(root, log)
    assert table_rows(root / "db1" / "b") == log.expected[("db1", "b", 12)]  # the dropped one kept its last state
    assert again["tables"]["db1.a"]["batches"] == 0  # a was not touched: no commit
    for t in ("db1/a", "db1/b", "db1/b__15", "db2/c", "db2/d"):
        ids = batches_committed(root / t)
        assert len(ids) == len(set(ids)), (t, ids)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_26_wal_collection_created_altered_and_dropped(spark, local_env, tmp_path, fmt):
    """The 2.6 WAL test producers (tests/wal26/producer.py): CreateCollection per vchannel (its header names no
    database, the insert neither: Milvus's default), an AlterCollection adding a field, a DropCollection."""
    from msgstream_spark.jobs import mirror
    from tests.spark import wal26_data as D
    from tests.wal26 import producer as P

    ch, tt = local_env.new_channel(f"many26{fmt}"), D.TT
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1, 2, 3]), P.timetick(tt + 2),
                       P.alter_collection(tt + 3, "note"), P.delete(tt + 4, [2]), P.timetick(tt + 5),
                       P.drop_collection(tt + 6), P.timetick(tt + 7)])
    root = tmp_path / "lake"
    out = mirror.run(mirror.build_parser().parse_args([
        "--config", config_file(local_env, tmp_path), "--database", "default", "--table-root", str(root),
        "--table-format", fmt, "--snapshot", "never", "--channels", ch, "--max-rows-per-trigger", "2",
        "--progress-interval", "1"]), spark)
    assert list(out["tables"]) == ["default.c26"] and out["tables"]["default.c26"]["id"] == P.COLLECTION
    where = root / "default" / "c26"
    if fmt == "delta":
        dt = deltalake.DeltaTable(str(where))
        got = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT pk, vec, note FROM t").read_all())
        props = dt.metadata().configuration
    else:  # pyiceberg, from the default SQLite catalog beside the table
        from pyiceberg.catalog.sql import SqlCatalog

        cat = SqlCatalog("msgstream", uri=f"sqlite:///{where}_catalog.sqlite", warehouse=f"file://{where}")
        it = cat.load_table(("msgstream", "c26"))
        got, props = it.scan().to_arrow(), it.properties
    rows = sorted(got.select(["pk", "vec", "note"]).to_pylist(), key=lambda r: r["pk"])
    assert rows == [{"pk": 1, "vec": [1.0, -1.0], "note": None}, {"pk": 3, "vec": [3.0, -3.0], "note": None}]
    assert props[PROP_DROPPED_TS] == str(tt + 6)


def test_collections_present_at_the_start_are_snapshotted_each_at_its_own_s(spark, local_env, milvus_proxy, tmp_path):
    """--snapshot initial: the collections Milvus lists (the suite's proxy, its models written with the log) are
    read through query at their own S; the stream starts after the snapshots; a collection created later comes
    from the stream."""
    from msgstream_spark.jobs import mirror

    chans = [local_env.new_channel("manys") for _ in range(2)]
    cfg = proxied_config(local_env, milvus_proxy, tmp_path, {"db1", "db2"})
    state = milvus_proxy.state
    root = tmp_path / "lake"
    argv = ["--config", cfg, "--collections", "db1.a,c,n", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "initial", "--channels", ",".join(chans), "--max-rows-per-trigger", "25",
            "--progress-interval", "1", "--num-snapshot-tasks", "2"]
    with local_env.client() as c:
        log = ManyLog(c, chans)
        for db, name, cid in (("db1", "a", 11), ("db2", "c", 13), ("db2", "other", 17)):
            log.create(db, name, cid)
            log.listed(state, db, name, cid)
        log.insert(11, range(30))
        log.insert(13, range(10))
        log.insert(17, range(3))
        log.tick()
        log.delete(11, [0, 1])
        log.upsert(13, [2], gen=1)
        log.tick()
        wrote: list[int] = []

        def between(request) -> None:  # c written after a's positions and S, before c's snapshot starts
            if request.collection_name == "a" and not wrote:
                wrote.append(1)
                log.insert(13, [60, 61])
                log.tick()

        state.on_query = between
        first = mirror.run(mirror.build_parser().parse_args([*argv, "--snapshot-concurrency", "1"]), spark)
        state.on_query = None
        assert wrote and sorted(first["tables"]) == ["db1.a", "db2.c"]
        # c's 60 and 61 are in c's snapshot (its S is later than a's) and on the stream after the positions the
        # query starts at (taken before the snapshots; the query runs beside them, so it reads them in this run or
        # the next): c's table must hold them once, as the snapshot read them, before and after the next run
        assert all(t["changes"] == 0 for t in first["tables"].values()), first
        for t in ("db1/a", "db2/c"):
            assert "msgstream.snapshot_ts" in deltalake.DeltaTable(str(root / t)).metadata().configuration
        assert_tables(root, log, skip={("db1", "n", 16), ("db2", "other", 17)})
        log.insert(11, [100])
        log.delete(13, [3])
        log.upsert(11, [5], gen=3)
        log.create("db1", "n", 16)
        log.insert(16, range(4))
        log.tick()
        again = mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.close()
    assert sorted(again["tables"]) == ["db1.a", "db1.n", "db2.c"] and again["tables"]["db1.a"]["changes"] > 0
    assert_tables(root, log, skip={("db2", "other", 17)})


def test_a_dropped_partition_s_rows_leave_the_table(spark, local_env, tmp_path):
    """2.3-2.5's DropPartition (RootCoord's GC step, on the collection's pchannels): every row of that partition
    leaves the table, those an earlier batch wrote and those of the same batch before the drop; a row written
    after it (another partition) stays; a second run applies nothing again."""
    from msgstream_spark.jobs import mirror

    cfg = config_file(local_env, tmp_path)
    root = tmp_path / "lake"

    def run(chans: list[str], step: int) -> dict:  # the drop's run reads its whole batch at once
        more = ("--max-rows-per-trigger", "1000") if step == 2 else ()
        return mirror.run(mirror.build_parser().parse_args(_argv(cfg, chans, root, *more)), spark)

    out, again = drop_partition_scenario(local_env, "parts", ("db1", "a", 21), root / "db1" / "a", run)
    assert out["tables"]["db1.a"]["batches"] >= 1 and again["tables"]["db1.a"]["batches"] == 0
    ids = batches_committed(root / "db1" / "a")
    assert len(ids) == len(set(ids)), ids


def test_a_collection_made_while_the_job_was_down_is_snapshotted_on_restart(spark, local_env, milvus_proxy, tmp_path):
    """A selected collection Milvus lists that the job's collections.json does not know (made while the job was
    down; the log no longer holds its creation nor its first rows) is snapshotted on restart at its own S, then
    streamed: its table holds the rows only Milvus still has and those the log brings after."""
    from msgstream_spark.jobs import mirror
    from tests.mirror_job.many_log import row

    job = database_job(local_env, milvus_proxy, tmp_path, "late")
    root, argv = job.root, job.argv
    with local_env.client() as c:
        log = ManyLog(c, job.chans)
        log.create("db1", "a", 31)
        log.listed(job.state, "db1", "a", 31)
        log.insert(31, range(5))
        log.tick()
        first = mirror.run(mirror.build_parser().parse_args(argv), spark)
        assert sorted(first["tables"]) == ["db1.a"]
        # db1.late: in Milvus with rows the log does not hold (its creation and first inserts are gone)
        log.colls[38], log.expected[("db1", "late", 38)] = ("db1", "late"), {}
        log.listed(job.state, "db1", "late", 38)
        old = [row("late", pk) for pk in range(10)]
        log.models[38].put(old, "_default", next(log._ts))
        log.expected[("db1", "late", 38)].update({r["pk"]: r for r in old})
        log.insert(38, [20, 21])  # on the log and in Milvus: before the snapshot's S
        log.insert(31, [6])
        log.tick()
        again = mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.insert(38, [22])
        log.delete(38, [0])
        log.tick()
        third = mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.close()
    assert sorted(again["tables"]) == ["db1.a", "db1.late"], again
    assert "msgstream.snapshot_ts" in deltalake.DeltaTable(str(root / "db1" / "late")).metadata().configuration
    assert table_rows(root / "db1" / "a") == log.expected[("db1", "a", 31)]
    assert table_rows(root / "db1" / "late") == log.expected[("db1", "late", 38)]
    assert third["tables"]["db1.late"]["changes"] > 0
