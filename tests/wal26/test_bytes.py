"""Byte facts of the 2.6 WAL format (wal doc §2, §4, §8), each with a worked example."""

from __future__ import annotations

import base64

import pytest

from msgstream_spark.errors import DecodeError, UnknownMessageTypeError
from msgstream_spark.msg.pb import common_pb2
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.wal26 import (
    BroadcastHeader,
    CipherHeader,
    InsertMessageHeader,
    TxnContext,
    WalCheckpoint,
    WalMessageId,
    WALName,
    b36decode,
    b36encode,
    decode_header,
    is_wal_message,
    parse_envelope,
    wal_position,
    wire_version,
)
from tests.wal26 import producer as P

TS = 455000614502400000  # 2025-01-01T00:00:00Z, logical 0


@pytest.mark.parametrize("value, text", [
    (0, "0"), (35, "z"), (36, "10"), (42, "16"), (1000, "rs"), (TS, "3gg498oqzuo0"),
    ((1 << 64) - 1, "3w5e11264sgsf"),
])
def test_base36_worked_examples(value, text):
    assert b36encode(value) == text == P.b36(value)
    assert b36decode(text) == value


def test_base36_signed_and_bad_text():
    assert b36encode(-1) == "-1" and b36decode("-1", signed=True) == -1  # _wt is FormatInt
    assert b36decode("RS") == 1000  # Go's ParseUint accepts upper case
    for bad in ("", "-1", "r s", "3w5e11264sgsg", "1.5"):
        with pytest.raises(ValueError):
            b36decode(bad)


def test_tt_property_of_a_worked_example():
    # _tt of 2025-01-01T00:00:00Z: FormatUint(455000614502400000, 36)
    env = parse_envelope({"_v": "1", "_t": "1", "_tt": "3gg498oqzuo0", "_h": ""})
    assert env.time_tick == TS and env.msg_type == 1 and env.vchannel is None and env.all_vchannels


def test_version_detection():
    assert wire_version({}) == 0 and wire_version({"msg_type": "Insert"}) == 0
    assert wire_version({"_v": "0"}) == 0  # Milvus's VersionOld
    assert wire_version({"_v": "1"}) == 1 and wire_version({"_v": "2"}) == 2
    with pytest.raises(DecodeError, match=r"_v='x'"):
        wire_version({"_v": "x"})
    with pytest.raises(UnknownMessageTypeError, match="version 3"):
        parse_envelope({"_v": "3", "_t": "2", "_tt": "1"})
    # a 2.6 proxy's version-0 entry (a pre-upgrade 2.5 body, rebuilt _t): no envelope; a bad _v is one
    # (its decode reports it)
    assert not is_wal_message({"_v": "0", "_t": "5", "_tt": "3gg498oqzuo0", "_vc": P.VCHANNEL, "_lc": "1"})
    assert not is_wal_message(None) and not is_wal_message({"msg_type": "Insert"}) and not is_wal_message({"_v": ""})
    assert all(is_wal_message({"_v": v}) for v in ("1", "2", "3", "x"))


def test_insert_header_bytes():
    # InsertMessageHeader{collection_id=100, partitions=[{partition_id=101, rows=2, binary_size=64,
    #                     segment_assignment{segment_id=102}}]}
    raw = bytes.fromhex("0864" "120a" "0865" "1002" "1840" "2202" "0866")
    assert P.insert_header(100, [(101, 2, 64, 102)]) == raw
    assert base64.b64encode(raw).decode() == "CGQSCghlEAIYQCICCGY="
    hdr = InsertMessageHeader.parse(raw)
    assert hdr.collection_id == 100 and hdr.assignment(101).segment_id == 102
    assert hdr.assignment(101).rows == 2 and hdr.assignment(101).binary_size == 64 and hdr.assignment(7) is None


def test_txn_context_and_keepalive_forever():
    # TxnContext{txn_id=7, keepalive_milliseconds=-1000}: a negative int64 is a 10-byte varint
    raw = bytes.fromhex("0807" "1098f8ffffffffffffff01")
    assert P.txn_context(7, -1000) == raw
    assert TxnContext.parse(raw) == TxnContext(7, -1000)
    env = parse_envelope(P.props(900, TS, tx=raw))
    assert env.txn == TxnContext(7, -1000) and env.txn_id == 7


