"""A real Milvus 2.3.5 writes the stream; what Milvus acknowledged and what ``query`` returns are the truth.

One collection with every type Milvus 2.3.5 has (all scalars, JSON, arrays of Int64 and VarChar,
a float vector, a dynamic field, a partition key over 3 partitions) on 2 shards gets inserts,
deletes and upserts through pymilvus; a second one (2.3.5 allows one vector field per collection)
has a binary vector, a VarChar key and named partitions. No float16 vectors (2.4+), no nullable
fields (2.4+) in 2.3.5. The batch source, a restarted AvailableNow stream,
``msgstream tail``/``inspect``, schema inference, replay from Milvus's etcd channel checkpoints and
starting/ending timestamps at Milvus's own MutationResult timestamps are compared with it.
"""

from __future__ import annotations

import base64
import json
import urllib.request

import pytest

from tests.milvus_real.stack import pchannels
from tests.milvus_real.workload import Workload, create_all_types, expected_row, load_for_query, normalize
from tests.spark.helpers import spark_options

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

FIELDS = ["pk", "b", "i8", "i16", "i32", "f", "d", "s", "j", "arr_i", "arr_s", "cat", "fv", "$meta"]


@pytest.fixture(scope="module")
def coll(milvus_stack, pymilvus_orm):
    """The all-types collection after inserts, deletes and an upsert; loaded for query."""
    w = Workload("all_types", create_all_types(pymilvus_orm, "all_types"))
    w.insert(range(0, 200))
    w.insert(range(200, 400))
    w.delete(list(range(0, 10)) + list(range(200, 205)))
    w.upsert(range(10, 30), gen=1)
    w.insert(range(400, 500))
    load_for_query(w.collection)  # flushed: the replay below starts at the checkpoints the flush moved
    return w


def source(spark, stack, name, **opts):
    r = (spark.read.format("msgstream").options(**spark_options(stack.env)).options(**stack.channel_options(name))
         .option("collection", name))
    return r.options(**{k: str(v) for k, v in opts.items()}).load()


def milvus_rows(col) -> dict[int, dict]:
    got = col.query("pk >= 0", output_fields=["*"], consistency_level="Strong", limit=16384)
    out = {}
    for r in got:  # query flattens the dynamic field's keys into the row: put them back under $meta
        d = {k: r.get(k) for k in FIELDS if k != "$meta"}
        d["$meta"] = {k: v for k, v in r.items() if k not in FIELDS}
        out[int(r["pk"])] = normalize(d)
    return out


def as_dict(r) -> dict:
    d = r.asDict(recursive=True)
    return normalize({k: d.get(k) for k in FIELDS})


def apply(rows) -> dict[int, dict]:
    """The collection's state after the stream's rows, in timestamp order (a delete at the same
    timestamp as an insert does not remove it: Milvus's rule; upserts rely on it)."""
    state: dict[int, dict] = {}
    for r in sorted(rows, key=lambda r: (r._ts, r.op != "delete")):
        if r.op == "delete":
            state.pop(r.pk, None)
        else:
            state[r.pk] = as_dict(r)
    return state


def test_batch_read_equals_what_milvus_acked_and_returns(spark, milvus_stack, coll):
    df = source(spark, milvus_stack, coll.name)
    rows = df.collect()
    inserts = [r for r in rows if r.op == "insert"]
    deletes = [r for r in rows if r.op == "delete"]
    for a in coll.acked:  # every acknowledged insert/upsert row, at its MutationResult timestamp
        if a.kind == "delete":
            continue
        got = {r.pk: r for r in inserts if r._ts == a.ts}
        assert sorted(got) == sorted(a.pks), a.kind
        for pk in a.pks:
            assert as_dict(got[pk]) == expected_row(pk, a.gen)
    assert len(inserts) == sum(len(a.pks) for a in coll.acked if a.kind != "delete")
    plain = [a for a in coll.acked if a.kind == "delete"]
    upserts = [a for a in coll.acked if a.kind == "upsert"]
    assert sorted(r.pk for r in deletes) == sorted(p for a in plain + upserts for p in a.pks)
    # an upsert is an insert plus a delete of the same keys at the same timestamp
    assert {r._ts for r in deletes if r.pk in upserts[0].pks} == {upserts[0].ts}
    # shards: the collection's two vchannels, named after their pchannel
    shards = {(r._channel, r._shard) for r in rows}
    assert len({s for _, s in shards}) == 2
    assert all(s.startswith(f"{c}_{r0._collection}v") for c, s in shards for r0 in rows[:1])
    assert len({r._partition for r in inserts}) == 3  # the partition key's three partitions
    assert apply(rows) == milvus_rows(coll.collection)


