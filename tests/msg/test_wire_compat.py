"""Byte compatibility with Milvus: every example of wire doc Appendix A and the §5.4 hash vectors."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from msgstream_spark.errors import DecodeError, UnknownMessageTypeError
from msgstream_spark.msg import codec, hashing, tso
from msgstream_spark.msg.position import MsgPosition, parse_positions
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, MsgType, TimeTickMsg

TS = 455000614502400000  # 2025-01-01T00:00:00Z, logical 0
TS_VARINT = bytes.fromhex("80808080df949fa806")


def test_tso_example():
    assert tso.compose(1735689600000) == TS
    assert tso.physical_ms(TS) == 1735689600000 and tso.logical(TS) == 0
    assert tso.to_datetime(TS).isoformat() == "2025-01-01T00:00:00+00:00"
    assert tso.parse_timestamp("2025-01-01T00:00:00Z") == TS
    assert tso.parse_timestamp(str(TS)) == TS
    assert tso.parse_timestamp(TS + 5) == TS + 5
    with pytest.raises(ValueError, match="ISO-8601"):
        tso.parse_timestamp("yesterday")


def test_timetick_payload_bytes():
    payload, props = codec.marshal(TimeTickMsg.build(TS, source_id=1))
    assert payload == bytes.fromhex("0a0f08b00918") + TS_VARINT + bytes.fromhex("2001")
    assert props == {"msg_type": "TimeTick"}
    msg = codec.unmarshal(payload, {})  # header fallback
    assert isinstance(msg, TimeTickMsg) and msg.timestamp == TS


def test_msgposition_bytes_for_kafka_offset_42():
    pos = MsgPosition("by-dev-rootcoord-dml_0", (42).to_bytes(8, "little"), "g", TS)
    want = (bytes.fromhex("0a16") + b"by-dev-rootcoord-dml_0" + bytes.fromhex("12082a00000000000000")
            + bytes.fromhex("1a016720") + TS_VARINT)
    assert pos.to_proto_bytes() == want
    assert MsgPosition.from_proto_bytes(want) == pos
    assert MsgPosition.from_base64(pos.to_base64()) == pos
    assert MsgPosition.parse(pos.to_json()) == pos
    assert MsgPosition.parse(base64.b64encode(want).decode()) == pos


def _minimal_insert() -> InsertMsg:
    from msgstream_spark.msg.pb import schema_pb2

    fd = schema_pb2.FieldData(type=5, field_name="pk", field_id=100)
    fd.scalars.long_data.data.extend([1, 2])
    return InsertMsg.build(fields_data=[fd], num_rows=2, timestamp=TS, collection_id=100, partition_id=101,
                           segment_id=102, shard_name="by-dev-rootcoord-dml_0_100v0", msg_id=7, source_id=3,
                           row_ids=[1, 2])


def test_minimal_insert_bytes_and_header():
    payload, props = codec.marshal(_minimal_insert())
    want = (bytes.fromhex("0a11089003100718") + TS_VARINT + bytes.fromhex("2003")
            + bytes.fromhex("121c") + b"by-dev-rootcoord-dml_0_100v0" + bytes.fromhex("386440654866")
            + bytes.fromhex("5212") + TS_VARINT + TS_VARINT + bytes.fromhex("5a020102")
            + bytes.fromhex("6a1008051202") + b"pk" + bytes.fromhex("1a061a040a0201022864")
            + bytes.fromhex("70027801"))
    assert payload == want
    assert props == {"msg_type": "Insert"}
    assert codec.header_msg_type(payload) == 400
    from msgstream_spark.msg.pb import common_pb2

    hdr = common_pb2.MsgHeader()
    hdr.ParseFromString(payload)
    assert hdr.base.msg_type == 400 and hdr.base.msgID == 7
    msg = codec.unmarshal(payload, props, channel="c", msg_id=b"\x01" * 8)
    assert isinstance(msg, InsertMsg) and msg.num_rows == 2 and msg.begin_ts == msg.end_ts == TS
    assert msg.to_arrow().column("pk").to_pylist() == [1, 2]


INT64_VECTORS = {0: 1669671676, 1: 1392991556, 10: 1857498428, 100: 1177227376, 1000: 679959820,
                 10000: 1785225994, 100000: 258819970, 1000000: 1669527334, 10**7: 112035536,
                 10**8: 107125476, 10**9: 913068403, 10**10: 1151135, 10**11: 2136277055,
                 10**12: 636570700, 10**13: 469485073, 10**14: 745519692, 10**15: 1724407835,
                 10**16: 2022854314, 10**17: 1713940411, 10**18: 2117120843}


def test_int64_hash_vectors_scalar_and_vectorised():
    for k, v in INT64_VECTORS.items():
        assert hashing.hash_int64(k) == v, k
    keys = np.array(list(INT64_VECTORS), dtype=np.int64)
    assert hashing.hash_int64_array(keys).tolist() == list(INT64_VECTORS.values())


def test_hash_matches_mmh3_on_random_keys():
    import mmh3

    keys = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, 2000, dtype=np.int64)
    want = [mmh3.hash(int(k).to_bytes(8, "little", signed=True), 0, signed=False) & 0x7FFFFFFF for k in keys]
    assert hashing.hash_int64_array(keys).tolist() == want


def test_string_hash_and_shards():
    assert hashing.hash_string("abcdef") == 1267612143
    long = "x" * 150
    assert hashing.hash_string(long) == hashing.hash_string("x" * 100)
    assert hashing.shard_indices(np.array([1, 100], dtype=np.int64), 2).tolist() == [0, 0]
    assert hashing.shard_indices(np.array([100, 102, 102, 103, 104]), 2).tolist() == [0, 0, 0, 1, 0]
    assert hashing.shard_indices(["abcdef"], 7).tolist() == [1267612143 % 7]


def test_delete_roundtrip_and_legacy_keys():
    msg = DeleteMsg.build(primary_keys=np.array([5, 6, 7]), timestamp=TS, collection_id=9, msg_id=3)
    payload, props = codec.marshal(msg)
    back = codec.unmarshal(payload, props)
    assert back.primary_keys.tolist() == [5, 6, 7] and back.num_rows == 3
    # a DeleteRequest with only the deprecated int64_primary_keys is rebuilt
    from msgstream_spark.msg.pb import msg_pb2

    legacy = msg_pb2.DeleteRequest(base=msg.proto.base, int64_primary_keys=[1, 2], timestamps=[TS, TS])
    back = codec.unmarshal(legacy.SerializeToString(), {"msg_type": "Delete"})
    assert back.primary_keys.tolist() == [1, 2] and back.num_rows == 2
    s = DeleteMsg.build(primary_keys=["a", "b"], timestamp=TS)
    assert codec.unmarshal(*codec.marshal(s)).primary_keys == ["a", "b"]


def test_decode_errors_name_channel_position_and_bytes():
    with pytest.raises(DecodeError) as ei:
        codec.unmarshal(b"\x0a\x05\x08", {"msg_type": "Insert"}, channel="ch-1", msg_id=b"\x07" + b"\0" * 7)
    text = str(ei.value)
    assert "ch-1" in text and "BwAAAAAAAAA=" in text and "payload(3 bytes" in text
    assert ei.value.payload == b"\x0a\x05\x08"
    with pytest.raises(DecodeError, match="empty payload"):
        codec.unmarshal(b"", {}, channel="c")
    with pytest.raises(DecodeError, match="MsgBase"):
        codec.unmarshal(b"\x12\x00", {}, channel="c")
    from msgstream_spark.msg.pb import common_pb2

    flush = common_pb2.MsgHeader(base=common_pb2.MsgBase(msg_type=402)).SerializeToString()
    with pytest.raises(UnknownMessageTypeError, match="Flush"):
        codec.unmarshal(flush, {})
    with pytest.raises(UnknownMessageTypeError, match="2.6"):
        codec.unmarshal(flush, {"_v": "1"})


def test_inconsistent_insert_is_rejected():
    msg = _minimal_insert()
    msg.proto.timestamps.append(TS)
    with pytest.raises(DecodeError, match="inconsistent Insert"):
        codec.unmarshal(*codec.marshal(msg), channel="c")
    msg = _minimal_insert()
    msg.proto.fields_data[0].scalars.long_data.data.append(3)
    with pytest.raises(DecodeError, match="field 'pk' has 3 rows"):
        codec.unmarshal(*codec.marshal(msg), channel="c")


def test_property_wins_over_header_and_unknown_property_falls_back():
    payload, _ = codec.marshal(TimeTickMsg.build(TS))
    assert codec.peek_msg_type(payload, {"msg_type": "TimeTick"}) == MsgType.TimeTick
    assert codec.peek_msg_type(payload, {"msg_type": "NoSuchType"}) == MsgType.TimeTick


def test_position_list_forms():
    a = MsgPosition("c0", b"\x01" * 8, "", 5)
    b = MsgPosition("c1", b"\x02" * 8, "", 6)
    assert parse_positions(f"{a.to_base64()},{b.to_base64()}") == [a, b]
    assert parse_positions(f'[{a.to_json()}, "{b.to_base64()}"]') == [a, b]
    assert parse_positions('{"c0": "%s", "c1": %s}' % (a.to_base64(), b.to_json())) == [a, b]
    with pytest.raises(ValueError, match="base64"):
        parse_positions("not-base64!!")
    with pytest.raises(ValueError, match="names no channel"):
        parse_positions('[{"msgID": ""}]')
