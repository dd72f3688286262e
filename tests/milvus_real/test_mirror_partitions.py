"""The mirror's ``_partition`` against the real Milvus 2.3.5: snapshot rows carry the id of the partition
they live in, the same id Milvus writes into the insert messages that the stream applies later.

A collection without a partition key, rows in ``_default`` and in a named partition, the snapshot, then
new rows in both partitions through the stream: every table row's ``_partition`` is the id Milvus's own
``ShowPartitions`` (through pymilvus's stub) gives for the partition the test wrote it into.
"""

from __future__ import annotations

import pytest
import yaml

from tests.milvus_real.test_milvus_oracle import await_ticks, pchannels
from tests.milvus_real.test_mirror import run_job
from tests.milvus_real.workload import bin_row, bin_schema, load_for_query

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]


@pytest.fixture
def cfg(milvus_stack, tmp_path) -> str:
    """The job's config: the cluster's Kafka (through the shim) and its proxy as ``milvus.address``."""
    values = {k: v for k, v in milvus_stack.env.config.values.items() if v not in ("", None)}
    values.update({"mq.type": "kafka", "milvus.address": milvus_stack.uri.removeprefix("http://")})
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def partition_ids(alias: str, name: str) -> dict[str, int]:
    """Partition name -> id, as Milvus answers ``ShowPartitions`` (pymilvus's own stub and protos)."""
    from pymilvus import connections
    from pymilvus.grpc_gen import milvus_pb2

    stub = connections._fetch_handler(alias)._stub
    resp = stub.ShowPartitions(milvus_pb2.ShowPartitionsRequest(collection_name=name), timeout=30)
    return dict(zip(resp.partition_names, resp.partitionIDs))


def test_snapshot_and_stream_rows_carry_the_partition_milvus_put_them_in(spark, milvus_stack, pymilvus_orm, cfg,
                                                                         tmp_path):
    from pymilvus import Collection

    from msgstream_spark.mirror.table import open_table

    col = Collection("mir_parts", bin_schema(), using=pymilvus_orm, shards_num=2)
    col.create_partition("pa")
    where: dict[str, str] = {}

    def insert(keys: range, partition: str):
        r = col.insert([bin_row(i) for i in keys], partition_name=partition)
        where.update({f"k{i}": partition for i in keys})
        return int(r.timestamp)

    insert(range(0, 60), "_default")
    insert(range(60, 120), "pa")
    load_for_query(col, "bv")  # flushed, as before: keys moved between partitions (see test_mirror_keys.py)
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, "mir_parts"))]
    first = run_job(spark, cfg, "mir_parts", tmp_path / "t", "delta", "--snapshot-tasks", "2", *chans)
    assert first["snapshot"]["mode"] == "initial" and first["snapshot"]["rows"] == 120
    insert(range(120, 130), "pa")
    ts = insert(range(130, 140), "_default")
    await_ticks(milvus_stack, ts, pchannels(pymilvus_orm, "mir_parts"))
    assert run_job(spark, cfg, "mir_parts", tmp_path / "t", "delta", *chans)["snapshot"]["mode"] == "resumed"

    ids = partition_ids(pymilvus_orm, "mir_parts")
    assert set(ids) == {"_default", "pa"} and ids["_default"] != ids["pa"]
    rows = open_table("delta", str(tmp_path / "t"), collection="mir_parts", pk="key", create=False).to_arrow()
    got = {r["key"]: r for r in rows.to_pylist()}
    assert sorted(got) == sorted(where)
    snapshot_s = first["snapshot"]["S"]
    from_snapshot = {k for k, r in got.items() if r["_ts"] == snapshot_s}
    assert from_snapshot == {f"k{i}" for i in range(120)}  # the later rows came through the stream
    wrong = {k: (r["_partition"], where[k]) for k, r in got.items() if r["_partition"] != ids[where[k]]}
    assert not wrong, f"{len(wrong)} rows with another partition id than Milvus's {ids}: {sorted(wrong.items())[:3]}"
    assert all(got[f"k{i}"]["bv"] == bin_row(i)["bv"] for i in range(140))
