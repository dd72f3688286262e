"""The test producer's 2.6 messages decoded: every type, rebuilt inserts/deletes, both formats on one reader."""

from __future__ import annotations

import numpy as np
import pytest

from msgstream_spark.errors import DecodeError, UnknownMessageTypeError
from msgstream_spark.msg import codec
from msgstream_spark.msg.pb import msg_pb2
from msgstream_spark.msg.types import (
    CreateCollectionMsg,
    CreatePartitionMsg,
    DeleteMsg,
    DropCollectionMsg,
    DropPartitionMsg,
    InsertMsg,
    TimeTickMsg,
)
from msgstream_spark.msg.wal26 import WalMessageType, WalMsg, decode_message, decode_wal, time_tick_of, vchannel_of
from tests.wal26 import producer as P

TT = P.tt_of(1_767_225_600_000, 3)  # 2026-01-01T00:00:00Z, logical 3
LOC = {"channel": P.PCHANNEL, "msg_id": (77).to_bytes(8, "little")}


def dec(built: P.Built):
    return decode_message(built.payload, built.properties, **LOC)


def test_insert_rebuilt_from_properties():
    b = P.insert(TT, [1, 2, 3], lc="rs")
    raw = InsertMsg(msg_pb2.InsertRequest.FromString(b.payload))
    assert set(raw.timestamps.tolist()) == {TT - P.PAYLOAD_TS_SKEW} and raw.segment_id == 0  # what the proxy wrote
    msg = dec(b)
    assert isinstance(msg, InsertMsg)
    assert msg.timestamps.tolist() == [TT] * 3 and msg.timestamp == TT and msg.begin_ts == msg.end_ts == TT
    assert msg.shard_name == P.VCHANNEL and msg.segment_id == P.SEGMENT and msg.partition_id == P.PARTITION
    assert msg.collection_id == P.COLLECTION and msg.num_rows == 3
    assert msg.to_arrow().column("pk").to_pylist() == [1, 2, 3]
    assert msg.wal.time_tick == TT and msg.wal.last_confirmed == "rs" and msg.properties == b.properties


def test_insert_equals_the_same_data_from_a_25_topic():
    msg = dec(P.insert(TT, [5, 6]))
    payload25 = P.insert_body([5, 6], TT, shard=P.VCHANNEL, segment=P.SEGMENT)
    old = codec.unmarshal(payload25, {"msg_type": "Insert"})
    assert old.wal is None
    assert msg.proto.SerializeToString() == old.proto.SerializeToString()


def test_insert_without_a_segment_is_corrupt():
    for seg in (0, None):
        b = P.insert(TT, [1], segment=seg or 0)
        if seg is None:
            b.properties["_h"] = P.b64(P.insert_header(P.COLLECTION, [(P.PARTITION + 9, 1, 8, 5)]))
        with pytest.raises(DecodeError, match=r"assigns no segment to partition 445.*corrupt") as ei:
            dec(b)
        assert f"channel={P.PCHANNEL}" in str(ei.value) and "msgID(base64)=TQAAAAAAAAA=" in str(ei.value)


def test_insert_header_of_another_collection():
    b = P.insert(TT, [1])
    b.properties["_h"] = P.b64(P.insert_header(9, [(P.PARTITION, 1, 8, 5)]))
    with pytest.raises(DecodeError, match="_h names collection 9, the body collection 444"):
        dec(b)


def test_delete_rebuilt_keeps_base_timestamp():
    msg = dec(P.delete(TT, [7, 8]))
    assert isinstance(msg, DeleteMsg)
    assert msg.timestamps.tolist() == [TT, TT] and msg.shard_name == P.VCHANNEL
    assert msg.proto.base.timestamp == TT - P.PAYLOAD_TS_SKEW  # Milvus does not rewrite a delete's base.timestamp
    assert msg.begin_ts == msg.end_ts == TT and msg.primary_keys.tolist() == [7, 8]


