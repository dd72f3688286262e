"""The many-collection job over Milvus 2.6 WAL channels (tests/mirror_job/wal_log.py writes them from the docs):
collections created in the 2.6.6+ form (a broadcast to the control vchannel and every vchannel, names and database
in the message, the schema in field #13) and in the 2.6.0-2.6.5 form (one copy per vchannel, no names), inserts,
upserts (transactions), deletes, a collection created mid-run, a drop, a name created again, a field added, a
DropPartition, a TruncateCollection (its copies in two runs: each vchannel's at its own time), a rename, a pchannel
added while the job runs, Iceberg tables in a catalog's namespace. After each step every table equals the rows its
collection holds (read by delta-rs or a catalog of the test's own, not this project's table code).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from msgstream_spark.mirror.many import PROP_DROPPED_TS, PROP_NAME, PROP_RENAMED_TS
from tests.mirror_job.wal_log import NEW, OLD, WalLog, shard_of
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def table_rows(location, cols: list[str]) -> dict[int, dict]:
    dt = deltalake.DeltaTable(str(location))
    sql = f"SELECT {', '.join(cols)} FROM t"
    t = pa.table(deltalake.QueryBuilder().register("t", dt).execute(sql).read_all())
    out: dict[int, dict] = {}
    for r in t.to_pylist():
        assert r["pk"] not in out, f"pk {r['pk']} twice in {location}"
        out[r["pk"]] = r
    return out


def assert_tables(root, log: WalLog, where: dict[int, str]) -> None:
    for cid, path in where.items():
        cols = [f.name for f in log.schemas[cid].fields]
        want = {pk: {c: r.get(c) for c in cols} for pk, r in log.expected[cid].items()}
        assert table_rows(root / path, cols) == want, f"table {path} of collection id {cid}"


def _run(cfg: str, chans: list[str], root, spark) -> dict:
    from msgstream_spark.jobs import mirror

    argv = ["--config", cfg, "--include", r"(db1|db2|default)\..*", "--table-root", str(root), "--table-format",
            "delta", "--snapshot", "never", "--channels", ",".join(chans), "--max-rows-per-trigger", "20",
            "--progress-interval", "1"]
    return mirror.run(mirror.build_parser().parse_args(argv), spark)


def test_a_26_wal_database_mirror_through_every_collection_ddl(spark, local_env, tmp_path):
    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("wal26many") for _ in range(2)]
    root = tmp_path / "lake"
    later = [k for k in range(80, 120) if shard_of(k, 2) == 1][:3]  # keys of vchannel 1
    with local_env.client() as c:
        log = WalLog(c, chans)
        # step 1: three collections (both 2.6 forms) and one not selected; a fourth created mid-run; one dropped
        log.create("db1", "a", 11, NEW)
        log.create("db1", "b", 12, OLD)  # its inserts name db1: the stream's only word on its database
        log.create("default", "c", 13, OLD)  # its inserts name no database: Milvus's default
        log.create("x", "z", 19, NEW)
        log.insert(11, range(0, 30))
        log.insert(12, range(0, 10))
        log.insert(13, range(100, 110))
        log.insert(13, range(110, 120), partition=131)
        log.insert(19, range(5))
        log.tick()
        log.delete(11, [1, 2, 3])
        log.upsert(13, [100, 111], gen=1)
        log.tick()
        log.create("db2", "d", 14, NEW)
        log.insert(14, range(50, 70))
        log.delete(12, [0])
        log.tick()
        log.drop(12)
        log.upsert(11, [4, 5, 40], gen=2)
        log.delete(14, [50])
        log.tick()
        first = _run(cfg, chans, root, spark)
        where = {11: "db1/a", 12: "db1/b", 13: "default/c", 14: "db2/d"}
        assert sorted(first["tables"]) == ["db1.a", "db1.b", "db2.d", "default.c"], first
        assert first["batches"] >= 3
        assert_tables(root, log, where)
        b = deltalake.DeltaTable(str(root / "db1" / "b")).metadata().configuration
        assert b[PROP_DROPPED_TS] == str(first["tables"]["db1.b"]["dropped_ts"])  # the first copy's time
        assert not (root / "x").exists()

        # step 2: b's name created again, a field added to a, a partition of c dropped, d truncated
        log.create("db1", "b", 15, NEW)
        log.insert(15, range(7))
        log.add_field(11, "note")
        log.insert(11, [60, 61], extra={"note": "after"})
        log.upsert(11, [6], gen=3, extra={"note": "up"})
        log.insert(13, range(120, 125), partition=131)  # same batch as the drop, before it
        log.drop_partition(13, 131)
        log.insert(13, [130], partition=132)  # after the drop: stays
        log.insert(14, [70, 71])  # before the truncate, in its batch
        log.truncate(14, shards=[1], broadcast_id=777)  # its control copy and vchannel 1's now, vchannel 0's later
        log.insert(14, later)  # on vchannel 1 after its copy (before vchannel 0's): stays
        log.tick()
        second = _run(cfg, chans, root, spark)
        where[15] = "db1/b__15"
        assert_tables(root, log, where)
        assert sorted(log.expected[13]) == [*range(100, 110), 111, 130]  # 111 upserted into _default: stays
        assert log.expected[14] and set(later) < set(log.expected[14])  # vchannel 0's rows not truncated yet
        assert second["tables"]["db1.b"]["id"] == 12 and second["tables"]["db1.b__15"]["id"] == 15  # both kept
        assert second["tables"]["db1.b__15"]["dropped_ts"] is None

        # step 3: a renamed (and moved to db2) on the stream; its rows keep coming under the new name
        log.rename(11, name="a2", db="db2")
        log.insert(11, [90], extra={"note": "renamed"})
        log.delete(11, [0])
        log.create("db1", "a", 16, NEW)  # the old name free again: a new collection, a new table
        log.insert(16, [1])
        # d's truncate reaches vchannel 0: its rows go; vchannel 1's later rows, in the table, older than this copy,
        # stay (the table keeps no vchannel: the key's shard tells them apart, not the time)
        log.truncate(14, shards=[0], broadcast_id=777)
        log.tick()
        third = _run(cfg, chans, root, spark)
        log.close()
    where[16] = "db1/a__16"
    assert_tables(root, log, where)
    assert sorted(log.expected[14]) == later
    assert third["tables"]["db2.a2"]["id"] == 11 and third["tables"]["db1.a"]["id"] == 16, third
    props = deltalake.DeltaTable(str(root / "db1" / "a")).metadata().configuration
    assert props[PROP_NAME] == "db2.a2" and int(props[PROP_RENAMED_TS]) > 0
    assert not (root / "db2" / "a2").exists()  # the table stays where it is: the collection id decides


def _until(what: str, check, seconds: float = 240.0) -> None:
    """Poll ``check`` until it holds (bounded: fails after ``seconds`` naming ``what``)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if check():
                return
        except (OSError, ValueError, deltalake.exceptions.TableNotFoundError):
            pass  # the table is not there yet
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.2)


