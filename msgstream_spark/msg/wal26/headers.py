"""Field tables of the 2.6 WAL protos (``messages.proto``, ``streaming.proto``; wal doc §8).

Typed values for what a reader acts on (insert/delete headers, transactions, broadcasts,
encryption, replication); every other message header is read into a plain dict by its table,
so DDL and maintenance messages stay inspectable without a compiled proto.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.msg.wal26 import fields
from msgstream_spark.msg.wal26.types import WalMessageType as T

I64, U64, I32, BOOL, ENUM, STR, BYTES = "int64", "uint64", "int32", "bool", "enum", "string", "bytes"

MESSAGE_ID = {1: ("id", STR), 2: ("wal_name", ENUM)}  # common.MessageID
KEY_VALUE = {1: ("key", STR), 2: ("value", STR)}  # common.KeyValuePair / a map<string,string> entry
SEGMENT_ASSIGNMENT = {1: ("segment_id", I64)}
PARTITION_ASSIGNMENT = {1: ("partition_id", I64), 2: ("rows", U64), 3: ("binary_size", U64),
                        4: ("segment_assignment", SEGMENT_ASSIGNMENT)}
INSERT_HEADER = {1: ("collection_id", I64), 2: ("partitions", [PARTITION_ASSIGNMENT]), 3: ("schema_version", I64)}
DELETE_HEADER = {1: ("collection_id", I64), 2: ("rows", U64)}
TXN_CONTEXT = {1: ("txn_id", I64), 2: ("keepalive_milliseconds", I64)}
RESOURCE_KEY = {1: ("domain", ENUM), 2: ("key", STR), 3: ("shared", BOOL)}
BROADCAST_HEADER = {1: ("broadcast_id", U64), 2: ("vchannels", [STR]), 3: ("resource_keys", [RESOURCE_KEY]),
                    4: ("ack_sync_up", BOOL)}
CIPHER_HEADER = {1: ("ez_id", I64), 2: ("collection_id", I64), 3: ("safe_key", BYTES), 4: ("payload_bytes", I64)}
REPLICATE_HEADER = {1: ("cluster_id", STR), 2: ("message_id", MESSAGE_ID), 3: ("last_confirmed_message_id", MESSAGE_ID),
                    4: ("time_tick", U64), 5: ("vchannel", STR)}
WAL_CHECKPOINT = {1: ("message_id", MESSAGE_ID), 2: ("time_tick", U64), 3: ("recovery_magic", I64)}

_COLL_PART = {1: ("collection_id", I64), 2: ("partition_id", I64)}
_DB_COLL = {1: ("db_id", I64), 2: ("collection_id", I64)}
_DB = {1: ("db_name", STR), 2: ("db_id", I64)}

# Headers (the ``_h`` property) of the types a reader may meet, by message type.
HEADERS: dict[int, dict] = {
    T.TimeTick: {},
    T.Insert: INSERT_HEADER,
    T.Delete: DELETE_HEADER,
    T.Flush: {1: ("collection_id", I64), 2: ("partition_id", I64), 3: ("segment_id", I64)},
    T.CreateCollection: {1: ("collection_id", I64), 2: ("partition_ids", [I64]), 3: ("db_id", I64)},
    T.DropCollection: {1: ("collection_id", I64), 2: ("db_id", I64)},
    T.CreatePartition: _COLL_PART,
    T.DropPartition: _COLL_PART,
    T.ManualFlush: {1: ("collection_id", I64), 2: ("flush_ts", U64), 3: ("segment_ids", [I64])},
    T.CreateSegment: {1: ("collection_id", I64), 2: ("partition_id", I64), 3: ("segment_id", I64),
                      4: ("storage_version", I64), 5: ("max_segment_size", U64), 6: ("max_rows", U64),
                      7: ("level", ENUM)},
    T.Import: {},
    T.SchemaChange: {1: ("collection_id", I64), 2: ("flushed_segment_ids", [I64])},
    T.AlterCollection: {1: ("db_id", I64), 2: ("collection_id", I64), 3: ("update_mask", {1: ("paths", [STR])}),
                        5: ("flushed_segment_ids", [I64])},
    T.AlterLoadConfig: {1: ("db_id", I64), 2: ("collection_id", I64), 3: ("partition_ids", [I64])},
    T.DropLoadConfig: _DB_COLL,
    T.CreateDatabase: _DB,
    T.AlterDatabase: _DB,
    T.DropDatabase: _DB,
    T.AlterAlias: {1: ("db_id", I64), 2: ("db_name", STR), 3: ("collection_id", I64), 4: ("collection_name", STR),
                   5: ("alias", STR)},
    T.DropAlias: {1: ("db_id", I64), 2: ("db_name", STR), 3: ("alias", STR)},
    T.DropUser: {1: ("user_name", STR)},
    T.DropRole: {1: ("role_name", STR), 2: ("force_drop", BOOL)},
    T.DropResourceGroup: {1: ("resource_group_name", STR)},
    T.CreateIndex: {1: ("db_id", I64), 2: ("collection_id", I64), 3: ("field_id", I64), 4: ("index_id", I64),
                    5: ("index_name", STR)},
    T.AlterIndex: {1: ("collection_id", I64), 2: ("index_ids", [I64])},
    T.DropIndex: {1: ("collection_id", I64), 2: ("index_ids", [I64])},
    T.FlushAll: {},
    T.TruncateCollection: {1: ("db_id", I64), 2: ("collection_id", I64), 3: ("segment_ids", [I64])},
    T.AlterWAL: {1: ("target_wal_name", ENUM), 2: ("config", [KEY_VALUE])},
    T.BeginTxn: {1: ("keepalive_milliseconds", I64)},
    T.CommitTxn: {},
    T.RollbackTxn: {},
}


@dataclass(frozen=True)
class PartitionSegmentAssignment:
    partition_id: int
    rows: int = 0
    binary_size: int = 0
    segment_id: int = 0  # segment_assignment.segment_id (0 when absent)


@dataclass(frozen=True)
class InsertMessageHeader:
    collection_id: int
    partitions: tuple[PartitionSegmentAssignment, ...] = ()

    @classmethod
    def parse(cls, raw: bytes) -> InsertMessageHeader:
        d = fields.decode(INSERT_HEADER, raw)
        parts = tuple(PartitionSegmentAssignment(p["partition_id"], p["rows"], p["binary_size"],
                                                 (p["segment_assignment"] or {}).get("segment_id", 0))
                      for p in d["partitions"])
        return cls(d["collection_id"], parts)

    def assignment(self, partition_id: int) -> PartitionSegmentAssignment | None:
        """The entry of ``partition_id`` (Milvus takes the first match)."""
        return next((p for p in self.partitions if p.partition_id == partition_id), None)


@dataclass(frozen=True)
class DeleteMessageHeader:
    collection_id: int
    rows: int = 0

    @classmethod
    def parse(cls, raw: bytes) -> DeleteMessageHeader:
        return cls(**fields.decode(DELETE_HEADER, raw))


@dataclass(frozen=True)
class TxnContext:
    """``_tx``: which transaction a message belongs to and its keepalive (-1000 = never expires)."""

    txn_id: int
    keepalive_milliseconds: int = 0

    @classmethod
    def parse(cls, raw: bytes) -> TxnContext:
        return cls(**fields.decode(TXN_CONTEXT, raw))


@dataclass(frozen=True)
class ResourceKey:
    domain: int
    key: str
    shared: bool = False


@dataclass(frozen=True)
class BroadcastHeader:
    """``_bh``: one DDL written once per vchannel; copies share ``broadcast_id``."""

    broadcast_id: int
    vchannels: tuple[str, ...] = ()
    resource_keys: tuple[ResourceKey, ...] = ()
    ack_sync_up: bool = False

    @classmethod
    def parse(cls, raw: bytes) -> BroadcastHeader:
        d = fields.decode(BROADCAST_HEADER, raw)
        return cls(d["broadcast_id"], tuple(d["vchannels"]), tuple(ResourceKey(**k) for k in d["resource_keys"]),
                   d["ack_sync_up"])


@dataclass(frozen=True)
class CipherHeader:
    """``_ch``: the payload is encrypted with a key of Milvus's KMS plugin (unreadable here)."""

    ez_id: int
    collection_id: int
    safe_key: bytes = field(default=b"", repr=False)
    payload_bytes: int = 0

    @classmethod
    def parse(cls, raw: bytes) -> CipherHeader:
        return cls(**fields.decode(CIPHER_HEADER, raw))