def test_timetick_for_every_vchannel():
    msg = dec(P.timetick(TT))
    assert isinstance(msg, TimeTickMsg) and msg.timestamp == TT and msg.wal.all_vchannels
    empty = decode_wal(b"", P.timetick(TT + 1).properties)
    assert isinstance(empty, TimeTickMsg) and empty.timestamp == TT + 1


@pytest.mark.parametrize("builder, cls", [
    (P.create_collection, CreateCollectionMsg), (P.drop_collection, DropCollectionMsg),
    (lambda tt: P.partition_msg(tt, create=True), CreatePartitionMsg),
    (lambda tt: P.partition_msg(tt, create=False), DropPartitionMsg),
])
def test_v1_ddl_bodies(builder, cls):
    msg = dec(builder(TT))
    assert type(msg) is cls and msg.timestamp == TT and msg.collection_id == P.COLLECTION


def test_create_collection_schema_and_header():
    msg = dec(P.create_collection(TT, bh=P.broadcast_header(9, [P.VCHANNEL, P.CONTROL_VCHANNEL])))
    assert [f.name for f in msg.schema.fields] == ["pk", "vec"]
    assert msg.wal.broadcast_id == 9 and msg.wal.broadcast.vchannels == (P.VCHANNEL, P.CONTROL_VCHANNEL)


def test_broadcast_copies_share_one_id():
    copies = [dec(b) for b in P.broadcast(P.create_collection, TT, 31, [P.CONTROL_VCHANNEL, P.VCHANNEL])]
    assert {m.wal.broadcast_id for m in copies} == {31}
    assert [m.wal.vchannel for m in copies] == [P.CONTROL_VCHANNEL, P.VCHANNEL]
    assert [m.wal.time_tick for m in copies] == [TT, TT + 1]
    assert copies[0].wal.is_control_vchannel and not copies[1].wal.is_control_vchannel


V2_CASES = [
    (P.flush, "Flush", {"collection_id": P.COLLECTION, "partition_id": P.PARTITION, "segment_id": P.SEGMENT}),
    (P.create_segment, "CreateSegment", {"segment_id": P.SEGMENT, "max_rows": 100_000, "storage_version": 2}),
    (P.manual_flush, "ManualFlush", {"collection_id": P.COLLECTION, "segment_ids": [P.SEGMENT]}),
    (lambda tt: P.begin_txn(tt, 5), "BeginTxn", {"keepalive_milliseconds": 0}),
    (lambda tt: P.commit_txn(tt, 5), "CommitTxn", {}),
    (lambda tt: P.rollback_txn(tt, 5), "RollbackTxn", {}),
    (lambda tt: P.v2("FlushAll", tt, vc=P.PCHANNEL, _pcl=""), "FlushAll", {}),
    (lambda tt: P.v2("CreateDatabase", tt, header=P.lfield(1, "db2") + P.vfield(2, 3),
                     body=b"\x0a\x04\x0a\x01k\x12\x00", vc=P.CONTROL_VCHANNEL),
     "CreateDatabase", {"db_name": "db2", "db_id": 3}),
    (lambda tt: P.v2("CreateIndex", tt, header=P.vfield(2, P.COLLECTION) + P.lfield(5, "ix"), body=b"\x0a\x00"),
     "CreateIndex", {"collection_id": P.COLLECTION, "index_name": "ix"}),
    (lambda tt: P.v2("TruncateCollection", tt, header=P.vfield(2, P.COLLECTION)), "TruncateCollection", {}),
    (lambda tt: P.v2("AlterWAL", tt, header=P.vfield(1, 2) + P.lfield(2, P.lfield(1, "k") + P.lfield(2, "v"))),
     "AlterWAL", {"target_wal_name": 2, "config": [{"key": "k", "value": "v"}]}),
]


