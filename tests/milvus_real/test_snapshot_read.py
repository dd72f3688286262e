"""The snapshot's read on a real Milvus 2.3.5: its rows are the stream's rows, type for type, byte for byte.

A collection with every type 2.3.5 has, inserted through pymilvus (JSON values that are a bare JSON
string, a number, nested objects; a dynamic field on some rows), read once by the batch source (the
log Milvus wrote) and once by the snapshot's reader (Milvus's ``Query``, decoded column by column). No
value is normalised before comparing: JSON must be the bytes Milvus stores, not re-serialised.
Milvus 2.3.5 does not pin iterator reads: the probe says so.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.config.loader import Config
from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.snapshot.handover import probe_pin
from msgstream_spark.mirror.snapshot.query.reader import RangeReader, plan_ranges
from msgstream_spark.mirror.snapshot.query.rpc import Querier, QueryTarget
from msgstream_spark.mq.milvus.settings import MilvusSettings
from tests.milvus_real.stack import ALIAS
from tests.milvus_real.test_milvus_oracle import source
from tests.milvus_real.workload import Workload, create_all_types, load_for_query, row

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

# JSON texts (2.3.5 takes objects only); spacing and key order as written, not as a serializer would
JSONS = ['{"b": [1, 2.50],  "a":{"é":null}}', '{ "s" : "x\\u00e9" }', '{"n":12}', '{}', '{"t": true, "a": []}']


def test_snapshot_rows_equal_the_stream_rows(spark, milvus_stack, pymilvus_orm, tmp_path):
    w = Workload("snap_bytes", create_all_types(ALIAS, "snap_bytes"))
    rows = [{**row(i), "j": JSONS[i % len(JSONS)]} for i in range(300)]
    w.collection.insert(rows)
    load_for_query(w.collection, flushed=False)  # for the snapshot's queries
    stream = source(spark, milvus_stack, "snap_bytes").toArrow()
    info = w.collection.describe()
    settings = MilvusSettings(Config.from_dict({"mq": {"type": "milvus"}, "milvus": {
        "address": milvus_stack.uri.removeprefix("http://"), "requestTimeout": 60,
        "metadataPath": str(tmp_path / "meta.json")}}))
    q = Querier(QueryTarget(settings, "snap_bytes", int(info["collection_id"])))
    try:
        assert not probe_pin(q, type("Info", (), {"pk": "pk", "pk_is_string": False})())
        ranges = plan_ranges(q, "pk", False, 3)
    finally:
        q.close()
    fields = [f for f in stream.schema if not f.name.startswith("_") and f.name != "op"]
    schema = table_schema(pa.schema(fields), "pk")
    snap = pa.Table.from_batches(list(RangeReader(q.target, "pk", False, schema, 1, answer_bytes=16 << 10,
                                                  row_bytes=200).read(ranges)), schema=schema).sort_by("pk")
    stream = stream.select([f.name for f in fields]).sort_by("pk")
    assert snap.num_rows == stream.num_rows == 300
    for f in fields:
        got, want = snap.column(f.name), stream.column(f.name)
        assert got.type == want.type, f.name
        assert got.to_pylist() == want.to_pylist(), f"column {f.name}: snapshot != stream"
    assert snap.column("j").to_pylist()[0] == stream.column("j").to_pylist()[0] != '{"b":[1,2.5],"a":{"é":null}}'


def test_the_calls_the_plan_relies_on(milvus_stack, pymilvus_orm, tmp_path):
    """What the plan and the read assume of Milvus 2.3.5 (mirror/snapshot/query/plan.py, rpc.py): a ``limit``
    query answers the smallest matching keys in key order, across sealed and growing segments of two shards and
    within a partition; a call carrying S as its guarantee timestamp (Customized) sees a write made at S; the
    plan of a few thousand keys costs about one call a range and its sizes are Milvus's counts."""
    import numpy as np
    from pymilvus import Collection, CollectionSchema, DataType, FieldSchema

    schema = CollectionSchema([FieldSchema("pk", DataType.INT64, is_primary=True),
                               FieldSchema("fv", DataType.FLOAT_VECTOR, dim=4)])
    col = Collection("snap_probes", schema, using=ALIAS, shards_num=2)
    col.create_partition("p1")
    keys = (np.arange(1, 6001) * 7919 % 1_000_003).tolist()  # scrambled: insert order is not key order
    col.insert([keys[:2000], np.zeros((2000, 4), np.float32)])
    col.insert([keys[2000:4000], np.zeros((2000, 4), np.float32)], partition_name="p1")
    load_for_query(col)  # flushed: sealed segments in both shards
    col.insert([keys[4000:], np.zeros((2000, 4), np.float32)])  # growing, among the sealed keys
    settings = MilvusSettings(Config.from_dict({"mq": {"type": "milvus"}, "milvus": {
        "address": milvus_stack.uri.removeprefix("http://"), "requestTimeout": 60,
        "metadataPath": str(tmp_path / "meta.json")}}))
    grown = col.insert([[2_000_000 + i for i in range(50)], np.zeros((50, 4), np.float32)])
    q = Querier(QueryTarget(settings, "snap_probes", int(col.describe()["collection_id"]), floor_ts=grown.timestamp))
    try:
        assert q.count("pk >= 2000000") == 50  # written at the guarantee timestamp: seen
        everything = sorted(keys) + list(range(2_000_000, 2_000_050))
        for expr, want in [("pk < 0 or pk >= 0", everything), ("pk > 500000", [k for k in everything if k > 500000]),
                           ("pk >= 90 and pk < 400000", [k for k in everything if 90 <= k < 400000])]:
            assert q.smallest_keys(expr, "pk", [], 200) == want[:200], expr
        assert q.smallest_keys("pk >= 0", "pk", ["p1"], 50) == sorted(keys[2000:4000])[:50]
        ranges = plan_ranges(q, "pk", False, 4)
        assert q.calls <= len(ranges) + 10 + 6  # + the six calls above
        assert [q.count(r.expr("pk", False)) for r in ranges] == [r.rows for r in ranges]
        assert sum(r.rows for r in ranges) == 6050 and len(ranges) == 4
    finally:
        q.close()
