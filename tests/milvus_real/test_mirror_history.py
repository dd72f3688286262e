"""``--history-table`` against the real Milvus 2.3.5: the change log "as of T" equals what ``query`` returned
at T, for times the test recorded between its writes; an upsert is one ``update``. With the source option
``upsertAs=update`` (an upsert read as one ``update`` row) the mirror equals ``query`` too (#38 item 1)."""

from __future__ import annotations

import pytest

from tests.milvus_real import test_mirror
from tests.milvus_real.test_milvus_oracle import FIELDS, await_ticks, milvus_rows, pchannels
from tests.milvus_real.test_mirror import assert_table_equals_query, last_ts, run_job
from tests.milvus_real.workload import Workload, create_all_types, load_for_query, normalize

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

cfg = test_mirror.cfg  # the job's config (the cluster's MQ, milvus.address), a fixture


def test_as_of_equals_query_at_the_recorded_times(spark, milvus_stack, pymilvus_orm, cfg, tmp_path):
    from msgstream_spark.mirror.history.table import HistoryTable, as_of, scd2

    w = Workload("mir_hist", create_all_types(pymilvus_orm, "mir_hist"))
    w.insert(range(0, 200))
    load_for_query(w.collection, flushed=False)  # for the snapshot's queries
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, "mir_hist"))]
    table, hist = tmp_path / "t", tmp_path / "h"
    points: list[tuple[int, dict]] = []

    def record(pk: int) -> None:  # an insert acknowledges its timestamp (2.3.5 answers 0 for a delete)
        ts = w.insert([pk]).ts
        points.append((ts, milvus_rows(w.collection)))  # Strong, and nothing written since ts

    def job() -> None:
        await_ticks(milvus_stack, last_ts(w), pchannels(pymilvus_orm, "mir_hist"))
        run_job(spark, cfg, "mir_hist", table, "delta", "--history-table", str(hist), *chans)

    job()  # the snapshot
    w.upsert(range(10, 20), gen=1)
    w.delete(range(0, 5))
    record(1000)
    job()
    w.upsert(range(10, 15), gen=2)
    w.delete(range(15, 18))
    w.insert(range(300, 310))
    record(1001)
    w.upsert(range(300, 305), gen=1)
    w.delete([1000])
    record(1002)
    job()

    h = HistoryTable(str(hist), "pk")
    for ts, want in points:
        got = {r["pk"]: normalize({k: r.get(k) for k in FIELDS}) for r in as_of(h, ts).to_pylist()}
        assert sorted(got) == sorted(want)
        assert got == want
    ops = [(r["op"], r["pk"]) for r in h.to_arrow().to_pylist()]  # the seed's rows are all inserts
    assert sorted(pk for op, pk in ops if op == "update") == sorted([*range(10, 20), *range(10, 15), *range(300, 305)])
    assert sorted(pk for op, pk in ops if op == "delete") == [0, 1, 2, 3, 4, 15, 16, 17, 1000]
    versions = scd2(h.to_arrow(), "pk").to_pylist()
    current = {r["pk"] for r in versions if r["_is_current"]}
    assert current == set(milvus_rows(w.collection))


def test_upsert_as_update_mirror_equals_query_and_logs_one_update_per_upsert(spark, milvus_stack, pymilvus_orm, cfg,
                                                                              tmp_path):
    """``--option upsertAs=update``: the source turns each upsert (2.3.5: an Insert and a Delete of the keys at one
    timestamp) into one ``update`` row; the mirror applies it as the key's new row (before #38 it deleted the key's
    row and wrote none) and the log records one ``update`` per upsert of an existing key."""
    from collections import Counter

    from msgstream_spark.mirror.history.table import HistoryTable

    w = Workload("mir_upd", create_all_types(pymilvus_orm, "mir_upd"))
    w.insert(range(0, 300))
    load_for_query(w.collection, flushed=False)  # for the snapshot's queries
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, "mir_upd"))]
    table, hist = tmp_path / "t", tmp_path / "h"

    def job() -> None:
        await_ticks(milvus_stack, last_ts(w), pchannels(pymilvus_orm, "mir_upd"))
        run_job(spark, cfg, "mir_upd", table, "delta", "--option", "upsertAs=update", "--history-table", str(hist),
                *chans)

    job()  # the snapshot
    w.upsert(range(0, 30), gen=1)
    w.insert(range(300, 320))
    w.delete(range(290, 300))
    w.upsert(range(305, 310), gen=1)  # keys inserted after the snapshot
    job()
    w.upsert(range(10, 20), gen=2)  # a second upsert of a key: a second update
    w.upsert(range(400, 405), gen=1)  # keys nobody has: the upsert inserts them
    w.delete(range(20, 25))
    job()
    assert_table_equals_query(table, "delta", w)
    log = HistoryTable(str(hist), "pk").to_arrow().to_pylist()  # the seed (inserts at S), then the changes
    updates = Counter(r["pk"] for r in log if r["op"] == "update")
    assert updates == Counter([*range(0, 30), *range(305, 310), *range(10, 20)])
    assert sorted(r["pk"] for r in log if r["op"] == "delete") == [*range(20, 25), *range(290, 300)]
    assert sorted(r["pk"] for r in log if r["op"] == "insert") == [*range(0, 320), *range(400, 405)]  # seed: 0..299
