"""The source's read tasks and planning on Milvus 2.6 WAL messages, without a Spark session.

The data comes from the independent test producer (tests/wal26/producer.py) through the
embedded log (a real SQLite file); the Spark end-to-end versions on every backend are in
test_wal26_spark.py.
"""

from __future__ import annotations

import base64
import json

import pytest

from msgstream_spark.errors import DecodeError, OptionError, SchemaError
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.wal26 import WalCheckpoint, WalMessageId, WALName
from msgstream_spark.source.offsets import entry, normalize, resolve_start
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.scan import Scanner
from msgstream_spark.source.walpos import parse_wal_start, wal_start_position
from msgstream_spark.spark.structs import infer
from tests.spark import wal26_data as D
from tests.spark.helpers import spark_options
from tests.wal26 import producer as P


def _key(rows):
    return [tuple(r[c] for c in D.ROW_COLUMNS) for r in rows]


def test_rows_from_a_26_topic_equal_the_same_data_written_as_25(local_env):
    mixed, old = local_env.new_channel("mixed"), local_env.new_channel("old")
    D.write_mixed(local_env, mixed)
    D.write_as_25(local_env, old)
    got, want = D.read_direct(local_env, mixed), D.read_direct(local_env, old)
    assert [(r["op"], r["pk"], r["_ts"]) for r in got] == D.expected_rows()
    assert _key(got) == _key(want)  # same columns, same values; _ts = _tt, _shard = _vc
    assert {r["_shard"] for r in got} == {D.VC}
    # a 2.6 row's _position is Milvus's: the _lc id in legacy bytes, the vchannel, the row's _tt
    pos = MsgPosition.from_base64(got[2]["_position"])
    first_id = got[0]["_msg_id"]
    assert (pos.channel_name, pos.msg_id, pos.timestamp, pos.wal_name) == (D.VC, first_id, D.TT + 4, WALName.RocksMQ)


def test_encrypted_message_fails_naming_channel_and_position_or_is_skipped(local_env):
    ch = local_env.new_channel("enc")
    ids = D.write_mixed(local_env, ch, encrypted=True)
    with pytest.raises(DecodeError) as err:
        D.read_direct(local_env, ch)
    enc_id = ids[-3].serialize()
    assert "encrypted Insert" in str(err.value) and err.value.channel == ch and err.value.msg_id == enc_id
    assert "onDecodeError=skip" in str(err.value)
    rows = D.read_direct(local_env, ch, onDecodeError="skip")
    assert [(r["op"], r["pk"], r["_ts"]) for r in rows] == D.expected_rows()  # no garbage rows


def test_messages_output_shows_every_message_with_the_26_columns(local_env):
    ch = local_env.new_channel("msgs")
    ids = D.write_mixed(local_env, ch)
    rows = D.read_direct(local_env, ch, output="messages")
    assert [r["msg_id"] for r in rows] == [i.serialize() for i in ids]  # v2, DDL, txn control: all visible
    old, cc_control, cc = rows[0], rows[2], rows[3]
    assert old["version"] is None and old["vchannel"] is None and old["msg_type"] == "Insert"
    assert (cc_control["version"], cc_control["vchannel"], cc_control["broadcast_id"]) == (1, P.CONTROL_VCHANNEL, 77)
    assert cc["msg_type"] == "CreateCollection" and cc["timestamp"] == D.TT + 1 and cc["collection_id"] == P.COLLECTION
    by_type = {}
    for r in rows:
        by_type.setdefault(r["msg_type"], []).append(r)
    assert [r["txn_id"] for r in by_type["BeginTxn"]] == [501, 502, 503]
    assert by_type["Flush"][0]["version"] == 2 and by_type["Flush"][0]["payload"] == b""
    assert by_type["46"][0]["payload"] == b"\x08\x01"  # a type newer than the 2.6 branch passes through
    ins = by_type["Insert"][1]
    assert (ins["shard"], ins["timestamp"], ins["num_rows"]) == (D.VC, D.TT + 4, 2)
    ticks = D.read_direct(local_env, ch, output="messages", messageTypes="timetick")
    assert all(r["msg_type"] == "TimeTick" and r["vchannel"] is None for r in ticks[1:])


