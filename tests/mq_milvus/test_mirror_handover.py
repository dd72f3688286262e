"""The snapshot's positions and S where a TimeTick follows newer data (2.5 msgstream on the embedded log).

On Milvus 2.3.5 the proxy reports a channel's time as its pending writes' smallest timestamp minus one
(``internal/proxy/channels_time_ticker.go``: ``stat.minTs - 1``) and RootCoord broadcasts it, so a TimeTick
often lands on a channel after data messages newer than itself: on the real 2.3.5 on Kafka, 59 of 61 ticks
of a channel written by a loop of inserts and upserts followed newer data (up to three ticks back, up to
619 ms newer), and 2 to 4 of them fell between an upsert's Insert and its Delete (one timestamp). Milvus's
own consumer handles it (a pack's end position points at the first newer message it holds back:
shared/docs/milvus-wire-format.md section 7.4). A snapshot position at such a tick, with the tick's own time
as S, left the Insert before the position (never streamed) and the Delete after it (streamed, newer than
S): the key was deleted from the table while Milvus kept it (the one-key loss of
tests/milvus_real/test_mirror.py::test_snapshot_while_writing_then_stream_equals_query).

The suite's proxy answers the snapshot's queries from a model at exactly S (pinned reads), the worst case
of Milvus 2.3.5's "at least at S".
"""

from __future__ import annotations

from pathlib import Path

import yaml

from msgstream_spark.mq.base import ProducerMessage
from tests.milvus_proxy.wal import tso_now
from tests.mq_milvus.collection_log import (
    CID,
    NAME,
    PARTITIONS,
    Msgstream25,
    Writer,
    collection_schema,
    partition_of,
    row,
)
from tests.mq_milvus.test_mirror_snapshot import assert_table_equals_model, run_job
from tests.sink.helpers import config_file

CHANNELS = ["by-dev-rootcoord-dml_0", "by-dev-rootcoord-dml_1"]


def _setup(local_env, milvus_proxy, tmp_path: Path):
    client = local_env.client()
    log = Msgstream25(client, CHANNELS)
    model = milvus_proxy.state.add_model("default", NAME, CID, CHANNELS, log.vchannels, collection_schema(),
                                         PARTITIONS)
    cfg = Path(config_file(local_env, tmp_path))
    cfg.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "milvus.address": milvus_proxy.address}))
    return client, log, Writer(log, model), str(cfg)


def test_an_upsert_cut_by_a_tick_at_the_positions_keeps_its_row(spark, local_env, milvus_proxy, tmp_path):
    """Key 4's upsert (shard 0) as Milvus 2.3.5 wrote it in the failing run: its Insert at T, RootCoord's
    TimeTick T - 1 on every channel (the positions are taken there: the snapshot sees S), its Delete at T after
    them. The table keeps the upserted row (Milvus's rule: a delete does not remove an insert of its own
    timestamp); before the fix S was T - 1, the snapshot (read at S) held the old row and the streamed Delete
    removed it."""
    client, log, writer, cfg = _setup(local_env, milvus_proxy, tmp_path)
    model = writer.model
    try:
        writer.create()
        writer.insert(range(0, 20))
        writer.tick()
        key, part = 4, partition_of(4)
        with model.lock:
            ts = tso_now()
            log.insert(ts, 0, part, [row(key, 1)])
            model.put([row(key, 1)], PARTITIONS[part][0], ts)
            log.tick(ts - 1)  # computed while the upsert was pending: its time minus one

        def delete_half(_request) -> None:  # after the positions: the snapshot's first Query
            milvus_proxy.state.on_query = None
            with model.lock:
                log.delete(ts, 0, [key])
                writer.insert(range(20, 22))
                writer.tick()

        milvus_proxy.state.on_query = delete_half
        first = run_job(spark, cfg, tmp_path / "t", "delta", CHANNELS, "--snapshot-tasks", "1")
        milvus_proxy.state.on_query = None
        assert first["snapshot"]["mode"] == "initial" and first["snapshot"]["pinned"] is True
        assert first["stream_rows"] > 0  # the stream read on to what was written during the snapshot
        assert_table_equals_model(tmp_path / "t", "delta", model)  # old code: the table lacked key 4
        assert model.snapshot()[key]["s"] == row(key, 1)["s"]
        assert first["snapshot"]["S"] >= ts, "S is below the Insert that lies before the positions"
    finally:
        milvus_proxy.state.on_query = None
        log.close()
        client.close()


def test_a_position_time_covers_every_message_before_it(local_env):
    """take_positions: each position's time is at least every Milvus time before its message (an Insert at T,
    then ticks at T - 2 and T - 1 as the last messages), so a resume from it and a snapshot at S miss nothing;
    a channel whose last message is its newest keeps that message's time."""
    from msgstream_spark.mirror.snapshot.handover import snapshot_ts, take_positions

    client = local_env.client()
    log = Msgstream25(client, CHANNELS)
    try:
        log.create(tso_now())
        t = tso_now()
        log.insert(t, 0, 0, [row(0)])
        for tick in (t - 2, t - 1):
            log.producers[0].send_batch([ProducerMessage(_tick(tick), {}, tick)])
        later = tso_now()
        log.insert(later, 1, 0, [row(1)])
        got = take_positions(client, CHANNELS)
        assert got[CHANNELS[0]].timestamp == t
        assert got[CHANNELS[1]].timestamp == later
        assert snapshot_ts(got) == later
    finally:
        log.close()
        client.close()


def _tick(ts: int) -> bytes:
    from msgstream_spark.msg.pb import common_pb2, msg_pb2

    return msg_pb2.TimeTickMsg(base=common_pb2.MsgBase(msg_type=1200, timestamp=ts, sourceID=7)).SerializeToString()
