"""Staging through the tables' store (``mirror run --database ... --staging LOCATION``): a pending collection's
batches staged in object storage by the batch's tasks (what a cluster needs: its machines share no disk), each
task attempt's file named uniquely and ``staged.json``, written by the driver last, listing the files that count;
the staged batches and bytes per pending collection as metrics (docs/mirror.md "Snapshots while streaming")."""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixtures.ports import free_port
from tests.fixtures.waits import wait_until
from tests.jobs.test_mirror_metrics import scrape, total
from tests.mirror_job.many_log import ManyLog, two_pending
from tests.mirror_job.test_mirror_many_beside import HOLD, _alive
from tests.mirror_job.test_mirror_many_kills import Lake, run

pytestmark = pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"staging": None, "table_root": None, "namespace": None, **kw})


def test_the_staging_location_by_master_and_flags(tmp_path):
    """``--staging`` wins; else ``<checkpoint>/staged`` with a local master, ``<table-root>/.msgstream-staged`` on a
    cluster; ``--namespace`` on a cluster without ``--staging`` is an error naming it; a run whose staging differs
    from the one its pending collections were staged at fails naming both."""
    from msgstream_spark.errors import MirrorError
    from msgstream_spark.jobs.mirror_many_pending import _kept_staging, staging_root

    chk = str(tmp_path / "chk")
    assert staging_root("local[2]", _args(table_root="s3://b/lake"), chk) == f"{chk}/staged"
    assert staging_root("spark://h:7077", _args(table_root="s3://b/lake"), chk) == "s3://b/lake/.msgstream-staged"
    assert staging_root("yarn", _args(table_root="s3://b/lake", staging="s3://b/st"), chk) == "s3://b/st"
    assert staging_root("local[*]", _args(staging="s3://b/st", namespace="ns"), chk) == "s3://b/st"
    with pytest.raises(MirrorError, match="--staging LOCATION"):
        staging_root("spark://h:7077", _args(namespace="ns"), chk)
    _kept_staging(chk, "s3://b/st", [])
    _kept_staging(chk, "s3://b/other", [])  # nothing pending: the new place is recorded
    with pytest.raises(MirrorError, match="s3://b/other.*s3://b/st"):
        _kept_staging(chk, "s3://b/st", [12])


def test_status_of_a_local_root_skips_the_staging(tmp_path):
    """``mirror status --table-root`` without a checkpoint lists the directories two levels down: the default
    staging of a cluster, ``<table-root>/.msgstream-staged/<collection id>``, is no database's table."""
    from msgstream_spark.cli.mirror_root_status import root_tables

    (tmp_path / "db1" / "a").mkdir(parents=True)
    (tmp_path / ".msgstream-staged" / "12" / "batch-3").mkdir(parents=True)
    assert [(t["database"], t["collection"]) for t in root_tables(str(tmp_path), None)] == [("db1", "a")]


def _payloads(spark, store, cid: int, batch_id: int) -> list[bytes]:
    from msgstream_spark.spark.mirror_many_staging import staged_payload

    _, df = staged_payload(spark, store, cid, batch_id)
    return sorted(bytes(r.payload) for r in df.collect())


def test_a_batch_staged_again_on_s3_replaces_its_files(spark, s3):
    """A batch staged twice with the same id (Spark's rerun after a kill): the second mark lists only the rerun's
    files, the first attempt's are gone, the rows read back once; a file no mark lists (a lost task attempt's) is
    never read; a batch without its mark is not staged; clearing collection 7 leaves collection 70's."""
    from msgstream_spark.mirror.store import open_store, uri
    from msgstream_spark.spark.mirror_many_staging import MARK, batch_dir, clear, stage, staged

    store = open_store(s3.uri("staging"), s3.options())
    rows = [("rows", 7, f"p{i}".encode()) for i in range(20)] + [("rows", 70, b"q"), ("create", 7, None)]
    df = spark.createDataFrame(rows, "kind string, _collection long, payload binary").repartition(3)
    want = sorted(f"p{i}".encode() for i in range(20))

    def files(cid: int, batch_id: int) -> list[str]:
        return json.loads(store.read(uri.join(batch_dir(store.root, cid, batch_id), MARK)))["files"]

    first = stage(df, store, 5, {7: (True, []), 70: (True, [])})
    before = files(7, 5)
    again = stage(df, store, 5, {7: (True, []), 70: (True, [])})
    after = files(7, 5)
    assert before and after and not set(before) & set(after)
    where = batch_dir(store.root, 7, 5)
    assert sorted(o.uri for o in store.list(where)) == sorted(uri.join(where, f) for f in [*after, MARK])
    assert _payloads(spark, store, 7, 5) == want  # once, not twice
    assert first[7] == again[7] == sum(store.head(uri.join(where, f)).size for f in after)
    lost = pa.table({"payload": pa.array([b"p0", b"zz"], pa.binary())})  # a speculative attempt's file
    with store.open_output(uri.join(where, "rows", "part-lost.parquet")) as out:
        pq.write_table(lost, out)
    assert _payloads(spark, store, 7, 5) == want
    stage(df, store, 6, {7: (True, [])})
    store.delete(uri.join(batch_dir(store.root, 7, 6), MARK))  # killed before its mark: unfinished
    assert staged(store, 7) == {5: again[7]} and staged(store, 70) == {5: again[70]}
    clear(store, 7)
    assert not list(store.list(uri.join(store.root, "7"))) and staged(store, 70) == {5: again[70]}
    assert _payloads(spark, store, 70, 5) == [b"q"]


