"""The snapshot from Milvus's storage (issue #30) against the real Milvus 2.3.5: its own binlogs and etcd.

The binlog reader and the plan read the files Milvus wrote (every 2.3.5 type; 2.3.5 has no nullable
fields, so no nulls) and must give what ``query`` returns; the job's ``--snapshot-source storage`` takes
several flushed segments, deletes in delete logs and in the growing segment, upserts, and writes running
through the snapshot, and after the stream catches up the table equals ``query`` row for row.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from tests.milvus_real.test_milvus_oracle import FIELDS, await_ticks, milvus_rows, pchannels
from tests.milvus_real.test_mirror import OnS3, Writer, assert_table_equals_query, last_ts, plain_reads, run_job
from tests.milvus_real.workload import (
    Workload,
    bin_row,
    bin_schema,
    create_all_types,
    expected_row,
    flush,
    load_for_query,
    normalize,
)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]


def storage_config(stack, base: dict | None = None, root: str | None = None, s3: dict | None = None) -> dict:
    """The keys the storage route reads, as the server's milvus.yaml has them (``s3``: minio.* keys instead)."""
    values = dict(base or {})
    values.update({"etcd.endpoints": stack.server.etcd, "etcd.rootPath": "by-dev", "common.storageType": "local",
                   "localStorage.path": root or str(stack.server.dir / "data")})
    if s3:
        values.update({"common.storageType": "minio", **s3})
    return values


@pytest.fixture(scope="module")
def scfg(milvus_stack, tmp_path_factory) -> str:
    values = {k: v for k, v in milvus_stack.env.config.values.items() if v not in ("", None)}
    values["mq.type"] = milvus_stack.mq
    values["milvus.address"] = milvus_stack.uri.removeprefix("http://")
    path = tmp_path_factory.mktemp("mirror-storage-cfg") / "cluster.yaml"
    path.write_text(yaml.safe_dump(storage_config(milvus_stack, values)))
    return str(path)


def _config(values: dict):
    from msgstream_spark.config.loader import Config

    return Config.load(None, overrides=values)


def _table_schema(mc, name: str) -> tuple[pa.Schema, str]:
    """The table's columns as the stream gives them (msg.dtypes), from Milvus's description."""
    from msgstream_spark.mirror.table import table_schema
    from msgstream_spark.msg.dtypes import SCALAR_ARROW, arrow_type_for

    d = mc.describe_collection(name)
    out, pk = [], ""
    for f in d["fields"]:
        t = int(f["type"])
        if f.get("is_dynamic"):
            out.append(pa.field("$meta", pa.string()))
            continue
        elem = int(f.get("element_type") or 0)
        typ = pa.list_(SCALAR_ARROW[elem]) if t == 22 else arrow_type_for(t)
        out.append(pa.field(f["name"], typ))
        pk = f["name"] if f.get("is_primary") else pk
    if d.get("enable_dynamic_field") and "$meta" not in [f.name for f in out]:
        out.append(pa.field("$meta", pa.string()))  # the stream's column; pymilvus's description leaves it out
    return table_schema(pa.schema(out), pk), pk


def _read_all(stack, name: str, root: str | None = None, s3: dict | None = None):
    """The storage route's rows of ``name`` (Spark-free: plan, deletes, units, a key pass where planned, read)."""
    from pymilvus import MilvusClient

    from msgstream_spark.mirror.snapshot.storage.reader import duplicate_winners
    from msgstream_spark.mirror.snapshot.storage.snapshot import prepare

    mc = MilvusClient(uri=stack.uri)
    try:
        schema, pk = _table_schema(mc, name)
        prep = prepare(_config(storage_config(stack, root=root, s3=s3)), mc, name, schema, pk)
    finally:
        mc.close()
    packing = prep.packing(2)
    if packing.key_pass:
        keys = pa.Table.from_batches([prep.reader.read_keys(t) for t in packing.key_pass])
        prep.reader.winners = duplicate_winners(keys, pk)
    batches = [b for units in packing.tasks for u in units for b in prep.reader.read_unit(u)]
    return prep, pa.Table.from_batches(batches, schema=prep.reader.schema)


