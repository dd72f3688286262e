"""ChannelDecoder: the one per-pchannel decoder, fed real broker messages (embedded log; every backend
where cheap) written by the independent test producer."""

from __future__ import annotations

import pytest

from msgstream_spark.errors import ConfigError, DecodeError
from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, MsgType, TimeTickMsg
from msgstream_spark.msg.wal26 import WalMessageType, WalMsg, WALName
from msgstream_spark.stream.decode import ChannelDecoder, wal_name
from tests.wal26 import producer as P

TT = P.tt_of(1_767_225_600_000)
W = WalMessageType


def _write_read(env, items):
    """Write Built (2.6) or (payload, props, ts) (2.5) items one per batch; read them back as broker messages."""
    client = env.client()
    ch = env.new_channel(P.PCHANNEL)
    try:
        prod = client.create_producer(ch)
        for it in items:
            pm = ProducerMessage(it.payload, it.properties, it.tt) if isinstance(it, P.Built) else ProducerMessage(*it)
            prod.send_batch([pm])
        prod.close()
        cons = client.subscribe(ch, "decoder-test", SubscriptionInitialPosition.EARLIEST)
        got = []
        for _ in range(50):  # bounded: 50 x 0.2 s at most
            got.extend(cons.receive_batch(len(items) - len(got), 0.2))
            if len(got) >= len(items):
                break
        cons.close()
    finally:
        client.close()
    assert len(got) == len(items)
    return ch, got


def _classic_insert(pks, ts):
    return (P.insert_body(pks, ts, shard=P.VCHANNEL, segment=9), {"msg_type": "Insert"}, ts)


def _classic_tick(ts):
    from msgstream_spark.msg import codec

    payload, props = codec.marshal(TimeTickMsg.build(ts))
    return (payload, props, ts)


def _feed(dec, got):
    out, errors = [], []
    for m in got:
        try:
            out.extend(dec.feed(m))
        except DecodeError as exc:
            errors.append(exc)
    return out, errors


def test_upgrade_boundary_rebuilt_dml_and_positions(local_env):
    items = [_classic_insert([1, 2], TT - 50), _classic_tick(TT - 40),
             P.create_collection(TT, lc="0"), P.timetick(TT + 1, lcs=True), P.insert(TT + 2, [3], lc="2"),
             P.delete(TT + 3, [1], lc="2"), P.timetick(TT + 4, lc="2")]
    ch, got = _write_read(local_env, items)
    out, errors = _feed(ChannelDecoder(ch, "local"), got)
    assert not errors
    assert [(d.version, type(d.msg).__name__) for d in out] == [
        (0, "InsertMsg"), (0, "TimeTickMsg"), (1, "CreateCollectionMsg"), (1, "TimeTickMsg"), (1, "InsertMsg"),
        (1, "DeleteMsg"), (1, "TimeTickMsg")]
    old, old_tick, cc, tick, ins, dele, _ = out
    # 2.5: body values, broker position
    assert old.time_tick == TT - 50 and old.vchannel == P.VCHANNEL and old.row_bearing
    assert old.position.msg_id == got[0].id.serialize() and old.position.channel_name == ch
    assert old_tick.vchannel is None and old_tick.time_tick == TT - 40 and not old_tick.row_bearing
    # 2.6: _tt, _vc, _lc; payload timestamps (_tt - skew) are not used
    assert ins.time_tick == TT + 2 and ins.msg.timestamps.tolist() == [TT + 2] and ins.vchannel == P.VCHANNEL
    assert ins.msg.segment_id == P.SEGMENT and ins.row_bearing and ins.raw is got[4]
    assert ins.position.msg_id == (2).to_bytes(8, "little") and ins.position.channel_name == P.VCHANNEL  # _lc=2
    assert ins.position.timestamp == TT + 2 and ins.position.wal_name == WALName.RocksMQ
    assert dele.msg.timestamps.tolist() == [TT + 3] and dele.row_bearing
    assert tick.vchannel is None and tick.position.msg_id == got[3].id.serialize()  # _lcs: its own id
    assert tick.position.channel_name == ch  # no _vc: the pchannel
    assert not cc.row_bearing and cc.txn_id is None