def _scan(env, ch, **kw):
    client = env.client()
    scan = Scanner(client, "rows", True)
    start = normalize({ch: entry(b"", 0)})
    scan.refresh(start)
    kw.setdefault("align", None)
    end, rows = scan.plan_end(start, **kw)
    scan.close()
    client.close()
    return end[ch], rows


def test_a_micro_batch_never_ends_inside_an_open_transaction(local_env):
    ch = local_env.new_channel("cut")
    with local_env.client() as c, c.create_producer(ch) as prod:
        ids = P.write(prod, [P.insert(D.TT, [1]), P.timetick(D.TT + 1), *P.upsert_txn(D.TT + 2, 7, [1], end="open"),
                             P.timetick(D.TT + 5)])
        end, rows = _scan(local_env, ch)
        assert end["msgID"] == base64.b64encode(ids[1].serialize()).decode() and rows == 1  # before the Begin
        more = P.write(prod, [P.commit_txn(D.TT + 6, 7), P.insert(D.TT + 7, [2]), P.timetick(D.TT + 8),
                              P.insert(D.TT + 9, [3]), P.timetick(D.TT + 10)])
    end, rows = _scan(local_env, ch)
    assert end["msgID"] == base64.b64encode(more[-1].serialize()).decode() and rows == 5
    end, rows = _scan(local_env, ch, max_rows=2)  # the first tick (1 row) fits; the next lies inside the txn
    assert end["msgID"] == base64.b64encode(ids[1].serialize()).decode() and rows == 1
    # per-message cuts: 2 rows end after the transaction's delete, so maxRowsPerTrigger yields up to its commit
    end, rows = _scan(local_env, ch, max_rows=2, align=False)
    assert end["msgID"] == base64.b64encode(more[0].serialize()).decode() and rows == 3


def test_split_pieces_give_a_transaction_exactly_once(local_env):
    ch = local_env.new_channel("split")
    with local_env.client() as c, c.create_producer(ch) as prod:
        first = P.write(prod, [P.insert(D.TT + i, [i]) for i in range(5)])
        P.write(prod, [*P.upsert_txn(D.TT + 10, 8, [100]), P.timetick(D.TT + 20)])
        P.write(prod, [P.insert(D.TT + 30 + i, [200 + i]) for i in range(4)])
    # after the first message (as a micro-batch starts), 13 messages asked in 4 pieces: a 2.6 piece ends
    # only with a TimeTick for every vchannel (message 10), so the cuts inside the transaction (messages
    # 5-8) move there (tests/source/test_split.py has transactions straddling cuts)
    rows = D.read_direct(local_env, ch, after=first[0], minPartitions="4")
    assert [(r["op"], r["pk"]) for r in rows] == [("insert", i) for i in range(1, 5)] + [
        ("delete", 100), ("insert", 100)] + [("insert", 200 + i) for i in range(4)]


def _checkpoint(wal_id: str, tt: int) -> str:
    return base64.b64encode(P.wal_checkpoint(wal_id, WALName.RocksMQ, tt)).decode()


def test_start_from_a_wal_checkpoint_or_a_message_id(local_env):
    ch = local_env.new_channel("resume")
    ids = D.write_mixed(local_env, ch)
    own = D.wal_id(local_env, ids[5])  # the first insert of the 2.6 part (TT + 4)
    rows = D.read_direct(local_env, ch, startingPositions=json.dumps({ch: _checkpoint(own, D.TT + 4)}))
    assert [(r["op"], r["pk"]) for r in rows] == [(op, pk) for op, pk, _ in D.expected_rows()[4:]]
    mid_json = json.dumps({ch: {"id": own, "wal_name": "RocksMQ"}})
    assert [r["pk"] for r in D.read_direct(local_env, ch, startingPositions=mid_json)][:2] == [3, 4]
    b64_mid = base64.b64encode(P.message_id(own, WALName.RocksMQ)).decode()
    assert isinstance(parse_wal_start(b64_mid), WalMessageId)
    assert isinstance(parse_wal_start(_checkpoint(own, 5)), WalCheckpoint)
    assert parse_wal_start(MsgPosition(ch, ids[0].serialize(), "", 3).to_base64()) is None  # a MsgPosition
    with pytest.raises(OptionError, match=f"channel {ch}: the start position is a Kafka WAL id, but the backend"):
        wal_start_position(ch, {"id": "rs", "wal_name": "Kafka"}, "local")
    with local_env.client() as c:
        start = resolve_start(c, [ch], json.dumps({ch: _checkpoint(own, D.TT + 4)}), None, True)
    assert start[ch] == entry(ids[5].serialize(), D.TT + 4, inclusive=True)