def test_binlog_reader_on_the_files_milvus_wrote(milvus_stack, pymilvus_orm):
    """Every 2.3.5 type (two collections: one vector field each), several segments, partitions, deletes in
    delete logs, an upsert: the rows equal ``query``'s, the descriptors name the ids etcd lists."""
    from pymilvus import Collection

    from msgstream_spark.errors import MirrorError
    from msgstream_spark.mirror.snapshot.storage.binlog import parse
    from msgstream_spark.mirror.snapshot.storage.units import Bounds, Unit

    w = Workload("st_types", create_all_types(pymilvus_orm, "st_types"))
    w.insert(range(0, 120))
    flush(w.collection)
    w.insert(range(120, 240))
    w.delete([3, 4, 130])
    w.upsert([5, 131], gen=1)
    w.insert([9], gen=2)  # a re-insert of a key in an older segment of its channel: one unit, the newest row
    # flushed before the load: the re-inserted key 9 in two sealed segments (with one of them growing, 2.3.5's query
    # merges the two rows with an error on array fields: "wrong field type added", field type Array)
    load_for_query(w.collection)
    prep, got = _read_all(milvus_stack, "st_types")
    assert len(prep.plan.segments) >= 2 and prep.plan.deltas
    assert got.num_rows == len(set(got.column("pk").to_pylist())) and not prep.packing(2).key_pass
    first = prep.plan.tasks[0]  # keys outside the stats log's bounds fail the read (no unit could hold them)
    with pytest.raises(MirrorError, match="outside its stats log"):
        list(prep.reader.read_unit(Unit([first], {first.segment: Bounds(10**12, 10**12 + 1)})))
    rows = {r["pk"]: normalize({k: r[k] for k in FIELDS}) for r in got.to_pylist()}
    want = milvus_rows(w.collection)
    # Milvus calls a re-inserted key undefined: its query answered either row (checked on the real server);
    # the storage route keeps the newest
    assert rows.pop(9) == expected_row(9, 2) and want.pop(9) in (expected_row(9, 0), expected_row(9, 2))
    assert rows == want
    assert set(got.column("_partition").to_pylist()) == {t.partition for t in prep.plan.tasks}
    assert max(got.column("_ts").to_pylist()) <= max(p.timestamp for p in prep.plan.checkpoints.values())
    data = milvus_stack.server.dir / "data"
    t = prep.plan.tasks[0]
    d = parse((data / t.path(1)).read_bytes(), t.path(1)).descriptor
    assert (d.collection_id, d.segment_id, d.field_id, d.data_type) == (prep.collection_id, t.segment, 1, 5)

    b = Collection("st_bin", bin_schema(), using=pymilvus_orm, shards_num=1)
    b.create_partition("p1")
    b.insert([bin_row(i) for i in range(0, 30)])
    b.insert([bin_row(i) for i in range(30, 50)], partition_name="p1")
    b.delete('key in ["k3", "k31"]')
    load_for_query(b, "bv", flushed=False)  # for query; _read_all's plan flushes
    _, got = _read_all(milvus_stack, "st_bin")
    want = {r["key"]: bytes(r["bv"][0]) for r in b.query('key != ""', output_fields=["*"], consistency_level="Strong")}
    assert {r["key"]: r["bv"] for r in got.to_pylist()} == want and len(want) == 48


