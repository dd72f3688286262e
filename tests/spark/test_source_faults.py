"""Source robustness on the embedded log: retried first batch, data types, bad input. (A streaming driver
SIGKILLed mid-stream and restarted from its checkpoint, each row exactly once, is
tests/chaos/test_driver_kills.py's, on this log, in make test: docs/testing.md, "Moves".)"""

from __future__ import annotations

import json

import pytest

from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg import codec
from msgstream_spark.msg.columns import arrow_to_field_data
from msgstream_spark.msg.types import InsertMsg, TimeTickMsg
from tests.fixtures.waits import finish
from tests.msg.test_columns import COLUMNS, N, _field_schema
from tests.spark.helpers import Publisher, spark_options

pytestmark = pytest.mark.slow  # Spark end to end


@pytest.fixture
def env(local_env):
    return local_env


@pytest.fixture
def pub(env):
    client = env.client()
    p = Publisher(client, [env.new_channel("dml"), env.new_channel("dml")])
    yield p
    p.close()
    client.close()


def _stream(spark, env, pub, sub, chk, **opts):
    return (spark.readStream.format("msgstream").options(**spark_options(env))
            .option("channels", ",".join(pub.channels)).option("subscription", sub)
            .options(**{k: str(v) for k, v in opts.items()}).load())


def test_failed_first_batch_is_retried_from_the_recorded_start(spark, env, pub, tmp_path):
    pub.rounds(1)  # before the query: "latest" must skip these
    chk, out, flag = tmp_path / "chk", tmp_path / "out", tmp_path / "failed-once"

    def sink(fail: bool):
        def write(df, batch_id):
            if fail and not flag.exists():
                flag.write_text(str(batch_id))
                raise RuntimeError("injected failure of the first micro-batch")
            df.write.mode("append").parquet(str(out))
        return write

    def run(fail: bool):
        q = (_stream(spark, env, pub, "retry", chk, startingPositions="latest").writeStream
             .foreachBatch(sink(fail)).option("checkpointLocation", str(chk)).trigger(availableNow=True).start())
        try:
            ended = q.awaitTermination(120)
        except Exception as exc:  # noqa: BLE001 - the injected failure
            return exc
        assert ended, "the foreachBatch availableNow run did not end within 120 s"
        return None

    assert run(False) is None  # resolves and records "latest"; nothing new yet
    pub.rounds(2)  # the data batch 0 must contain
    err = run(True)
    assert err is not None and "injected failure" in str(err)
    assert run(False) is None  # Spark asks initialOffset() again: the recorded start is reused
    got = sorted(r.pk for r in spark.read.parquet(str(out)).collect())
    assert got == list(range(20, 60))


def test_every_data_type_with_nulls(spark, env):
    ch = env.new_channel("types")
    schemas = {n: _field_schema(n, spec, 100 + i) for i, (n, spec) in enumerate(COLUMNS.items())}
    fds = [arrow_to_field_data(spec[1], schemas[n]) for n, spec in COLUMNS.items()]
    msg = InsertMsg.build(fields_data=fds, num_rows=N, timestamp=1 << 40, collection_id=1, msg_id=1)
    with env.client() as c, c.create_producer(ch) as p:
        p.send(ProducerMessage(*codec.marshal(msg)))
    df = spark.read.format("msgstream").options(**spark_options(env)).option("channels", ch).load()
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types["fv"] == "array<float>" and types["bv"] == "binary" and types["sp"] == "map<bigint,float>"
    assert types["i8"] == "tinyint" and types["j"] == "string" and types["arr_s"] == "array<string>"
    rows = sorted(df.collect(), key=lambda r: r.pk)
    for name, (_t, values, _n, _d) in COLUMNS.items():
        want = values.to_pylist()
        got = [r[name] for r in rows]
        if name == "sp":
            got = [sorted(g.items()) if g is not None else None for g in got]
            want = [sorted(w) for w in want]
        if name == "bv":
            got = [bytes(g) for g in got]
        assert got == want, name


