"""jobs/mirror.py's snapshot through the 2.6 proxy (``mq.type: milvus``, 2.5 entries before 2.6 ones) and on
Pulsar (2.5 msgstream).

The SDK address is the suite's proxy (tests/milvus_proxy): its ``Query`` answers from a model of the
collection's rows that the test's writer changes together with writing the messages (2.6 WAL entries
into the proxy's store, or 2.5 msgstream messages on pulsar-lite), under one lock and with one TSO.
A collection with rows, then ``--snapshot initial`` while the writer inserts, deletes and upserts
(after the snapshot's first queries, and between its range queries: the proxy calls the writer back),
then more writes and a second run from the checkpoint: the table equals the model row for row,
vectors bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.milvus_real.workload import normalize
from tests.mq_milvus.collection_log import (
    CID,
    FIELDS,
    NAME,
    PARTITIONS,
    Msgstream25,
    Wal26,
    Writer,
    collection_schema,
)
from tests.sink.helpers import config_file

pytestmark = pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")

HOOKED_QUERIES = 8  # the proxy runs a writer round after each of the snapshot's first queries


def run_job(spark, cfg: str, table: Path, fmt: str, channels: list[str], *extra: str) -> dict:
    from msgstream_spark.jobs import mirror

    return mirror.run(mirror.build_parser().parse_args([
        "--config", cfg, "--collection", NAME, "--table", str(table), "--table-format", fmt,
        "--channels", ",".join(channels), "--progress-interval", "1", "--max-rows-per-trigger", "500",
        *extra]), spark)


def table_rows(table: Path, fmt: str) -> dict:
    from msgstream_spark.mirror.table import open_table

    t = open_table(fmt, str(table), collection=NAME, pk="pk", create=False)
    return {r["pk"]: normalize({k: r.get(k) for k in [*FIELDS, "_partition"]}) for r in t.to_arrow().to_pylist()}


def assert_table_equals_model(table: Path, fmt: str, model) -> None:
    want = {pk: normalize(r) for pk, r in model.snapshot().items()}
    got = table_rows(table, fmt)
    assert sorted(got) == sorted(want)
    bad = [pk for pk in want if got[pk] != want[pk]]
    assert not bad, f"{len(bad)} rows differ, e.g. pk {bad[0]}: table {got[bad[0]]} vs model {want[bad[0]]}"
    for pk in want:  # vectors bit for bit
        assert np.asarray(got[pk]["fv"], np.float32).tobytes() == np.asarray(want[pk]["fv"], np.float32).tobytes()


def mirror_while_writing(spark, state, writer: Writer, cfg: str, table: Path, fmt: str, channels: list[str],
                         upgrade=None):
    """The collection's first rows, the snapshot run with writes during it, writes after, the second run.
    ``upgrade``: the log the writer switches to after the first rows (a cluster upgraded from 2.5 to 2.6)."""
    writer.create()
    writer.insert(range(0, 150))
    writer.insert(range(150, 300))
    writer.tick()
    if upgrade is not None:
        writer.log = upgrade
    state.on_query = lambda _req: writer.round() if len(state.queries) <= HOOKED_QUERIES else None
    writer.start(after=state.queried)
    try:
        first = run_job(spark, cfg, table, fmt, channels, "--snapshot-tasks", "3")
    finally:
        state.on_query = None
        writer.stop()
    snap = first["snapshot"]
    assert snap["mode"] == "initial" and snap["rows"] >= 300
    assert 2 <= snap["ranges"] <= 8  # about 3 tasks' shares, cut per partition (2) where its keys are
    assert snap["plan_calls"] <= snap["ranges"] + 10  # the partitions' counts, the probes, about one call a cut
    assert snap["read_calls"] >= snap["ranges"]
    assert snap["pinned"] is True  # the proxy answers an iterator's session_ts: every range read at exactly S
    seen = [v for _, outs, v in state.queries if outs == ["*"]]  # the range reads' model versions
    assert len(set(seen)) > 1, "no write between the snapshot's range queries"
    assert any(ts > snap["S"] and v <= max(seen) for _, ts, v in writer.acked), \
        "no write after S that the snapshot's queries saw (the handover case)"
    for _ in range(3):
        writer.round()
    second = run_job(spark, cfg, table, fmt, channels)
    assert second["snapshot"]["mode"] == "resumed" and second["stream_rows"] > 0
    assert_table_equals_model(table, fmt, writer.model)


@pytest.mark.parametrize(("fmt", "string_key"), [("delta", False), ("iceberg", True)], ids=["delta", "iceberg-varchar"])
def test_snapshot_through_the_26_proxy_equals_the_model(spark, milvus_proxy, tmp_path, fmt, string_key):
    """``mq.type: milvus``: the log and the SDK are the same proxy (an Int64 key, and a VarChar key). The
    pchannels are an upgraded cluster's: the collection's creation and first rows are 2.5 entries (the proxy
    serves them as version-0 messages), the writes during and after the snapshot 2.6 ones."""
    from tests.fixtures.milvus_env import StoreWriter

    pchannels = ["by-dev-rootcoord-dml_0", "by-dev-rootcoord-dml_1"]
    store = StoreWriter(milvus_proxy.store_path)
    old = Msgstream25(store.client, pchannels, string_key)
    log = Wal26(store.client, pchannels, string_key)
    model = milvus_proxy.state.add_model("default", NAME, CID, pchannels, log.vchannels,
                                         collection_schema(string_key), PARTITIONS)
    cfg = tmp_path / "milvus.yaml"
    cfg.write_text(yaml.safe_dump({
        "mq.type": "milvus", "milvus.address": milvus_proxy.address, "milvus.requestTimeout": 10,
        "milvus.metadataPath": str(tmp_path / "meta.json"), "milvus.collections": f"default.{NAME}"}))
    try:
        mirror_while_writing(spark, milvus_proxy.state, Writer(old, model), str(cfg), tmp_path / "t", fmt, pchannels,
                             upgrade=log)
    finally:
        old.close()
        log.close()
        store.close()


def test_snapshot_on_pulsar_25_equals_the_model(spark, pulsar_lite_env, milvus_proxy, tmp_path):
    """``mq.type: pulsar`` (2.5 msgstream on pulsar-lite, a VarChar key); the SDK calls go to the proxy's model."""
    pchannels = [pulsar_lite_env.new_channel("snap25") for _ in range(2)]
    client = pulsar_lite_env.client()
    log = Msgstream25(client, pchannels, string_key=True)
    model = milvus_proxy.state.add_model("default", NAME, CID, pchannels, log.vchannels,
                                         collection_schema(string_key=True), PARTITIONS)
    cfg = Path(config_file(pulsar_lite_env, tmp_path))
    values = yaml.safe_load(cfg.read_text())
    cfg.write_text(yaml.safe_dump({**values, "milvus.address": milvus_proxy.address}))
    try:
        mirror_while_writing(spark, milvus_proxy.state, Writer(log, model), str(cfg), tmp_path / "t", "delta",
                             pchannels)
    finally:
        log.close()
        client.close()
