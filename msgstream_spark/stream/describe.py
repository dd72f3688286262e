"""A collection's schema as Milvus describes it now: ``DescribeCollection`` through the proxy at config key
``milvus.address`` (the address the mirror's snapshot reads through), whatever backend the messages come from.

The answer's ``schema`` is the same ``CollectionSchema`` protobuf a CreateCollection message carries (fields,
types, dims in ``type_params``, the primary key, struct arrays, functions), so the source maps it to its
output exactly as it maps a schema read from the channels. Milvus leaves the system fields (RowID,
Timestamp) out of the answer; the mapping ignores them in a CreateCollection's schema too.
"""

from __future__ import annotations

from typing import Any

from msgstream_spark.config import Config
from msgstream_spark.mq.milvus.channels import describe_schema
from msgstream_spark.mq.milvus.connection import ProxyConnection
from msgstream_spark.mq.milvus.settings import MilvusSettings
from msgstream_spark.msg.pb import schema_pb2


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
    return schema, got[1]