def test_a_file_gone_mid_read_names_the_segment_and_the_gc_setting(milvus_stack, pymilvus_orm, tmp_path):
    """Garbage collection after a compaction, modelled on a copy of Milvus's files: the read fails naming the
    segment and dataCoord.gc.dropTolerance; a re-plan (the files back) reads it."""
    from msgstream_spark.errors import MirrorError
    from msgstream_spark.mirror.snapshot.storage.access import SegmentGoneError
    from msgstream_spark.mirror.snapshot.storage.snapshot import with_replans

    w = Workload("st_gone", create_all_types(pymilvus_orm, "st_gone"))
    w.insert(range(0, 50))
    flush(w.collection)
    copy = tmp_path / "data"
    shutil.copytree(milvus_stack.server.dir / "data", copy, ignore=shutil.ignore_patterns("etcd.data", "rocksmq"))
    prep, _ = _read_all(milvus_stack, "st_gone", root=str(copy))
    task = prep.plan.tasks[0]
    victim = copy / task.path(105)
    saved = victim.read_bytes()
    os.remove(victim)
    with pytest.raises(SegmentGoneError) as e:
        prep.reader.read(task)
    assert str(task.segment) in str(e.value) and "dataCoord.gc.dropTolerance" in str(e.value)
    assert SegmentGoneError.in_text(f"PythonException: {e.value}\n at ...").segment == task.segment
    calls = []

    def attempt():
        calls.append(1)
        if len(calls) == 2:
            victim.write_bytes(saved)
        return prep.reader.read(task).num_rows

    assert with_replans(attempt) == task.rows and len(calls) == 2
    os.remove(victim)
    with pytest.raises(MirrorError, match="dataCoord.gc.dropTolerance"):
        with_replans(lambda: prep.reader.read(task), attempts=2)


def test_storage_snapshot_while_writing_then_stream_equals_query(spark, milvus_stack, pymilvus_orm, scfg,
                                                                  tmp_path, s3):
    """The snapshot's output into a Delta table on the S3 server (tests/milvus_real_pulsar/test_mirror_storage.py
    runs the same into a local directory)."""
    storage_snapshot_while_writing(spark, milvus_stack, pymilvus_orm, scfg, tmp_path, OnS3.make(s3, tmp_path, "t",
                                                                                                "delta"))


def storage_snapshot_while_writing(spark, milvus_stack, pymilvus_orm, scfg, tmp_path, on: OnS3 | None = None):
    """Several flushed segments, deletes in delete logs and in the growing segment, upserts, a writer running
    through the snapshot; the table from storage + stream equals ``query`` row for row (``on``: the table on the
    S3 server, also as plain readers read it; default a directory in ``tmp_path``)."""
    name = "st_mirror"
    table, where, more = (on.uri, on.where, on.args) if on else (tmp_path / "t", {}, ())
    w = Workload(name, create_all_types(pymilvus_orm, name))
    w.insert(range(0, 600))
    flush(w.collection)
    w.insert(range(600, 1200))
    w.delete(list(range(0, 30)))
    w.upsert(range(40, 60), gen=1)
    flush(w.collection)  # deletes and upserts in delete logs
    w.insert(range(1200, 1300))
    w.delete(list(range(600, 610)))
    w.upsert(range(620, 630), gen=2)  # in the growing segment: flushed by the job, or streamed
    before = len(w.acked)
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, name)), *more]
    writer = Writer([w], first_new=1300).start()
    try:
        s = run_job(spark, scfg, name, table, "delta", "--snapshot-source", "storage", *chans)
    finally:
        writer.stop()
    snap = s["snapshot"]
    assert snap["source"] == "storage" and snap["mode"] == "initial" and snap["segments"] >= 2
    assert [x for x in w.acked[before:] if x.ts and x.ts > snap["S"]], "no write after S"
    await_ticks(milvus_stack, last_ts(w), pchannels(pymilvus_orm, name))
    assert run_job(spark, scfg, name, table, "delta", "--snapshot-source", "storage",
                   *chans)["snapshot"]["mode"] == "resumed"
    load_for_query(w.collection, flushed=False)  # for query (the job flushed)
    assert_table_equals_query(table, "delta", w, **where)
    if on:
        want = milvus_rows(w.collection)
        assert all(got == want for got in plain_reads(on.uri, "delta", name, where))


