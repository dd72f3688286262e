"""collapse: the last change per pk by ``_seq``, whatever the arrival order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.collapse import collapse
from tests.mirror.changes import delete, insert, model, to_arrow, upsert


def _state(t: pa.Table) -> dict:
    return {r["pk"]: (r["v"], r["_ts"]) for r in t.to_pylist() if r["op"] == "insert"}


def test_upsert_repeated_pk_and_two_channels_in_opposite_order():
    msgs = [insert(10, (1, "a"), (2, "b"), (1, "a2"), (1, "a3")),
            *reversed(upsert(20, (2, "b2"))),  # the insert arrives before its delete (same ts)
            insert(40, (3, "c"), channel="chB"), delete(30, 3, channel="chA"),  # newer first, other channel
            delete(60, 4, channel="chA"), insert(50, (4, "d"), channel="chB")]
    got = collapse(to_arrow(msgs), "pk")
    assert got.column("pk").to_pylist() == [1, 2, 3, 4]
    assert got.column("op").to_pylist() == ["insert", "insert", "insert", "delete"]
    assert _state(got) == model(msgs) == {1: ("a", 10), 2: ("b2", 20), 3: ("c", 40)}
    assert got.schema == to_arrow(msgs).schema


def test_random_changes_in_any_arrival_order_equal_the_model():
    rng = np.random.default_rng(11)
    msgs = []
    for ts in range(1, 400):
        kind = rng.integers(0, 3)
        pks = [int(p) for p in rng.integers(0, 25, rng.integers(1, 5))]
        rows = [(p, f"v{ts}_{i}") for i, p in enumerate(pks)]
        msgs += [insert(ts, *rows)] if kind == 0 else [delete(ts, *pks)] if kind == 1 else upsert(ts, *rows)
    order = rng.permutation(len(msgs))
    got = collapse(to_arrow([msgs[i] for i in order]), "pk")
    assert _state(got) == model(msgs)
    assert len(set(got.column("pk").to_pylist())) == got.num_rows


def test_empty_batch_and_bad_batches():
    empty = to_arrow([])
    assert collapse(empty, "pk").num_rows == 0
    with pytest.raises(MirrorError, match=r"needs the columns \['_seq'\]"):
        collapse(to_arrow([insert(1, (1, "a"))]).drop_columns(["_seq"]), "pk")
    bad = to_arrow([insert(1, (1, "a"))])
    bad = bad.set_column(bad.schema.get_field_index("pk"), "pk", pa.array([None], pa.int64()))
    with pytest.raises(MirrorError, match="primary key column 'pk' of a change batch holds nulls"):
        collapse(bad, "pk")
