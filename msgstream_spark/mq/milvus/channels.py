"""Collections -> pchannels and vchannels, from ``DescribeCollection`` (as Milvus's SDKs read them)."""

from __future__ import annotations

from dataclasses import dataclass

from msgstream_spark.errors import BackendError, ChannelNotFoundError
from msgstream_spark.mq.milvus.connection import ProxyConnection, pb_modules, status_error

_NOT_FOUND_CODES = (100, 4)  # merr collection not found / legacy CollectionNotExists
_DB_NOT_FOUND = 800


@dataclass(frozen=True)
class CollectionChannels:
    database: str
    collection: str
    collection_id: int
    pchannels: tuple[str, ...]
    vchannels: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"database": self.database, "collection": self.collection, "collection_id": self.collection_id,
                "pchannels": list(self.pchannels), "vchannels": list(self.vchannels)}


def describe(conn: ProxyConnection, database: str, collection: str) -> CollectionChannels:
    resp = _describe(conn, database, collection)
    if not resp.physical_channel_names:
        raise BackendError(f"DescribeCollection({database}.{collection}) on {conn.settings.address} returned no "
                           "physical channels")
    return CollectionChannels(database, collection, int(resp.collectionID), tuple(resp.physical_channel_names),
                              tuple(resp.virtual_channel_names))


def describe_schema(conn: ProxyConnection, database: str, collection: str,
                    collection_id: int = 0) -> tuple[bytes, int] | None:
    """(serialized CollectionSchema, collection id) from ``DescribeCollection`` (of ``collection_id`` when it is
    not 0); ``None`` when the answer carries no schema fields."""
    resp = _describe(conn, database, collection, collection_id)
    if not resp.HasField("schema") or not resp.schema.fields:
        return None
    return resp.schema.SerializeToString(), int(resp.collectionID)


def _describe(conn: ProxyConnection, database: str, collection: str, collection_id: int = 0):
    _, milvus_pb2, _ = pb_modules()
    req = milvus_pb2.DescribeCollectionRequest(db_name=database, collection_name=collection,
                                               collectionID=collection_id)
    resp = conn.unary(f"DescribeCollection({database}.{collection})", "DescribeCollection", req)
    st = resp.status
    if st.code in _NOT_FOUND_CODES or st.error_code == 4:
        raise ChannelNotFoundError(f"collection {collection!r} not found in database {database!r} on Milvus proxy "
                                   f"{conn.settings.address} (milvus.collections): {st.reason}")
    if st.code == _DB_NOT_FOUND:
        raise ChannelNotFoundError(f"database {database!r} not found on Milvus proxy {conn.settings.address} "
                                   f"(milvus.collections / milvus.database): {st.reason}")
    err = status_error(conn.settings, f"DescribeCollection({database}.{collection})", st)
    if err is not None:
        raise err
    return resp


def partitions(conn: ProxyConnection, database: str, collection: str) -> list[tuple[str, int]]:
    """The collection's partitions as ``(name, id)`` from ``ShowPartitions`` (ids: what messages carry)."""
    _, milvus_pb2, _ = pb_modules()
    what = f"ShowPartitions({database}.{collection})"
    req = milvus_pb2.ShowPartitionsRequest(db_name=database, collection_name=collection)
    resp = conn.unary(what, "ShowPartitions", req)
    err = status_error(conn.settings, what, resp.status)
    if err is not None:
        raise err
    if len(resp.partition_names) != len(resp.partitionIDs):
        raise BackendError(f"{what} on {conn.settings.address}: {len(resp.partition_names)} names but "
                           f"{len(resp.partitionIDs)} ids")
    return [(str(n), int(i)) for n, i in zip(resp.partition_names, resp.partitionIDs)]