def test_a_pchannel_added_while_the_job_runs_is_read_from_its_start(spark, local_env, tmp_path):
    """Milvus 2.6.12+ adds pchannels online (``rootCoord.dmlChannelNum`` raised). The job, given no ``--channels``,
    reads the channels named like the cluster's DML channels (``channelPattern``) and lists them again before
    every batch: a channel that appears mid-run is read from its first message, and a collection created on it
    gets its table, while the first channel keeps streaming."""
    import yaml

    from msgstream_spark.jobs import mirror

    cluster = f"grow{uuid.uuid4().hex[:8]}"
    cfg = Path(config_file(local_env, tmp_path))
    cfg.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "msgchannel.channameprefix.cluster": cluster}))
    ch0, ch1 = (f"{cluster}-rootcoord-dml_{i}" for i in range(2))
    root = tmp_path / "lake"
    argv = ["--config", str(cfg), "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--trigger", "processing-time:1s", "--timeout", "600", "--progress-interval", "1"]
    out: dict = {}
    with local_env.client() as c:
        log = WalLog(c, [ch0])
        log.create("db1", "a", 21, NEW)
        log.insert(21, range(10))
        log.tick()
        job = threading.Thread(target=lambda: out.update(mirror.run(mirror.build_parser().parse_args(argv), spark)))
        job.start()
        try:
            _until("db1.a's first rows", lambda: len(table_rows(root / "db1" / "a", ["pk"])) == 10)
            log.add_pchannel(ch1)  # the cluster grows: a new pchannel, a collection placed on it
            log.create("db1", "b", 22, NEW, on=[ch1])
            log.insert(22, range(100, 105))
            log.insert(21, [10, 11])
            log.tick()
            _until("db1.b on the new channel", lambda: len(table_rows(root / "db1" / "b", ["pk"])) == 5)
            _until("db1.a's later rows", lambda: len(table_rows(root / "db1" / "a", ["pk"])) == 12)
        finally:
            for q in spark.streams.active:
                q.stop()
            job.join(timeout=120)
            log.close()
    assert not job.is_alive() and sorted(out["tables"]) == ["db1.a", "db1.b"], out
    assert_tables(root, log, {21: "db1/a", 22: "db1/b"})


