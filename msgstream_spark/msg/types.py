"""The TsMsg model: Milvus request protobufs with the msgstream metadata around them.

Each class keeps the request protobuf from ``pymilvus.grpc_gen`` as ``proto`` and exposes
what readers and writers need (ids, timestamps, primary keys) as numpy arrays.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from msgstream_spark.msg.columns import field_data_to_arrow
from msgstream_spark.msg.pb import common_pb2, msg_pb2, schema_pb2
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.schema import collection_arrow_schema
from msgstream_spark.msg.structs import rebuild_structs, struct_targets


class MsgType(enum.IntEnum):
    """``commonpb.MsgType`` values used on DML channels."""

    CreateCollection = 100
    DropCollection = 101
    CreatePartition = 200
    DropPartition = 201
    Insert = 400
    Delete = 401
    TimeTick = 1200
    Replicate = 1212


class TsMsg:
    """Base of every message. ``hash_values`` route it on produce (not on the wire)."""

    msg_type: MsgType
    # Milvus 2.6 WAL messages carry their decoded properties (a ``wal26.Envelope``); None for 2.5 ones.
    wal: Any = None

    def __init__(self, proto: Any, *, hash_values: Sequence[int] | np.ndarray = (),
                 position: MsgPosition | None = None, properties: Mapping[str, str] | None = None) -> None:
        self.proto = proto
        self.hash_values = hash_values
        self.position = position
        self.properties = dict(properties or {})

    @property
    def base_msg_id(self) -> int:
        return int(self.proto.base.msgID)

    @property
    def timestamp(self) -> int:
        return int(self.proto.base.timestamp)

    @property
    def begin_ts(self) -> int:
        return self.timestamp

    @property
    def end_ts(self) -> int:
        return self.timestamp

    @property
    def collection_id(self) -> int:
        return int(getattr(self.proto, "collectionID", 0))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(msgID={self.base_msg_id}, ts={self.timestamp})"


def _base(msg_type: MsgType, ts: int, msg_id: int = 0, source_id: int = 0):
    return common_pb2.MsgBase(msg_type=int(msg_type), msgID=int(msg_id), timestamp=int(ts), sourceID=int(source_id))


class _DmlMsg(TsMsg):
    """Insert and delete: per-row timestamps decide begin/end ts."""

    @property
    def timestamps(self) -> np.ndarray:
        return np.array(self.proto.timestamps, dtype=np.uint64)  # 15x faster than fromiter on upb

    @property
    def begin_ts(self) -> int:
        ts = self.timestamps  # numpy's min: Python's min over the protobuf container is ~10x slower
        return int(ts.min()) if len(ts) else self.timestamp

    @property
    def end_ts(self) -> int:
        ts = self.timestamps
        return int(ts.max()) if len(ts) else self.timestamp

    @property
    def shard_name(self) -> str:
        return self.proto.shardName

    @property
    def partition_id(self) -> int:
        return int(self.proto.partitionID)

    @property
    def collection_name(self) -> str:
        return self.proto.collection_name

    @property
    def partition_name(self) -> str:
        return self.proto.partition_name


class InsertMsg(_DmlMsg):
    msg_type = MsgType.Insert
    # float vectors viewed in the payload rather than parsed (``codec.unmarshal(float_views=True)``): per
    # ``fields_data`` index, the values that FieldData's ``float_vector`` then lacks
    float_views: dict[int, np.ndarray] | None = None

    def field_arrays(self) -> dict[str, pa.Array]:
        """Each FieldData as an Arrow array, by field name (float vectors from :attr:`float_views` where set)."""
        views = self.float_views
        if views is None:
            return {fd.field_name: field_data_to_arrow(fd) for fd in self.proto.fields_data}
        return {fd.field_name: field_data_to_arrow(fd, views.get(k)) for k, fd in enumerate(self.proto.fields_data)}

    @property
    def num_rows(self) -> int:
        return int(self.proto.num_rows)

    @property
    def row_ids(self) -> np.ndarray:
        return np.array(self.proto.rowIDs, dtype=np.int64)

    @property
    def segment_id(self) -> int:
        return int(self.proto.segmentID)

    @property
    def fields_data(self):
        return self.proto.fields_data

    def to_arrow(self, schema: Any = None) -> pa.RecordBatch:
        """The user fields as a ``pyarrow.RecordBatch``.

        Without ``schema``: one column per FieldData, by name (a struct array shows as its flattened
        ``struct[sub]`` columns, as in the WAL). With the collection's ``schema.CollectionSchema``:
        its columns in its order and types, struct arrays rebuilt as ``list<struct>``, columns the
        message lacks (e.g. a BM25 output, computed after the WAL) null.
        """
        values = self.field_arrays()
        if schema is None:
            return pa.RecordBatch.from_arrays(list(values.values()), names=list(values))
        arrow = collection_arrow_schema(schema)
        rebuild_structs(values, struct_targets(arrow))
        n = self.num_rows
        cols = [values[f.name].cast(f.type) if f.name in values else pa.nulls(n, f.type) for f in arrow]
        return pa.RecordBatch.from_arrays(cols, schema=arrow)

    @classmethod
    def build(cls, *, fields_data: Sequence[Any], num_rows: int, timestamp: int | Sequence[int],
              collection_id: int = 0, partition_id: int = 0, segment_id: int = 0, shard_name: str = "",
              msg_id: int = 0, source_id: int = 0, row_ids: Sequence[int] | np.ndarray | None = None,
              collection_name: str = "", partition_name: str = "", db_name: str = "",
              hash_values: Sequence[int] | np.ndarray = ()) -> InsertMsg:
        """An InsertMsg from ready FieldData (see ``columns.arrow_to_field_data``)."""

        if np.ndim(timestamp) == 0:
            ts = np.full(num_rows, int(timestamp), dtype=np.uint64)
        else:
            ts = np.asarray(timestamp, dtype=np.uint64)
        base_ts = int(ts.max()) if len(ts) else int(np.asarray(timestamp).max(initial=0))
        rid = np.arange(num_rows, dtype=np.int64) if row_ids is None else np.asarray(row_ids, np.int64)
        req = msg_pb2.InsertRequest(
            base=_base(MsgType.Insert, base_ts, msg_id, source_id), shardName=shard_name, db_name=db_name,
            collection_name=collection_name, partition_name=partition_name, collectionID=collection_id,
            partitionID=partition_id, segmentID=segment_id, num_rows=num_rows,
            version=msg_pb2.InsertDataVersion.ColumnBased)
        req.timestamps.extend(ts.tolist())
        req.rowIDs.extend(rid.tolist())
        req.fields_data.extend(fields_data)
        return cls(req, hash_values=hash_values)


class DeleteMsg(_DmlMsg):
    msg_type = MsgType.Delete

    @property
    def num_rows(self) -> int:
        return int(self.proto.num_rows)

    @property
    def primary_keys(self) -> np.ndarray | list[str]:
        ids = self.proto.primary_keys
        which = ids.WhichOneof("id_field")
        if which == "str_id":
            return list(ids.str_id.data)
        if which == "int_id":
            return np.array(ids.int_id.data, dtype=np.int64)
        return np.array(self.proto.int64_primary_keys, dtype=np.int64)

    @classmethod
    def build(cls, *, primary_keys: np.ndarray | Sequence[int] | Sequence[str], timestamp: int,
              collection_id: int = 0, partition_id: int = -1, shard_name: str = "", msg_id: int = 0,
              source_id: int = 0, collection_name: str = "", partition_name: str = "", db_name: str = "",
              hash_values: Sequence[int] | np.ndarray = ()) -> DeleteMsg:

        keys = primary_keys
        n = len(keys)
        ids = schema_pb2.IDs()
        if n and isinstance(keys[0], str):
            ids.str_id.data.extend(list(keys))
        else:
            ids.int_id.data.extend(np.asarray(keys, dtype=np.int64).tolist())
        req = msg_pb2.DeleteRequest(
            base=_base(MsgType.Delete, timestamp, msg_id, source_id), shardName=shard_name, db_name=db_name,
            collection_name=collection_name, partition_name=partition_name, collectionID=collection_id,
            partitionID=partition_id, num_rows=n, primary_keys=ids)
        req.timestamps.extend([int(timestamp)] * n)
        return cls(req, hash_values=hash_values)


class TimeTickMsg(TsMsg):
    msg_type = MsgType.TimeTick

    @classmethod
    def build(cls, ts: int, *, source_id: int = 0, msg_id: int = 0) -> TimeTickMsg:
        return cls(msg_pb2.TimeTickMsg(base=_base(MsgType.TimeTick, ts, msg_id, source_id)), hash_values=[0])


class CreateCollectionMsg(TsMsg):
    msg_type = MsgType.CreateCollection

    @property
    def collection_id(self) -> int:
        return int(self.proto.collectionID)

    @property
    def collection_name(self) -> str:
        return self.proto.collectionName

    @property
    def schema(self):
        """The parsed ``schema.CollectionSchema`` (from the bytes field or field 13)."""

        if self.proto.schema:
            s = schema_pb2.CollectionSchema()
            s.ParseFromString(self.proto.schema)
            return s
        if self.proto.HasField("collection_schema"):
            return self.proto.collection_schema
        return None

    @classmethod
    def build(cls, *, collection_id: int, collection_name: str, schema: Any, timestamp: int,
              virtual_channels: Sequence[str] = (), physical_channels: Sequence[str] = (),
              partition_ids: Sequence[int] = (), msg_id: int = 0) -> CreateCollectionMsg:

        req = msg_pb2.CreateCollectionRequest(
            base=_base(MsgType.CreateCollection, timestamp, msg_id), collectionName=collection_name,
            collectionID=collection_id, schema=schema.SerializeToString())
        req.virtualChannelNames.extend(virtual_channels)
        req.physicalChannelNames.extend(physical_channels)
        req.partitionIDs.extend(partition_ids)
        return cls(req, hash_values=[0])


class DropCollectionMsg(TsMsg):
    msg_type = MsgType.DropCollection

    @property
    def collection_id(self) -> int:
        return int(self.proto.collectionID)

    @classmethod
    def build(cls, *, collection_id: int, collection_name: str, timestamp: int, msg_id: int = 0):
        return cls(msg_pb2.DropCollectionRequest(base=_base(MsgType.DropCollection, timestamp, msg_id),
                                                 collectionName=collection_name, collectionID=collection_id),
                   hash_values=[0])


class _PartitionMsg(TsMsg):
    @property
    def collection_id(self) -> int:
        return int(self.proto.collectionID)

    @property
    def partition_id(self) -> int:
        return int(self.proto.partitionID)

    @classmethod
    def build(cls, *, collection_id: int, partition_id: int, timestamp: int, collection_name: str = "",
              partition_name: str = "", msg_id: int = 0):

        proto_cls = (msg_pb2.CreatePartitionRequest if cls.msg_type == MsgType.CreatePartition
                     else msg_pb2.DropPartitionRequest)
        return cls(proto_cls(base=_base(cls.msg_type, timestamp, msg_id), collection_name=collection_name,
                             partition_name=partition_name, collectionID=collection_id,
                             partitionID=partition_id), hash_values=[0])


class CreatePartitionMsg(_PartitionMsg):
    msg_type = MsgType.CreatePartition


class DropPartitionMsg(_PartitionMsg):
    msg_type = MsgType.DropPartition


@dataclass
class MsgPack:
    """A batch of messages with its time range and per-channel start/end positions."""

    msgs: list[TsMsg] = field(default_factory=list)
    begin_ts: int = 0
    end_ts: int = 0
    start_positions: list[MsgPosition] = field(default_factory=list)
    end_positions: list[MsgPosition] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.msgs)
