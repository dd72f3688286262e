"""The Spark source (``format("msgstream")``, ``mq.type=milvus``) reading through the suite's proxy.

The first two tests check the SPI wiring over 2.5 messages, which the proxy serves as Milvus 2.6 does:
version-0 messages (rebuilt properties around the 2.5 body). A pchannel with 2.5 entries before 2.6 ones
(an upgraded cluster) is test_upgraded.py's; 2.6 rows after restarts are the last test's.
"""

from __future__ import annotations

import pytest
import yaml

from msgstream_spark.config import Config
from tests.fixtures.milvus_env import StoreWriter
from tests.fixtures.waits import finish
from tests.spark.helpers import Publisher
from tests.wal26.test_stream26 import TT as _TT


def _rows(df) -> list:
    return sorted((r.op, r.pk) for r in df.select("op", "pk").collect())


def test_batch_read_through_the_proxy_equals_reading_the_log(spark, milvus_proxy, tmp_path):
    w = StoreWriter(milvus_proxy.store_path)
    pub = Publisher(w.client, [f"spark-milvus-{i}" for i in range(2)])
    try:
        pub.rounds(3, rows=5)
        pub.delete(pub.channels[0], [0, 1])
        pub.tick()
    finally:
        pub.close()
        w.close()
    # milvus.* keys as options here (the streaming test below passes them through a config file)
    via_proxy = (spark.read.format("msgstream").option("mq.type", "milvus")
                 .option("milvus.address", milvus_proxy.address)
                 .option("milvus.metadataPath", str(tmp_path / "meta.json")).option("milvus.requestTimeout", "10")
                 .option("channels", ",".join(pub.channels)).load())
    local = Config.from_dict({"mq": {"type": "local"}, "local": {"path": milvus_proxy.store_path}})
    direct = (spark.read.format("msgstream").option("mq.type", "local").option("local.path", local.get("local.path"))
              .option("channels", ",".join(pub.channels)).load())
    got = _rows(via_proxy)
    assert got == _rows(direct)
    assert sorted((op, pk) for op, pk, _ in pub.published) == got


def test_available_now_stream_through_the_proxy(spark, milvus_proxy, tmp_path):
    w = StoreWriter(milvus_proxy.store_path)
    pub = Publisher(w.client, ["spark-milvus-stream"])
    try:
        pub.rounds(2, rows=4)
    finally:
        pub.close()
    conf = tmp_path / "milvus.yaml"
    conf.write_text(yaml.safe_dump({"mq": {"type": "milvus"}, "milvus": {
        "address": milvus_proxy.address, "metadataPath": str(tmp_path / "meta.json"), "requestTimeout": 10}}))

    def run(out):
        df = (spark.readStream.format("msgstream").option("config", str(conf)).option("channels", pub.channels[0])
              .option("subscription", "s1").load())
        q = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation",
             str(tmp_path / "ck")).trigger(availableNow=True).start())
        finish(q, 120, "the availableNow run through the proxy")
        return sorted((r.op, r.pk) for r in spark.read.parquet(str(out)).select("op", "pk").collect())

    w.close()
    assert run(tmp_path / "out") == [("insert", i) for i in range(8)]
    # restarted from a version-0 entry's position: nothing twice. (No 2.5 entry can follow: each call wrote a
    # 2.6 TimeTick, and Milvus drops an entry below a tick; test_upgraded.py writes 2.6 rows after them.)
    assert run(tmp_path / "out") == [("insert", i) for i in range(8)]


def test_restarted_stream_reads_exactly_the_new_2_6_rows(spark, milvus_proxy, tmp_path):
    """Issue #19: every DumpMessages call persists a TimeTick (Milvus 2.6); a query restarted from its
    checkpoint read none of the rows written after its first run. Rows carry the proxy's TSO, as
    Milvus's do: each later than every tick written before."""
    from tests.milvus_proxy.wal import tso_now
    from tests.mq_milvus.test_dump import fill
    from tests.wal26 import producer as P

    ch = "spark-milvus-26"
    conf = tmp_path / "milvus.yaml"
    conf.write_text(yaml.safe_dump({"mq": {"type": "milvus"}, "milvus": {
        "address": milvus_proxy.address, "metadataPath": str(tmp_path / "meta.json"), "requestTimeout": 10}}))

    def run() -> list:
        df = (spark.readStream.format("msgstream").option("config", str(conf)).option("channels", ch)
              .option("subscription", "s26").load())
        q = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        assert q.awaitTermination(120) is not False, "the AvailableNow query did not finish"
        return sorted((r.op, r.pk) for r in spark.read.parquet(str(tmp_path / "out")).select("op", "pk").collect())

    tt = tso_now()
    fill(milvus_proxy, ch, [P.create_collection(tt), P.insert(tt + 1, [0, 1]), P.insert(tt + 2, [2]),
                            P.timetick(tt + 3)])
    assert run() == [("insert", pk) for pk in range(3)]
    tt = tso_now()
    fill(milvus_proxy, ch, [P.insert(tt, [3, 4]), P.timetick(tt + 1), P.insert(tt + 2, [5])])
    want = [("insert", pk) for pk in range(6)]
    assert run() == want  # exactly the new rows, once
    tt = tso_now()  # ticks and a transaction interleaved with the new rows; a rolled-back one never shows
    fill(milvus_proxy, ch, [P.timetick(tt), *P.upsert_txn(tt + 1, 71, [6]), P.insert(tt + 5, [7]),
                            P.timetick(tt + 6), *P.upsert_txn(tt + 7, 72, [8], end="rollback"), P.timetick(tt + 11)])
    want += [("delete", 6), ("insert", 6), ("insert", 7)]
    assert run() == sorted(want)
    assert run() == sorted(want)  # nothing new: nothing read twice


