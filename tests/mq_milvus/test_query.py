"""The suite proxy's query side through pymilvus's own ``MilvusClient`` (what the mirror's snapshot calls):
``has_collection``, ``describe_collection`` with the schema, ``query`` with ``count(*)``, the snapshot's
pk-range expressions, ``limit``, partitions (``ShowPartitions``, ``partition_names``) and Strong
consistency, Milvus's errors; Int64 and VarChar keys."""

from __future__ import annotations

import numpy as np
import pytest

from msgstream_spark.mirror.snapshot.handover import MilvusTarget, collection_partitions, describe, query_target
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.reader import plan_ranges
from msgstream_spark.mirror.snapshot.query.rpc import Querier
from tests.fixtures.milvus_env import milvus_config
from tests.milvus_proxy.query import CollectionModel
from tests.mq_milvus.collection_log import CID, NAME, PARTITIONS, collection_schema, key, row

pytestmark = pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")


@pytest.fixture
def sdk(milvus_proxy):
    from pymilvus import MilvusClient

    mc = MilvusClient(uri=f"http://{milvus_proxy.address}", timeout=10)
    yield mc
    mc.close()


def _model(proxy, string_key: bool, n: int) -> CollectionModel:
    m = proxy.state.add_model("default", NAME, CID, ["dml_0"], [f"dml_0_{CID}v0"], collection_schema(string_key),
                                  PARTITIONS)
    with m.lock:
        m.put(row(key(i, string_key)) for i in range(0, n, 2))
        m.put((row(key(i, string_key)) for i in range(1, n, 2)), "p1")
    return m


@pytest.mark.parametrize("string_key", [False, True], ids=["int64", "varchar"])
def test_the_snapshot_calls_answer_as_milvus(milvus_proxy, sdk, tmp_path, string_key):
    model = _model(milvus_proxy, string_key, 30)
    assert sdk.has_collection(NAME) and not sdk.has_collection("other")
    d = sdk.describe_collection(NAME)
    assert d["collection_id"] == CID and d["enable_dynamic_field"]
    assert [(f["name"], bool(f.get("is_primary")), bool(f.get("is_dynamic"))) for f in d["fields"]] == [
        ("pk", True, False), ("s", False, False), ("f", False, False), ("j", False, False), ("fv", False, False),
        ("$meta", False, True)]
    info = describe(MilvusTarget(milvus_proxy.address, NAME), sdk)
    assert (info.row_count, info.pk_is_string, info.dynamic) == (30, string_key, True)
    keys = sorted(model.rows)
    parts = collection_partitions(milvus_config(milvus_proxy.address, tmp_path), info, NAME)
    assert parts == PARTITIONS
    q = Querier(query_target(milvus_config(milvus_proxy.address, tmp_path), info, NAME))
    try:
        ranges = plan_ranges(q, "pk", string_key, 3, parts)
    finally:
        q.close()
    got = [sdk.query(NAME, r.expr("pk", string_key), output_fields=["*"], limit=16384, consistency_level="Strong",
                     partition_names=r.partition_names) for r in ranges]
    assert sorted(r["pk"] for part in got for r in part) == keys  # the ranges cover every key once
    assert {r.partition for r in ranges} == {"_default", "p1"}
    first = got[0][0]
    want = row(keys[0])
    assert first["s"] == want["s"] and first["j"] == want["j"] and first.get("dyn") == want["$meta"].get("dyn")
    assert np.asarray(first["fv"], np.float32).tobytes() == np.asarray(want["fv"], np.float32).tobytes()
    assert len(sdk.query(NAME, PkRange().expr("pk", string_key), output_fields=["pk"], limit=7)) == 7
    with model.lock:  # Strong: a write done before the query is seen
        model.remove(keys[:5])
    assert sdk.query(NAME, "", output_fields=["count(*)"], consistency_level="Strong")[0]["count(*)"] == 25


def test_bad_queries_fail_with_milvus_texts(milvus_proxy, sdk):
    from pymilvus.exceptions import MilvusException

    _model(milvus_proxy, False, 3)
    with pytest.raises(MilvusException, match="cannot parse expression"):
        sdk.query(NAME, "pk >= and pk < 3", output_fields=["pk"], limit=10)
    with pytest.raises(MilvusException, match="field nope not exist"):
        sdk.query(NAME, "pk >= 0", output_fields=["nope"], limit=10)
    with pytest.raises(MilvusException, match="empty expression should be used with limit"):
        sdk.query(NAME, "", output_fields=["pk"])
    with pytest.raises(MilvusException, match="partition name p9 not found"):
        sdk.query(NAME, "pk >= 0", output_fields=["pk"], limit=10, partition_names=["p9"])
    with pytest.raises(MilvusException, match="collection not found"):
        sdk.query("other", "pk >= 0", output_fields=["pk"], limit=10)
