"""The product's 2.6 encoder (msg/wal26/encode.py) against the independent test producer and the wal doc.

Same inputs, same bytes: headers, ``_tx``, properties and TimeTick bodies; worked examples in
the wal doc's style; and everything decodes back with the library's decoder.
"""

from __future__ import annotations

import base64

import pytest

from msgstream_spark.msg.wal26 import PartitionSegmentAssignment as PSA
from msgstream_spark.msg.wal26 import decode_message, parse_envelope
from msgstream_spark.msg.wal26 import encode as E
from tests.wal26 import producer as P

TT = P.tt_of(1_767_225_600_000)  # 2026-01-01T00:00:00Z


def test_headers_match_the_test_producer_byte_for_byte():
    for parts in ([(P.PARTITION, 2, 32, P.SEGMENT)], [(1, 0, 0, 5), (2, 7, 9, 6)], [(-3, 1, 1, 1 << 40)]):
        assert E.insert_header(P.COLLECTION, [PSA(*p) for p in parts]) == P.insert_header(P.COLLECTION, parts)
    assert E.delete_header(P.COLLECTION, 3) == P.delete_header(P.COLLECTION, 3)
    for txn_id, keepalive in ((501, 10_000), (1 << 61, 0), (7, -1000)):
        assert E.txn_context(txn_id, keepalive) == P.txn_context(txn_id, keepalive)
    assert E.begin_txn_header(0) == b""  # proxies write 0: an empty header, "_h" = ""


def test_worked_examples():
    # InsertMessageHeader{collection_id 444, [{partition 445, rows 2, binary_size 32, segment 446}]}
    hdr = E.insert_header(444, [PSA(445, 2, 32, 446)])
    #   08 bc03 (collection_id 444) 12 0c (partitions, 12 bytes): 08 bd03 (445) 10 02 (rows) 18 20 (size 32)
    #   22 03 (segment_assignment, 3 bytes): 08 be03 (segment_id 446)
    assert hdr.hex() == "08bc03" "120c" "08bd03" "1002" "1820" "2203" "08be03"
    assert base64.b64encode(hdr).decode() == "CLwDEgwIvQMQAhggIgMIvgM="  # the _h property
    # TxnContext{txn_id 501, keepalive 10000 ms}
    assert E.txn_context(501, 10_000).hex() == "08f50310904e"
    p = E.properties(1, P.tt_of(1_735_689_600_000))  # 2025-01-01T00:00:00Z, doc's base-36 example
    assert p == {"_v": "1", "_t": "1", "_tt": "3gg498oqzuo0", "_h": ""}
    # a TxnContext with the "never expires" keepalive -1000 (ten-byte two's-complement varint)
    assert E.txn_context(1, -1000).hex() == "0801" + "10" + "98f8ffffffffffffff01"


def test_properties_match_the_test_producer():
    hdr = P.insert_header(P.COLLECTION, [(P.PARTITION, 2, 32, P.SEGMENT)])
    mine = E.insert_properties(TT, P.VCHANNEL, P.COLLECTION, P.PARTITION, rows=2, binary_size=32,
                               segment_id=P.SEGMENT, last_confirmed="rs")
    assert mine == P.props(P.T["Insert"], TT, header=hdr, lc="rs", wt=None)
    mine = E.delete_properties(TT, P.VCHANNEL, P.COLLECTION, rows=1, last_confirmed_self=True)
    assert mine == P.props(P.T["Delete"], TT, header=P.delete_header(P.COLLECTION, 1), lcs=True, wt=None)
    payload, props = E.timetick(TT, source_id=7)
    want = P.timetick(TT, wt=None)
    assert (payload, props) == (want.payload, want.properties)  # no _vc: every vchannel
    for mine, theirs in ((E.begin_txn(TT, P.VCHANNEL, 501), P.begin_txn(TT, 501, wt=None)),
                         (E.commit_txn(TT, P.VCHANNEL, 501), P.commit_txn(TT, 501, wt=None)),
                         (E.rollback_txn(TT, P.VCHANNEL, 501), P.rollback_txn(TT, 501, wt=None))):
        assert mine == (theirs.payload, theirs.properties)
    body = E.delete_properties(TT, P.VCHANNEL, P.COLLECTION, rows=1)
    assert E.in_txn(body, 501) == P.in_txn(P.Built(b"", dict(body), TT), 501).properties
    with pytest.raises(ValueError, match="_lc or _lcs"):
        E.properties(2, TT, last_confirmed="0", last_confirmed_self=True)


def test_encoded_messages_decode_back():
    body = P.insert_body([1, 2], TT - 5, segment=0)
    props = E.insert_properties(TT, P.VCHANNEL, P.COLLECTION, P.PARTITION, rows=2, binary_size=len(body),
                                segment_id=P.SEGMENT, wal_term=3)
    msg = decode_message(body, props)
    assert msg.timestamps.tolist() == [TT, TT] and msg.segment_id == P.SEGMENT and msg.shard_name == P.VCHANNEL
    assert msg.wal.wal_term == 3 and msg.wal.header_fields["partitions"][0]["binary_size"] == len(body)
    env = parse_envelope(E.begin_txn(TT, P.VCHANNEL, 9, 2500, last_confirmed_self=True)[1])
    assert env.txn.txn_id == 9 and env.txn.keepalive_milliseconds == 2500 and env.last_confirmed_self
    tick = decode_message(*E.timetick(TT + 1))
    assert tick.timestamp == TT + 1 and tick.wal.vchannel is None
