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
from msgstream_spark.mirror.snapshot.query.plan import KeyProbe, pieces
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
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
    """Skewed keys (squares of random numbers): every task gets about its share, from about one call a cut."""
    keys = [int(k) for k in np.unique(np.random.default_rng(3).integers(0, 10**12, 6_000) ** 2 // 10**9)]
    model = _model(milvus_proxy, False, keys)
    q = Querier(_target(milvus_proxy, tmp_path))
    try:
        ranges = plan_ranges(q, "pk", False, 8)
        calls = q.calls
        counts = [q.count(r.expr("pk", False)) for r in ranges]
    finally:
        q.close()
    assert sum(counts) == len(model.rows)
    assert max(counts) <= 1.5 * len(keys) / 8 + 1, counts
    assert calls <= len(ranges) + 10, (calls, len(ranges))
    assert [r.rows for r in ranges] == counts  # the plan's sizes are Milvus's counts (nothing written meanwhile)
    got = _read(_target(milvus_proxy, tmp_path), ranges, False, answer_bytes=64 << 10, row_bytes=100)
    assert sorted(got.column("pk").to_pylist()) == sorted(model.rows)


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


@pytest.mark.parametrize("string_key", [False, True], ids=["int64", "varchar"])
def test_piece_sizes_are_milvus_counts(milvus_proxy, tmp_path, string_key):
    """A piece's planned rows are Milvus's count(*) of its expression (both bounds, both key types), and the
    pieces cover every key once."""
    keys = sorted(key(i, string_key) for i in range(500))
    _model(milvus_proxy, string_key, keys)
    q = Querier(_target(milvus_proxy, tmp_path))
    try:
        got = list(pieces(KeyProbe(q, "pk", string_key), PkRange(), 60, string_key))
        for r in got:
            lo = 0 if r.lo is None else bisect.bisect_left(keys, r.lo)
            hi = len(keys) if r.hi is None else bisect.bisect_left(keys, r.hi)
            assert q.count(r.expr("pk", string_key)) == hi - lo == r.rows
    finally:
        q.close()
    assert sum(r.rows for r in got) == 500 and len(got) == 8


def test_a_collection_written_during_the_plan_and_the_read(milvus_proxy, tmp_path):
    """Rows inserted and deleted after every query, partitions named: the plan still ends, its ranges still
    cover every key once, and the read answers the collection as it is when each piece is read."""
    model = _model(milvus_proxy, False, range(0, 30_000, 3))
    before = set(model.rows)
    counter = iter(range(10**6))

    def write(_req) -> None:
        n = next(counter)
        with model.lock:
            model.put([row(k) for k in range(30_000 + n * 40, 30_040 + n * 40)])  # new keys above every key
            model.put([row(3 * k + 1) for k in range(n, 10_000, 397)], "p1")  # and among them, in p1
            model.remove(range(3 * n * 11, 3 * n * 11 + 15, 3))

    milvus_proxy.state.on_query = write
    q = Querier(_target(milvus_proxy, tmp_path))
    try:
        ranges = plan_ranges(q, "pk", False, 4, PARTITIONS)
        calls = q.calls
    finally:
        q.close()
    try:
        got = _read(_target(milvus_proxy, tmp_path), ranges, False, answer_bytes=32 << 10, row_bytes=100)
    finally:
        milvus_proxy.state.on_query = None
    assert calls <= len(ranges) + 10, (calls, len(ranges))
    for part in {r.partition for r in ranges}:
        mine = [r for r in ranges if r.partition == part]
        assert mine[0].lo is None and mine[-1].hi is None and all(a.hi == b.lo for a, b in zip(mine, mine[1:]))
    pks = got.column("pk").to_pylist()
    assert len(pks) == len(set(pks)) and set(pks) <= set(model.history)
    deleted = {k for k, changes in model.history.items() if any(r is None for _, r in changes)}
    assert before - deleted <= set(pks)  # every key there before and never deleted


def test_calls_read_at_s_not_at_the_proxys_now(milvus_proxy, tmp_path):
    """With S set (``floor_ts``), every call carries S as its guarantee timestamp (Customized): Milvus reads at
    a time >= S, the model at S exactly (the oldest allowed); without S, Strong: a write just done is seen.
    The reader sent consistency level 2 as "Strong" before: Bounded, which on the real 2.3.5 missed an insert
    done just before the query."""
    model = _model(milvus_proxy, False, range(100))
    s = tso_now()
    with model.lock:
        model.put([row(k) for k in range(100, 150)])
    at_s = Querier(QueryTarget(_target(milvus_proxy, tmp_path).settings, NAME, CID, floor_ts=s))
    now = Querier(_target(milvus_proxy, tmp_path))
    try:
        assert at_s.count("pk >= 0") == 100 and now.count("pk >= 0") == 150
        assert at_s.smallest_keys("pk >= 98", "pk", [], 5) == [98, 99]
    finally:
        at_s.close()
        now.close()
