"""2.6 messages through real storage (the embedded SQLite log): an upgrade boundary, transactions,
DDL, empty bodies and flag properties survive and decode; positions come from ``_lc``."""

from __future__ import annotations

from msgstream_spark.errors import DecodeError
from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition
from msgstream_spark.msg.types import CreateCollectionMsg, DeleteMsg, InsertMsg, TimeTickMsg
from msgstream_spark.msg.wal26 import WalMessageId, WalMsg, WALName, decode_message, wal_position
from msgstream_spark.stream.txn import TxnAssembler
from tests.wal26 import producer as P

TT = P.tt_of(1_767_225_600_000)


def _read_all(client, channel, n):
    cons = client.subscribe(channel, "wal26-check", SubscriptionInitialPosition.EARLIEST)
    try:
        got = []
        for _ in range(50):  # bounded: 50 x 0.2 s at most
            got.extend(cons.receive_batch(n - len(got), 0.2))
            if len(got) >= n:
                break
        return got
    finally:
        cons.close()


def test_upgrade_boundary_and_wal_messages_through_the_embedded_log(local_env):
    client = local_env.client()
    ch = local_env.new_channel("by-dev-rootcoord-dml_0")
    try:
        prod = client.create_producer(ch)
        old_ins = P.insert_body([1, 2], TT - 50, shard=P.VCHANNEL, segment=9)
        old_ids = prod.send_batch([ProducerMessage(old_ins, {"msg_type": "Insert"}, TT - 50)])
        lc = P.b36(old_ids[0].value)  # every 2.6 message says: resume at the first one to see me again
        wal = [P.create_collection(TT, lc=lc), P.timetick(TT + 1, lcs=True), P.insert(TT + 2, [3], lc=lc),
               *[P.Built(b.payload, {**b.properties, "_lc": lc}, b.tt) for b in P.upsert_txn(TT + 3, 21, [3])],
               *P.upsert_txn(TT + 10, 22, [4], end="rollback"), P.flush(TT + 20, lc=lc),
               P.create_segment(TT + 21), P.alter_collection(TT + 22, lc=lc), P.encrypted_insert(TT + 23, [5]),
               P.timetick(TT + 24, lc=lc)]
        ids = old_ids + P.write(prod, wal)
        prod.close()
        got = _read_all(client, ch, len(ids))
    finally:
        client.close()
    assert [m.id for m in got] == ids
    assert [(m.payload, dict(m.properties)) for m in got[1:]] == [(b.payload, b.properties) for b in wal]
    assert got[1 + 1].properties["_lcs"] == "" and got[1 + 11].payload == b""  # flags and empty bodies survive

    assembler, out, errors = TxnAssembler(), [], []
    for m in got:
        try:
            msg = decode_message(m.payload, m.properties, channel=m.channel, msg_id=m.id.serialize())
        except DecodeError as exc:
            errors.append(exc)
            continue
        if msg.wal is not None:
            msg.position = wal_position(msg.wal, WALName.RocksMQ, WalMessageId(WALName.RocksMQ, P.b36(m.id.value)))
        out.extend(assembler.feed(msg))
    assert len(errors) == 1 and "encrypted Insert" in str(errors[0]) and errors[0].msg_id == ids[-2].serialize()
    kinds = [(type(m).__name__, m.wal.type_name if m.wal else "2.5") for m in out]
    assert kinds == [("InsertMsg", "2.5"), ("CreateCollectionMsg", "CreateCollection"), ("TimeTickMsg", "TimeTick"),
                     ("InsertMsg", "Insert"), ("DeleteMsg", "Delete"), ("InsertMsg", "Insert"), ("WalMsg", "Flush"),
                     ("WalMsg", "CreateSegment"), ("WalMsg", "AlterCollection"), ("TimeTickMsg", "TimeTick")]
    old, cc, tick, ins, upsert_del, upsert_ins = out[:6]
    assert isinstance(old, InsertMsg) and old.timestamps.tolist() == [TT - 50] * 2 and old.position is None
    assert isinstance(cc, CreateCollectionMsg) and [f.name for f in cc.schema.fields] == ["pk", "vec"]
    assert isinstance(tick, TimeTickMsg) and tick.position.msg_id == ids[2].serialize()  # _lcs: its own id
    assert ins.timestamps.tolist() == [TT + 2] and ins.segment_id == P.SEGMENT and ins.shard_name == P.VCHANNEL
    assert ins.position.msg_id == ids[0].serialize() and ins.position.channel_name == P.VCHANNEL
    assert ins.position.timestamp == TT + 2 and ins.position.wal_name == WALName.RocksMQ
    assert isinstance(upsert_del, DeleteMsg) and upsert_del.timestamps.tolist() == [TT + 6]  # the commit's _tt
    assert upsert_ins.timestamps.tolist() == [TT + 6] and upsert_ins.position.timestamp == TT + 6
    assert isinstance(out[8], WalMsg) and [f.name for f in out[8].schema.fields][-1] == "note"
    assert assembler.outcome(21) == "committed" and assembler.outcome(22) == "rolled_back"


def test_every_kind_survives_every_backend(backend):
    """Each backend keeps payloads (zero-byte bodies too) and properties (flags have the value "") as written."""
    client = backend.client()
    ch = backend.new_channel("by-dev-rootcoord-dml_0")
    wal = P.every_kind(TT, lc="0")
    try:
        prod = client.create_producer(ch)
        ids = P.write(prod, wal)
        prod.close()
        got = _read_all(client, ch, len(ids))
    finally:
        client.close()
    assert [(m.payload, dict(m.properties)) for m in got] == [(b.payload, b.properties) for b in wal]
    assert any(m.payload == b"" for m in got) and any(m.properties.get("_lcs") == "" for m in got)
    assembler, out = TxnAssembler(), []
    for m in got:
        if "_ch" not in m.properties:
            out.extend(assembler.feed(decode_message(m.payload, m.properties)))
    rows = [(m.wal.type_name, m.timestamps.tolist()) for m in out if isinstance(m, (InsertMsg, DeleteMsg))]
    assert rows == [("Insert", [TT + 4] * 2), ("Delete", [TT + 5]), ("Delete", [TT + 9]), ("Insert", [TT + 9])]
