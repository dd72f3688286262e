"""With ``mq.type: milvus`` and the collection configured (``milvus.collections``), schema inference asks the
proxy (``DescribeCollection``) and reads no message; an answer without schema fields, or a collection
that is not configured, leaves it to the scan of the channels. The proxy is the suite's own
(tests/milvus_proxy), its answer built with Milvus's generated protobuf classes; the log comes from the
independent 2.6 test producer."""

from __future__ import annotations

import pytest

from msgstream_spark.errors import SchemaError
from msgstream_spark.mq.milvus.consumer import MilvusConsumer
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.schema import infer_collection
from tests.milvus_proxy.wal import tso_now
from tests.mq_milvus.test_dump import fill
from tests.wal26 import producer as P


@pytest.fixture
def fetched(monkeypatch):
    got: list = []
    real = MilvusConsumer.receive_batch

    def counting(self, *a, **kw):
        batch = real(self, *a, **kw)
        got.extend(batch)
        return batch

    monkeypatch.setattr(MilvusConsumer, "receive_batch", counting)
    return got


@pytest.fixture
def proxy(milvus_proxy):
    milvus_proxy.state.collections[("default", "c26")] = (P.COLLECTION, [P.PCHANNEL], [P.VCHANNEL])
    tt = tso_now()
    fill(milvus_proxy, P.PCHANNEL, [P.create_collection(tt, vc=P.CONTROL_VCHANNEL), P.insert(tt + 1, [1]),
                                    P.timetick(tt + 2)])
    return milvus_proxy


def _opts(proxy, tmp_path, **extra):
    return parse_read_options({"mq.type": "milvus", "milvus.address": proxy.address,
                               "milvus.metadataPath": str(tmp_path / "meta.json"), "milvus.collections": "default.c26",
                               "channels": P.PCHANNEL, **extra}, streaming=False)


def _names(schema) -> list[str]:
    return [f.name for f in schema.fields]


def test_a_described_schema_is_used_without_reading_the_log(proxy, tmp_path, fetched):
    proxy.state.schemas[("default", "c26")] = P.collection_schema("described").SerializeToString()
    for collection in ({}, {"collection": "c26"}, {"collection": str(P.COLLECTION)}):
        schema, cid = infer_collection(_opts(proxy, tmp_path, **collection), [P.PCHANNEL])
        assert cid == P.COLLECTION and _names(schema) == ["pk", "vec", "described"]
        assert schema.fields[2].nullable
    assert fetched == []


def test_without_a_described_schema_the_log_is_scanned(proxy, tmp_path, fetched):
    schema, cid = infer_collection(_opts(proxy, tmp_path), [P.PCHANNEL])  # the proxy sends no schema
    assert cid == P.COLLECTION and _names(schema) == ["pk", "vec"] and fetched
    proxy.state.schemas[("default", "c26")] = P.collection_schema("described").SerializeToString()
    fetched.clear()
    with pytest.raises(SchemaError, match="collection 'other'"):  # not configured: not described, not in the log
        infer_collection(_opts(proxy, tmp_path, collection="other"), [P.PCHANNEL])
    assert fetched
