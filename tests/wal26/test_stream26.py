"""MsgStream / TtMsgStream over Milvus 2.6 channels: the upgrade boundary, transactions, and resuming
from 2.6 positions, WAL checkpoints and message ids (start AT the id, skip ``_tt`` <= the time tick)."""

from __future__ import annotations

import pytest

from msgstream_spark.errors import ConfigError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, TimeTickMsg
from msgstream_spark.msg.wal26 import WalCheckpoint, WalMessageId, WALName
from msgstream_spark.stream import MsgStream, TtMsgStream
from msgstream_spark.stream.walstart import parse_start, resume_position
from tests.wal26 import producer as P

TT = P.tt_of(1_767_225_600_000)
COLL = P.COLLECTION


def _lc(mid) -> str:
    """A broker id as the WAL id string Milvus writes (b36 offset/id; base64 MessageIdData on Pulsar)."""
    return P.b36(mid.value) if hasattr(mid, "value") else P.b64(mid.serialize())


def write_wal(client, ch, items):
    """Write like a streamingnode: ``_lc`` = the oldest open transaction's Begin, else the previous message.

    ``items``: Built messages (2.6) or (payload, props, ts) tuples (2.5). Returns the broker ids.
    """
    prod = client.create_producer(ch)
    ids, open_begins, prev = [], {}, None
    try:
        for it in items:
            if isinstance(it, P.Built):
                props = dict(it.properties)
                txn = it.extra.get("txn")
                anchor = min(open_begins.values(), key=lambda m: m.sort_key()) if open_begins else prev
                if "_lcs" not in props:
                    props["_lc"] = _lc(anchor) if anchor is not None else "0"
                pm = ProducerMessage(it.payload, props, it.tt)
            else:
                txn, pm = None, ProducerMessage(*it)
            mid = prod.send_batch([pm])[0]
            if txn is not None:
                kind, txn_id = txn
                if kind == "begin":
                    open_begins[txn_id] = mid
                elif kind == "end":
                    open_begins.pop(txn_id, None)
            ids.append(mid)
            prev = mid
    finally:
        prod.close()
    return ids


def _txn(items, txn_id):
    """Mark an upsert_txn's messages for write_wal's _lc bookkeeping."""
    items[0].extra["txn"] = ("begin", txn_id)
    for b in items[1:-1]:
        b.extra["txn"] = ("body", txn_id)
    if len(items) == 4:
        items[-1].extra["txn"] = ("end", txn_id)
    return items


def scenario(vc):
    """2.5 messages, then 2.6: a committed upsert, a rolled-back one, and a transaction that stays open over a
    TimeTick and commits after another insert."""
    old = (P.insert_body([1], TT - 30, shard=vc, segment=9), {"msg_type": "Insert"}, TT - 30)
    from msgstream_spark.msg import codec

    tick_payload, tick_props = codec.marshal(TimeTickMsg.build(TT - 20))
    open_txn = _txn(P.upsert_txn(TT + 20, 33, [5]), 33)
    begin, body_del, body_ins, commit = open_txn
    for b in (begin, body_del, body_ins, commit):
        b.properties["_vc"] = vc
    return [old, (tick_payload, tick_props, TT - 20),  # 0, 1
            P.timetick(TT, lcs=True), P.insert(TT + 1, [2], vc=vc),  # 2, 3
            *_vc(_txn(P.upsert_txn(TT + 2, 31, [2]), 31), vc),  # 4-7 committed at TT + 5
            *_vc(_txn(P.upsert_txn(TT + 10, 32, [3], end="rollback"), 32), vc),  # 8-11
            P.timetick(TT + 15),  # 12
            begin, body_del, P.timetick(TT + 22), body_ins,  # 13-16: a tick inside the open txn
            P.insert(TT + 24, [6], vc=vc), commit, P.timetick(TT + 30)]  # 17-19 (commit at TT + 23)


def _vc(items, vc):
    for b in items:
        b.properties["_vc"] = vc
    return items


def _rows(packs):
    out = []
    for pack in packs:
        for m in pack.msgs:
            if isinstance(m, (InsertMsg, DeleteMsg)):
                pks = list(m.proto.primary_keys.int_id.data) if isinstance(m, DeleteMsg) else \
                    [int(v) for v in m.proto.fields_data[0].scalars.long_data.data]
                out.append((type(m).__name__[0], pks, m.timestamps.tolist()[0]))
    return out


def _drain(stream, until=None, limit=50):
    """Packs until one reaches the ``until`` tick (the channel's last), or none comes for a while."""
    packs = []
    for _ in range(limit):  # bounded
        pack = stream.consume(timeout=5.0 if until is not None else 1.0)
        if pack is None:
            break
        packs.append(pack)
        if until is not None and pack.end_ts >= until:
            break
    return packs


END = TT + 30  # the last TimeTick of the scenario


ALL = [("I", [1], TT - 30), ("I", [2], TT + 1), ("D", [2], TT + 5), ("I", [2], TT + 5),
       ("D", [5], TT + 23), ("I", [5], TT + 23), ("I", [6], TT + 24)]


@pytest.fixture
def wal_channel(backend):
    client = backend.client()
    ch = backend.new_channel(P.PCHANNEL)
    vc = f"{ch}_{COLL}v0"
    try:
        ids = write_wal(client, ch, scenario(vc))
    finally:
        client.close()
    return backend, ch, vc, ids


