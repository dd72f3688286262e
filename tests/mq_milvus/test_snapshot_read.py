"""The snapshot's read (mirror/snapshot/query/reader.py, query.py, answer.py) against the suite's proxy, without Spark.

The proxy's ``Query`` answers from a model of the collection (tests/milvus_proxy/query.py) that follows
Milvus where the reader's behaviour depends on it: a ``limit`` query answers the smallest keys, the
``collection_id`` parameter is checked, an iterator query with a ``guarantee_timestamp`` reads the rows
as of that time (MVCC) and stops merging when one shard's rows run out, string literals are unquoted as
Go does (surrogate escapes refused), answers above ``maxOutputSize`` are refused.
"""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.snapshot.handover import probe_pin
from msgstream_spark.mirror.snapshot.query.ranges import PkRange, cut_by_count
from msgstream_spark.mirror.snapshot.query.reader import RangeReader, plan_ranges
from msgstream_spark.mirror.snapshot.query.rpc import CollectionChanged, Querier, QueryTarget
from msgstream_spark.mq.milvus.settings import MilvusSettings
from msgstream_spark.msg.schema import collection_arrow_schema
from tests.fixtures.milvus_env import milvus_config
from tests.milvus_proxy.wal import tso_now
from tests.mq_milvus.collection_log import CID, NAME, PARTITIONS, collection_schema, key, row

pytestmark = pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")


def _target(proxy, tmp_path, cid: int = CID, pin_ts: int = 0) -> QueryTarget:
    return QueryTarget(MilvusSettings(milvus_config(proxy.address, tmp_path)), NAME, cid, pin_ts)


def _model(proxy, string_key: bool, keys, schema=None):
    m = proxy.state.add_model("default", NAME, CID, ["dml_0"], [f"dml_0_{CID}v0"],
                              schema or collection_schema(string_key), PARTITIONS)
    with m.lock:
        m.put(row(k) for k in keys)
    return m


def _read(target: QueryTarget, ranges, string_key: bool, schema=None, **kw) -> pa.Table:
    arrow = table_schema(collection_arrow_schema(schema or collection_schema(string_key)), "pk")
    reader = RangeReader(target, "pk", string_key, arrow, 1, **kw)
    return pa.Table.from_batches(list(reader.read(ranges)), schema=arrow)


