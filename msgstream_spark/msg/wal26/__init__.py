"""Milvus 2.6 streaming-WAL messages: properties, headers, bodies, ids and checkpoints.

``decode_message(payload, properties)`` reads both formats: a message without ``_v`` goes
to the 2.5 codec, a WAL message (``_v`` 1 or 2) is decoded from its properties (see
``docs/milvus-26.md`` and ``../shared/docs/milvus-26-wal-format.md``).
"""

from msgstream_spark.msg.wal26.decode import (
    WalMsg,
    decode_message,
    decode_wal,
    time_tick_of,
    vchannel_of,
    wal_position,
    with_time_tick,
)
from msgstream_spark.msg.wal26.envelope import Envelope, is_wal_message, parse_envelope, wire_version
from msgstream_spark.msg.wal26.headers import (
    BroadcastHeader,
    CipherHeader,
    DeleteMessageHeader,
    InsertMessageHeader,
    PartitionSegmentAssignment,
    ReplicateHeader,
    ResourceKey,
    TxnContext,
    decode_header,
)
from msgstream_spark.msg.wal26.ids import WalCheckpoint, WalMessageId, position_of
from msgstream_spark.msg.wal26.types import WalMessageType, WALName, b36decode, b36encode, type_name

__all__ = [
    "BroadcastHeader", "CipherHeader", "DeleteMessageHeader", "Envelope", "InsertMessageHeader",
    "PartitionSegmentAssignment", "ReplicateHeader", "ResourceKey", "TxnContext", "WALName", "WalCheckpoint",
    "WalMessageId", "WalMessageType", "WalMsg", "b36decode", "b36encode", "decode_header", "decode_message",
    "decode_wal", "is_wal_message", "parse_envelope", "position_of", "time_tick_of", "type_name", "vchannel_of",
    "wal_position", "wire_version", "with_time_tick",
]
