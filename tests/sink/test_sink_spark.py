"""The Spark sink end to end: every data type, deletes, sharding, validation, exactly-once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from msgstream_spark.sink.dedupe import ReplayFilter
from tests.fixtures.login_env import login_env
from tests.sink import failpoint
from tests.sink.helpers import config_file, deleted_keys, inserted_rows, read_all, two_part_parquet

pytestmark = pytest.mark.slow


def _types_df(spark):
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        BooleanType,
        ByteType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StringType,
        StructField,
        StructType,
    )

    schema = StructType([
        StructField("op", StringType()), StructField("pk", LongType(), False),
        StructField("b", BooleanType()), StructField("i8", ByteType()), StructField("i16", ShortType()),
        StructField("i32", IntegerType()), StructField("i64", LongType()), StructField("f", FloatType()),
        StructField("d", DoubleType()), StructField("s", StringType()), StructField("meta", StringType()),
        StructField("tags", ArrayType(IntegerType())), StructField("vec", ArrayType(FloatType())),
        StructField("h16", ArrayType(FloatType())), StructField("bf16", ArrayType(FloatType())),
        StructField("bin", BinaryType()), StructField("sparse", MapType(LongType(), FloatType())),
    ])
    rows = []
    for k in range(12):
        rows.append(("insert", k, k % 2 == 0, k - 6, 300 * k, 70000 * k, 2**40 + k, k / 4, k / 3,
                     f"text-{k}", json.dumps({"k": k}), [k, k + 1], [float(k), 0.5, -1.0, 2.0],
                     [0.5 * k, 1.25, -2.0, 0.0], [1.0 * k, -0.5, 4.0, 8.0], bytes([k, 255 - k]),
                     {k: 0.5, 1000 + k: 1.5}))
    rows.append(("delete", 3, None, None, None, None, None, None, None, None, None, None, None, None, None, None,
                 None))
    return spark.createDataFrame(rows, schema)


FIELD_TYPES = "meta:JSON,tags:Array,h16:Float16Vector,bf16:BFloat16Vector"


def test_round_trip_every_type_with_deletes_and_milvus_sharding(spark, backend, tmp_path):
    local_env = backend
    chans = [local_env.new_channel("rt") for _ in range(2)]
    df = _types_df(spark)
    (df.repartition(2).write.format("msgstream").option("config", config_file(local_env, tmp_path))
     .option("channels", ",".join(chans)).option("collection", "types").option("collectionID", "449")
     .option("fieldTypes", FIELD_TYPES).mode("append").save())
    with local_env.client() as c:
        got = read_all(c, chans)
    from msgstream_spark.msg.hashing import hash_int64

    want = {r["pk"]: r for r in (row.asDict() for row in df.collect()) if r["op"] == "insert"}
    seen = {}
    for i, ch in enumerate(chans):
        for row in inserted_rows(got[ch]):
            assert hash_int64(row["pk"]) % 2 == i
            seen[row["pk"]] = row
        for r in got[ch]:
            if r.type_name in ("Insert", "Delete"):
                assert r.msg.proto.shardName == f"{ch}_449v{i}"
        assert got[ch][-1].type_name == "TimeTick"
    assert set(seen) == set(want)
    for k, exp in want.items():
        row = seen[k]
        for col in ("b", "i8", "i16", "i32", "i64", "s", "tags", "vec", "h16", "bf16", "bin"):
            assert row[col] == exp[col], (k, col, row[col], exp[col])
        assert row["f"] == pytest.approx(exp["f"]) and row["d"] == exp["d"]
        assert json.loads(row["meta"]) == json.loads(exp["meta"])
        assert dict(row["sparse"]) == exp["sparse"]
    deletes = [k for ch in chans for k in deleted_keys(got[ch])]
    assert deletes == [3]
    assert 3 in deleted_keys(got[chans[hash_int64(3) % 2]])


def test_round_trip_through_the_msgstream_reader(spark, local_env, tmp_path):
    from chispa import assert_df_equality

    chans = [local_env.new_channel("rr") for _ in range(2)]
    cfg = config_file(local_env, tmp_path)
    df = _types_df(spark)
    (df.write.format("msgstream").option("config", cfg).option("channels", ",".join(chans))
     .option("fieldTypes", FIELD_TYPES).mode("append").save())
    back = (spark.read.format("msgstream").option("config", cfg).option("channels", ",".join(chans)).load())
    cols = [c for c in df.columns if c not in ("op", "sparse")]  # maps cannot be sorted by chispa
    ins = back.where("op = 'insert'").select(*cols)
    exp = df.where("op = 'insert'").select(*cols)
    exp = spark.createDataFrame(exp.rdd, ins.schema)  # the reader's columns are all nullable
    assert_df_equality(ins, exp, ignore_row_order=True)
    got_sparse = {r["pk"]: r["sparse"] for r in back.where("op = 'insert'").select("pk", "sparse").collect()}
    assert got_sparse == {r["pk"]: r["sparse"] for r in df.where("op = 'insert'").select("pk", "sparse").collect()}
    assert set(back.columns) >= {"_channel", "_ts", "_position"}
    # what the reader returns can be written back: its metadata columns are ignored by the sink
    chans2 = [local_env.new_channel("rr2") for _ in range(2)]
    (back.write.format("msgstream").option("config", cfg).option("channels", ",".join(chans2))
     .option("fieldTypes", FIELD_TYPES).mode("append").save())
    again = spark.read.format("msgstream").option("config", cfg).option("channels", ",".join(chans2)).load()
    assert again.where("op = 'insert'").count() == 12 and again.where("op = 'delete'").count() == 1
    dels = [r["pk"] for r in back.where("op = 'delete'").select("pk").collect()]
    assert dels == [3]


def test_string_keys_shard_by_crc32(spark, local_env, tmp_path):
    chans = [local_env.new_channel("str") for _ in range(3)]
    keys = [f"user-{i}" for i in range(40)]
    df = spark.createDataFrame([(k, float(i)) for i, k in enumerate(keys)], "id string, score double")
    (df.write.format("msgstream").option("config", config_file(local_env, tmp_path))
     .option("channels", ",".join(chans)).mode("append").save())
    with local_env.client() as c:
        got = read_all(c, chans)
    for i, ch in enumerate(chans):
        assert sorted(r["id"] for r in inserted_rows(got[ch])) == sorted(
            k for k in keys if zlib.crc32(k.encode()[:100]) % 3 == i)


def test_bad_schema_fails_before_any_task_and_names_the_column(spark, local_env, tmp_path):
    ch = local_env.new_channel("bad")
    df = spark.createDataFrame([(1, {"a": "b"})], "pk long, attrs map<string,string>")
    with pytest.raises(Exception, match="attrs"):
        (df.write.format("msgstream").option("config", config_file(local_env, tmp_path))
         .option("channels", ch).mode("append").save())
    with local_env.client() as c:
        assert c.latest_message_id(ch) is None


def test_null_primary_key_and_wrong_dimension_fail_the_write_with_the_column(spark, local_env, tmp_path):
    ch = local_env.new_channel("badrows")
    cfg = config_file(local_env, tmp_path)
    nulls = spark.createDataFrame([(1, [1.0, 2.0]), (None, [3.0, 4.0])], "pk long, vec array<float>")
    with pytest.raises(Exception, match="primary key column 'pk' is null"):
        nulls.coalesce(1).write.format("msgstream").option("config", cfg).option("channels", ch).mode(
            "append").save()
    dims = spark.createDataFrame([(1, [1.0, 2.0]), (2, [3.0])], "pk long, vec array<float>")
    with pytest.raises(Exception, match="vector column 'vec' has dimension 1"):
        dims.coalesce(1).write.format("msgstream").option("config", cfg).option("channels", ch).mode(
            "append").save()
    with local_env.client() as c:
        assert c.latest_message_id(ch) is None


def test_overwrite_mode_is_rejected(spark, local_env, tmp_path):
    df = spark.createDataFrame([(1,)], "pk long")
    with pytest.raises(Exception, match="only appends"):
        (df.write.format("msgstream").option("config", config_file(local_env, tmp_path))
         .option("channels", local_env.new_channel()).mode("overwrite").save())


def test_streaming_exactly_once_after_a_killed_task(spark, local_env, tmp_path):
    """Kill the Python worker after it produced and before the batch commits; rerun the query.

    The replayed batch is written again (the channel holds duplicates) and reading with the
    replay filter / dedupe yields every row exactly once.
    """

    chans = [local_env.new_channel("eo") for _ in range(2)]
    src = two_part_parquet(tmp_path)
    cfg = config_file(local_env, tmp_path)
    marker = tmp_path / "killed.marker"
    chk = tmp_path / "chk"
    root = Path(__file__).resolve().parents[2]
    # The failpoint lives in tests: a process of its own whose Spark workers load it (sitecustomize).
    env = {**login_env(), "PYTHONPATH": os.pathsep.join([str(root / "tests" / "sink" / "site"), str(root)]),
           failpoint.ENV: str(marker), "PYSPARK_PYTHON": sys.executable}
    run = subprocess.run([sys.executable, "-m", "tests.sink.killed_sink", cfg, ",".join(chans), str(src), str(chk)],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 3, run.stdout + run.stderr[-2000:]  # the killed worker failed the query
    assert marker.exists()
    q = (spark.readStream.schema("pk long, v double").parquet(str(src)).writeStream.format("msgstream")
         .option("config", cfg).option("channels", ",".join(chans)).option("writerId", "eo-test")
         .option("checkpointLocation", str(chk)).trigger(availableNow=True).start())
    assert q.awaitTermination(300)
    assert q.exception() is None
    with local_env.client() as c:
        got = read_all(c, chans)
    raw = [r["pk"] for ch in chans for r in inserted_rows(got[ch])]
    assert len(raw) > 200  # the batch was produced twice
    f = ReplayFilter()
    kept = {ch: [r for r in got[ch] if f.keep(ch, r.raw.properties)] for ch in chans}
    assert sorted(r["pk"] for ch in chans for r in inserted_rows(kept[ch])) == list(range(200))
