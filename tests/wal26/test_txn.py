"""Transactions assembled as Milvus's consumers do: commit releases, rollback and expiry drop."""

from __future__ import annotations

from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, TimeTickMsg
from msgstream_spark.msg.wal26 import WalMessageType, decode_message
from msgstream_spark.stream.txn import TxnAssembler
from tests.wal26 import producer as P

MS = 1 << 18  # one millisecond in hybrid-timestamp units
TT = P.tt_of(1_767_225_600_000)


def msgs(built):
    return [decode_message(b.payload, b.properties) for b in built]


def test_commit_releases_bodies_with_the_commit_time_tick():
    a = TxnAssembler()
    out = []
    flags = []
    for m in msgs(P.upsert_txn(TT, 1, [4, 5])):
        out.extend(a.feed(m))
        flags.append(a.has_open)
    assert flags == [True, True, True, False]  # a batch may end only after the commit
    assert [type(m) for m in out] == [DeleteMsg, InsertMsg]  # the delete before the insert of the upsert
    commit_tt = TT + 3
    assert [m.timestamps.tolist() for m in out] == [[commit_tt] * 2, [commit_tt] * 2]
    assert out[1].proto.base.timestamp == commit_tt and out[1].wal.time_tick == commit_tt
    assert a.outcome(1) == "committed" and a.stats["committed"] == 1


def test_commit_takes_the_commit_last_confirmed_and_position():
    built = P.upsert_txn(TT, 2, [1])
    built[-1].properties["_lc"] = "rs"
    seq = msgs(built)
    seq[-1].position = MsgPosition(P.PCHANNEL, (1000).to_bytes(8, "little"), "", commit_tt := TT + 3, 3)
    out = TxnAssembler().feed_all(seq)
    assert all(m.wal.last_confirmed == "rs" for m in out)
    assert all(m.position == MsgPosition(P.VCHANNEL, (1000).to_bytes(8, "little"), "", commit_tt, 3) for m in out)


def test_rollback_drops_everything():
    a = TxnAssembler()
    assert a.feed_all(msgs(P.upsert_txn(TT, 3, [1], end="rollback"))) == []
    assert not a.has_open and a.outcome(3) == "rolled_back"


def test_control_messages_for_a_messages_view():
    a = TxnAssembler(emit_control=True)
    out = a.feed_all(msgs(P.upsert_txn(TT, 4, [1])))
    assert [m.wal.msg_type for m in out] == [900, 3, 2, 901]
    out = a.feed_all(msgs(P.upsert_txn(TT + 10, 5, [1], end="rollback")))
    assert [m.wal.msg_type for m in out] == [900, 902]


def test_expiry_at_last_body_plus_keepalive():
    a = TxnAssembler()
    open_txn = msgs(P.upsert_txn(TT, 6, [1], end="open", keepalive_ms=100))
    assert a.feed_all(open_txn) == [] and a.has_open
    last_body_tt = TT + 2
    assert a.oldest_open().deadline == last_body_tt + 100 * MS
    tick = a.feed(msgs([P.timetick(last_body_tt + 100 * MS - 1)])[0])
    assert isinstance(tick[0], TimeTickMsg) and a.has_open  # one below the deadline: still open
    a.feed(msgs([P.timetick(last_body_tt + 100 * MS)])[0])
    assert not a.has_open and a.outcome(6) == "expired"
    late = msgs([P.in_txn(P.insert(TT + 200 * MS, [9]), 6, 100), P.commit_txn(TT + 201 * MS, 6, 100)])
    assert a.feed_all(late) == []  # a commit after expiry is ignored, and so are late bodies
    assert a.stats["ignored_messages"] == 2


def test_expiry_from_the_begin_when_no_body_and_zero_keepalive_means_default():
    a = TxnAssembler()
    a.feed(msgs([P.begin_txn(TT, 7, keepalive_ms=0)])[0])
    assert a.oldest_open().keepalive_ms == 10_000 and a.oldest_open().deadline == TT + 10_000 * MS
    a.feed(msgs([P.timetick(TT + 10_000 * MS)])[0])
    assert a.outcome(7) == "expired"


def test_replicated_transactions_never_expire():
    a = TxnAssembler()
    a.feed_all(msgs(P.upsert_txn(TT, 8, [1], end="open", keepalive_ms=-1000)))
    a.feed(msgs([P.timetick(TT + 10**9 * MS)])[0])
    assert a.has_open and a.oldest_open().deadline is None
    out = a.feed(msgs([P.commit_txn(TT + 10**9 * MS + 1, 8, -1000)])[0])
    assert len(out) == 2


def test_interleaved_transactions_and_plain_messages():
    a = TxnAssembler()
    seq = [P.begin_txn(TT, 10), P.insert(TT + 1, [100]), P.begin_txn(TT + 2, 11, vc=P.VCHANNEL[:-1] + "1"),
           P.in_txn(P.insert(TT + 3, [1]), 10), P.in_txn(P.insert(TT + 4, [2], vc=P.VCHANNEL[:-1] + "1"), 11),
           P.rollback_txn(TT + 5, 11), P.flush(TT + 6), P.commit_txn(TT + 7, 10)]
    out = a.feed_all(msgs(seq))
    assert [(m.wal.msg_type, m.wal.time_tick) for m in out] == [(2, TT + 1), (4, TT + 6), (2, TT + 7)]
    assert out[2].to_arrow().column("pk").to_pylist() == [1]


def test_bodies_of_a_transaction_never_begun_are_ignored_and_duplicates_too():
    a = TxnAssembler()
    assert a.feed_all(msgs([P.in_txn(P.insert(TT, [1]), 12), P.commit_txn(TT + 1, 12)])) == []
    a.feed_all(msgs([P.begin_txn(TT + 2, 13), P.begin_txn(TT + 3, 13)]))
    assert len(a.open_transactions()) == 1 and a.stats["ignored_messages"] == 3


def test_25_messages_and_non_txn_messages_pass_straight_through():
    from msgstream_spark.msg import codec

    old = codec.unmarshal(P.insert_body([1], TT, segment=1), {"msg_type": "Insert"})
    a = TxnAssembler()
    assert a.feed(old) == [old]
    alter = msgs([P.alter_collection(TT)])[0]
    assert a.feed(alter) == [alter] and alter.wal.msg_type == WalMessageType.AlterCollection