def test_broadcast_header_bytes():
    # BroadcastHeader{broadcast_id=5, vchannels=["a_1v0"], resource_keys=[{domain=CollectionName(2), key="c"}]}
    raw = bytes.fromhex("0805" "1205") + b"a_1v0" + bytes.fromhex("1a05" "0802" "1201") + b"c"
    assert P.broadcast_header(5, ["a_1v0"], [(2, "c", False)]) == raw
    bh = BroadcastHeader.parse(raw)
    assert bh.broadcast_id == 5 and bh.vchannels == ("a_1v0",)
    assert bh.resource_keys[0].domain == 2 and bh.resource_keys[0].key == "c" and not bh.resource_keys[0].shared


def test_cipher_header():
    raw = P.cipher_header(3, 444, b"k", 10)
    assert raw == bytes.fromhex("0803" "10bc03" "1a016b" "200a")
    assert CipherHeader.parse(raw) == CipherHeader(3, 444, b"k", 10)


def test_every_reserved_property_decoded_and_unknown_keys_kept():
    props = P.props(2, TS + 5, header=P.insert_header(1, [(2, 1, 8, 3)]), lc="rs", tx=P.txn_context(9, 0),
                    bh=P.broadcast_header(4, ["x"]), wt=-2, _btt=P.b36(TS), _np="", _pcl="", _ur="future",
                    trace="keep-me")
    props["_rh"] = P.b64(P.lfield(1, "src") + P.lfield(2, P.message_id("rs", 3)) + P.vfield(4, TS) + P.lfield(5, "v"))
    env = parse_envelope(props)
    assert (env.version, env.msg_type, env.time_tick, env.vchannel) == (1, 2, TS + 5, P.VCHANNEL)
    assert env.last_confirmed == "rs" and not env.last_confirmed_self
    assert env.wal_term == -2 and env.barrier_time_tick == TS and env.not_persisted and env.pchannel_level
    assert env.txn == TxnContext(9, 0) and env.broadcast_id == 4
    assert env.replicate.cluster_id == "src" and env.replicate.message_id == {"id": "rs", "wal_name": 3}
    assert env.replicate.time_tick == TS and env.replicate.vchannel == "v"
    assert env.extra == {"_ur": "future"}  # unknown reserved keys are carried, not rejected
    assert decode_header(2, env.header)["partitions"][0]["segment_assignment"] == {"segment_id": 3}
    assert parse_envelope(P.props(1, TS, lcs=True)).last_confirmed_self


@pytest.mark.parametrize("key, value, needle", [
    ("_tt", "3gg498oqzuo!", "_tt='3gg498oqzuo!'"),
    ("_t", "Insert", "_t='Insert' is not a decimal"),
    ("_h", "not base64!", "_h='not base64!' is not standard base64"),
    ("_tx", P.b64(b"\x08"), "_tx='CA==' is not a valid protobuf"),
    ("_wt", "zzzzzzzzzzzzzzzzz", "_wt="),
])
def test_bad_property_names_property_value_and_place(key, value, needle):
    props = P.props(2, TS)
    props[key] = value
    with pytest.raises(DecodeError) as ei:
        parse_envelope(props, channel="by-dev-rootcoord-dml_0", msg_id=(42).to_bytes(8, "little"))
    msg = str(ei.value)
    assert needle in msg and "channel=by-dev-rootcoord-dml_0" in msg and "msgID(base64)=KgAAAAAAAAA=" in msg


def test_missing_tt_or_type():
    with pytest.raises(DecodeError, match="without the _tt"):
        parse_envelope({"_v": "1", "_t": "2"})
    with pytest.raises(DecodeError, match="without the _t property"):
        parse_envelope({"_v": "1", "_tt": "1"})