def test_transactions_commit_rollback_expire_and_has_open(local_env):
    ka = 1000  # keepalive ms
    items = [*P.upsert_txn(TT, 21, [7], keepalive_ms=ka),  # 0-3 committed
             *P.upsert_txn(TT + 10, 22, [8], end="rollback"),  # 4-7
             *P.upsert_txn(TT + 20, 23, [9], end="open", keepalive_ms=ka),  # 8-10 expires
             P.insert(TT + 30, [10]),  # 11: outside any txn, passes while 23 is open
             P.timetick(TT + 22 + (ka << 18))]  # 12: expires 23 (last body tt + keepalive)
    ch, got = _write_read(local_env, items)
    dec = ChannelDecoder(ch, "local")
    seen = []
    for i, m in enumerate(got):
        released = dec.feed(m)
        seen.append((i, dec.has_open, [type(d.msg).__name__ for d in released]))
        if i == 9:
            assert dec.oldest_open == got[8].id and dec.oldest_open_raw is got[8]
    assert seen[1] == (1, True, []) and seen[2] == (2, True, [])
    assert seen[3] == (3, False, ["DeleteMsg", "InsertMsg"])
    assert seen[7] == (7, False, [])  # rolled back: nothing
    assert seen[11] == (11, True, ["InsertMsg"]) and seen[12] == (12, False, ["TimeTickMsg"])
    assert dec.txn.outcome(21) == "committed" and dec.txn.outcome(22) == "rolled_back"
    assert dec.txn.outcome(23) == "expired" and dec.oldest_open is None
    # committed bodies: the commit's _tt, their own broker message, the txn id
    dec2 = ChannelDecoder(ch, "local")
    out = dec2.feed_all(got[:4])
    assert [d.time_tick for d in out] == [TT + 3, TT + 3] and [d.raw for d in out] == got[1:3]
    assert all(d.txn_id == 21 and d.row_bearing for d in out)
    assert out[0].msg.timestamps.tolist() == [TT + 3] and out[1].msg.timestamps.tolist() == [TT + 3]
    assert not dec2._raws  # nothing held once no transaction is open


def test_emit_control_shows_begin_and_commit(local_env):
    ch, got = _write_read(local_env, P.upsert_txn(TT, 5, [1]))
    out = ChannelDecoder(ch, "local", emit_control=True).feed_all(got)
    assert [d.wal_type for d in out] == [W.BeginTxn, W.Delete, W.Insert, W.CommitTxn]
    assert [d.raw for d in out] == got and [d.row_bearing for d in out] == [False, True, True, False]


def test_version2_bodies_control_vchannel_and_unknown_types_pass_through(local_env):
    items = [*P.broadcast(P.create_collection, TT, 77, [P.CONTROL_VCHANNEL, P.VCHANNEL], lc="0"),
             P.create_segment(TT + 3), P.flush(TT + 4), P.manual_flush(TT + 5), P.alter_collection(TT + 6),
             P.v2("CreateIndex", TT + 7), P.v2(46, TT + 8, body=b"\x08\x01"),
             P.Built(P.insert_body([1], TT), P.props(2, TT + 9, vc=P.CONTROL_VCHANNEL,
                                                      header=P.insert_header(P.COLLECTION, [(P.PARTITION, 1, 0, 5)]),
                                                      _zz="new key"), TT + 9)]
    ch, got = _write_read(local_env, items)
    out = ChannelDecoder(ch, "local").feed_all(got)
    assert len(out) == len(items) and not any(d.row_bearing for d in out)
    assert [d.broadcast_id for d in out[:2]] == [77, 77] and out[0].vchannel == P.CONTROL_VCHANNEL
    assert all(isinstance(d.msg, WalMsg) for d in out[2:8]) and out[7].wal_type == 46
    assert [d.version for d in out[2:8]] == [2] * 6
    assert isinstance(out[8].msg, InsertMsg) and out[8].msg.wal.extra == {"_zz": "new key"}


