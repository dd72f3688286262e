"""How the storage snapshot groups binlogs into units and tasks, and keeps one row per key in a unit.

The stats logs' JSON is shaped as Milvus 2.3.5 writes it (``PrimaryKeyStats`` of ``internal/storage/stats.go``:
one object per flush, a list in the compound log ``.../1``; legacy ``min``/``max`` beside ``minPk``/``maxPk``),
as read from the real server's files in tests/milvus_real/test_mirror_storage.py.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.order import seq_array
from msgstream_spark.mirror.snapshot.storage.plan import ReadTask, StoragePlan
from msgstream_spark.mirror.snapshot.storage.reader import _Kept, _one_per_key
from msgstream_spark.mirror.snapshot.storage.units import Bounds, _stats_bounds, pack


def _task(seg: int, ch: str, rows: int = 10, index: int = 0) -> ReadTask:
    return ReadTask(seg, 1, ch, 99, index, 0, rows, ((1, f"insert_log/{seg}/1/{index}"),))


def _plan(*tasks: ReadTask) -> StoragePlan:
    return StoragePlan(7, 1, {}, list(tasks), segments=sorted({t.segment for t in tasks}))


def test_stats_bounds_of_an_object_a_compound_list_and_varchar_keys():
    one = {"fieldID": 100, "max": 0, "min": 0, "bf": {"m": 8, "k": 1, "b": "AA=="}, "pkType": 5, "maxPk": 19999,
           "minPk": 3}
    assert _stats_bounds(json.dumps(one).encode(), "s") == Bounds(3, 19999)
    two = [dict(one, minPk=20002, maxPk=84997), dict(one, minPk=85000, maxPk=149999)]
    assert _stats_bounds(json.dumps(two).encode(), "s") == Bounds(20002, 149999)
    legacy = {"fieldID": 100, "max": 50, "min": 4}
    assert _stats_bounds(json.dumps(legacy).encode(), "s") == Bounds(4, 50)
    text = {"fieldID": 100, "pkType": 21, "maxPk": "k9", "minPk": "k10"}
    assert _stats_bounds(json.dumps(text).encode(), "s") == Bounds("k10", "k9")
    assert not _stats_bounds(json.dumps({"fieldID": 100}).encode(), "s").known
    with pytest.raises(MirrorError, match="stats log s"):
        _stats_bounds(b"\x00not json", "s")


def test_overlapping_segments_of_one_channel_are_one_unit_and_no_key_pass():
    a, b, c = _task(1, "ch0"), _task(2, "ch0"), _task(3, "ch0")
    d, e = _task(4, "ch1"), _task(5, "ch1")
    bounds = {1: Bounds(0, 10), 2: Bounds(5, 20), 3: Bounds(21, 30), 4: Bounds(0, 10), 5: Bounds(100, 200)}
    p = pack(_plan(a, b, c, d, e), bounds, parallelism=8)
    units = sorted(sorted(t.segment for t in u.tasks) for ts in p.tasks for u in ts)
    assert units == [[1, 2], [3], [4], [5]] and p.key_pass == []
    # a segment without stats may share keys with any segment of its channel, never with another channel's
    p = pack(_plan(a, b, c, d, e), {**bounds, 3: Bounds()}, parallelism=8)
    assert sorted(sorted(t.segment for t in u.tasks) for ts in p.tasks for u in ts) == [[1, 2, 3], [4], [5]]


def test_a_unit_too_large_is_split_by_segment_behind_a_key_pass():
    a, b, c = _task(1, "ch0", 600), _task(2, "ch0", 600), _task(3, "ch0", 600)
    p = pack(_plan(a, b, c), {1: Bounds(0, 10), 2: Bounds(5, 20), 3: Bounds(40, 50)}, 8, max_unit_rows=1000)
    assert sorted(t.segment for t in p.key_pass) == [1, 2]
    assert sorted(sorted(t.segment for t in u.tasks) for ts in p.tasks for u in ts) == [[1], [2], [3]]


def test_tasks_are_about_the_cores_unless_the_binlogs_are_large():
    tasks = [_task(s, "ch0", 100) for s in range(10)]
    bounds = {s: Bounds(s * 10, s * 10 + 9) for s in range(10)}
    p = pack(_plan(*tasks), bounds, parallelism=2)
    assert len(p.tasks) == 2 and sorted(len(b) for b in p.tasks) == [5, 5]
    p = pack(_plan(*tasks), bounds, parallelism=2, task_bytes=100 * 64 * 3)
    assert len(p.tasks) == 4


def test_one_row_per_key_across_a_unit_keeps_the_largest_seq():
    def kept(seg: int, keys: list[int], ts: list[int]) -> _Kept:
        idx = np.arange(len(keys))
        t = _task(seg, "ch0", len(keys))
        return _Kept(t, idx, np.array(ts, np.uint64), pa.array(keys, pa.int64()),
                     seq_array(np.array(ts, np.uint64), "insert", row=idx.astype(np.int64)))

    first, second = kept(1, [1, 2, 3, 2], [10, 10, 10, 11]), kept(2, [3, 4], [12, 5])
    out = _one_per_key([first, second])
    assert [k.pks.to_pylist() for k in out] == [[1, 2], [3, 4]]
    assert out[0].idx.tolist() == [0, 3] and out[0].ts.tolist() == [10, 11]
    same = [kept(1, [5, 6], [1, 1])]
    assert _one_per_key(same)[0] is same[0]  # no repeated key: nothing copied
    unordered = [kept(1, [9, 5, 7], [1, 1, 1]), kept(2, [8, 6], [2, 2])]
    assert [k.pks.to_pylist() for k in _one_per_key(unordered)] == [[9, 5, 7], [8, 6]]
    again = [kept(1, [5, 6, 7], [1, 1, 1]), kept(2, [7, 8], [2, 2])]  # in order but for the repeated key
    assert [k.pks.to_pylist() for k in _one_per_key(again)] == [[5, 6], [7, 8]]


def test_an_empty_plan_still_has_one_task_for_the_empty_file():
    assert pack(_plan(), {}, parallelism=4).tasks == [[]]
