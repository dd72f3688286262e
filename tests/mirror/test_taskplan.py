"""The Spark path's two stages without Spark: writing tasks keep their narrow rows in changes files, planning
tasks each take the changes of some keys (as the shuffle by key hands them), look them up and return deleted
positions; the driver merges the tasks' rows into one commit. A key in two writing tasks, a table file whose
rows are deleted by two planning tasks, and the `existed` answers the history needs."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from msgstream_spark.mirror import open_table
from msgstream_spark.mirror.store.parquet import read_parquet
from msgstream_spark.mirror.write.batch import commit_plan
from msgstream_spark.mirror.write.layout import TaskWriter
from msgstream_spark.mirror.write.taskplan import (
    ChangesFile,
    changes_count,
    changes_dir,
    changes_files,
    existed_keys,
    merge_plans,
    plan_share,
)
from tests.mirror.changes import FIELDS, delete, insert, model, table_state, to_arrow, upsert


def _write(spec, at: str, chunks: list) -> pa.Table:
    """One writing task: its chunks through a TaskWriter, narrow rows into its changes file; its output rows."""
    w, ch = TaskWriter(spec), ChangesFile(spec.store(), at, spec.key_type)
    for c in chunks:
        ch.add(w.add(to_arrow(c)))
    return ch.close(w.close())


def _plan_by_key_parity(t, written: pa.Table, existed: bool = False) -> pa.Table:
    """Two planning tasks: even keys and odd keys (every change of a key in one task, as a shuffle by key)."""
    narrow = pa.concat_tables([read_parquet(t.store, p) for p in changes_files(written)])
    odd = pc.equal(pc.bit_wise_and(narrow.column("key"), 1), 1)
    files = t.live_files()
    return pa.concat_tables([plan_share(narrow.filter(pc.invert(odd)), files, t.pk, pa.int64(), existed),
                             plan_share(narrow.filter(odd), files, t.pk, pa.int64(), existed)])


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_two_writing_and_two_planning_tasks_commit_the_model(fmt, tmp_path):
    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    first = [insert(10, (1, "a"), (2, "b"), (3, "c"), (4, "d"))]
    at = changes_dir(t.write_spec().data_dir, "q/1", 0)
    written = _write(t.write_spec(), at, [first])
    assert changes_count(written) == 4 and at.endswith("_changes/q_1-0")
    assert commit_plan(t, merge_plans(written, _plan_by_key_parity(t, written)), set(), query_id="q",
                       batch_id=0) is not None
    # batch 1: key 1 in both writing tasks (the newer in the second), keys 1..4 of the one table file changed
    # by both planning tasks (odd and even keys): its deleted positions come from two tasks and are united
    chunks1 = [[*upsert(30, (1, "a-old")), delete(31, 2)], [insert(35, (5, "e"))]]
    chunks2 = [[insert(40, (1, "a-new"), (4, "d2"))]]
    at = changes_dir(t.write_spec().data_dir, "q", 1)
    written = pa.concat_tables([_write(t.write_spec(), at, chunks1), _write(t.write_spec(), at, chunks2)])
    planned = _plan_by_key_parity(t, written, existed=True)
    plan = merge_plans(written, planned)
    table_file = [f.path for f in t.live_files()]
    assert len(table_file) == 1 and sorted(plan.deletes[table_file[0]].tolist()) == [0, 1, 3]  # keys 1, 2, 4
    assert sorted(existed_keys(planned).column("key").to_pylist()) == [1, 2, 4]
    assert plan.rows == 4  # 1 (newest of two tasks), delete 2, insert 5, update 4
    assert commit_plan(t, plan, {7}, query_id="q", batch_id=1) is not None  # collection ids: no id on the table
    want = model(first + [m for c in chunks1 + chunks2 for m in c])
    assert table_state(t.to_arrow()) == want == {1: ("a-new", 40), 3: ("c", 10), 4: ("d2", 40), 5: ("e", 35)}
    assert commit_plan(t, plan, set(), query_id="q", batch_id=1) is None  # the batch is in the table: skipped


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_the_tasks_plan_is_fenced_at_the_files_they_looked_up(fmt, tmp_path):
    """#38 item 3 on the Spark path: the planning tasks look up the live files the driver broadcast; their
    version is the plan's base, and a commit by another writer in between refuses the batch."""
    from msgstream_spark.errors import MirrorError
    from msgstream_spark.mirror import apply_batch

    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    first = [insert(10, (1, "a"), (2, "b"))]
    assert apply_batch(t, to_arrow(first), "pk", "q", 0)
    mine = [*upsert(30, (1, "mine"))]
    written = _write(t.write_spec(), changes_dir(t.write_spec().data_dir, "q", 1), [mine])
    files = t.live_files()
    p = merge_plans(written, _plan_by_key_parity(t, written), files.version)
    assert p.base == files.version is not None
    theirs = [*upsert(20, (1, "theirs"))]  # another query's batch between the lookup and the commit
    assert apply_batch(open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk"), to_arrow(theirs), "pk",
                       "other", 0)
    with pytest.raises(MirrorError, match="which batch 1 of query q was planned on"):
        commit_plan(t, p, set(), query_id="q", batch_id=1)
    assert table_state(t.to_arrow()) == model(first + theirs)


