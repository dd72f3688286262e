"""A real Milvus 2.3.5 describes a collection's schema (config key ``milvus.address``, ``DescribeCollection``
through the project's proxy connection) as the source infers it from the collection's CreateCollection
message in the MQ: the same Arrow columns, primary key and collection id (docs/spark-source.md, "Where the
schema comes from"). The collection has a dynamic field, a VarChar, a vector and an auto-id key."""

from __future__ import annotations

import logging

import pytest

from msgstream_spark.msg.schema import collection_arrow_schema
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.schema import infer_collection, primary_key
from tests.milvus_real.stack import pchannels
from tests.spark.helpers import spark_options

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]
NAME = "schema_described"


@pytest.fixture
def collection(milvus_stack, pymilvus_orm):
    from pymilvus import Collection, CollectionSchema, DataType, FieldSchema

    schema = CollectionSchema([FieldSchema("pk", DataType.INT64, is_primary=True, auto_id=True),
                               FieldSchema("title", DataType.VARCHAR, max_length=32),
                               FieldSchema("fv", DataType.FLOAT_VECTOR, dim=4)], enable_dynamic_field=True)
    col = Collection(NAME, schema, using=pymilvus_orm, shards_num=1)
    col.insert([{"title": "a", "fv": [1.0, 2.0, 3.0, 4.0], "extra": 7}])
    yield col, pchannels(pymilvus_orm, NAME)
    col.drop()


def test_milvus_describes_the_schema_the_create_message_carries(milvus_stack, collection, caplog):
    col, channels = collection
    base = {**spark_options(milvus_stack.env), "channels": ",".join(channels), "collection": NAME}
    from_log, log_cid = infer_collection(parse_read_options({**base, "schemaScanMessages": "0"}, streaming=False),
                                         channels)
    with caplog.at_level(logging.INFO, logger="msgstream_spark.source.schema"):
        described, cid = infer_collection(parse_read_options(
            {**base, "milvus.address": milvus_stack.uri, "milvus.requestTimeout": "30"}, streaming=False), channels)
    assert "the one DescribeCollection gives" in caplog.text
    assert cid == log_cid == col.describe()["collection_id"]
    assert collection_arrow_schema(described) == collection_arrow_schema(from_log)
    assert primary_key(described) == primary_key(from_log) == "pk"
    assert [f.name for f in collection_arrow_schema(described)] == ["pk", "title", "fv", "$meta"]

    def ids(schema):
        return [(f.name, f.fieldID, f.data_type, f.is_dynamic) for f in schema.fields if f.fieldID >= 100]

    assert ids(described) == ids(from_log)  # 2.3.5 describes no $meta: put back with the id Milvus gave it