def test_encrypted_and_corrupt_messages_raise_and_the_decoder_goes_on(local_env):
    bad = P.insert(TT + 1, [2])
    bad.payload = b"\xff\xff\xff"
    items = [P.insert(TT, [1]), P.encrypted_insert(TT + 1, [2]), bad, P.insert(TT + 2, [3])]
    ch, got = _write_read(local_env, items)
    dec = ChannelDecoder(ch, "local")
    out, errors = _feed(dec, got)
    assert [d.msg.timestamps.tolist() for d in out] == [[TT], [TT + 2]]
    assert len(errors) == 2 and "encrypted Insert" in str(errors[0])
    assert [e.channel for e in errors] == [ch, ch]
    assert [e.msg_id for e in errors] == [m.id.serialize() for m in got[1:3]]


def test_tick_violation_duplicates_and_start_ts(local_env):
    items = [_classic_insert([1], TT - 9), _classic_tick(TT - 5), _classic_insert([2], TT - 1),
             P.insert(TT + 1, [3]), P.timetick(TT + 5), P.insert(TT + 4, [4]),  # violation: 4 < 5
             P.insert(TT + 6, [5]), *P.upsert_txn(TT + 7, 9, [6]), P.timetick(TT + 20)]
    ch, got = _write_read(local_env, items)
    dec = ChannelDecoder(ch, "local")
    out = dec.feed_all([*got[:4], got[3], *got[4:]])  # got[3] twice: a redelivery
    assert [d.time_tick for d in out if d.row_bearing] == [TT - 9, TT - 1, TT + 1, TT + 6, TT + 10, TT + 10]
    assert dec.stats["tt_violations"] == 1 and dec.stats["duplicates"] == 1 and dec.last_tick == TT + 20
    # resume: skip what is at or before start_ts (a 2.5 seek, then _tt; a txn by its commit's _tt)
    for start, want in ((TT - 9, [TT - 1, TT + 1, TT + 6, TT + 10, TT + 10]), (TT + 6, [TT + 10, TT + 10]),
                        (TT + 10, [])):
        dec = ChannelDecoder(ch, "local", start_ts=start)
        assert [d.time_tick for d in dec.feed_all(got) if d.row_bearing] == want
    dec = ChannelDecoder(ch, "local", start_ts=TT + 2)
    ticks = [d.time_tick for d in dec.feed_all(got) if d.is_tick]
    assert ticks == [TT + 5, TT + 20] and not dec.seeking  # Milvus's TimeTickGT filter keeps later ticks


def test_wal_names():
    assert wal_name("local") == WALName.RocksMQ and wal_name("kafka") == WALName.Kafka
    assert wal_name("Pulsar") == WALName.Pulsar and wal_name(WALName.Kafka) == WALName.Kafka
    with pytest.raises(ConfigError, match="unknown WAL 'woodpeckerx'"):
        wal_name("woodpeckerx")


def test_every_kind_on_every_backend(backend):
    """Positions are the backend's legacy id bytes; rows come out once, re-timed; nothing else fails."""
    ch, got = _write_read(backend, P.every_kind(TT))
    dec = ChannelDecoder(ch, backend.name)
    out, errors = _feed(dec, got)
    assert len(errors) == 1 and "encrypted" in str(errors[0]) and errors[0].channel == ch
    rows = [(type(d.msg).__name__, d.time_tick) for d in out if d.row_bearing]
    assert rows == [("InsertMsg", TT + 4), ("DeleteMsg", TT + 5), ("DeleteMsg", TT + 9), ("InsertMsg", TT + 9)]
    tick = next(d for d in out if d.is_tick)  # the first TimeTick carries _lcs: its own broker id
    assert tick.position.msg_id == tick.raw.id.serialize()
    assert isinstance(out[0].msg, type(out[1].msg)) and out[0].msg.msg_type == MsgType.CreateCollection
    assert not isinstance(out[-1].msg, DeleteMsg)