def test_schema_is_inferred_from_the_real_create_collection(spark, milvus_stack, coll):
    df = source(spark, milvus_stack, coll.name)
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert {k: types[k] for k in FIELDS} == {
        "pk": "bigint", "b": "boolean", "i8": "tinyint", "i16": "smallint", "i32": "int", "f": "float",
        "d": "double", "s": "string", "j": "string", "arr_i": "array<bigint>", "arr_s": "array<string>",
        "cat": "bigint", "fv": "array<float>", "$meta": "string"}
    explicit = source(spark, milvus_stack, coll.name, schema="pk bigint, arr_i array<bigint>, arr_s array<string>")
    got = {r.pk: (r.arr_i, r.arr_s) for r in explicit.where("op = 'insert'").collect()}
    assert got[401] == ([401], ["x401", "x401"]) and got[402] == ([402, 403], [])


def test_timestamps_at_milvus_mutation_results(spark, milvus_stack, coll):
    rows = [(r.op, r.pk, r._ts) for r in source(spark, milvus_stack, coll.name).select("op", "pk", "_ts").collect()]
    for a in coll.acked:
        if not a.ts:  # Milvus 2.3.5 acknowledges a delete with timestamp 0
            continue
        end = sorted((op, pk, ts) for op, pk, ts in
                     (tuple(r) for r in source(spark, milvus_stack, coll.name, endingTimestamp=a.ts)
                      .select("op", "pk", "_ts").collect()))
        assert end == sorted(r for r in rows if r[2] <= a.ts), f"endingTimestamp={a.ts} ({a.kind})"
        start = sorted(tuple(r) for r in source(spark, milvus_stack, coll.name, startingTimestamp=a.ts)
                       .select("op", "pk", "_ts").collect())
        assert start == sorted(r for r in rows if r[2] >= a.ts), f"startingTimestamp={a.ts} ({a.kind})"


def _etcd_range(stack, prefix: str) -> dict[str, bytes]:
    """Keys under ``prefix`` from the embedded etcd (its v3 JSON gateway on the client port)."""
    key = prefix.encode()
    body = json.dumps({"key": base64.b64encode(key).decode(),
                       "range_end": base64.b64encode(key[:-1] + bytes([key[-1] + 1])).decode()}).encode()
    req = urllib.request.Request(f"http://{stack.server.etcd}/v3/kv/range", data=body)
    with urllib.request.urlopen(req, timeout=10) as resp:
        kvs = json.loads(resp.read()).get("kvs", [])
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]) for kv in kvs}


def test_replay_from_milvus_etcd_channel_checkpoints(spark, milvus_stack, coll):
    from msgstream_spark.msg.position import MsgPosition
    from msgstream_spark.stream.names import to_physical_channel

    cid = source(spark, milvus_stack, coll.name).first()._collection
    cps = {k.rsplit("/", 1)[1]: v for k, v in
           _etcd_range(milvus_stack, "by-dev/meta/datacoord-meta/channel-cp/").items() if f"_{cid}v" in k}
    assert len(cps) == 2
    coll.insert(range(500, 520))  # after the flush: what a replay from the checkpoint must bring back
    spec = ",".join(base64.b64encode(v).decode() for v in cps.values())  # etcd's bytes, as they are
    positions = [MsgPosition.from_base64(base64.b64encode(v).decode()) for v in cps.values()]
    chans = sorted({to_physical_channel(p.channel_name) for p in positions})
    full = source(spark, milvus_stack, coll.name).where(f"_channel in ('{chans[0]}', '{chans[-1]}')")
    cp_ts = {to_physical_channel(p.channel_name): p.timestamp for p in positions}
    want = sorted((r.op, r.pk) for r in full.collect() if r._ts > cp_ts[r._channel])
    replay = (spark.read.format("msgstream").options(**spark_options(milvus_stack.env))
              .option("channels", ",".join(chans)).option("collection", coll.name)
              .option("startingPositions", spec).load())
    got = sorted((r.op, r.pk) for r in replay.collect())
    assert got == want
    assert {("insert", pk) for pk in range(500, 520)} <= set(got)