@pytest.mark.parametrize("builder, name, header", V2_CASES, ids=[c[1] for c in V2_CASES])
def test_v2_messages_are_typed_and_never_fail(builder, name, header):
    b = builder(TT)
    msg = dec(b)
    assert isinstance(msg, WalMsg) and msg.wal_type == WalMessageType[name] and msg.wal.version == 2
    assert msg.timestamp == TT and msg.body == b.payload and msg.msg_type == 0
    for key, value in header.items():
        assert msg.header[key] == value
    for body in (b"", b"\xff\xff\xff"):  # empty and non-empty (even garbage) bodies build
        assert decode_wal(body, b.properties).body == body


def test_alter_collection_carries_the_new_schema():
    msg = dec(P.alter_collection(TT, "note"))
    assert msg.wal_type == WalMessageType.AlterCollection and msg.collection_id == P.COLLECTION
    assert [f.name for f in msg.schema.fields] == ["pk", "vec", "note"]
    assert msg.header["update_mask"] == {"paths": ["schema"]}
    assert dec(P.flush(TT)).schema is None


def test_unknown_types_and_v1_import_pass_through():
    msg = dec(P.v2(46, TT, header=b"\x08\x01", body=b"\x01\x02"))
    assert isinstance(msg, WalMsg) and msg.wal_type == 46 and msg.wal.type_name == "46" and msg.header is None
    imp = dec(P.Built(b"\x0a\x00", P.props(11, TT), TT))
    assert isinstance(imp, WalMsg) and imp.wal_type == WalMessageType.Import and imp.header == {}


def test_malformed_v2_header_fails_only_on_access():
    b = P.flush(TT)
    b.properties["_h"] = P.b64(b"\x08")
    msg = dec(b)
    with pytest.raises(DecodeError, match="malformed _h header of a Flush"):
        _ = msg.header
    assert msg.collection_id == 0


def test_encrypted_message_names_channel_and_position():
    with pytest.raises(DecodeError) as ei:
        dec(P.encrypted_insert(TT, [1, 2]))
    text = str(ei.value)
    assert "encrypted Insert message" in text and "encryption zone 3, collection 444" in text
    assert f"channel={P.PCHANNEL}" in text and "msgID(base64)=TQAAAAAAAAA=" in text


def test_malformed_v1_body_names_where():
    b = P.insert(TT, [1])
    b.payload = b"\x0a\xff"
    with pytest.raises(DecodeError, match="malformed Insert payload") as ei:
        dec(b)
    assert ei.value.channel == P.PCHANNEL


def test_one_reader_for_both_formats():
    old_payload = P.insert_body([1], TT - 5, shard=P.VCHANNEL, segment=3)
    old = decode_message(old_payload, {"msg_type": "Insert"})
    assert old.wal is None and old.timestamps.tolist() == [TT - 5] and old.segment_id == 3
    b = P.insert(TT, [1])
    new = decode_message(b.payload, b.properties)
    assert new.wal.version == 1 and new.timestamps.tolist() == [TT]
    # Milvus reads a 2.5 message with the body's BeginTs as time tick and its ShardName as vchannel
    assert (time_tick_of(old), vchannel_of(old)) == (TT - 5, P.VCHANNEL)
    assert (time_tick_of(new), vchannel_of(new)) == (TT, P.VCHANNEL)
    tick = dec(P.timetick(TT + 9))
    assert (time_tick_of(tick), vchannel_of(tick)) == (TT + 9, None)
    with pytest.raises(UnknownMessageTypeError, match="version 7"):
        decode_message(b"", {"_v": "7", "_t": "2", "_tt": "1"})
    # the classic codec alone still refuses WAL messages (its callers decide)
    with pytest.raises(UnknownMessageTypeError):
        codec.unmarshal(b.payload, b.properties)


def test_txn_messages_carry_their_context():
    msgs = [dec(b) for b in P.upsert_txn(TT, 12, [4])]
    assert [m.wal.txn_id for m in msgs] == [12] * 4
    assert isinstance(msgs[1], DeleteMsg) and isinstance(msgs[2], InsertMsg)
    assert np.all(msgs[2].timestamps == TT + 2)
