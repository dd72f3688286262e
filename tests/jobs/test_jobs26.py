"""The ingest and replay jobs on a Milvus 2.6 channel (embedded log): a 2.5 -> 2.6 upgrade boundary,
committed and rolled-back transactions, and a replay from a position saved by the CLI helper."""

from __future__ import annotations

import json

import pytest

from tests.jobs.test_jobs import ns, table
from tests.sink.helpers import config_file
from tests.wal26 import producer as P
from tests.wal26.test_stream26 import COLL, TT, scenario, write_wal

pytestmark = pytest.mark.slow

# (op, pk, _ts) of the scenario: the 2.5 insert keeps its body's time, 2.6 rows take _tt (a transaction's:
# its commit's); the rolled-back upsert of pk 3 leaves nothing.
EXPECTED = [("insert", 1, TT - 30), ("insert", 2, TT + 1), ("delete", 2, TT + 5), ("insert", 2, TT + 5),
            ("delete", 5, TT + 23), ("insert", 5, TT + 23), ("insert", 6, TT + 24)]


def _ops(path):
    t = table(path)
    return sorted(zip(t.column("op").to_pylist(), t.column("pk").to_pylist(), t.column("_ts").to_pylist()),
                  key=lambda r: (r[2], r[0] != "delete", r[1]))


def test_ingest_and_replay_a_26_channel(spark, local_env, tmp_path):
    from msgstream_spark.cli.commands import latest_position
    from msgstream_spark.jobs import ingest, replay

    cfg = config_file(local_env, tmp_path)
    ch = local_env.new_channel(P.PCHANNEL)
    vc = f"{ch}_{COLL}v0"
    with local_env.client() as c:
        write_wal(c, ch, scenario(vc))
    out, chk = tmp_path / "events", tmp_path / "chk"
    iargs = ns(config=cfg, channels=ch, output=str(out), format="parquet", checkpoint=str(chk),
               subscription="it-ingest26", starting="earliest", trigger="available-now", max_rows_per_trigger=None,
               dedupe=False, partition_by=None, timeout=None, progress_interval=1.0)
    s1 = ingest.run(iargs, spark)
    assert s1["rows"] == len(EXPECTED) and _ops(out) == EXPECTED

    with local_env.client() as c:
        saved = latest_position(c, ch)  # the closing TimeTick: its broker id, its _tt
        assert saved.timestamp == TT + 30
        write_wal(c, ch, [P.insert(TT + 40, [7], vc=vc), *P.upsert_txn(TT + 41, 71, [8], end="rollback"),
                          P.timetick(TT + 50)])
    pos_file = tmp_path / "pos.json"
    pos_file.write_text(json.dumps([saved.to_json_dict()]))
    s2 = ingest.run(iargs, spark)  # incremental: only the new committed row
    assert s2["rows"] == 1 and _ops(out) == [*EXPECTED, ("insert", 7, TT + 40)]
    rout = tmp_path / "replay"
    r = replay.run(ns(config=cfg, channels=ch, output=str(rout), format="parquet", mode="overwrite",
                      start="@" + str(pos_file), from_ts=None, end=None, to_ts=None, dedupe=False), spark)
    assert r["rows"] == 1 and _ops(rout) == [("insert", 7, TT + 40)]