def test_a_batch_skipped_on_re_run_removes_its_changes_directory(tmp_path):
    """#38 item 7: a driver killed after a batch's table commit and before it removed the batch's changes files:
    the re-run skips the batch (it is in the table) and removes them."""
    import os

    from msgstream_spark.mirror import apply_batch
    from msgstream_spark.spark.mirror import MirrorBatch

    t = open_table("delta", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    batch = [insert(10, (1, "a"), (2, "b"))]
    at = changes_dir(t.write_spec().data_dir, "q", 0)
    _write(t.write_spec(), at, [batch])  # what the killed run's writing tasks left
    assert apply_batch(t, to_arrow(batch), "pk", "q", 0)  # its commit survived the kill
    assert os.listdir(at)
    sink = MirrorBatch(t, "pk", query_id="q")
    sink(None, 0)  # the re-run hands Spark's batch 0 again (the skip reads no row of it)
    assert sink.skipped == 1 and sink.batches == 0
    assert not os.path.exists(at) and table_state(t.to_arrow()) == model(batch)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_files_of_task_results_the_driver_never_got_are_deleted(kind, tmp_path, request):
    """A writing task that finished its data file (and key index) on an executor that died before its result
    reached the driver is run again; the lost attempt's file is in no commit and the driver deletes it once the
    batch is committed, with its key index; the kept files stay, ``mirror orphans`` finds nothing. A batch run
    again after a killed driver drops every file its earlier attempts claimed (none of them is committed)."""
    from msgstream_spark.mirror.maintenance import orphans
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.mirror.write.keyindex import side_path
    from msgstream_spark.mirror.write.taskplan import claims_dir, data_files, drop_lost_files, remove_changes

    opts = None
    loc = str(tmp_path / "t")
    if kind == "s3":
        s3 = request.getfixturevalue("s3")
        opts, loc = s3.options(), s3.uri("lake", "t")
    t = open_table("delta", loc, collection="coll", pk="pk", arrow_schema=FIELDS, storage_options=opts)
    spec = t.write_spec()
    store = open_store(loc, opts, env={})

    def task(at: str, chunk: list) -> pa.Table:
        w, ch = TaskWriter(spec, claims=claims_dir(at)), ChangesFile(spec.store(), at, spec.key_type)
        ch.add(w.add(to_arrow(chunk)))
        return ch.close(w.close())

    # a driver killed before batch 0's commit: its re-run finds the claimed file and drops it
    at0 = changes_dir(spec.data_dir, "q", 0)
    killed = data_files(task(at0, [insert(5, (9, "z"))]))
    assert store.head(killed[0]) is not None and store.head(side_path(killed[0])) is not None
    assert drop_lost_files(store, at0, spec.data_dir) == killed
    assert store.head(killed[0]) is None and store.head(side_path(killed[0])) is None
    remove_changes(store, at0)

    batch = [insert(10, (1, "a"), (2, "b")), insert(11, (3, "c"))]
    kept = task(at0, batch[:1])
    lost = task(at0, batch[1:])  # the task's result never reached the driver: it is run again
    again = task(at0, batch[1:])
    written = pa.concat_tables([kept, again])
    lost_file = data_files(lost)
    assert commit_plan(t, merge_plans(written, _plan_by_key_parity(t, written)), set(), query_id="q",
                       batch_id=0) is not None
    assert [p for p in orphans(t) if "/_changes/" not in p] == lost_file  # what it was left as before #41
    assert drop_lost_files(store, at0, spec.data_dir, written) == lost_file
    assert store.head(lost_file[0]) is None and store.head(side_path(lost_file[0])) is None
    assert all(store.head(p) is not None for p in data_files(written))
    remove_changes(store, at0)
    assert orphans(t) == [] and table_state(t.to_arrow()) == model(batch)