@pytest.fixture(scope="module")
def bin_coll(milvus_stack, pymilvus_orm):
    """Binary vectors, a VarChar key, partitions p1 and p2 besides _default; a delete in p1."""
    from pymilvus import Collection

    from tests.milvus_real.workload import bin_row, bin_schema

    col = Collection("bin_parts", bin_schema(), using=pymilvus_orm, shards_num=2)
    for p in ("p1", "p2"):
        col.create_partition(p)
    parts = {"_default": range(0, 10), "p1": range(10, 30), "p2": range(30, 35)}
    for p, keys in parts.items():
        col.insert([bin_row(i) for i in keys], partition_name=p)
    col.delete('key in ["k10", "k11"]', partition_name="p1")
    load_for_query(col, "bv", flushed=False)  # for query
    return col, parts


def test_binary_vectors_varchar_keys_and_partitions(spark, milvus_stack, bin_coll):
    from tests.milvus_real.workload import bin_row

    col, parts = bin_coll
    df = source(spark, milvus_stack, "bin_parts")
    assert {f.name: f.dataType.simpleString() for f in df.schema.fields}["bv"] == "binary"
    rows = df.collect()
    inserts = {r.key: r for r in rows if r.op == "insert"}
    want_bv = {f"k{i}": bin_row(i)["bv"] for ks in parts.values() for i in ks}
    assert {k: bytes(r.bv) for k, r in inserts.items()} == want_bv
    by_part: dict[int, set] = {}
    for r in inserts.values():
        by_part.setdefault(r._partition, set()).add(r.key)
    want = {frozenset(f"k{i}" for i in ks) for ks in parts.values()}
    assert {frozenset(v) for v in by_part.values()} == want  # one partition id per named partition
    assert sorted(r.key for r in rows if r.op == "delete") == ["k10", "k11"]
    for p, keys in parts.items():
        got = {r["key"] for r in col.query("key != ''", output_fields=["key"], partition_names=[p],
                                           consistency_level="Strong")}
        part_id = inserts[f"k{keys[-1]}"]._partition
        stream = {r.key for r in rows if r.op == "insert" and r._partition == part_id}
        assert got == stream - {"k10", "k11"}


def await_ticks(stack, ts: int, chans: list[str], timeout: float = 30.0) -> None:
    """Wait (bounded) until each channel holds a message at or after ``ts`` (Milvus ticks the channels of live
    collections every 200 ms): then a stream aligned to ticks can take everything acknowledged up to ``ts``. One
    reader a channel, from its last message on, takes the messages as they come until one is that late (a
    channel's messages are in time order: it was the channel's last message when it came)."""
    import time

    from msgstream_spark.stream.timeseek import message_time

    deadline = time.monotonic() + timeout
    with stack.env.client() as c:
        for ch in chans:
            r = c.reader(ch)
            try:
                r.seek(c.latest_message_id(ch), inclusive=True)
                while True:
                    left = deadline - time.monotonic()
                    assert left > 0, f"no time tick >= {ts} on {ch} within {timeout}s"
                    got = r.receive_batch(1, min(left, 5.0))
                    if got and (message_time(got[0].payload, got[0].properties) or 0) >= ts:
                        break
            finally:
                r.unsubscribe()


def stream_once(spark, stack, name, checkpoint, out):
    df = (spark.readStream.format("msgstream").options(**spark_options(stack.env))
          .options(**stack.channel_options(name)).option("collection", name).option("subscription", f"it-{name}")
          .load())
    q = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(180) is not False
    assert q.exception() is None


def test_streaming_available_now_restarted_in_the_middle(spark, milvus_stack, pymilvus_orm, tmp_path):
    from collections import Counter

    w = Workload("streamed", create_all_types(pymilvus_orm, "streamed"))
    w.insert(range(0, 100))
    await_ticks(milvus_stack, w.acked[-1].ts, pchannels(pymilvus_orm, "streamed"))
    stream_once(spark, milvus_stack, "streamed", tmp_path / "chk", tmp_path / "out")
    first = spark.read.parquet(str(tmp_path / "out")).count()
    assert first == 100
    w.delete(range(0, 5))
    w.upsert(range(5, 10), gen=1)
    w.insert(range(100, 150))
    await_ticks(milvus_stack, w.acked[-1].ts, pchannels(pymilvus_orm, "streamed"))
    stream_once(spark, milvus_stack, "streamed", tmp_path / "chk", tmp_path / "out")
    out = spark.read.parquet(str(tmp_path / "out")).collect()
    keys = Counter((r.op, r.pk, r._ts) for r in out)
    assert max(keys.values()) == 1  # nothing twice across the restart
    batch = source(spark, milvus_stack, "streamed").select("op", "pk", "_ts").collect()
    assert sorted(keys) == sorted(tuple(r) for r in batch)
    load_for_query(w.collection, flushed=False)  # for query
    assert apply(out) == milvus_rows(w.collection)


