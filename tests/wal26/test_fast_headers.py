"""The insert/delete header fast path (the C protobuf parser) reads what the field walker reads and
fails where it fails. Headers built with the independent test producer's wire writer."""

from __future__ import annotations

import pytest

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg.wal26 import decode_message, fields
from msgstream_spark.msg.wal26.headers import DELETE_HEADER, INSERT_HEADER, delete_collection, insert_route
from tests.wal26 import producer as P


def _walker(raw: bytes):
    d = fields.decode(INSERT_HEADER, raw)
    segs = {}
    for p in d["partitions"]:
        segs.setdefault(p["partition_id"], (p["segment_assignment"] or {}).get("segment_id", 0))
    return d["collection_id"], segs


@pytest.mark.parametrize("raw", [
    P.insert_header(444, [(445, 3, 100, 446)]),
    P.insert_header(444, [(445, 3, 100, 446), (445, 1, 1, 9), (7, 0, 0, 0)]),  # the first entry of a partition
    P.insert_header(444, [(445, 3, 100, 446)]) + P.vfield(9, 5) + P.lfield(10, b"new"),  # a newer Milvus's fields
    b"\x08" + bytes([0xBC | 0x80, 0x83, 0x80, 0x00]) + P.lfield(2, P.vfield(1, 445)),  # an overlong varint
    P.insert_header(-5, [(-1, 0, 0, (1 << 63) + 3)]),  # negative int64s
    b"",
])
def test_insert_route_reads_what_the_walker_reads(raw):
    assert insert_route(raw) == _walker(raw)


@pytest.mark.parametrize("raw, field", [
    (P.vfield(2, 7), "partitions"),  # a message field written as a varint
    (P.lfield(2, P.lfield(4, b"") + P.vfield(4, 1)), "segment_assignment"),  # nested, wrong wire type
    (P.lfield(1, b"x"), "collection_id"),
])
def test_wrong_wire_types_fail_naming_the_field(raw, field):
    with pytest.raises(ValueError, match=field):
        fields.decode(INSERT_HEADER, raw)
    with pytest.raises(ValueError, match=field):
        insert_route(raw)


def test_truncated_header_and_delete_header():
    with pytest.raises(ValueError):
        insert_route(P.insert_header(444, [(445, 3, 100, 446)])[:-1])
    raw = P.delete_header(444, 3)
    assert delete_collection(raw) == fields.decode(DELETE_HEADER, raw)["collection_id"] == 444
    with pytest.raises(ValueError, match="collection_id"):
        delete_collection(P.lfield(1, b"x"))


def test_a_malformed_insert_header_fails_the_decode_naming_where():
    b = P.insert(P.tt_of(1_767_225_600_000), [1, 2])
    b.properties["_h"] = P.b64(P.vfield(2, 7))
    with pytest.raises(DecodeError, match="malformed _h header of a Insert.*partitions") as ei:
        decode_message(b.payload, b.properties, channel="ch0", msg_id=b"\x01" * 8)
    assert ei.value.channel == "ch0"
