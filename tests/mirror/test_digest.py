"""The verify digests: equal rows hash equally across Arrow types, every fault kind is named, a duplicate
shows in the sum (an XOR would cancel it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror.verify.compare import compare, hashed_columns, reduce_side, split_flux
from msgstream_spark.mirror.verify.digest import Digest, column_hash, key_hashes, row_hashes


def _table(pks, ints=None, lists=pa.list_, strings=None) -> pa.Table:
    ints, strings = ints or pa.int8(), strings or pa.string()
    n = len(pks)
    return pa.table({
        "pk": pa.array(pks, pa.int64()),
        "i": pa.array([p % 100 for p in pks], ints),
        "s": pa.array([f"s{p}" if p % 7 else None for p in pks], strings),
        "j": pa.array(['{"b": 1, "a": [1, 2]}' if p % 2 else None for p in pks], strings),
        "fv": pa.array([[float(p), 0.5, -1.0] for p in pks], lists(pa.float32())),
        "_ts": pa.array(np.arange(n), pa.int64()),  # not hashed: the table's _ts is the change's, Milvus's is S
        "_partition": pa.array([None] * n, pa.int64()),
    })


def _reduce(t: pa.Table, buckets: int = 8):
    return reduce_side(iter(t.to_batches(max_chunksize=37)), "pk", hashed_columns(t.schema, False), ["j"], buckets,
                       False)


def test_equal_rows_hash_equally_across_arrow_types():
    a = _table(list(range(200)))
    b = _table(list(range(200)), ints=pa.int32(), lists=pa.large_list, strings=pa.large_string())
    b = b.set_column(3, "j", pa.array(['{"a":[1,2],"b":1}' if p % 2 else "{}" for p in range(200)]))
    b = b.set_column(5, "_ts", pa.array(np.full(200, 99), pa.int64()))
    cols = hashed_columns(a.schema, False)
    assert (row_hashes(a, cols, ["j"]) == row_hashes(b, cols, ["j"])).all()
    assert _reduce(a).digest.differing(_reduce(b.take(np.arange(199, -1, -1))).digest) == []


def test_each_fault_kind_is_named():
    base = _table(list(range(300)))
    fv = base.column("fv").to_pylist()
    v = np.asarray(fv[22], np.float32)
    v.view(np.uint32)[1] ^= 1  # one bit of one float
    fv[22] = v.tolist()
    bad = base.set_column(4, "fv", pa.array(fv, pa.list_(pa.float32())))
    bad = bad.filter(pa.array([p != 13 for p in range(300)]))  # row 13 deleted
    bad = pa.concat_tables([bad, base.slice(31, 1), _table([900])])  # row 31 twice, a key Milvus lacks
    problems, differing = compare(_reduce(base), _reduce(bad))
    assert {(p["kind"], p["pk"]) for p in problems} == {("missing", 13), ("stale", 22), ("duplicated", 31),
                                                        ("extra", 900)}
    assert 1 <= differing <= 4
    errors, flux = split_flux(problems, {13, 900})
    assert {p["pk"] for p in errors} == {22, 31} and {(p["pk"], p["was"]) for p in flux} == {(13, "missing"),
                                                                                             (900, "extra")}


def test_a_duplicate_changes_the_sum_where_xor_would_cancel():
    t = _table([1, 2, 3])
    twice = pa.concat_tables([t, t.slice(0, 1), t.slice(0, 1)])  # row 1 three times: XOR of two copies cancels
    d1, d2 = Digest(1), Digest(1)
    cols = hashed_columns(t.schema, False)
    for d, x in ((d1, t), (d2, twice)):
        d.add(None, key_hashes(x.column("pk")) % np.uint64(1), row_hashes(x, cols, ["j"]))
    assert d1.differing(d2) == [(None, 0)] and d2.counts[(None, 0)] == 5


def test_one_changed_byte_changes_the_hash_and_nulls_differ_from_empty():
    h = column_hash(pa.array(["abc", "abd", "", None, "acb"]))
    assert len(set(h.tolist())) == 5
    lists = column_hash(pa.array([[1.0], [1.0, 0.0], [], None], pa.list_(pa.float32())))
    assert len(set(lists.tolist())) == 4