def test_batch_reads_from_every_pack_end_of_a_tt_stream_give_the_rest_once(spark, milvus_proxy, tmp_path):
    """A TtMsgStream's pack end positions (Milvus's form: the legacy bytes of an ``_lc`` and the tick) as a
    batch read's ``startingPositions``: every later row once, every earlier one never. The pack ending at a
    Commit sent after a later insert (the proxy sends by ``_tt``) is among them. As ``endingPositions``: the
    rows up to the pack end, none after (a range stopped before the end's ``_lc`` and lost rows there)."""
    from msgstream_spark.mq.registry import build_client
    from msgstream_spark.stream import TtMsgStream
    from tests.fixtures.milvus_env import milvus_config
    from tests.mq_milvus.test_stream import PACK_ENDS, _fill, _packs_to

    ch, _ = _fill(milvus_proxy)
    milvus_proxy.state.pause_after = tuple(sent for sent, _ in PACK_ENDS)
    ends = []
    with TtMsgStream(build_client("milvus", milvus_config(milvus_proxy.address, tmp_path))) as s:
        s.as_consumer([ch], "tt-ends", "earliest")
        for _, end_tt in PACK_ENDS:
            ends.append((end_tt, _packs_to(s, milvus_proxy, end_tt)[-1].end_positions[0]))
            milvus_proxy.state.release()
    every = _scenario_rows()

    def reader(**positions):  # a DataFrameReader keeps the options set on it: a fresh one each time
        return (spark.read.format("msgstream").option("mq.type", "milvus")
                .option("milvus.address", milvus_proxy.address).option("milvus.requestTimeout", "10")
                .option("milvus.metadataPath", str(tmp_path / "meta.json")).option("channels", ch)
                .options(**{k: p.to_base64() for k, p in positions.items() if p is not None}))

    assert _spark_rows(reader().load()) == every
    for end_tt, pos in ends:
        got = _spark_rows(reader(startingPositions=pos).load())
        assert got == [r for r in every if r[2] > end_tt], f"from the pack end at TT{end_tt - _TT:+d}"
    # bounded by the next pack end (endingPositions): exactly the rows of the packs between
    for (lo, start), (hi, end) in zip([(None, None), *ends], ends):
        got = _spark_rows(reader(startingPositions=start, endingPositions=end).load())
        assert got == [r for r in every if (lo is None or r[2] > lo) and r[2] <= hi], f"up to TT{hi - _TT:+d}"


def _scenario_rows() -> list:
    from tests.wal26.test_stream26 import ALL

    return sorted(({"I": "insert", "D": "delete"}[op], pks[0], ts) for op, pks, ts in ALL)


def _spark_rows(df) -> list:
    return sorted((r.op, r.pk, r._ts) for r in df.select("op", "pk", "_ts").collect())


def test_a_batch_read_from_the_first_pack_end_of_a_fresh_wal(spark, milvus_proxy, tmp_path):
    """The first message's position in a fresh 2.6 WAL is the TimeTick written when the WAL opened (its
    ``_lc``), an entry the proxy never sends: a start there is no loss (it was taken for a truncated one)."""
    from msgstream_spark.mq.registry import build_client
    from msgstream_spark.stream import TtMsgStream
    from tests.fixtures.milvus_env import milvus_config
    from tests.mq_milvus.test_stream import _packs_to
    from tests.wal26 import producer as P
    from tests.wal26.test_stream26 import write_wal

    ch = "spark-milvus-fresh"
    vc = f"{ch}_{P.COLLECTION}v0"
    w = StoreWriter(milvus_proxy.store_path)
    try:
        ids = write_wal(w.client, ch, [P.timetick(_TT, lcs=True), P.insert(_TT + 1, [1], vc=vc),
                                       P.insert(_TT + 2, [2], vc=vc), P.timetick(_TT + 3)])
    finally:
        w.close()
    milvus_proxy.state.pause_after = (1,)
    with TtMsgStream(build_client("milvus", milvus_config(milvus_proxy.address, tmp_path))) as s:
        s.as_consumer([ch], "tt-fresh", "earliest")
        pos = _packs_to(s, milvus_proxy, _TT + 1)[-1].end_positions[0]
    assert pos.msg_id == ids[0].offset.to_bytes(8, "little")  # the opening TimeTick's id
    reader = (spark.read.format("msgstream").option("mq.type", "milvus").option("milvus.address", milvus_proxy.address)
              .option("milvus.metadataPath", str(tmp_path / "meta.json")).option("channels", ch)
              .option("startingPositions", pos.to_base64()))
    assert _spark_rows(reader.load()) == [("insert", 2, _TT + 2)]
    milvus_proxy.truncate(ch, ids[1].offset)  # retention removes the tick and the first insert: a loss, said so
    with pytest.raises(Exception, match="was removed by retention"):
        reader.load().collect()
