"""A test producer of Milvus 2.6 WAL messages, written from ../shared/docs/milvus-26-wal-format.md.

Independent of the library's decoder and of any product encoder: its own protobuf field
writer for the ``messagespb`` headers, its own base-36 (numpy's ``base_repr``), and Milvus's
generated ``msgpb`` classes for version-1 bodies. Each builder returns a :class:`Built`
(payload, properties, time tick); :func:`write` sends them through any backend's raw producer.
Payload timestamps are deliberately *not* the ``_tt`` (the proxy's values are not authoritative).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from msgstream_spark.msg.pb import common_pb2, msg_pb2, schema_pb2

PCHANNEL = "by-dev-rootcoord-dml_0"
COLLECTION = 444
PARTITION = 445
SEGMENT = 446
VCHANNEL = f"{PCHANNEL}_{COLLECTION}v0"
CONTROL_VCHANNEL = f"{PCHANNEL}_vcchan"
T = {"TimeTick": 1, "Insert": 2, "Delete": 3, "Flush": 4, "CreateCollection": 5, "DropCollection": 6,
     "CreatePartition": 7, "DropPartition": 8, "ManualFlush": 9, "CreateSegment": 10, "Import": 11,
     "AlterCollection": 13, "CreateDatabase": 16, "CreateIndex": 34, "FlushAll": 37, "TruncateCollection": 38,
     "AlterWAL": 700, "BeginTxn": 900, "CommitTxn": 901, "RollbackTxn": 902}
PAYLOAD_TS_SKEW = 987_654  # payload timestamps = _tt - this: a reader using them is wrong


def tt_of(physical_ms: int, logical: int = 0) -> int:
    """A hybrid timestamp: physical milliseconds shifted left by 18 bits, plus the logical part."""
    return physical_ms * 262144 + logical


def b36(value: int) -> str:
    return np.base_repr(int(value), 36).lower()


def b64(data: bytes) -> str:
    return base64.standard_b64encode(data).decode("ascii")


# -- protobuf wire writer (proto3: default values are not written) -------------------------------------------
def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def vfield(number: int, value: int | bool) -> bytes:
    return b"" if not value else varint(number << 3) + varint(int(value))


def lfield(number: int, data: bytes | str, *, keep_empty: bool = False) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return b"" if not raw and not keep_empty else varint(number << 3 | 2) + varint(len(raw)) + raw


def packed(number: int, values: Sequence[int]) -> bytes:
    return lfield(number, b"".join(varint(v) for v in values)) if values else b""


# -- headers (messages.proto field numbers, wal doc §8) ------------------------------------------------------
def insert_header(collection: int, parts: Iterable[tuple[int, int, int, int]]) -> bytes:
    """InsertMessageHeader from (partition_id, rows, binary_size, segment_id) tuples."""
    body = vfield(1, collection)
    for pid, rows, size, seg in parts:
        assignment = vfield(1, pid) + vfield(2, rows) + vfield(3, size) + lfield(4, vfield(1, seg), keep_empty=True)
        body += lfield(2, assignment, keep_empty=True)
    return body


def delete_header(collection: int, rows: int) -> bytes:
    return vfield(1, collection) + vfield(2, rows)


def txn_context(txn_id: int, keepalive_ms: int) -> bytes:
    return vfield(1, txn_id) + vfield(2, keepalive_ms)


def broadcast_header(broadcast_id: int, vchannels: Sequence[str], keys: Sequence[tuple[int, str, bool]] = ()) -> bytes:
    out = vfield(1, broadcast_id) + b"".join(lfield(2, vc) for vc in vchannels)
    return out + b"".join(lfield(3, vfield(1, d) + lfield(2, k) + vfield(3, s), keep_empty=True) for d, k, s in keys)


def cipher_header(ez_id: int, collection: int, safe_key: bytes, payload_bytes: int) -> bytes:
    return vfield(1, ez_id) + vfield(2, collection) + lfield(3, safe_key) + vfield(4, payload_bytes)


def message_id(wal_id: str, wal_name: int) -> bytes:
    """common.MessageID{id = 1, WAL_name = 2}."""
    return lfield(1, wal_id) + vfield(2, wal_name)


def wal_checkpoint(wal_id: str, wal_name: int, time_tick: int, recovery_magic: int = 0) -> bytes:
    """streaming.WALCheckpoint{message_id = 1, time_tick = 2, recovery_magic = 3}."""
    return lfield(1, message_id(wal_id, wal_name), keep_empty=True) + vfield(2, time_tick) + vfield(3, recovery_magic)


# -- messages ------------------------------------------------------------------------------------------------
@dataclass
class Built:
    payload: bytes
    properties: dict[str, str]
    tt: int
    note: str = ""
    extra: dict = field(default_factory=dict)


def props(t: int, tt: int, *, vc: str | None = VCHANNEL, header: bytes = b"", version: int = 1,
          lc: str | None = None, lcs: bool = False, tx: bytes | None = None, bh: bytes | None = None,
          ch: bytes | None = None, wt: int | None = 1, **extra: str) -> dict[str, str]:
    p = {"_v": str(version), "_t": str(t), "_tt": b36(tt), "_h": b64(header)}
    if vc is not None:
        p["_vc"] = vc
    if wt is not None:
        p["_wt"] = b36(wt)
    if lcs:
        p["_lcs"] = ""
    elif lc is not None:
        p["_lc"] = lc
    for key, value in (("_tx", tx), ("_bh", bh), ("_ch", ch)):
        if value is not None:
            p[key] = b64(value)
    p.update(extra)
    return p


def _base(msg_type: int, ts: int, msg_id: int = 0) -> common_pb2.MsgBase:
    return common_pb2.MsgBase(msg_type=msg_type, msgID=msg_id, timestamp=ts, sourceID=7)


def insert_body(pks: Sequence[int], ts: int, *, collection: int = COLLECTION, partition: int = PARTITION,
                shard: str = "proxy-shard-name", segment: int = 0) -> bytes:
    """msgpb.InsertRequest with an Int64 pk and a 2-dim FloatVector, as a proxy writes it."""
    n = len(pks)
    pk = schema_pb2.FieldData(type=schema_pb2.DataType.Int64, field_name="pk", field_id=100)
    pk.scalars.long_data.data.extend(pks)
    vec = schema_pb2.FieldData(type=schema_pb2.DataType.FloatVector, field_name="vec", field_id=101)
    vec.vectors.dim = 2
    vec.vectors.float_vector.data.extend([float(v) for p in pks for v in (p, -p)])
    req = msg_pb2.InsertRequest(base=_base(400, ts, 11), shardName=shard, collection_name="c26",
                                partition_name="_default", collectionID=collection, partitionID=partition,
                                segmentID=segment, num_rows=n, fields_data=[pk, vec],
                                version=msg_pb2.InsertDataVersion.ColumnBased)
    req.timestamps.extend([ts] * n)
    req.rowIDs.extend(range(1000, 1000 + n))
    return req.SerializeToString()


def insert(tt: int, pks: Sequence[int], *, vc: str = VCHANNEL, segment: int = SEGMENT, **kw) -> Built:
    header = insert_header(COLLECTION, [(PARTITION, len(pks), 16 * len(pks), segment)])
    return Built(insert_body(pks, tt - PAYLOAD_TS_SKEW), props(T["Insert"], tt, vc=vc, header=header, **kw), tt,
                 "insert")


def delete_body(pks: Sequence[int], ts: int, *, collection: int = COLLECTION) -> bytes:
    ids = schema_pb2.IDs()
    ids.int_id.data.extend(pks)
    req = msg_pb2.DeleteRequest(base=_base(401, ts, 12), shardName="proxy-shard-name", collection_name="c26",
                                collectionID=collection, partitionID=-1, num_rows=len(pks), primary_keys=ids)
    req.timestamps.extend([ts] * len(pks))
    return req.SerializeToString()


def delete(tt: int, pks: Sequence[int], *, vc: str = VCHANNEL, **kw) -> Built:
    return Built(delete_body(pks, tt - PAYLOAD_TS_SKEW),
                 props(T["Delete"], tt, vc=vc, header=delete_header(COLLECTION, len(pks)), **kw), tt, "delete")


def timetick(tt: int, **kw) -> Built:
    """A TimeTick: V1 msgpb.TimeTickMsg, base.timestamp = _tt, no _vc (it applies to every vchannel)."""
    payload = msg_pb2.TimeTickMsg(base=_base(1200, tt)).SerializeToString()
    return Built(payload, props(T["TimeTick"], tt, vc=None, **kw), tt, "timetick")


def collection_schema(extra_field: str | None = None) -> schema_pb2.CollectionSchema:
    s = schema_pb2.CollectionSchema(name="c26")
    s.fields.add(fieldID=100, name="pk", is_primary_key=True, data_type=schema_pb2.DataType.Int64)
    vec = s.fields.add(fieldID=101, name="vec", data_type=schema_pb2.DataType.FloatVector)
    vec.type_params.add(key="dim", value="2")
    if extra_field:
        s.fields.add(fieldID=102, name=extra_field, data_type=schema_pb2.DataType.VarChar, nullable=True)
    return s


def create_collection(tt: int, *, vc: str = VCHANNEL, db_id: int = 1, bh: bytes | None = None, **kw) -> Built:
    req = msg_pb2.CreateCollectionRequest(base=_base(100, tt - PAYLOAD_TS_SKEW), collectionName="c26",
                                          collectionID=COLLECTION, schema=collection_schema().SerializeToString(),
                                          partitionIDs=[PARTITION], virtualChannelNames=[VCHANNEL],
                                          physicalChannelNames=[PCHANNEL])
    header = vfield(1, COLLECTION) + packed(2, [PARTITION]) + vfield(3, db_id)
    return Built(req.SerializeToString(), props(T["CreateCollection"], tt, vc=vc, header=header, bh=bh, **kw), tt,
                 "create_collection")


def drop_collection(tt: int, **kw) -> Built:
    req = msg_pb2.DropCollectionRequest(base=_base(101, tt - PAYLOAD_TS_SKEW), collectionName="c26",
                                        collectionID=COLLECTION)
    header = vfield(1, COLLECTION) + vfield(2, 1)
    return Built(req.SerializeToString(), props(T["DropCollection"], tt, header=header, **kw), tt, "drop_collection")


def partition_msg(tt: int, *, create: bool = True, **kw) -> Built:
    cls = msg_pb2.CreatePartitionRequest if create else msg_pb2.DropPartitionRequest
    req = cls(base=_base(200 if create else 201, tt - PAYLOAD_TS_SKEW), collection_name="c26", partition_name="p1",
              collectionID=COLLECTION, partitionID=PARTITION + 1)
    t = T["CreatePartition"] if create else T["DropPartition"]
    header = vfield(1, COLLECTION) + vfield(2, PARTITION + 1)
    return Built(req.SerializeToString(), props(t, tt, header=header, **kw), tt, "partition")


def v2(name: str, tt: int, *, header: bytes = b"", body: bytes = b"", vc: str | None = VCHANNEL, **kw) -> Built:
    """A version-2 message of type ``name`` (bodies of Flush, CreateSegment, ... are empty messages)."""
    t = T[name] if isinstance(name, str) else int(name)
    return Built(body, props(t, tt, vc=vc, header=header, version=2, **kw), tt, f"v2:{name}")


def flush(tt: int, segment: int = SEGMENT, **kw) -> Built:
    return v2("Flush", tt, header=vfield(1, COLLECTION) + vfield(2, PARTITION) + vfield(3, segment), **kw)


def create_segment(tt: int, segment: int = SEGMENT, **kw) -> Built:
    header = (vfield(1, COLLECTION) + vfield(2, PARTITION) + vfield(3, segment) + vfield(4, 2)
              + vfield(5, 1 << 30) + vfield(6, 100_000) + vfield(7, 2))
    return v2("CreateSegment", tt, header=header, **kw)


def manual_flush(tt: int, **kw) -> Built:
    return v2("ManualFlush", tt, header=vfield(1, COLLECTION) + vfield(2, tt) + packed(3, [SEGMENT]), **kw)


def alter_collection(tt: int, new_field: str = "note", **kw) -> Built:
    """AlterCollection (V2): body.updates.schema = the schema with ``new_field`` added."""
    updates = lfield(3, "c26") + lfield(5, collection_schema(new_field).SerializeToString())
    header = vfield(1, 1) + vfield(2, COLLECTION) + lfield(3, lfield(1, "schema"))  # update_mask.paths
    return v2("AlterCollection", tt, header=header, body=lfield(1, updates), **kw)


def begin_txn(tt: int, txn_id: int, keepalive_ms: int = 10_000, **kw) -> Built:
    # real proxies write the BeginTxn header's keepalive as 0; the _tx context carries the one to use
    return v2("BeginTxn", tt, header=vfield(1, 0), tx=txn_context(txn_id, keepalive_ms), **kw)


def commit_txn(tt: int, txn_id: int, keepalive_ms: int = 10_000, **kw) -> Built:
    return v2("CommitTxn", tt, tx=txn_context(txn_id, keepalive_ms), **kw)


def rollback_txn(tt: int, txn_id: int, keepalive_ms: int = 10_000, **kw) -> Built:
    return v2("RollbackTxn", tt, tx=txn_context(txn_id, keepalive_ms), **kw)


def in_txn(msg: Built, txn_id: int, keepalive_ms: int = 10_000) -> Built:
    msg.properties["_tx"] = b64(txn_context(txn_id, keepalive_ms))
    return msg


def upsert_txn(tt: int, txn_id: int, pks: Sequence[int], *, end: str = "commit",
               keepalive_ms: int = 10_000) -> list[Built]:
    """An upsert: BeginTxn, delete, insert of the same pks, then CommitTxn / RollbackTxn (or nothing: 'open')."""
    out = [begin_txn(tt, txn_id, keepalive_ms), in_txn(delete(tt + 1, pks), txn_id, keepalive_ms),
           in_txn(insert(tt + 2, pks), txn_id, keepalive_ms)]
    if end == "commit":
        out.append(commit_txn(tt + 3, txn_id, keepalive_ms))
    elif end == "rollback":
        out.append(rollback_txn(tt + 3, txn_id, keepalive_ms))
    return out


def broadcast(builder, tt: int, broadcast_id: int, vchannels: Sequence[str], **kw) -> list[Built]:
    """One DDL written once per vchannel, each copy with its own _vc and _tt, all with one _bh."""
    bh = broadcast_header(broadcast_id, list(reversed(vchannels)), [(2, "c26", False)])
    return [builder(tt + i, vc=vc, bh=bh, **kw) for i, vc in enumerate(vchannels)]


def encrypted_insert(tt: int, pks: Sequence[int]) -> Built:
    plain = insert_body(pks, tt)
    scrambled = bytes(b ^ 0x5A for b in plain)  # stands in for ciphertext
    built = insert(tt, pks)
    built.payload = scrambled
    built.properties["_ch"] = b64(cipher_header(3, COLLECTION, b"wrapped-key", len(plain)))
    return built


def every_kind(tt: int, lc: str | None = None) -> list[Built]:
    """One of each: DDL (broadcast), DML, a committed and a rolled-back upsert, version-2 bodies, an
    encrypted insert, a type newer than the 2.6 branch, and TimeTicks."""
    kw = {} if lc is None else {"lc": lc}
    return [*broadcast(create_collection, tt, 77, [CONTROL_VCHANNEL, VCHANNEL], **kw), timetick(tt + 2, lcs=True),
            create_segment(tt + 3, **kw), insert(tt + 4, [1, 2], **kw), delete(tt + 5, [1], **kw),
            *upsert_txn(tt + 6, 501, [2]), *upsert_txn(tt + 10, 502, [3], end="rollback"),
            flush(tt + 14, **kw), manual_flush(tt + 15, **kw), alter_collection(tt + 16, **kw),
            partition_msg(tt + 17, **kw), encrypted_insert(tt + 18, [4]), v2(46, tt + 19, body=b"\x08\x01", **kw),
            drop_collection(tt + 20, **kw), timetick(tt + 21, **kw)]


def write(producer, msgs: Iterable[Built]) -> list:
    """Send through a backend's raw producer (mq SPI), one message per send: returns the ids."""
    from msgstream_spark.mq.base import ProducerMessage

    return [producer.send_batch([ProducerMessage(m.payload, m.properties, m.tt)])[0] for m in msgs]
