"""2.6 WAL test data for the Spark source, and the same data as 2.5 messages, on any backend.

Built with the independent test producer (``tests.wal26.producer``). ``write_mixed`` writes a
2.5 -> 2.6 upgrade boundary with every kind of 2.6 message; ``write_as_25`` writes the rows a
Milvus consumer applies from it, as plain 2.5 messages, so a reader must give equal rows.
"""

from __future__ import annotations

import json

from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg.pb import msg_pb2
from msgstream_spark.source.offsets import entry, resolve_end, resolve_start
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.spark.partitions import plan_partitions, read_partition
from msgstream_spark.spark.structs import collection_fields, messages_struct, rows_struct
from msgstream_spark.stream.decode import own_wal_id, wal_name
from tests.spark.helpers import spark_options
from tests.wal26 import producer as P

TT = P.tt_of(1_767_225_600_000)  # 2026-01-01
VC = P.VCHANNEL
ROW_COLUMNS = ("op", "pk", "vec", "_shard", "_collection", "_partition", "_ts")


def old_insert(pks, ts) -> ProducerMessage:
    return ProducerMessage(P.insert_body(pks, ts, shard=VC, segment=P.SEGMENT), {"msg_type": "Insert"}, ts)


def old_delete(pks, ts) -> ProducerMessage:
    req = msg_pb2.DeleteRequest()
    req.ParseFromString(P.delete_body(pks, ts))
    req.shardName = VC
    return ProducerMessage(req.SerializeToString(), {"msg_type": "Delete"}, ts)


def old_tick(ts) -> ProducerMessage:
    return ProducerMessage(P.timetick(ts).payload, {"msg_type": "TimeTick"}, ts)


def send(prod, msgs) -> list:
    return [prod.send_batch([m])[0] for m in msgs]


def wal_id(env, mid) -> str:
    return own_wal_id(wal_name(env.name), mid).id


def write_mixed(env, ch: str, *, encrypted: bool = False) -> list:
    """2.5 insert + tick, then 2.6: broadcast CreateCollection, inserts/deletes, a committed and a
    rolled-back upsert, an expired transaction, version-2 bodies, a newer type, ticks. Returns ids."""
    with env.client() as c, c.create_producer(ch) as prod:
        ids = send(prod, [old_insert([1, 2], TT - 50), old_tick(TT - 40)])
        lc = wal_id(env, ids[0])
        wal = [*P.broadcast(P.create_collection, TT, 77, [P.CONTROL_VCHANNEL, VC], lc=lc), P.timetick(TT + 2, lc=lc),
               P.create_segment(TT + 3, lc=lc), P.insert(TT + 4, [3, 4], lc=lc), P.delete(TT + 5, [1], lc=lc),
               *P.upsert_txn(TT + 6, 501, [2]), *P.upsert_txn(TT + 10, 502, [3], end="rollback"),
               P.flush(TT + 14, lc=lc), P.manual_flush(TT + 15), P.v2(46, TT + 16, body=b"\x08\x01"),
               P.v2("CreateIndex", TT + 17), P.partition_msg(TT + 18), P.timetick(TT + 19, lc=lc),
               *P.upsert_txn(TT + 20, 503, [5], end="open", keepalive_ms=1),  # expires at the next tick
               P.timetick(TT + 20 + (5 << 18), lc=lc)]
        if encrypted:
            wal.append(P.encrypted_insert(TT + (6 << 18), [9]))
        wal += [P.insert(TT + (7 << 18), [6], lc=lc), P.timetick(TT + (8 << 18), lc=lc)]
        return ids + P.write(prod, wal)


def expected_rows() -> list[tuple]:
    """(op, pk, _ts) a Milvus consumer applies from ``write_mixed`` (2.5 rows keep their own ts)."""
    return [("insert", 1, TT - 50), ("insert", 2, TT - 50), ("insert", 3, TT + 4), ("insert", 4, TT + 4),
            ("delete", 1, TT + 5), ("delete", 2, TT + 9), ("insert", 2, TT + 9), ("insert", 6, TT + (7 << 18))]


def write_as_25(env, ch: str) -> None:
    """The rows of ``write_mixed`` as 2.5 messages (shard, segment and times as Milvus applies them)."""
    msgs = []
    for op, pk, ts in expected_rows():
        if msgs and op == "insert" and msgs[-1][0] == "insert" and msgs[-1][2] == ts:
            msgs[-1][1].append(pk)
        else:
            msgs.append((op, [pk], ts))
    with env.client() as c, c.create_producer(ch) as prod:
        send(prod, [old_insert(p, t) if op == "insert" else old_delete(p, t) for op, p, t in msgs])


def rows_schema_json() -> tuple[str, str]:
    fields, pk = collection_fields(P.collection_schema())
    return json.dumps(rows_struct(fields).jsonValue()), pk


def read_direct(env, ch: str, *, after=None, **options) -> list[dict]:
    """A bounded read of ``ch`` through the source's planning and read tasks, without Spark
    (``after``: start after this message id, as a micro-batch does, instead of startingPositions)."""
    opts = parse_read_options({**spark_options(env), "channels": ch, **options}, streaming=False)
    if opts.output == "messages":
        sj, pk = json.dumps(messages_struct().jsonValue()), None
    else:
        sj, pk = rows_schema_json()
    client = opts.client()
    try:
        start = resolve_start(client, [ch], opts.starting, opts.starting_ts, True)
        if after is not None:
            start = {ch: entry(after.serialize(), 0)}
        end = resolve_end(client, [ch], opts.ending, opts.ending_ts)
        parts = plan_partitions(client, start, end, opts, sj, pk)
    finally:
        client.close()
    return [r for p in parts for b in read_partition(p) for r in b.to_pylist()]
