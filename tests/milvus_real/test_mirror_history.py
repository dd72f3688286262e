"""``--history-table`` against the real Milvus 2.3.5: the change log "as of T" equals what ``query`` returned
at T, for times the test recorded between its writes; an upsert is one ``update``."""

from __future__ import annotations

import pytest

from tests.milvus_real import test_mirror
from tests.milvus_real.test_milvus_oracle import FIELDS, await_ticks, milvus_rows, pchannels
from tests.milvus_real.test_mirror import last_ts, run_job
from tests.milvus_real.workload import Workload, create_all_types, load_for_query, normalize

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

cfg = test_mirror.cfg  # the job's config (the cluster's MQ, milvus.address), a fixture


def test_as_of_equals_query_at_the_recorded_times(spark, milvus_stack, pymilvus_orm, cfg, tmp_path):
    from msgstream_spark.mirror.trust.history import HistoryTable, as_of, scd2

    w = Workload("mir_hist", create_all_types(pymilvus_orm, "mir_hist"))
    w.insert(range(0, 200))
    load_for_query(w.collection)
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
