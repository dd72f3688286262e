"""The snapshot's plan (mirror/snapshot/query/plan.py) without Spark or a server: call counts and balance on
Int64 and VarChar keys, uniform, skewed and clustered, a collection written during the plan, ten million keys.

The probe answers as Milvus does where the plan depends on it: ``count(*)`` of a range's expression, and a
``limit`` query's smallest matching keys in key order (seen on the real 2.3.5; tests/milvus_real checks it,
tests/mq_milvus runs the same plan through the suite's proxy model over gRPC).
"""

from __future__ import annotations

import numpy as np
import pytest

from msgstream_spark.mirror.snapshot.query.plan import pieces
from msgstream_spark.mirror.snapshot.query.ranges import PkRange


class SortedKeys:
    """Milvus's two answers over a sorted list of keys (a NumPy array for Int64 keys); ``on_call`` runs
    after every answer (a collection written during the plan)."""

    def __init__(self, keys, on_call=None) -> None:
        self.keys = np.asarray(sorted(keys)) if not isinstance(keys, np.ndarray) else keys
        self.calls = 0
        self.on_call = on_call

    def _span(self, r: PkRange) -> tuple[int, int]:
        lo = 0 if r.lo is None else int(np.searchsorted(self.keys, r.lo, "right" if r.after else "left"))
        hi = len(self.keys) if r.hi is None else int(np.searchsorted(self.keys, r.hi, "left"))
        return lo, max(lo, hi)

    def _answered(self, value):
        self.calls += 1
        if self.on_call is not None:
            self.on_call(self)
        return value

    def count(self, r: PkRange) -> int:
        lo, hi = self._span(r)
        return self._answered(hi - lo)

    def smallest(self, r: PkRange, limit: int) -> list:
        lo, hi = self._span(r)
        return self._answered([k.item() for k in self.keys[lo:min(hi, lo + limit)]])


def _check(probe: SortedKeys, got: list[PkRange], want: int, slack: float = 0.5) -> list[int]:
    """The pieces cover every key once, in order; each holds ``want`` rows give or take ``slack``."""
    assert got[0].lo is None and got[-1].hi is None
    assert all(a.hi == b.lo and a.hi is not None for a, b in zip(got, got[1:]))
    real = [hi - lo for lo, hi in map(probe._span, got)]
    assert sum(real) == len(probe.keys)
    assert all((1 - slack) * want <= n <= (1 + slack) * want for n in real[:-1]), (real, want)
    return real


N = 200_000
_rng = np.random.default_rng(7)
INT_KEYS = {
    "dense": lambda: np.arange(N),
    "offset": lambda: np.arange(10**15, 10**15 + N),
    "random64": lambda: np.unique(_rng.integers(-(2**63), 2**63 - 1, N, dtype=np.int64)),
    "auto_id": lambda: 449_000_000_000_000_000 + np.cumsum(_rng.integers(1, 40, N)),
    "squares": lambda: np.arange(N, dtype=np.int64) ** 2,
    "two_clusters": lambda: np.concatenate([np.arange(N // 2), np.arange(10**15, 10**15 + N // 2)]),
    "skewed_clusters": lambda: np.concatenate([np.arange(1000), np.arange(10**9, 10**9 + 150_000),
                                               np.arange(5 * 10**17, 5 * 10**17 + 49_000)]),
}


@pytest.mark.parametrize("tasks", [2, 8])
@pytest.mark.parametrize("dist", sorted(INT_KEYS))
def test_int64_plans_cost_about_a_call_per_range(dist, tasks):
    probe = SortedKeys(INT_KEYS[dist]())
    want = -(-len(probe.keys) // tasks)
    got = list(pieces(probe, PkRange(), want, False))
    _check(probe, got, want)
    assert len(got) == tasks
    assert probe.calls <= len(got) + 10, (probe.calls, len(got))


def _strings(n: int = 40_000) -> dict[str, list[str]]:
    rng = np.random.default_rng(11)
    return {"doc_000123": [f"doc_{i:06d}" for i in range(n)],
            "hex": sorted({f"{int(x):032x}" for x in rng.integers(0, 2**62, n)}),
            "user-123": sorted({f"user-{int(x)}" for x in rng.integers(0, 10**9, n)}),
            "mixed, outside the BMP": sorted({f"{p}{i}" for i in range(n // 4)
                                              for p in ("a", "zz", "é", "\U0001F600")})}


@pytest.mark.parametrize("tasks", [2, 8])
def test_varchar_plans(tasks):
    """VarChar keys spread over few of Unicode's characters: the plan interpolates in the characters it saw."""
    for name, keys in _strings().items():
        probe = SortedKeys(keys)
        want = -(-len(keys) // tasks)
        got = list(pieces(probe, PkRange(), want, True))
        _check(probe, got, want)
        assert probe.calls <= 2 * len(got) + 10, (name, probe.calls, len(got))


def test_a_range_with_both_bounds_is_cut_without_a_limit_query():
    """A task's range (both bounds from the plan, its rows known) is cut by counts alone."""
    probe = SortedKeys(np.arange(0, 3_000_000, 3))
    got = list(pieces(probe, PkRange(300_000, 2_400_000), 50_000, False, rows=700_000))
    assert len(got) == 14 and got[0].lo == 300_000 and got[-1].hi == 2_400_000
    assert all(a.hi == b.lo for a, b in zip(got, got[1:]))
    assert probe.calls <= len(got) + 2, probe.calls
    assert max(abs(r.rows - 50_000) for r in got) <= 0.25 * 50_000


def test_small_ranges_cost_nothing_or_one_query():
    probe = SortedKeys(np.arange(100))
    assert list(pieces(probe, PkRange(), 1000, False, rows=100)) == [PkRange(rows=100)]
    assert probe.calls == 0
    got = list(pieces(probe, PkRange(), 10, False, rows=100))  # every key in one limit query: cuts exact
    assert [r.rows for r in got] == [10] * 10 and probe.calls == 1


@pytest.mark.parametrize("where", ["above", "among", "deleted"])
def test_a_collection_written_during_the_plan(where):
    """Rows written or deleted after every call: the plan ends within its bound and its pieces still cover
    every key exactly (their sizes are estimates; what is read is decided by the bounds alone)."""
    keys = np.arange(0, 150_000, 3)
    step = iter(range(10**6))

    def write(p: SortedKeys) -> None:
        n = next(step)
        if where == "above":  # an auto-id collection taking inserts
            p.keys = np.concatenate([p.keys, np.arange(150_000 + n * 1000, 151_000 + n * 1000)])
        elif where == "among":
            p.keys = np.union1d(p.keys, np.arange(1 + n, 150_000, 97))
        else:
            p.keys = np.delete(p.keys, np.arange(n * 100, n * 100 + 900))

    probe = SortedKeys(keys, on_call=write)
    got = list(pieces(probe, PkRange(), 5_000, False))
    assert probe.calls <= len(got) + 10, (probe.calls, len(got))
    assert got[0].lo is None and got[-1].hi is None and all(a.hi == b.lo for a, b in zip(got, got[1:]))
    lo_hi = [probe._span(r) for r in got]
    assert sum(hi - lo for lo, hi in lo_hi) == len(probe.keys)


def test_ten_million_keys_in_answer_sized_pieces():
    """A task's share of a large collection: pieces found one call each, in well under a second of Python."""
    probe = SortedKeys(np.sort(np.random.default_rng(1).integers(-(2**62), 2**62, 10_000_000)))
    got = list(pieces(probe, PkRange(), 30_000, False, tolerance=0.25))
    _check(probe, got, 30_000)
    assert len(got) == 333 and probe.calls <= len(got) + 10
