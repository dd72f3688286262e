"""The msgstream source on a real SparkSession (local[2]): batch and streaming reads."""

from __future__ import annotations

import json

import pytest
from chispa import assert_df_equality

from msgstream_spark.msg.position import MsgPosition
from tests.fixtures.waits import finish, wait_until
from tests.spark.helpers import COLLECTION, MS, TS0, Publisher, spark_options

pytestmark = pytest.mark.slow  # Spark end to end


@pytest.fixture
def pub(backend):
    client = backend.client()
    chans = [backend.new_channel("dml"), backend.new_channel("dml")]
    p = Publisher(client, chans)
    yield p
    p.close()
    client.close()


def read(spark, backend, pub, **opts):
    r = spark.read.format("msgstream").options(**spark_options(backend)).option("channels", ",".join(pub.channels))
    return r.options(**{k: str(v) for k, v in opts.items()}).load()


def stream(spark, backend, pub, sub, checkpoint, out, trigger=None, **opts):
    """A streaming query into a parquet table at ``out`` (exactly-once file sink)."""
    df = (spark.readStream.format("msgstream").options(**spark_options(backend))
          .option("channels", ",".join(pub.channels)).option("subscription", sub)
          .options(**{k: str(v) for k, v in opts.items()}).load())
    w = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
    return w.trigger(**(trigger or {"availableNow": True})).start()


def rows_of(spark, out):
    return sorted((r.op, r.pk) for r in spark.read.parquet(str(out)).select("op", "pk").collect())


def test_batch_read_inserts_and_deletes(spark, backend, pub):
    pub.rounds(3, rows=5)
    pub.delete(pub.channels[0], [0, 1])
    pub.tick()
    df = read(spark, backend, pub)
    assert df.columns[:4] == ["op", "pk", "vec", "name"]
    assert df.schema["_event_time"].dataType.typeName() == "timestamp"
    got = sorted((r.op, r.pk, r._channel) for r in df.select("op", "pk", "_channel").collect())
    assert got == sorted(pub.published)
    row = df.where("op = 'insert' and pk = 6").first()
    assert row.vec == [6.0, 7.0, 8.0, 9.0] and row.name == "n6" and row._collection == COLLECTION
    assert df.where("pk = 5 and op = 'insert'").first().name is None  # nullable field
    assert row._shard.endswith(f"_{COLLECTION}v0") and row._ts > TS0


def test_streaming_stop_restart_exactly_the_remaining_rows(spark, backend, pub, tmp_path):
    pub.rounds(2)
    out = tmp_path / "out"
    q = stream(spark, backend, pub, "restart", tmp_path / "chk", out)
    finish(q, 120, "the first availableNow run")
    first = rows_of(spark, out)
    assert len(first) == 40
    pub.rounds(2)
    q = stream(spark, backend, pub, "restart", tmp_path / "chk", out)
    finish(q, 120, "the restarted availableNow run")
    both = rows_of(spark, out)
    assert len(both) == 80 and len(set(both)) == 80  # none twice
    assert both == sorted((op, pk) for op, pk, _ in pub.published)


def test_max_rows_per_trigger_and_available_now_batch_counts(spark, backend, pub, tmp_path):
    pub.rounds(5, rows=4)  # 5 tick-delimited rounds of 8 rows
    q = stream(spark, backend, pub, "rate", tmp_path / "chk", tmp_path / "out", maxRowsPerTrigger=16)
    finish(q, 120, "the rate-limited availableNow run")
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [16, 16, 8]  # batches end at time ticks, within the cap
    assert len(rows_of(spark, tmp_path / "out")) == 40
    latest = json.loads(q.recentProgress[-1]["sources"][0]["latestOffset"])  # reportLatestOffset
    assert set(latest) == set(pub.channels)


def test_replay_from_a_saved_position(spark, backend, pub):
    pub.rounds(4, rows=3)
    df = read(spark, backend, pub)
    saved = df.where("pk = 12").first()._position  # first row of round 3, channel 0
    pos = MsgPosition.from_base64(saved)
    assert pos.channel_name == pub.channels[0]
    start = '{"%s": "%s", "%s": "latest"}' % (pub.channels[0], saved, pub.channels[1])
    replay = read(spark, backend, pub, startingPositions=start)
    got = sorted(r.pk for r in replay.collect())
    assert got == [12, 13, 14, 18, 19, 20]  # that message and the later ones of channel 0 only


def test_starting_timestamp(spark, backend, pub):
    pub.rounds(3, rows=2)
    cut = TS0 + 5 * MS  # after round 2's inserts? rounds: insert ch0, insert ch1, tick -> 3 ts steps each
    df = read(spark, backend, pub, startingTimestamp=cut)
    ts = [r._ts for r in df.collect()]
    assert ts and min(ts) >= cut
    assert len(ts) == sum(1 for r in read(spark, backend, pub).collect() if r._ts >= cut)


def test_output_messages(spark, backend, pub):
    pub.rounds(1, rows=2)
    df = read(spark, backend, pub, output="messages")
    types = sorted(r.msg_type for r in df.collect())
    assert types == ["Insert", "Insert", "TimeTick", "TimeTick"]
    ins = df.where("msg_type = 'Insert'").first()
    assert ins.num_rows == 2 and ins.properties["msg_type"] == "Insert" and len(ins.payload) > 20
    only = read(spark, backend, pub, output="messages", messageTypes="timetick")
    assert only.count() == 2


def test_same_data_through_register_and_autoregistration(spark, backend, pub):
    from msgstream_spark.spark.datasource import MsgStreamDataSource

    pub.rounds(1, rows=3)
    auto = read(spark, backend, pub).select("op", "pk", "vec", "name")
    spark.dataSource.register(MsgStreamDataSource)
    registered = read(spark, backend, pub).select("op", "pk", "vec", "name")
    assert_df_equality(auto, registered, ignore_row_order=True)


def test_reads_leave_no_subscriptions_behind(spark, backend, pub, tmp_path):
    # On Pulsar a forgotten subscription holds the topic's backlog forever: read tasks, scans,
    # schema inference and probes must all remove theirs.
    broker = backend.extras.get("broker")
    if broker is None:
        pytest.skip("inspects the suite's own Pulsar broker")
    pub.rounds(2, rows=3)
    assert read(spark, backend, pub).count() == 12  # 2 rounds x 2 channels x 3 rows
    q = stream(spark, backend, pub, "kept-sub", tmp_path / "chk", tmp_path / "out")
    finish(q, 120, "the availableNow run")
    topics = [pub.client.settings.topic(ch) for ch in pub.channels]

    def leftovers() -> dict:
        return {t: [s for s in broker.subscription_names(t) if s.startswith("__msgstream")] for t in topics}

    # a reader's non-durable subscription goes with its connection
    wait_until(lambda: leftovers() == {t: [] for t in topics}, 60, "the readers' subscriptions to go",
               seen=leftovers)