def test_schema_inference_and_alter_collection(local_env):
    ch = local_env.new_channel("alter")
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [*P.broadcast(P.create_collection, D.TT, 5, [P.CONTROL_VCHANNEL, D.VC]), P.insert(D.TT + 2, [1]),
                       P.alter_collection(D.TT + 3, "note"), P.insert(D.TT + 4, [2]), P.timetick(D.TT + 5)])
    opts = parse_read_options({**spark_options(local_env), "channels": ch}, streaming=False)
    struct, pk, cid = infer(opts, [ch])
    assert cid == P.COLLECTION and pk == "pk" and "note" in struct.fieldNames()  # a new query: the altered schema
    with pytest.raises(SchemaError) as err:
        D.read_direct(local_env, ch)  # the query's schema (pk, vec) lacks the added field
    assert f"collection c26 (id {P.COLLECTION})" in str(err.value) and "adds field(s) note" in str(err.value)
    assert f"channel {ch}" in str(err.value) and "onSchemaChange=ignore" in str(err.value)
    rows = D.read_direct(local_env, ch, onSchemaChange="ignore")
    assert [r["pk"] for r in rows] == [1, 2] and "note" not in rows[0]
    with pytest.raises(OptionError, match="onschemachange must be one of fail, ignore"):
        parse_read_options({**spark_options(local_env), "channels": ch, "onSchemaChange": "drop"}, streaming=False)


def test_early_26_broadcast_copies_count_once_by_barrier(local_env):
    """Copies with _btt and no _bh (early 2.6.x): a later copy must not undo an AlterCollection."""
    a, b = local_env.new_channel("btt"), local_env.new_channel("btt")
    with local_env.client() as c:
        with c.create_producer(a) as prod:
            P.write(prod, [P.create_collection(D.TT, _btt=P.b36(D.TT)), P.alter_collection(D.TT + 3, "note")])
        with c.create_producer(b) as prod:
            P.write(prod, [P.create_collection(D.TT + 1, vc=f"{b}_{P.COLLECTION}v1", _btt=P.b36(D.TT))])
    opts = parse_read_options({**spark_options(local_env), "channels": f"{a},{b}"}, streaming=False)
    struct, _, _ = infer(opts, [a, b])
    assert "note" in struct.fieldNames()



def test_a_bounded_read_leaves_an_open_transaction_for_the_next_read_from_a_position(local_env):
    ch = local_env.new_channel("bounded")
    vc = f"{ch}_{P.COLLECTION}v0"  # a real vchannel of this pchannel, so its positions map back to it
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.insert(D.TT, [1], vc=vc, lcs=True), P.timetick(D.TT + 1)])
        lc = P.b36(c.latest_message_id(ch).offset - 1)  # the insert: what every later message confirms
        P.write(prod, [P.begin_txn(D.TT + 2, 9, vc=vc, lc=lc), P.in_txn(P.delete(D.TT + 3, [1], vc=vc, lc=lc), 9)])
        first = D.read_direct(local_env, ch)
        assert [(r["op"], r["pk"]) for r in first] == [("insert", 1)]  # the open transaction is left out
        P.write(prod, [P.in_txn(P.insert(D.TT + 4, [1], vc=vc, lc=lc), 9), P.commit_txn(D.TT + 5, 9, vc=vc, lc=lc),
                       P.timetick(D.TT + 6)])
    resumed = D.read_direct(local_env, ch, startingPositions=first[-1]["_position"])
    assert [(r["op"], r["pk"], r["_ts"]) for r in resumed] == [("delete", 1, D.TT + 5), ("insert", 1, D.TT + 5)]