@dataclass(frozen=True)
class ReplicateHeader:
    """``_rh``: the message was replicated from another cluster by Milvus CDC."""

    cluster_id: str
    message_id: dict[str, Any] | None = None  # {"id", "wal_name"} in the source cluster
    last_confirmed_message_id: dict[str, Any] | None = None
    time_tick: int = 0
    vchannel: str = ""

    @classmethod
    def parse(cls, raw: bytes) -> ReplicateHeader:
        return cls(**fields.decode(REPLICATE_HEADER, raw))


def insert_route(raw: bytes) -> tuple[int, dict[int, int]]:
    """What a reader needs of an insert's ``_h``: (collection id, {partition id: segment id}).

    The first entry of a partition counts (as in Milvus); segment 0 = none assigned. The hot-path
    twin of :meth:`InsertMessageHeader.parse` (one per 2.6 insert): the C protobuf parser, with the
    field walker's rules and errors (:func:`fields.parse_fast`). ValueError on a malformed header.
    """
    m = fields.parse_fast(INSERT_HEADER, _insert_pb(), raw)
    segments: dict[int, int] = {}
    for p in m.partitions:
        segments.setdefault(p.partition_id, p.segment_assignment.segment_id)
    return m.collection_id, segments


def delete_collection(raw: bytes) -> int:
    """The collection id of a delete's ``_h`` (the hot-path twin of :meth:`DeleteMessageHeader.parse`)."""
    return fields.parse_fast(DELETE_HEADER, _delete_pb(), raw).collection_id


def _insert_pb():
    global _INSERT_PB
    if _INSERT_PB is None:
        _INSERT_PB = fields.proto_class(INSERT_HEADER, "InsertMessageHeader")
    return _INSERT_PB


def _delete_pb():
    global _DELETE_PB
    if _DELETE_PB is None:
        _DELETE_PB = fields.proto_class(DELETE_HEADER, "DeleteMessageHeader")
    return _DELETE_PB


_INSERT_PB = _DELETE_PB = None


def decode_header(msg_type: int, raw: bytes) -> dict[str, Any] | None:
    """The ``_h`` header of a message type as a dict, or None for a type without a table."""
    spec = HEADERS.get(int(msg_type))
    return None if spec is None else fields.decode(spec, raw)