def test_iceberg_tables_in_a_catalog_namespace(spark, local_env, tmp_path, monkeypatch):
    """``--catalog NAME --namespace NS``: each collection an Iceberg table ``NS.<db>__<name>`` of the catalog (a SQL
    catalog here, configured as pyiceberg users do), read back through a separately loaded catalog; a truncate, a
    rename (the table keeps its identifier) and a name created again (``__<id>``) through a restart."""
    from pyiceberg.catalog import load_catalog

    from msgstream_spark.jobs import mirror

    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{tmp_path}/lake.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", f"file://{tmp_path}/wh")
    ch = [local_env.new_channel("wal26ns") for _ in range(2)]
    argv = ["--config", config_file(local_env, tmp_path), "--database", "db1", "--catalog", "lake", "--namespace",
            "mirror", "--checkpoint", str(tmp_path / "chk"), "--snapshot", "never", "--channels", ",".join(ch),
            "--progress-interval", "1"]

    def lake():  # a catalog of its own, not the job's (pyiceberg read its environment at import)
        return load_catalog("lake", type="sql", uri=f"sqlite:///{tmp_path}/lake.db", warehouse=f"file://{tmp_path}/wh")

    def rows(ident: str, cid: int) -> dict[int, dict]:
        got = lake().load_table(ident).scan().to_arrow().select(["pk", "s", "fv"]).to_pylist()
        assert len(got) == len({r["pk"] for r in got}), ident
        return {r["pk"]: r for r in got}

    def want(cid: int) -> dict[int, dict]:
        return {pk: {c: r[c] for c in ("pk", "s", "fv")} for pk, r in log.expected[cid].items()}

    with local_env.client() as c:
        log = WalLog(c, ch)
        log.create("db1", "a", 31, NEW)
        log.create("db1", "b", 32, OLD)
        log.insert(31, range(12))
        log.insert(32, range(5))
        log.tick()
        log.truncate(32)
        log.insert(32, [7])
        log.upsert(31, [3], gen=1)
        log.tick()
        first = mirror.run(mirror.build_parser().parse_args(argv), spark)
        assert sorted(first["tables"]) == ["db1.a", "db1.b"], first
        assert rows("mirror.db1__a", 31) == want(31) and rows("mirror.db1__b", 32) == want(32)
        log.rename(31, name="a_old")
        log.create("db1", "a", 33, NEW)
        log.insert(33, [1, 2])
        log.insert(31, [50])
        log.tick()
        second = mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.insert(31, [51])  # a restart opens the renamed collection's table (it records the first name)
        log.delete(33, [1])
        log.tick()
        third = mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.close()
    assert second["tables"]["db1.a_old"]["id"] == 31 and second["tables"]["db1.a"]["id"] == 33, second
    assert third["tables"]["db1.a_old"]["changes"] == 1, third
    assert rows("mirror.db1__a", 31) == want(31)  # the renamed collection's table keeps its identifier
    assert rows("mirror.db1__a__33", 33) == want(33)
    props = lake().load_table("mirror.db1__a").properties
    assert props[PROP_NAME] == "db1.a_old"

