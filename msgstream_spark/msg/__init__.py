"""Milvus messages: the TsMsg model, the codec, columns, positions, TSO and hashing."""

from msgstream_spark.msg import codec, columns, hashing, schema, tso
from msgstream_spark.msg.position import MsgPosition, parse_positions
from msgstream_spark.msg.types import (
    CreateCollectionMsg,
    CreatePartitionMsg,
    DeleteMsg,
    DropCollectionMsg,
    DropPartitionMsg,
    InsertMsg,
    MsgPack,
    MsgType,
    TimeTickMsg,
    TsMsg,
)

__all__ = [
    "CreateCollectionMsg", "CreatePartitionMsg", "DeleteMsg", "DropCollectionMsg", "DropPartitionMsg",
    "InsertMsg", "MsgPack", "MsgPosition", "MsgType", "TimeTickMsg", "TsMsg", "codec", "columns", "hashing",
    "parse_positions", "schema", "tso",
]
