"""The pchannels of a cluster upgraded from Milvus 2.5 to 2.6, read through the suite's proxy (issue #32).

2.5 msgstream messages (Milvus's ``msgpb`` bodies, as the 2.5 proxy and RootCoord wrote them) come
first, then 2.6 WAL entries (the independent producer's envelopes). The proxy serves the 2.5 entries
as Milvus 2.6 does: version-0 messages with rebuilt properties (``_v`` "0", ``_t``, ``_tt`` = BeginTs,
``_vc``, ``_h``, ``_lc`` 30 version-0 messages back; tests/milvus_proxy/old_version.py). More than 30
of them, several sharing one ``_tt`` (one insert over two partitions, the 2.5 upsert's insert and
delete). Schema inference, a batch read (whole and split into ranges) and a restarted stream give
every committed row exactly once.
"""

from __future__ import annotations

import collections

import pytest
import yaml

from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.schema import infer_collection
from tests.fixtures.milvus_env import StoreWriter
from tests.mq_milvus.collection_log import CID, FIELDS, NAME, PARTITIONS, Msgstream25, Wal26, Writer, collection_schema

PCHANNELS = ["by-dev-rootcoord-dml_0", "by-dev-rootcoord-dml_1"]


class Upgraded:
    """The collection's 2.5 history, then (``upgrade``) its 2.6 one, on the proxy's pchannels."""

    def __init__(self, proxy) -> None:
        self.store = StoreWriter(proxy.store_path)
        self.old = Msgstream25(self.store.client, PCHANNELS)
        self.new = Wal26(self.store.client, PCHANNELS)
        model = proxy.state.add_model("default", NAME, CID, PCHANNELS, self.old.vchannels, collection_schema(),
                                      PARTITIONS)
        proxy.state.schemas.clear()  # DescribeCollection without a schema: inference reads the log
        self.writer = Writer(self.old, model)

    def before(self) -> None:
        w = self.writer
        w.create()
        for i in range(40):  # 40 version-0 inserts: more than the proxy's _lc window of 30
            w.insert([i])
        w.insert(range(40, 60))  # one time tick, a message per shard and partition
        w.delete([1, 2, 41])
        w.upsert([3, 42], gen=1)  # 2.5: an insert and a delete with one time tick
        w.tick()

    def upgrade(self) -> None:
        w = self.writer
        w.log = self.new
        w.insert(range(60, 70))
        w.delete([4, 61])
        w.upsert([5, 62], gen=2)  # 2.6: a transaction
        w.tick()

    def expected(self) -> list:
        return sorted(self.writer.events)

    def close(self) -> None:
        self.old.close()
        self.new.close()
        self.store.close()


@pytest.fixture
def upgraded(milvus_proxy):
    u = Upgraded(milvus_proxy)
    yield u
    u.close()


def _options(proxy, tmp_path, **extra) -> dict:
    return {"mq.type": "milvus", "milvus.address": proxy.address, "milvus.requestTimeout": "10",
            "milvus.metadataPath": str(tmp_path / "meta.json"), "channels": ",".join(PCHANNELS), **extra}


@pytest.mark.parametrize("collection", [None, NAME, str(CID)])
def test_schema_inference_reads_version_0_entries_as_2_5_messages(milvus_proxy, upgraded, tmp_path, collection):
    """Issue #32: ``_note_wal_schema`` took a version-0 CreateCollection for a 2.6 one (AttributeError)."""
    extra = {} if collection is None else {"collection": collection}
    upgraded.before()
    for upgrade in (True, False):  # only 2.5 entries (and the proxy's ticks), then after the upgrade (a rescan)
        schema, cid = infer_collection(parse_read_options(_options(milvus_proxy, tmp_path, **extra),
                                                          streaming=False), PCHANNELS)
        assert cid == CID and [f.name for f in schema.fields] == FIELDS
        assert [f.name for f in schema.fields if f.is_primary_key] == ["pk"]
        if upgrade:
            upgraded.upgrade()


def _rows(df) -> list:
    return sorted((r.op, r.pk) for r in df.select("op", "pk").collect())


def test_batch_read_gives_every_row_of_both_versions_once(spark, milvus_proxy, upgraded, tmp_path):
    upgraded.before()
    upgraded.upgrade()
    want = upgraded.expected()
    assert collections.Counter(op for op, _ in want) == {"insert": 74, "delete": 9}
    for split in ({}, {"minPartitions": "4"}, {"maxRecordsPerPartition": "7"}):
        df = spark.read.format("msgstream").options(**_options(milvus_proxy, tmp_path, collection=NAME),
                                                     **split).load()
        assert _rows(df) == want, split
    values = {r.pk: r.s for r in spark.read.format("msgstream").options(
        **_options(milvus_proxy, tmp_path, collection=NAME)).load().where("op = 'insert'").collect()
        if r.pk in (3, 5)}
    assert values == {3: "s1003", 5: "s2005"}  # the upserted versions


def test_restarted_stream_gives_every_row_once(spark, milvus_proxy, upgraded, tmp_path):
    conf = tmp_path / "milvus.yaml"
    conf.write_text(yaml.safe_dump({"mq": {"type": "milvus"}, "milvus": {
        "address": milvus_proxy.address, "metadataPath": str(tmp_path / "meta.json"), "requestTimeout": 10}}))

    def run() -> list:
        df = (spark.readStream.format("msgstream").option("config", str(conf)).option("channels", ",".join(PCHANNELS))
              .option("collection", NAME).option("subscription", "up").option("maxRowsPerTrigger", "9").load())
        q = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        assert q.awaitTermination(120) is not False, "the AvailableNow query did not finish"
        return sorted((r.op, r.pk) for r in spark.read.parquet(str(tmp_path / "out")).select("op", "pk").collect())

    upgraded.before()
    assert run() == upgraded.expected()  # version-0 entries only: the checkpoint ends among them
    upgraded.upgrade()
    assert run() == upgraded.expected()  # resumed from a version-0 entry's _lc and _tt: the new rows, once
    assert run() == upgraded.expected()  # nothing new: nothing twice