def test_tail_and_inspect_equal_what_milvus_acked(milvus_stack, coll, tmp_path, capsys):
    from msgstream_spark.cli.main import main
    from tests.sink.helpers import config_file

    cfg = config_file(milvus_stack.env, tmp_path)
    chans = milvus_stack.dml_channels(coll.name)
    capsys.readouterr()
    assert main(["tail", "--config", cfg, "-c", ",".join(chans), "--rows", "--no-ticks", "--timeout", "2"]) == 0
    msgs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    mine = [m for m in msgs if m.get("collection_name") == coll.name]
    last = next(a for a in coll.acked if a.kind == "insert" and a.pks[0] == 400)
    rows = {r["pk"]: r for m in mine if m["msg_type"] == "Insert" for r in m["rows"] if r["pk"] in last.pks}
    assert {pk: normalize(r) for pk, r in rows.items()} == {pk: expected_row(pk, 0) for pk in last.pks}
    deleted = sorted(r["pk"] for m in mine if m["msg_type"] == "Delete" for r in m["rows"])
    assert deleted == sorted(p for a in coll.acked if a.kind in ("delete", "upsert") for p in a.pks)
    # inspect: one raw Insert payload of batch 400.. decodes to the same rows
    one = next(m for m in mine if m["msg_type"] == "Insert" and m["rows"][0]["pk"] in last.pks)
    with milvus_stack.env.client() as c:
        r = c.reader(one["channel"])
        try:
            r.seek(c.bytes_to_message_id(base64.b64decode(one["msgID"])), inclusive=True)
            payload = r.receive_batch(1, 10.0)[0].payload
        finally:
            r.unsubscribe()
    (tmp_path / "insert.bin").write_bytes(payload)
    assert main(["inspect", "--file", str(tmp_path / "insert.bin"), "--rows"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["rows"] == one["rows"] and shown["timestamp"] == last.ts


def test_collection_dropped_and_recreated_while_streaming(spark, milvus_stack, pymilvus_orm, tmp_path):
    """Documented behaviour: option collection=<name> follows the name. A streaming query (here
    run as AvailableNow batches on one checkpoint) goes on across DropCollection and a new
    CreateCollection of that name: the new collection's rows arrive with its new ``_collection``
    id, the old collection's rows stay as they were read, nothing is read twice."""
    w1 = Workload("phoenix", create_all_types(pymilvus_orm, "phoenix"))
    w1.insert(range(0, 20))
    await_ticks(milvus_stack, w1.acked[-1].ts, pchannels(pymilvus_orm, "phoenix"))
    stream_once(spark, milvus_stack, "phoenix", tmp_path / "chk", tmp_path / "out")
    first = spark.read.parquet(str(tmp_path / "out")).select("op", "pk", "_collection").collect()
    old_id = {r._collection for r in first}
    assert sorted(r.pk for r in first) == list(range(20)) and len(old_id) == 1
    w1.collection.drop()
    w2 = Workload("phoenix", create_all_types(pymilvus_orm, "phoenix"))
    w2.insert(range(100, 130))
    await_ticks(milvus_stack, w2.acked[-1].ts, pchannels(pymilvus_orm, "phoenix"))
    stream_once(spark, milvus_stack, "phoenix", tmp_path / "chk", tmp_path / "out")
    rows = spark.read.parquet(str(tmp_path / "out")).select("op", "pk", "_collection").collect()
    assert len(rows) == 50
    new = [r for r in rows if r._collection not in old_id]
    assert sorted(r.pk for r in new) == list(range(100, 130)) and len({r._collection for r in new}) == 1
    assert sorted(r.pk for r in rows if r._collection in old_id) == list(range(20))
