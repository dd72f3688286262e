"""The sink's core without Spark: options, validation, sharding, splitting, ids, ticks, replays."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.errors import OptionError, SchemaError
from msgstream_spark.sink.dedupe import ReplayFilter
from msgstream_spark.sink.encode import split_points
from msgstream_spark.sink.options import parse_sink_options
from msgstream_spark.sink.plan import plan_write
from msgstream_spark.sink.task import PROP_BATCH, PROP_SEQ, PROP_TASK, PROP_WRITER, TaskWriter
from tests.sink.helpers import config_file, deleted_keys, inserted_rows, read_all, read_channel

# Milvus's Hash32Int64 test vectors (wire doc §5.4) and the CRC32 vector for VarChar keys.
INT_HASHES = {0: 1669671676, 1: 1392991556, 10: 1857498428, 100: 1177227376, 1000: 679959820,
              10000: 1785225994, 100000: 258819970, 1000000: 1669527334, 10**7: 112035536,
              10**8: 107125476, 10**9: 913068403, 10**10: 1151135, 10**11: 2136277055}
STR_HASHES = {"abcdef": 1267612143}


def _writer(env, tmp_path, schema, **opts):
    base = {"config": config_file(env, tmp_path), "channels": opts.pop("channels")}
    base.update({k: str(v) for k, v in opts.items()})
    o = parse_sink_options(base)
    return o, TaskWriter(o, plan_write(schema, o))


def _vec_batch(pks, dim=4, ops=None):
    n = len(pks)
    vals = np.arange(n * dim, dtype=np.float32) / 7
    arrays = [pa.array(pks, type=pa.int64()), pa.array([f"t{p}" for p in pks]),
              pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * dim, dim, dtype=np.int32)), pa.array(vals))]
    names = ["pk", "title", "vec"]
    if ops is not None:
        arrays.insert(0, pa.array(ops, type=pa.string()))
        names.insert(0, "op")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def test_option_errors_name_the_option(local_env, tmp_path):
    cfg = config_file(local_env, tmp_path)
    with pytest.raises(OptionError, match="unknown msgstream sink option.*bogus"):
        parse_sink_options({"config": cfg, "channels": "a", "bogus": "1"})
    with pytest.raises(OptionError, match="shardsNum=3 does not match the 2 channel"):
        parse_sink_options({"config": cfg, "channels": "a,b", "shardsNum": "3"})
    with pytest.raises(OptionError, match="maxMessageSize must be an integer"):
        parse_sink_options({"config": cfg, "channels": "a", "maxMessageSize": "big"})
    with pytest.raises(OptionError, match="-partition-"):
        parse_sink_options({"config": cfg, "channels": "x-partition-1"})
    with pytest.raises(OptionError, match="lists a channel twice"):
        parse_sink_options({"config": cfg, "channels": "a,a"})


def test_vchannel_names_and_live_milvus_warning(local_env, tmp_path):
    cfg = config_file(local_env, tmp_path)
    o = parse_sink_options({"config": cfg, "channels": "own-dml_0,own-dml_1", "collectionID": "449"})
    assert o.vchannels == ("own-dml_0_449v0", "own-dml_1_449v1")
    with pytest.warns(UserWarning, match="look like a Milvus cluster's DML channels"):
        parse_sink_options({"config": cfg, "channels": "by-dev-rootcoord-dml_3"})


def test_split_points_respect_the_limit():
    sizes = np.array([10, 10, 10, 50, 5, 5, 100, 1], dtype=np.int64)
    parts = split_points(sizes, 30)
    assert parts == [(0, 3), (3, 4), (4, 6), (6, 7), (7, 8)]  # an oversized row gets its own message
    assert split_points(np.array([], dtype=np.int64), 30) == []


def test_plan_rejects_what_a_collection_cannot_hold(local_env, tmp_path):
    o = parse_sink_options({"config": config_file(local_env, tmp_path), "channels": "a"})
    with pytest.raises(SchemaError, match="'when'"):
        plan_write(pa.schema([("pk", pa.int64()), ("when", pa.struct([("x", pa.int32())]))]), o)
    with pytest.raises(SchemaError, match="primary key column 'pk' must be an integer"):
        plan_write(pa.schema([("pk", pa.float64())]), o)
    with pytest.raises(SchemaError, match="no primary key column"):
        plan_write(pa.schema([("key", pa.int64())]), o)
    with pytest.raises(SchemaError, match="column 'op' must be a string"):
        plan_write(pa.schema([("op", pa.int32()), ("pk", pa.int64())]), o)


def test_rows_shard_like_milvus_and_messages_are_well_formed(backend, tmp_path):
    local_env = backend
    chans = [local_env.new_channel("dml") for _ in range(3)]
    pks = list(INT_HASHES)
    o, w = _writer(local_env, tmp_path, _vec_batch(pks).schema, channels=",".join(chans), collectionID=77)
    w.write_batches([_vec_batch(pks)])
    with local_env.client() as c:
        got = read_all(c, chans)
    for i, ch in enumerate(chans):
        rows = inserted_rows(got[ch])
        assert sorted(r["pk"] for r in rows) == sorted(p for p in pks if INT_HASHES[p] % 3 == i)
        inserts = [r for r in got[ch] if r.type_name == "Insert"]
        for r in inserts:
            p = r.msg.proto
            assert p.shardName == f"{ch}_77v{i}" and p.collectionID == 77 and p.version == 1
            assert len(p.rowIDs) == len(p.timestamps) == p.num_rows
            assert set(p.timestamps) == {p.base.timestamp}
            assert r.raw.properties["msg_type"] == "Insert"
            assert {PROP_WRITER, PROP_BATCH, PROP_TASK, PROP_SEQ} <= set(r.raw.properties)
        # the channel ends with one time tick above every DML timestamp
        assert got[ch][-1].type_name == "TimeTick"
        tick = got[ch][-1].msg.proto.base.timestamp
        assert all(r.msg.proto.base.timestamp < tick for r in inserts)
    ids = [r.msg.proto.base.msgID for rs in got.values() for r in rs if r.type_name == "Insert"]
    assert len(ids) == len(set(ids)) and all(i > 0 for i in ids)


def test_string_keys_shard_by_crc32(local_env, tmp_path):
    chans = [local_env.new_channel("s") for _ in range(2)]
    keys = ["abcdef", "x", "yy", "zzz", "key-42"]
    batch = pa.RecordBatch.from_arrays([pa.array(keys), pa.array([1.5] * 5, type=pa.float64())], names=["id", "v"])
    o, w = _writer(local_env, tmp_path, batch.schema, channels=",".join(chans))
    w.write_batches([batch])
    import zlib

    with local_env.client() as c:
        got = read_all(c, chans)
    assert zlib.crc32(b"abcdef") == STR_HASHES["abcdef"]
    for i, ch in enumerate(chans):
        want = sorted(k for k in keys if zlib.crc32(k.encode()[:100]) % 2 == i)
        assert sorted(r["id"] for r in inserted_rows(got[ch])) == want


def test_op_runs_keep_order_and_deletes_carry_keys(local_env, tmp_path):
    ch = local_env.new_channel("ops")
    ops = ["insert", "insert", "delete", "INSERT", None, "delete"]
    pks = [1, 2, 1, 1, 3, 2]
    batch = _vec_batch(pks, ops=ops)
    o, w = _writer(local_env, tmp_path, batch.schema, channels=ch)
    w.write_batches([batch])
    with local_env.client() as c:
        reads = read_all(c, [ch])[ch]
    kinds = [r.type_name for r in reads]
    assert kinds == ["Insert", "Delete", "Insert", "Delete", "TimeTick"]
    ts = [r.msg.proto.base.timestamp for r in reads]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    assert deleted_keys(reads) == [1, 2]
    assert sorted(r["pk"] for r in inserted_rows(reads)) == [1, 1, 2, 3]


def test_bad_rows_are_rejected_before_anything_is_produced(local_env, tmp_path):
    ch = local_env.new_channel("bad")
    good = _vec_batch([1, 2, 3])
    null_pk = pa.RecordBatch.from_arrays([pa.array([4, None], type=pa.int64()), pa.array(["a", "b"]),
                                          good.column(2).slice(0, 2)], names=good.schema.names)
    o, w = _writer(local_env, tmp_path, good.schema, channels=ch)
    with pytest.raises(SchemaError, match="primary key column 'pk' is null in 1 row"):
        w.write_batches([good, null_pk])
    wrong_dim = pa.RecordBatch.from_arrays(
        [pa.array([5, 6], type=pa.int64()), pa.array(["a", "b"]),
         pa.array([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0]], type=pa.list_(pa.float32()))], names=good.schema.names)
    o, w = _writer(local_env, tmp_path, good.schema, channels=ch)
    with pytest.raises(SchemaError, match="vector column 'vec' has dimension 2 .* dimension 4"):
        w.write_batches([good, wrong_dim])
    bad_op = _vec_batch([1], ops=["remove"])
    o, w = _writer(local_env, tmp_path, bad_op.schema, channels=ch)
    with pytest.raises(SchemaError, match="column 'op' has value 'remove'"):
        w.write_batches([bad_op])
    with local_env.client() as c:
        assert c.latest_message_id(ch) is None  # nothing was produced


def test_a_task_produces_while_its_input_still_arrives(local_env, tmp_path):
    """With the default buffer, a task whose rows pass 4 MiB produces before its input ends (so the produce overlaps
    Spark's hand-over of the next batches), and every row arrives once."""
    from msgstream_spark.sink.options import DEFAULT_BUFFER_BYTES

    ch = local_env.new_channel("overlap")
    dim, per = 128, 2000  # ~0.5 KiB a row: ~1 MiB a batch
    batches = [_vec_batch(list(range(i * per, (i + 1) * per)), dim=dim) for i in range(8)]
    o, w = _writer(local_env, tmp_path, batches[0].schema, channels=ch)
    assert o.buffer_bytes == DEFAULT_BUFFER_BYTES == 4 * 1024 * 1024
    seen_before_end: list[int] = []

    def arriving():
        with local_env.client() as c:
            for i, b in enumerate(batches):
                if i == len(batches) - 1:  # before the last batch: the first ~5 MiB are in the log (bounded wait)
                    deadline = time.monotonic() + 10
                    while c.latest_message_id(ch) is None and time.monotonic() < deadline:
                        time.sleep(0.02)
                    seen_before_end.append(len(read_channel(c, ch)))
                yield b

    w.write_batches(arriving())
    assert seen_before_end[0] > 0, "nothing was produced before the task's input ended"
    with local_env.client() as c:
        reads = read_channel(c, ch)
    assert sorted(r["pk"] for r in inserted_rows(reads)) == list(range(8 * per))


def test_a_tasks_first_flush_comes_after_its_first_batch(local_env, tmp_path):
    """The first flush comes at FIRST_FLUSH_BYTES (512 KiB), the next ones at twice the last up to bufferBytes: the
    rows of a task's first ~1 MiB batch are produced before its second batch arrives (not after 4 MiB)."""
    from msgstream_spark.sink.task import FIRST_FLUSH_BYTES

    ch = local_env.new_channel("first")
    dim, per = 128, 2000  # ~1 MiB a batch
    batches = [_vec_batch(list(range(i * per, (i + 1) * per)), dim=dim) for i in range(3)]
    o, w = _writer(local_env, tmp_path, batches[0].schema, channels=ch)
    assert FIRST_FLUSH_BYTES == 512 * 1024 < o.buffer_bytes
    produced_before: list[int] = []

    def arriving():
        with local_env.client() as c:
            for i, b in enumerate(batches):
                if i == 1:  # the first batch's flush runs in the background: wait for it (bounded)
                    deadline = time.monotonic() + 5
                    while c.latest_message_id(ch) is None and time.monotonic() < deadline:
                        time.sleep(0.02)
                    produced_before.append(len(inserted_rows(read_channel(c, ch))))
                yield b

    w.write_batches(arriving())
    assert produced_before == [per], "the first batch's rows were not produced before the second batch arrived"
    assert w._flush_at == 2 * 1024 * 1024  # flushed at 512 KiB and at 1 MiB; the next one at 2 MiB
    with local_env.client() as c:
        assert sorted(r["pk"] for r in inserted_rows(read_channel(c, ch))) == list(range(3 * per))


def test_inserts_split_below_max_message_size(local_env, tmp_path):
    ch = local_env.new_channel("split")
    pks = list(range(2000))
    batch = _vec_batch(pks, dim=64)  # ~270 bytes per row
    o, w = _writer(local_env, tmp_path, batch.schema, channels=ch, maxMessageSize=65536)
    w.write_batches([batch])
    with local_env.client() as c:
        reads = read_all(c, [ch])[ch]
    inserts = [r for r in reads if r.type_name == "Insert"]
    assert len(inserts) >= 8
    assert all(len(r.raw.payload) <= 65536 for r in inserts)
    assert sorted(r["pk"] for r in inserted_rows(reads)) == pks


def test_inserts_split_at_the_configs_pulsar_max_message_size(pulsar_service, tmp_path):
    """pulsar.maxMessageSize is the sink's split size (as in Milvus): lowered, writes split instead of failing."""
    from tests.fixtures.backend_env import BackendEnv
    from tests.fixtures.pulsar_env import pulsar_config

    env = BackendEnv("pulsar", pulsar_config(*pulsar_service[:2], maxMessageSize=32768))
    ch = env.new_channel("psplit")
    pks = list(range(1500))
    batch = _vec_batch(pks, dim=64)  # ~290 bytes per row, ~430 KB in all
    o, w = _writer(env, tmp_path, batch.schema, channels=ch)
    assert o.max_message_size == 32768
    w.write_batches([batch])
    with env.client() as c:
        reads = read_all(c, [ch])[ch]
    inserts = [r for r in reads if r.type_name == "Insert"]
    assert len(inserts) >= 14 and all(len(r.raw.payload) <= 32768 for r in inserts)
    assert sorted(r["pk"] for r in inserted_rows(reads)) == pks
    # an option beats the config; one row is never split
    o, w = _writer(env, tmp_path, batch.schema, channels=ch, maxMessageSize=1024)
    assert o.max_message_size == 1024


def test_every_insert_fits_the_limit_even_where_the_estimate_is_low(local_env, tmp_path):
    """A negative Int8 takes 10 bytes on the wire (an int32 varint), not the 1 estimated: the encoder halves
    pieces whose encoded size is over the limit."""
    ch = local_env.new_channel("fit")
    n = 3000
    batch = pa.RecordBatch.from_pydict({"pk": pa.array(range(n), pa.int64()),
                                        "small": pa.array([-1 - i % 100 for i in range(n)], pa.int8()),
                                        "tiny": pa.array([-1] * n, pa.int8())})
    o, w = _writer(local_env, tmp_path, batch.schema, channels=ch, maxMessageSize=8192)
    w.write_batches([batch])
    with local_env.client() as c:
        reads = read_all(c, [ch])[ch]
    inserts = [r for r in reads if r.type_name == "Insert"]
    assert all(len(r.raw.payload) <= 8192 for r in inserts), max(len(r.raw.payload) for r in inserts)
    assert sorted(r["pk"] for r in inserted_rows(reads)) == list(range(n))


def test_retried_task_reproduces_keys_and_replay_filter_drops_them(backend, tmp_path):
    local_env = backend
    ch = local_env.new_channel("eo")
    batch = _vec_batch(list(range(50)))
    for attempt in (0, 1):  # the same task written twice, as Spark retries it
        o = parse_sink_options({"config": config_file(local_env, tmp_path), "channels": ch, "writerId": "w1",
                                "maxMessageSize": "2048"})
        TaskWriter(o, plan_write(batch.schema, o), batch_id=3, task_id=1, attempt=attempt).write_batches([batch])
    with local_env.client() as c:
        reads = read_all(c, [ch])[ch]
    inserts = [r for r in reads if r.type_name == "Insert"]
    assert len(inserts) % 2 == 0 and len(inserts) >= 4
    half = len(inserts) // 2
    assert [r.msg.proto.base.msgID for r in inserts[:half]] == [r.msg.proto.base.msgID for r in inserts[half:]]
    f = ReplayFilter()
    kept = [r for r in reads if f.keep(ch, r.raw.properties)]
    assert f.dropped == half
    assert sorted(x["pk"] for x in inserted_rows(kept)) == list(range(50))


def test_fast_float_vector_bytes_equal_the_protobuf_serialization():
    from msgstream_spark.msg.columns import arrow_to_field_data
    from msgstream_spark.msg.pb import schema_pb2
    from msgstream_spark.sink.wire import fields_data_entry, float_vector_entry

    arr = pa.array([[float(i), -0.5, 1e-3] for i in range(300)], type=pa.list_(pa.float32())).slice(7, 200)
    fs = schema_pb2.FieldSchema(name="vec", fieldID=103, data_type=schema_pb2.FloatVector)
    rows = arr.flatten().to_numpy().reshape(200, 3)
    fast = b"".join(float_vector_entry(rows, "vec", 103))
    assert fast == fields_data_entry(arrow_to_field_data(arr, fs).SerializeToString())


def test_insert_payload_is_canonical_protobuf(local_env, tmp_path):
    """The payload assembled from parts re-serializes to the same bytes (field order kept)."""
    from msgstream_spark.msg.pb import msg_pb2

    batch = _vec_batch(list(range(20)), dim=5)
    o = parse_sink_options({"config": config_file(local_env, tmp_path), "channels": "c0"})
    w = TaskWriter(o, plan_write(batch.schema, o))
    msgs = w.encoder.encode(batch)
    assert msgs
    for m in msgs:
        req = msg_pb2.InsertRequest()
        req.ParseFromString(m.payload)
        assert req.SerializeToString() == m.payload and req.num_rows == m.rows and req.version == 1
        assert [len(fd.vectors.float_vector.data) for fd in req.fields_data if fd.field_name == "vec"] == [5 * m.rows]


def test_produce_failure_names_the_channel_and_reports_nothing_unwritten(local_env, tmp_path):
    """A real produce failure: the SQLite log is locked by another writer beyond busyTimeout."""
    import sqlite3

    from msgstream_spark.errors import BackendError

    ch = local_env.new_channel("locked")
    batch = _vec_batch([1, 2, 3])
    cfg = config_file(local_env, tmp_path)
    o = parse_sink_options({"config": cfg, "channels": ch, "local.busyTimeout": "0.2"})
    TaskWriter(o, plan_write(batch.schema, o)).write_batches([batch])  # the channel exists now
    with local_env.client() as c:
        before = len(read_all(c, [ch])[ch])
    opened = TaskWriter(o, plan_write(batch.schema, o))
    opened._producer(ch)  # the producer is open before the lock is taken: the send itself fails
    lock = sqlite3.connect(local_env.config.get("local.path"), timeout=5, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        for w in (TaskWriter(o, plan_write(batch.schema, o)), opened):
            with pytest.raises(BackendError, match=ch):
                w.write_batches([_vec_batch([4, 5, 6])])
            assert w.result.rows == 0  # nothing is reported as written
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    with local_env.client() as c:
        assert len(read_all(c, [ch])[ch]) == before


def test_a_committed_streaming_batch_is_recognised_for_a_stable_writer_id(local_env, tmp_path):
    from msgstream_spark.sink.task import committed_key

    batch = _vec_batch([1])
    cfg = config_file(local_env, tmp_path)
    stable = parse_sink_options({"config": cfg, "channels": "c", "writerId": "sync-1"})
    random_id = parse_sink_options({"config": cfg, "channels": "c"})
    with local_env.client() as c:
        c.put_metadata(committed_key("sync-1"), "5")
    plan = plan_write(batch.schema, stable)
    assert TaskWriter(stable, plan, batch_id=5).already_committed()
    assert not TaskWriter(stable, plan, batch_id=6).already_committed()
    assert not TaskWriter(random_id, plan, batch_id=0).already_committed()