def test_plan_spreads_rows_over_tasks(milvus_proxy, tmp_path):
    """A ``limit`` query answers the smallest keys: a plan from it put ~all rows in one range. The plan
    from counts gives every task about its share."""
    keys = [int(k) for k in np.unique(np.random.default_rng(3).integers(0, 10**12, 6_000) ** 2 // 10**9)]
    model = _model(milvus_proxy, False, keys)
    q = Querier(_target(milvus_proxy, tmp_path))
    try:
        ranges = plan_ranges(q, "pk", False, 8)
        counts = [q.count(r.expr("pk", False)) for r in ranges]
    finally:
        q.close()
    assert sum(counts) == len(model.rows)
    assert max(counts) <= 2 * len(keys) / 8 + 1, counts
    got = _read(_target(milvus_proxy, tmp_path), ranges, False, answer_bytes=64 << 10, row_bytes=100)
    assert sorted(got.column("pk").to_pylist()) == sorted(model.rows)


def test_cut_by_count_is_iterative_on_ten_million_keys():
    """The old split recursed once per 8,192 rows (RecursionError near 8M rows in one range)."""
    keys = np.sort(np.random.default_rng(1).integers(-(2**62), 2**62, 10_000_000))

    def count(r: PkRange) -> int:
        lo = 0 if r.lo is None else int(np.searchsorted(keys, r.lo, "right" if r.after else "left"))
        hi = len(keys) if r.hi is None else int(np.searchsorted(keys, r.hi, "left"))
        return hi - lo

    pieces = list(cut_by_count(PkRange(), len(keys), 50_000, count, False))
    assert all(p.rows <= 50_000 for p in pieces)
    assert sum(count(p) for p in pieces) == len(keys)
    assert all(a.hi == b.lo for a, b in zip(pieces, pieces[1:])) and pieces[0].lo is None and pieces[-1].hi is None


def test_answers_refused_as_too_large_are_halved(milvus_proxy, tmp_path):
    model = _model(milvus_proxy, False, range(2000))
    milvus_proxy.state.max_output_bytes = 6000
    try:
        got = _read(_target(milvus_proxy, tmp_path), [PkRange()], False, answer_bytes=8 << 20, row_bytes=100)
    finally:
        milvus_proxy.state.max_output_bytes = 0
    assert sorted(got.column("pk").to_pylist()) == sorted(model.rows)
    assert any("exceed" not in e for e, _, _ in milvus_proxy.state.queries)


def test_varchar_keys_outside_the_bmp(milvus_proxy, tmp_path):
    """Bounds are Milvus string literals: json.dumps wrote surrogate escapes that Milvus's parser refuses."""
    keys = [f"{p}{i}" for i in range(300) for p in ("k", "\U0001F600", "é", '"', "\\", "\U00010348")]
    model = _model(milvus_proxy, True, keys)
    q = Querier(_target(milvus_proxy, tmp_path))
    try:
        ranges = plan_ranges(q, "pk", True, 5, PARTITIONS)
    finally:
        q.close()
    got = _read(_target(milvus_proxy, tmp_path), ranges, True, answer_bytes=16 << 10, row_bytes=100)
    assert sorted(got.column("pk").to_pylist()) == sorted(model.rows)
    assert any("\U0001F600" in e for e, _, _ in milvus_proxy.state.queries)


def test_a_recreated_collection_fails_the_read(milvus_proxy, tmp_path):
    _model(milvus_proxy, False, range(50))
    q = Querier(_target(milvus_proxy, tmp_path))
    try:
        ranges = plan_ranges(q, "pk", False, 2)
    finally:
        q.close()
    _model(milvus_proxy, False, range(50, 80)).collection_id = CID + 1  # dropped, re-created under the name
    milvus_proxy.state.collections[("default", NAME)] = (CID + 1, ["dml_0"], [f"dml_0_{CID + 1}v0"])
    with pytest.raises(CollectionChanged, match="dropped and re-created"):
        _read(_target(milvus_proxy, tmp_path), ranges, False)


def test_a_range_that_shrinks_is_read_as_it_is(milvus_proxy, tmp_path):
    model = _model(milvus_proxy, False, range(3000))
    q = Querier(_target(milvus_proxy, tmp_path))
    try:
        ranges = plan_ranges(q, "pk", False, 2)
    finally:
        q.close()
    with model.lock:
        model.remove(range(0, 3000, 3))
    got = _read(_target(milvus_proxy, tmp_path), ranges, False, answer_bytes=32 << 10, row_bytes=100)
    assert sorted(got.column("pk").to_pylist()) == sorted(model.rows)


@pytest.mark.parametrize("string_key", [False, True], ids=["int64", "varchar"])
def test_pinned_read_is_the_collection_at_s(milvus_proxy, tmp_path, string_key):
    """Writes between the snapshot's queries: a pinned read (iterator + guarantee_timestamp=S) answers the
    rows as of S, across the model's two shards (Milvus stops an iterator's merge when a shard runs out)."""
    model = _model(milvus_proxy, string_key, [key(i, string_key) for i in range(1200)])
    s = tso_now()
    counter = iter(range(10**6))

    def write(_req) -> None:  # after every query: an upsert, a delete and a new key, each after S
        n = next(counter)
        with model.lock:
            model.put([row(key(n % 1200, string_key), gen=1), row(key(5000 + n, string_key))])
            model.remove([key((n * 7 + 3) % 1200, string_key)])

    q = Querier(_target(milvus_proxy, tmp_path))
    try:
        assert probe_pin(q, type("Info", (), {"pk": "pk", "pk_is_string": string_key})())
        ranges = plan_ranges(q, "pk", string_key, 3, PARTITIONS)
    finally:
        q.close()
    milvus_proxy.state.on_query = write
    try:
        pinned = _read(_target(milvus_proxy, tmp_path, pin_ts=s), ranges, string_key, answer_bytes=8 << 10,
                       row_bytes=100)
        unpinned = _read(_target(milvus_proxy, tmp_path), ranges, string_key, answer_bytes=8 << 10, row_bytes=100)
    finally:
        milvus_proxy.state.on_query = None
    at_s = model.rows_at(s)
    got = {r["pk"]: r["s"] for r in pinned.select(["pk", "s"]).to_pylist()}
    assert got == {k: v["s"] for k, v in at_s.items()}
    assert pinned.num_rows == len(at_s)
    assert {r["pk"] for r in unpinned.select(["pk"]).to_pylist()} != set(at_s)  # the writes were seen unpinned


def test_bisect_counts_agree_with_the_model(milvus_proxy, tmp_path):
    """The count of a cut range is Milvus's count(*) of its expression (both bounds, both key types)."""
    keys = sorted(f"k{i}" for i in range(500))
    _model(milvus_proxy, True, keys)
    q = Querier(_target(milvus_proxy, tmp_path))
    try:
        for r in cut_by_count(PkRange(), 500, 60, lambda r: q.count(r.expr("pk", True)), True):
            lo = 0 if r.lo is None else bisect.bisect_left(keys, r.lo)
            hi = len(keys) if r.hi is None else bisect.bisect_left(keys, r.hi)
            assert q.count(r.expr("pk", True)) == hi - lo
    finally:
        q.close()