def test_tt_stream_reads_the_upgrade_boundary_and_transactions(wal_channel):
    backend, ch, vc, ids = wal_channel
    with TtMsgStream(backend.client()) as s:
        s.as_consumer([ch], "tt26", "earliest")
        packs = _drain(s, END)
        assert s.decoder(ch).txn.outcome(32) == "rolled_back"
    assert _rows(packs) == ALL
    assert [p.end_ts for p in packs] == [TT - 20, TT, TT + 15, TT + 22, TT + 30]
    row = packs[1].msgs[0] if packs[1].msgs else None
    assert row is None  # the first WAL tick's pack holds nothing
    ins = packs[2].msgs[0]
    assert ins.position.channel_name == vc and ins.position.timestamp == TT + 1
    assert ins.position.msg_id == ids[2].serialize()  # _lc = the message before it (the _lcs tick)


def test_resume_from_a_pack_end_inside_an_open_transaction(wal_channel):
    backend, ch, vc, ids = wal_channel
    with TtMsgStream(backend.client()) as s:
        s.as_consumer([ch], "tt26a", "earliest")
        first = [s.consume(1.0) for _ in range(4)]  # up to the tick at TT + 22, inside txn 33
        assert first[-1].end_ts == TT + 22 and s.decoder(ch).has_open
        saved = first[-1].end_positions
    assert saved[0].msg_id == ids[13].serialize()  # at or before the open transaction's Begin
    with TtMsgStream(backend.client()) as s:
        s.as_consumer([ch], "tt26b", "unknown")
        s.seek(saved)
        rest = _drain(s, END)
    assert _rows(first) + _rows(rest) == ALL


def test_start_after_a_begin_rereads_from_last_confirmed(wal_channel):
    """A start between a Begin and its Commit (a broker id, not a Milvus position) re-reads from the
    body's _lc, so the transaction comes out whole and nothing comes twice."""
    backend, ch, vc, ids = wal_channel
    with TtMsgStream(backend.client()) as s:
        s.as_consumer([ch], "tt26c", "unknown")
        s.seek([MsgPosition(ch, ids[14].serialize(), "", TT + 20)])  # after Begin(13), at the first body
        packs = _drain(s, END)
        assert s.decoder(ch).stats["rewinds"] == 1
    assert _rows(packs) == ALL[4:]


def test_resume_from_a_row_position_checkpoint_and_message_id(wal_channel):
    backend, ch, vc, ids = wal_channel
    with TtMsgStream(backend.client()) as s:
        s.as_consumer([ch], "tt26d", "earliest")
        packs = _drain(s, END)
    row_pos = next(m.position for p in packs for m in p.msgs if isinstance(m, InsertMsg) and m.timestamp == TT + 1)
    wal = {"local": WALName.RocksMQ, "kafka": WALName.Kafka, "pulsar": WALName.Pulsar}[backend.name]
    cp = WalCheckpoint(WalMessageId(wal, _lc(ids[12])), TT + 15)
    starts = {"row": (row_pos, ALL[2:]), "checkpoint": (resume_position(ch, cp, backend=backend.name), ALL[4:]),
              "message id": (parse_start(ch, f'{{"id": "{_lc(ids[3])}", "wal_name": "{wal.name}"}}', "message_id",
                                         backend=backend.name), ALL[1:])}
    for name, (pos, want) in starts.items():
        with TtMsgStream(backend.client()) as s:
            s.as_consumer([ch], f"tt26-{name.replace(' ', '')}", "unknown")
            s.seek([pos])
            assert _rows(_drain(s, END)) == want, name


def test_plain_msgstream_releases_transactions_at_commit(wal_channel):
    backend, ch, vc, ids = wal_channel
    with MsgStream(backend.client()) as s:
        s.as_consumer([ch], "plain26", "earliest")
        packs = _drain(s, END, limit=100)
    assert _rows(packs) == ALL[:4] + [ALL[6], *ALL[4:6]]  # broker order: no sorting in the plain stream
    row_pos = next(m.position for p in packs for m in p.msgs if isinstance(m, InsertMsg) and m.timestamp == TT + 1)
    with MsgStream(backend.client()) as s:  # a 2.6 position: AT its msgID (_lc), skip _tt <= its timestamp
        s.as_consumer([ch], "plain26b", "unknown")
        s.seek([row_pos])
        assert _rows(_drain(s, END, limit=100)) == ALL[2:4] + [ALL[6], *ALL[4:6]]
    assert sum(isinstance(m, TimeTickMsg) for p in packs for m in p.msgs) == 5


def test_resume_checks(local_env):
    cp = WalCheckpoint(WalMessageId(WALName.Kafka, "rs"), 5)
    pos = resume_position("ch", cp, backend="kafka")
    assert pos == MsgPosition("ch", (1000).to_bytes(8, "little"), "", 5, int(WALName.Kafka))
    with pytest.raises(ConfigError, match="Kafka WAL id, but the backend is pulsar"):
        resume_position("ch", cp, backend="pulsar")
    with pytest.raises(ConfigError, match="channel ch: not a checkpoint"):
        parse_start("ch", "!!", "checkpoint")
    assert MsgPosition.from_json_dict(pos.to_json_dict()) == pos  # WAL_name survives the JSON form
