"""jobs/mirror.py against the real Milvus 2.3.5: what a key and a field are (issue #32, items 4-6).

- A field whose name starts with ``_`` (Milvus accepts ``_tag``) is a column of the table, from the snapshot
  and from the stream.
- A key held in two partitions when the snapshot reads them (inserted into both, as Milvus allows, or moved
  from one to the other between the two partitions' reads) is one row of the table, and a key moved after
  the snapshot (deleted from one partition, inserted into another) stays one row.
- A delete naming a partition the key is not in: Milvus keeps the key (its query node applies a delete to
  the named partition's segments only), the mirror deletes the key's row (docs/mirror.md says so).
- An empty Iceberg table without S, start positions or checkpoint (what a kill between the two commits of
  an earlier release left) is snapshotted, not streamed from ``--starting``.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
import yaml

from tests.milvus_real.test_milvus_oracle import await_ticks, pchannels
from tests.milvus_real.test_mirror import assert_table_equals_query, last_ts, run_job
from tests.milvus_real.workload import Workload, create_all_types, load_for_query

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]


@pytest.fixture
def cfg(milvus_stack, tmp_path) -> str:
    values = {k: v for k, v in milvus_stack.env.config.values.items() if v not in ("", None)}
    values.update({"mq.type": milvus_stack.mq, "milvus.address": milvus_stack.uri.removeprefix("http://")})
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def table_of(fmt: str, table, collection: str, pk: str) -> dict:
    from msgstream_spark.mirror.table import open_table

    rows = open_table(fmt, str(table), collection=collection, pk=pk, create=False).to_arrow().to_pylist()
    keys = [r[pk] for r in rows]
    assert len(keys) == len(set(keys)), f"a key is in the table twice: {sorted(k for k in keys if keys.count(k) > 1)}"
    return {r[pk]: r for r in rows}


def test_a_field_named_with_an_underscore_is_a_column(spark, milvus_stack, pymilvus_orm, cfg, tmp_path):
    from pymilvus import Collection, CollectionSchema, DataType, FieldSchema

    schema = CollectionSchema([FieldSchema("pk", DataType.INT64, is_primary=True),
                               FieldSchema("_tag", DataType.VARCHAR, max_length=16),
                               FieldSchema("fv", DataType.FLOAT_VECTOR, dim=2)])
    col = Collection("mir_tag", schema, using=pymilvus_orm, shards_num=2)

    def rows(keys, gen=0):
        return [{"pk": i, "_tag": f"t{i}.{gen}", "fv": [float(i), float(gen)]} for i in keys]

    col.insert(rows(range(0, 100)))
    load_for_query(col, flushed=False)  # for the snapshot's queries
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, "mir_tag"))]
    first = run_job(spark, cfg, "mir_tag", tmp_path / "t", "iceberg", *chans)
    assert first["snapshot"]["mode"] == "initial" and first["snapshot"]["rows"] == 100
    col.insert(rows(range(100, 120)))
    col.delete("pk in [0, 1, 2]")
    ts = col.upsert(rows(range(10, 15), gen=1)).timestamp
    await_ticks(milvus_stack, int(ts), pchannels(pymilvus_orm, "mir_tag"))
    assert run_job(spark, cfg, "mir_tag", tmp_path / "t", "iceberg", *chans)["snapshot"]["mode"] == "resumed"
    want = {r["pk"]: r["_tag"] for r in col.query("pk >= 0", output_fields=["_tag"], consistency_level="Strong",
                                                 limit=16384)}
    got = {k: r["_tag"] for k, r in table_of("iceberg", tmp_path / "t", "mir_tag", "pk").items()}
    assert got == want and got[10] == "t10.1" and 0 not in got and got[119] == "t119.0"


def test_a_key_in_two_partitions_is_one_row(spark, milvus_stack, pymilvus_orm, cfg, tmp_path):
    from pymilvus import Collection, CollectionSchema, DataType, FieldSchema

    schema = CollectionSchema([FieldSchema("key", DataType.VARCHAR, is_primary=True, max_length=16),
                               FieldSchema("v", DataType.INT64), FieldSchema("fv", DataType.FLOAT_VECTOR, dim=2)])
    col = Collection("mir_moved", schema, using=pymilvus_orm, shards_num=2)
    col.create_partition("pa")

    def rows(keys, v):
        return [{"key": f"k{i}", "v": v, "fv": [float(i), float(v)]} for i in keys]

    col.insert(rows(range(0, 60), 0))
    col.insert(rows(range(60, 120), 1), partition_name="pa")
    col.insert(rows([5], 2), partition_name="pa")  # k5 in both partitions (Milvus does not forbid it)
    load_for_query(col)  # flushed: growing segments gave k5 (in two partitions) its old value after an upsert
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, "mir_moved"))]
    first = run_job(spark, cfg, "mir_moved", tmp_path / "t", "delta", "--snapshot-tasks", "2", *chans)
    assert first["snapshot"]["mode"] == "initial" and first["snapshot"]["rows"] == 120
    snap = table_of("delta", tmp_path / "t", "mir_moved", "key")
    assert len(snap) == 120 and snap["k5"]["v"] in (0, 2)
    # after the snapshot: k7 moves from _default to pa; k5 changes (an upsert into pa); k70 (in pa) is deleted
    # naming _default, which Milvus applies to _default's segments only
    col.delete('key in ["k7"]')
    col.insert(rows([7], 3), partition_name="pa")
    col.upsert(rows([5], 4), partition_name="pa")
    col.delete('key in ["k70"]', partition_name="_default")
    ts = col.insert(rows([200], 5)).timestamp
    await_ticks(milvus_stack, int(ts), pchannels(pymilvus_orm, "mir_moved"))
    assert run_job(spark, cfg, "mir_moved", tmp_path / "t", "delta", *chans)["snapshot"]["mode"] == "resumed"
    got = {k: r["v"] for k, r in table_of("delta", tmp_path / "t", "mir_moved", "key").items()}
    want = {r["key"]: r["v"] for r in col.query('key >= ""', output_fields=["v"], consistency_level="Strong",
                                                limit=16384)}
    assert want["k7"] == 3 and want["k5"] == 4 and "k70" in want  # Milvus: the partition-scoped delete missed it
    assert got["k7"] == 3 and got["k5"] == 4 and "k70" not in got  # the mirror: deleted by key, whatever partition
    assert got == {k: v for k, v in want.items() if k != "k70"}


def test_an_empty_table_without_a_start_is_snapshotted(spark, milvus_stack, pymilvus_orm, cfg, tmp_path):
    from msgstream_spark.jobs.mirror_start import S_PROPERTY
    from msgstream_spark.mirror.table import open_table

    w = Workload("mir_empty", create_all_types(pymilvus_orm, "mir_empty"))
    w.insert(range(0, 200))
    load_for_query(w.collection, flushed=False)  # for the snapshot's queries
    table = tmp_path / "t"  # what an earlier release's kill between its two Iceberg commits left
    open_table("iceberg", str(table), collection="mir_empty", pk="pk", create=True,
               arrow_schema=pa.schema([("pk", pa.int64())]))
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, "mir_empty"))]
    s = run_job(spark, cfg, "mir_empty", table, "iceberg", *chans)
    assert s["snapshot"]["mode"] == "replaced" and s["snapshot"]["rows"] == 200
    t = open_table("iceberg", str(table), collection="mir_empty", pk="pk", create=False)
    assert t.properties()[S_PROPERTY] == str(s["snapshot"]["S"])
    w.delete(range(0, 10))
    w.insert(range(200, 220))
    await_ticks(milvus_stack, last_ts(w), pchannels(pymilvus_orm, "mir_empty"))
    assert run_job(spark, cfg, "mir_empty", table, "iceberg", *chans)["snapshot"]["mode"] == "resumed"
    assert_table_equals_query(table, "iceberg", w)