def test_a_snapshot_beside_the_stream_staged_on_s3(spark, local_env, milvus_proxy, s3, tmp_path, monkeypatch):
    """Tables and staging on the S3 server (``--staging s3://...``: the store path a cluster takes): while db1.b's
    snapshot is held, its changes are staged as objects (nothing on the driver's disk), the metrics show b's staged
    batches and their bytes (the objects' sizes), a's table takes a batch; after the handover b's table equals its
    rows, each batch recorded once, its staging and its series gone."""
    lake, port = Lake(s3, tmp_path, monkeypatch), free_port()
    chans = [local_env.new_channel("st3") for _ in range(2)]
    state = milvus_proxy.state
    cfg = lake.config(local_env, tmp_path, **{"milvus.address": milvus_proxy.address,
                                              "milvus.requesttimeout": 3 * HOLD})
    staging = s3.uri("staging")
    argv = ["--config", cfg, "--database", "db1", *lake.args, "--snapshot", "initial", "--channels", ",".join(chans),
            "--num-snapshot-tasks", "1", "--snapshot-concurrency", "1", "--staging", staging,
            "--metrics-port", str(port), "--trigger", "processing-time:200ms", "--timeout", "300"]
    b3 = s3.server.boto3()

    def marks() -> dict[str, int]:
        objs = b3.list_objects_v2(Bucket=s3.bucket, Prefix="staging/52/").get("Contents", [])
        return {o["Key"]: o["Size"] for o in objs}

    seen: dict = {}
    with local_env.client() as c:
        log = ManyLog(c, chans)
        two_pending(log, state, 51, 52)

        def hold(request) -> None:  # b's first Query: its S taken; b's changes now come after it
            if request.collection_name != "b" or "held" in seen:
                return
            seen["held"] = True
            log.insert(52, [100, 101])
            log.delete(52, [0])
            log.upsert(52, [5], gen=1)
            log.insert(51, [100])
            log.tick()
            b = lake.table("db1", "b")

            def agree() -> bool:  # b staged (its marks and files as objects), the metrics showing the same
                objects, got = marks(), scrape(port)
                seen["objects"], seen["scrape"] = objects, got
                files = sum(n for k, n in objects.items() if k.endswith(".parquet"))
                return (files > 0 and total(got, "msgstream_mirror_staged_bytes", table=b) == files
                        and total(got, "msgstream_mirror_staged_batches", table=b)
                        == len([k for k in objects if k.endswith("/staged.json")]))

            try:
                wait_until(agree, HOLD, "b staged, the staged metrics showing it", seen=lambda: seen)
                wait_until(lambda: 100 in lake.rows("db1", "a"), HOLD, "a's row 100 in a's table")
            except AssertionError as exc:
                seen["error"] = exc
            seen["done"] = True

        state.on_query = hold
        out: list = []
        job = threading.Thread(target=lambda: out.append(run(spark, argv)))
        job.start()
        try:
            wait_until(lambda: "done" in seen, 2 * HOLD, "b's snapshot held",
                       alive=lambda: _alive(job, out))
            wait_until(lambda: lake.keys("db1", "b", "_delta_log/"), HOLD, "b's snapshot committed",
                       alive=lambda: _alive(job, out))
            log.insert(52, [300])  # the first batch after b's snapshot: its handover, then these rows
            log.delete(52, [3])
            log.tick()
            wait_until(lambda: lake.rows("db1", "b") == log.expected[("db1", "b", 52)], HOLD,
                       "b's table equal to its rows", alive=lambda: _alive(job, out))
            after = scrape(port)
        finally:
            state.on_query = None
            for q in spark.streams.active:
                q.stop()
            job.join(HOLD)
        log.close()
    assert "error" not in seen, seen.get("error")
    b = lake.table("db1", "b")
    assert total(seen["scrape"], "msgstream_mirror_staged_batches", table=b) >= 1, seen
    assert not (lake.chk / "staged").exists()  # nothing staged on the driver's disk
    assert out and out[0]["handed_over"] == [51, 52], out
    lake.check(log)  # both tables equal to their rows, no batch recorded twice
    assert not marks() and not total(after, "msgstream_mirror_staged_batches", table=b)


def test_a_batch_staged_by_the_version_before_is_read(spark, tmp_path):
    """A restart over staging the version before wrote (Spark's own Parquet write of ``rows/``, a ``staged.json``
    without ``files``): its rows are read back at the handover, not taken as none."""
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.spark.mirror_many_staging import MARK, batch_dir, staged

    store = open_store(str(tmp_path / "staged"))
    where = Path(batch_dir(store.root, 7, 4))
    rows = [(f"p{i}".encode(),) for i in range(5)]
    spark.createDataFrame(rows, "payload binary").write.mode("overwrite").parquet(str(where / "rows"))
    (where / MARK).write_text(json.dumps({"rows": True, "removals": []}))
    assert list(staged(store, 7)) == [4]
    assert _payloads(spark, store, 7, 4) == sorted(r[0] for r in rows)