def test_bad_options_name_the_option(spark, env):
    base = spark_options(env)
    def load(**o):
        return spark.read.format("msgstream").options(**base).options(**o).load()
    cases = [
        ({"channels": "a", "maxRowsPerTriger": "5"}, "maxrowspertriger"),
        ({"channels": "a", "output": "tables"}, "option output must be one of rows, messages"),
        ({"channels": "a", "channelPattern": "a.*"}, "exactly one of the options channels or channelPattern"),
        ({"channels": "a", "startingTimestamp": "last tuesday"}, "option startingtimestamp"),
        ({"channels": "a", "onDecodeError": "ignore"}, "ondecodeerror must be one of fail, skip"),
        ({"channels": "a", "config": "/nonexistent.yaml"}, "config file not found"),
        ({"channels": "a", "mq.type": "nats"}, "mq.type"),
    ]
    for opts, needle in cases:
        with pytest.raises(Exception) as ei:
            load(**opts)
        assert needle in str(ei.value), (opts, str(ei.value)[:300])
    q = (spark.readStream.format("msgstream").options(**base).option("channels", "a").option("schema", "pk bigint")
         .load().writeStream.format("console").start())
    with pytest.raises(Exception, match="subscription is required"):  # streaming options: checked at start
        q.awaitTermination(60)


def test_nothing_to_infer_is_a_clear_error(spark, env):
    ch = env.new_channel("empty")
    with env.client() as c, c.create_producer(ch) as p:
        p.send(ProducerMessage(*codec.marshal(TimeTickMsg.build(5))))
    with pytest.raises(Exception, match="cannot infer a schema"):
        spark.read.format("msgstream").options(**spark_options(env)).option("channels", ch).load()


def test_corrupt_message_fail_and_skip(spark, env, pub):
    pub.rounds(1, rows=3)
    bad = b"\x0a\x04\x08\x90\x03\x10"  # an Insert header, then garbage
    pub._p(pub.channels[0]).send(ProducerMessage(bad + b"\xff\xff\xff", {"msg_type": "Insert"}))
    pub.rounds(1, rows=3)
    base = spark.read.format("msgstream").options(**spark_options(env)).option("channels", ",".join(pub.channels))
    with pytest.raises(Exception) as ei:
        base.load().collect()
    text = str(ei.value)
    assert pub.channels[0] in text and "payload(" in text and "onDecodeError=skip" in text
    rows = base.option("onDecodeError", "skip").load().collect()
    assert sorted(r.pk for r in rows) == list(range(12))


def test_data_loss_fails_or_skips(spark, env, pub):
    pub.rounds(3, rows=50)
    df = spark.read.format("msgstream").options(**spark_options(env)).option("channels", pub.channels[0]).load()
    old = df.orderBy("_ts").first()._position
    with env.client() as c:
        c.settings.retention_bytes = 3000
        assert c.apply_retention(pub.channels[0]) > 0
    start = json.dumps({pub.channels[0]: old})
    r = (spark.read.format("msgstream").options(**spark_options(env)).option("channels", pub.channels[0])
         .option("schema", "pk bigint"))
    with pytest.raises(Exception, match="removed by retention"):
        r.option("startingPositions", start).load().collect()
    rows = r.option("startingPositions", start).option("failOnDataLoss", "false").load().collect()
    assert 0 < len(rows) < 150


def test_channel_pattern_picks_up_new_channels(spark, env, tmp_path):
    prefix = env.new_channel("pat")
    client = env.client()
    p = Publisher(client, [f"{prefix}_0"])
    p.rounds(1, rows=2)
    opts = {**spark_options(env), "channelPattern": f"{prefix}_\\d+", "subscription": "pattern"}

    def run():
        q = (spark.readStream.format("msgstream").options(**opts).load().writeStream.format("parquet")
             .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(availableNow=True).start())
        finish(q, 120, "the channel-pattern availableNow run")
        return sorted(r._channel for r in spark.read.parquet(str(tmp_path / "out")).collect())

    assert run() == [f"{prefix}_0"] * 2
    p2 = Publisher(client, [f"{prefix}_1"], ts=p.ts, next_pk=100)
    p2.rounds(1, rows=3)
    assert run() == [f"{prefix}_0"] * 2 + [f"{prefix}_1"] * 3
    p.close()
    p2.close()
    client.close()
