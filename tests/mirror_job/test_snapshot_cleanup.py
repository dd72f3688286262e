"""The query route's snapshot files in the table's store: a snapshot whose read fails leaves nothing in the
table's location (one directory per retry before), on a local disk and on an S3 server; a read that succeeds
writes its files straight into the store with the snapshot's write options."""

from __future__ import annotations

import socket

import pyarrow as pa
import pytest

from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.reader import RangeReader
from msgstream_spark.mirror.snapshot.query.rpc import QueryTarget

pytestmark = pytest.mark.slow


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_failed_snapshot_write_removes_its_directory(spark, tmp_path, request, where):
    from msgstream_spark.config.loader import Config
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.mq.milvus.settings import MilvusSettings
    from msgstream_spark.spark.snapshot import write_snapshot

    settings = MilvusSettings(Config.from_dict({"mq": {"type": "milvus"}, "milvus": {  # nobody listens there
        "address": f"127.0.0.1:{closed_port()}", "requestTimeout": 2, "metadataPath": str(tmp_path / "m.json")}}))
    target = QueryTarget(settings, "c", 7)
    schema = table_schema(pa.schema([("pk", pa.int64()), ("v", pa.string())]), "pk")
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        store = open_store(s3.uri("t"), s3.options())
    else:
        (tmp_path / "t").mkdir()
        store = open_store(str(tmp_path / "t"))
    for attempt in range(2):  # a retried snapshot does not pile up directories either
        with pytest.raises(Exception, match="127.0.0.1"):
            write_snapshot(spark, RangeReader(target, "pk", False, schema, 100), [PkRange()],
                           store.join(f"snapshot-100-{attempt}"), 10, progress_interval=60, store=store)
    assert list(store.list(store.join(""))) == []
    if where == "local":
        assert list((tmp_path / "t").iterdir()) == []


@pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")
def test_the_snapshot_files_go_straight_into_an_s3_table(spark, milvus_proxy, s3, tmp_path):
    """Two ranges read from the proxy's model at S by Spark tasks, written into a bucket: the files are the store's
    URIs, their rows the model's, the counts the tasks'; the float vectors uncompressed and without statistics,
    the other columns snappy with statistics (the key's bounds a commit records come from them)."""
    from msgstream_spark.mirror.snapshot.query.reader import plan_ranges
    from msgstream_spark.mirror.snapshot.query.rpc import Querier
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.mirror.write.files import footer, read_parquet
    from msgstream_spark.mq.milvus.settings import MilvusSettings
    from msgstream_spark.msg.schema import collection_arrow_schema
    from msgstream_spark.spark.snapshot import write_snapshot
    from tests.fixtures.milvus_env import milvus_config
    from tests.milvus_proxy.wal import tso_now
    from tests.mq_milvus.collection_log import CID, NAME, PARTITIONS, collection_schema, row

    model = milvus_proxy.state.add_model("default", NAME, CID, ["dml_0"], [f"dml_0_{CID}v0"], collection_schema(),
                                         PARTITIONS)
    with model.lock:
        model.put(row(k) for k in range(400))
    s = tso_now()
    target = QueryTarget(MilvusSettings(milvus_config(milvus_proxy.address, tmp_path)), NAME, CID, floor_ts=s)
    q = Querier(target)
    try:
        ranges = plan_ranges(q, "pk", False, 2)
    finally:
        q.close()
    schema = table_schema(collection_arrow_schema(collection_schema()), "pk")
    store = open_store(s3.uri("t"), s3.options())
    out = store.join(f"snapshot-{s}-x")
    files = write_snapshot(spark, RangeReader(target, "pk", False, schema, s, row_bytes=200), ranges, out, 400,
                           progress_interval=60, store=store)
    assert len(files.files) == len(ranges) == 2 and all(f.startswith(out + "/") for f in files.files)
    assert sorted(m.uri for m in store.list(out)) == files.files  # nothing else: no temporary object left
    assert files.rows == 400 and files.calls >= len(ranges)
    got = pa.concat_tables([read_parquet(store, f) for f in files.files])
    assert sorted(got.column("pk").to_pylist()) == list(range(400))
    meta = footer(store, files.files[0])[1]
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    for i, name in enumerate(names):
        col = meta.row_group(0).column(i)
        if name.startswith("fv."):  # the vector's floats
            assert col.compression == "UNCOMPRESSED" and col.statistics is None, name
        elif name == "pk":
            assert col.compression == "SNAPPY" and col.statistics.has_min_max, name


def test_a_key_read_in_two_partitions_is_one_snapshot_row(spark, tmp_path):
    """Two partitions' reads both hold key 5 (moved between them during the snapshot, or inserted into both):
    the snapshot's files keep one row for it, the one of the larger partition id."""
    import pyarrow.parquet as pq

    from msgstream_spark.mirror.order import snapshot_seq_array
    from msgstream_spark.spark.snapshot import one_row_per_key

    out = tmp_path / "t" / "snapshot-100-x"
    out.mkdir(parents=True)
    for part, keys in ((11, [1, 5, 7]), (12, [5, 9])):
        n = len(keys)
        pq.write_table(pa.table({"pk": pa.array(keys, pa.int64()), "v": [f"p{part}"] * n,
                                 "_ts": pa.array([100] * n, pa.int64()), "_seq": snapshot_seq_array(100, n),
                                 "_partition": pa.array([part] * n, pa.int64())}), out / f"part-{part}.parquet")
    assert one_row_per_key(spark, str(out), "pk") == 1
    got = sorted((r["pk"], r["v"], r["_partition"]) for r in pq.read_table(out).to_pylist())
    assert got == [(1, "p11", 11), (5, "p12", 12), (7, "p11", 11), (9, "p12", 12)]
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["snapshot-100-x"]
    assert one_row_per_key(spark, str(out), "pk") == 0