def test_storage_route_refuses_a_missing_config_key(spark, milvus_stack, pymilvus_orm, scfg, tmp_path, capsys):
    from msgstream_spark.jobs import mirror
    from msgstream_spark.jobs._common import main_wrapper

    w = Workload("st_bad", create_all_types(pymilvus_orm, "st_bad"))
    w.insert(range(0, 10))
    cfg = tmp_path / "no-etcd.yaml"
    cfg.write_text(yaml.safe_dump({k: v for k, v in yaml.safe_load(Path(scfg).read_text()).items()
                                   if k != "etcd.endpoints"}))
    argv = ["--config", str(cfg), "--table-format", "delta", "--collection", "st_bad", "--table", str(tmp_path / "t"),
            "--snapshot-source", "storage", "--channels", ",".join(pchannels(pymilvus_orm, "st_bad"))]
    capsys.readouterr()
    assert main_wrapper(mirror.build_parser(), lambda a: mirror.run(a, spark), argv) == 1
    assert "etcd.endpoints" in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_same_files_read_from_s3_compatible_storage(milvus_stack, pymilvus_orm, tmp_path):
    """Milvus's files under a bucket's root path on an S3-compatible server (moto's), read with the minio.* keys
    Milvus uses: the rows equal the local read's; the secret is in no error text."""
    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    from msgstream_spark.mirror.snapshot.storage.access import SegmentGoneError
    from tests.fixtures.ports import free_port

    w = Workload("st_s3", create_all_types(pymilvus_orm, "st_s3"))
    w.insert(range(0, 80))
    w.delete([1, 2])
    flush(w.collection)
    local_prep, local_rows = _read_all(milvus_stack, "st_s3")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        s3 = fs.S3FileSystem(access_key="AK", secret_key="SK-secret", endpoint_override=f"127.0.0.1:{port}",
                             scheme="http", region="us-east-1", allow_bucket_creation=True)
        s3.create_dir("milvus-bucket")
        data = milvus_stack.server.dir / "data"
        for task in local_prep.plan.tasks:
            for _, rel in task.files:
                with s3.open_output_stream(f"milvus-bucket/files/{rel}") as out:
                    out.write((data / rel).read_bytes())
        stats = [rel for paths in local_prep.plan.stats.values() for rel in paths]
        for rel in [rel for _, _, rel in local_prep.plan.deltas] + stats:
            with s3.open_output_stream(f"milvus-bucket/files/{rel}") as out:
                out.write((data / rel).read_bytes())
        keys = {"minio.address": "127.0.0.1", "minio.port": port, "minio.bucketName": "milvus-bucket",
                "minio.rootPath": "files", "minio.accessKeyID": "AK", "minio.secretAccessKey": "SK-secret",
                "minio.useSSL": False}
        prep, rows = _read_all(milvus_stack, "st_s3", s3=keys)
        assert prep.reader.settings.kind == "s3"
        assert sorted(rows.to_pylist(), key=lambda r: r["pk"]) == sorted(local_rows.to_pylist(), key=lambda r: r["pk"])
        assert rows.num_rows == 78
        s3.delete_file(f"milvus-bucket/files/{prep.plan.tasks[0].path(1)}")
        with pytest.raises(SegmentGoneError) as e:
            prep.reader.read(prep.plan.tasks[0])
        assert "SK-secret" not in str(e.value) and "SK-secret" not in repr(prep.reader.settings)
    finally:
        server.stop()


def test_etcd_reads_are_pinned_to_one_revision(milvus_stack):
    """The gateway's first range fixes the revision; a key written after it is not in later ranges of the same
    plan, and a new plan sees it (a key outside Milvus's own prefixes)."""
    import base64
    import json
    import urllib.request

    from msgstream_spark.mirror.snapshot.storage.etcdmeta import EtcdGateway

    prefix = f"msgstream-test/{os.getpid()}/"
    gw = EtcdGateway(milvus_stack.server.etcd)
    assert gw.range(prefix) == {} and gw.revision
    body = json.dumps({"key": base64.b64encode(f"{prefix}k".encode()).decode(),
                       "value": base64.b64encode(b"v").decode()}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{gw.url}/v3/kv/put", data=body), timeout=10).read()
    assert gw.range(prefix) == {}
    assert EtcdGateway(milvus_stack.server.etcd).range(prefix) == {f"{prefix}k": b"v"}
