"""A collection's schema as Milvus describes it now: ``DescribeCollection`` through the proxy at config key
``milvus.address`` (the address the mirror's snapshot reads through), whatever backend the messages come from.

The answer's ``schema`` is the same ``CollectionSchema`` protobuf a CreateCollection message carries (fields,
types, dims in ``type_params``, the primary key, struct arrays, functions), so the source maps it to its
output exactly as it maps a schema read from the channels. Milvus leaves the system fields (RowID,
Timestamp) out of the answer; the mapping ignores them in a CreateCollection's schema too. Milvus 2.3.5 also
leaves out the dynamic field (``$meta``, JSON) that its CreateCollection carries, and says
``enable_dynamic_field`` instead: :func:`milvus_schema` puts it back as Milvus created it (after the declared
fields, the next field id), so rows carry ``$meta`` either way (tests/milvus_real/test_schema_describe.py).
"""

from __future__ import annotations

from typing import Any

from msgstream_spark.config import Config
from msgstream_spark.mq.milvus.channels import describe_schema
from msgstream_spark.mq.milvus.connection import ProxyConnection
from msgstream_spark.mq.milvus.settings import MilvusSettings
from msgstream_spark.msg.pb import schema_pb2

DYNAMIC_FIELD = "$meta"  # the name Milvus gives a collection's dynamic field


def milvus_schema(config: Config, collection: str) -> tuple[Any, int] | None:
    """(CollectionSchema, collection id) of ``collection`` (a name, or an id: all digits) in the database of
    ``milvus.database``, as the Milvus at ``milvus.address`` describes it; ``None`` when the answer carries
    no schema. Raises the backend's errors (unreachable, refused credentials, no such collection)."""
    settings = MilvusSettings(config)
    conn = ProxyConnection(settings)
    try:
        by_id = int(collection) if collection.isdigit() else 0
        got = describe_schema(conn, settings.database, "" if by_id else collection, by_id)
    finally:
        conn.close()
    if got is None:
        return None
    schema = schema_pb2.CollectionSchema()
    schema.ParseFromString(got[0])
    if schema.enable_dynamic_field and not any(f.is_dynamic for f in schema.fields):
        schema.fields.add(fieldID=max((f.fieldID for f in schema.fields), default=99) + 1, name=DYNAMIC_FIELD,
                          data_type=schema_pb2.DataType.JSON, is_dynamic=True)
    return schema, got[1]