def test_kafka_ids():
    # Kafka: WAL id = offset in base 36; legacy bytes = 8-byte little-endian offset
    mid = WalMessageId.kafka(1000)
    assert mid == WalMessageId(WALName.Kafka, "rs")
    assert mid.to_legacy_bytes() == bytes.fromhex("e803000000000000")
    assert WalMessageId.from_legacy_bytes("kafka", bytes.fromhex("e803000000000000")) == mid
    assert mid.int_value == 1000
    # common.MessageID{id="rs", WAL_name=Kafka(3)} = 0a 02 'r' 's' 10 03, same bytes as pymilvus's class
    raw = bytes.fromhex("0a027273" "1003")
    assert mid.to_proto_bytes() == raw == P.message_id("rs", 3)
    assert raw == common_pb2.MessageID(id="rs", WAL_name=3).SerializeToString()
    assert WalMessageId.from_proto_bytes(raw) == mid
    assert WalMessageId.parse(base64.b64encode(raw).decode()) == mid
    assert WalMessageId.parse('{"id": "rs", "wal_name": "kafka"}') == mid
    assert WalMessageId.parse('{"id": "rs", "wal_name": 3}') == mid


def test_pulsar_ids():
    # Pulsar: WAL id = base64 of the MessageIdData bytes Milvus writes (ledger 12, entry 3)
    data = bytes.fromhex("080c" "1003" "1800" "2000" "3001")
    mid = WalMessageId.pulsar(data)
    assert mid == WalMessageId(WALName.Pulsar, "CAwQAxgAIAAwAQ==")
    assert mid.to_legacy_bytes() == data
    assert WalMessageId.from_proto_bytes(mid.to_proto_bytes()) == mid
    # 2.6's Pulsar producer batches: ids may carry batch_index 2 of batch_size 5
    batched = bytes.fromhex("080c" "1003" "1800" "2002" "3005")
    assert WalMessageId.pulsar(batched).id == "CAwQAxgAIAIwBQ=="
    assert WalMessageId.pulsar(batched).to_legacy_bytes() == batched
    with pytest.raises(DecodeError, match="ledgerId"):
        WalMessageId(WALName.Pulsar, P.b64(b"\x18\x00")).to_legacy_bytes()
    with pytest.raises(DecodeError, match="base64"):
        WalMessageId(WALName.Pulsar, "??").to_legacy_bytes()


def test_rocksmq_and_unsupported_wals():
    assert WalMessageId(WALName.RocksMQ, "16").to_legacy_bytes() == (42).to_bytes(8, "little")
    with pytest.raises(DecodeError, match="WoodPecker"):
        WalMessageId(WALName.WoodPecker, "x").to_legacy_bytes()
    with pytest.raises(DecodeError, match="8 bytes"):
        WalMessageId.from_legacy_bytes(WALName.Kafka, b"\x01")
    with pytest.raises(ValueError, match="unknown WAL name"):
        WALName.parse("nats")


def test_wal_checkpoint():
    # WALCheckpoint{message_id{id="rs", WAL_name=Kafka}, time_tick=TS, recovery_magic=1}
    raw = P.wal_checkpoint("rs", 3, TS, 1)
    assert raw == bytes.fromhex("0a06" "0a027273" "1003" "1080808080df949fa806" "1801")
    cp = WalCheckpoint.parse(base64.b64encode(raw).decode())
    assert cp == WalCheckpoint(WalMessageId.kafka(1000), TS, 1) == WalCheckpoint.parse(raw)
    pos = cp.to_position("by-dev-rootcoord-dml_0")
    assert pos == MsgPosition("by-dev-rootcoord-dml_0", bytes.fromhex("e803000000000000"), "", TS, 3)
    with pytest.raises(ValueError, match="base64"):
        WalCheckpoint.parse("***")
    with pytest.raises(ValueError, match="WALCheckpoint"):
        WalCheckpoint.parse(b"\x0a\x05")


def test_position_is_built_from_last_confirmed_not_own_id():
    env = parse_envelope(P.props(2, TS, lc="rs"))
    own = WalMessageId.kafka(1005)
    pos = wal_position(env, WALName.Kafka, own)
    # msgpb.MsgPosition{channel_name=_vc, msgID=legacy(_lc), timestamp=_tt, WAL_name=Kafka}
    assert pos == MsgPosition(P.VCHANNEL, (1000).to_bytes(8, "little"), "", TS, 3)
    assert MsgPosition.from_proto_bytes(pos.to_proto_bytes()) == pos
    lcs = parse_envelope(P.props(1, TS, lcs=True))
    assert wal_position(lcs, WALName.Kafka, own).msg_id == (1005).to_bytes(8, "little")
    assert wal_position(parse_envelope(P.props(1, TS)), WALName.Kafka, own) is None
