"""Issue #38 item 1: a change whose ``op`` is ``update`` (a Milvus upsert read with the source option
``upsertAs=update``) is the key's new version in every write path: the Spark path's two stages (writing tasks,
planning tasks, the driver's commit) run here without Spark, the library's ``apply_batch`` and the change log.
An op outside insert/update/delete fails the batch with a MirrorError naming it, and nothing is committed.

The ``update`` rows are made by the source's own pairing (``source.upserts.pair``) from the Insert and Delete
messages Milvus 2.3.5 writes for an upsert, not written by hand."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.history.table import history_rows
from msgstream_spark.mirror.write.batch import commit_plan, lookup_local
from msgstream_spark.mirror.write.layout import TaskWriter, plan
from msgstream_spark.mirror.write.taskplan import ChangesFile, changes_dir, merge_plans, plan_share
from msgstream_spark.source.upserts import pair
from tests.mirror.changes import FIELDS, delete, insert, model, table_state, to_arrow, upsert

FIRST = [insert(10, (1, "a"), (2, "b"), (3, "c"))]
# 2.3.5 writes an upsert as an Insert and a Delete of its keys at one timestamp; key 4 is new
LATER = [*upsert(20, (1, "a2"), (4, "d")), delete(25, 3), *reversed(upsert(30, (2, "b2"))), *upsert(40, (1, "a3"))]
WANT = {1: ("a3", 40), 2: ("b2", 30), 4: ("d", 20)}


def _updates() -> pa.Table:
    got = pair(to_arrow(LATER), "pk")
    assert sorted(zip(got.column("op").to_pylist(), got.column("pk").to_pylist())) == [
        ("delete", 3), ("update", 1), ("update", 1), ("update", 2), ("update", 4)]
    return got


def _table(fmt, tmp_path):
    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    assert apply_batch(t, to_arrow(FIRST), "pk", "q", 0)
    return t


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_update_rows_through_the_spark_paths_stages(fmt, tmp_path):
    t = _table(fmt, tmp_path)
    spec = t.write_spec()
    w, changes = TaskWriter(spec), ChangesFile(t.store, changes_dir(spec.data_dir, "q", 1), spec.key_type)
    updates = _updates()
    narrow = w.add(updates.slice(0, 3))
    narrow = pa.concat_tables([narrow, w.add(updates.slice(3))])  # two chunks: key 1 in both
    changes.add(narrow)
    written = changes.close(w.close())
    ups = narrow.filter(pc.equal(narrow.column("op"), "update"))
    assert ups.num_rows == 4 and ups.column("_file").null_count == 0  # every update names the row it wrote
    planned = plan_share(narrow, t.live_files(), "pk", pa.int64())
    assert commit_plan(t, merge_plans(written, planned), set(), query_id="q", batch_id=1) is not None
    assert table_state(t.to_arrow()) == model(FIRST + LATER) == WANT


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_update_rows_through_apply_batch(fmt, tmp_path):
    t = _table(fmt, tmp_path)
    assert apply_batch(t, _updates(), "pk", "q", 1)
    assert table_state(t.to_arrow()) == WANT
    assert not apply_batch(t, _updates(), "pk", "q", 1)  # exactly once, as any batch
    assert table_state(t.to_arrow()) == WANT


def test_the_change_log_records_one_update_per_upsert():
    existed = pa.table({"pk": pa.array([1, 2, 3], pa.int64()), "_ts": pa.array([10, 10, 10], pa.int64())})
    got = [(r["op"], r["pk"], r["_ts"], r["v"]) for r in history_rows(_updates(), "pk", existed).to_pylist()]
    assert got == [("update", 1, 20, "a2"), ("update", 1, 40, "a3"), ("update", 2, 30, "b2"),
                   ("delete", 3, 25, None), ("insert", 4, 20, "d")]  # key 4 did not exist: its upsert inserts it


def _with_op(changes: pa.Table, i: int, op: str | None) -> pa.Table:
    ops = changes.column("op").to_pylist()
    ops[i] = op
    return changes.set_column(changes.schema.get_field_index("op"), "op", pa.array(ops, pa.string()))


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
@pytest.mark.parametrize("op", ["upsert", None])
def test_an_unknown_op_fails_the_batch_by_name_and_commits_nothing(fmt, op, tmp_path):
    t = _table(fmt, tmp_path)
    before = table_state(t.to_arrow())
    bad = _with_op(to_arrow([insert(50, (1, "x"), (7, "y"))]), 1, op)
    where = rf"op {op!r} \(key column 'pk' = 7, _ts 50, _channel ch0; ops found: {op}\)"
    with pytest.raises(MirrorError, match=rf"table {tmp_path / 't'}.* {where}: the mirror applies only insert, "
                                          "update, delete; the batch fails, nothing committed"):
        apply_batch(t, bad, "pk", "q", 1)
    with pytest.raises(MirrorError, match=where):  # what a Spark writing task runs
        TaskWriter(t.write_spec()).add(bad)
    with pytest.raises(MirrorError, match=rf"change log holds {where}"):
        history_rows(bad, "pk", pa.table({"pk": pa.array([], pa.int64()), "_ts": pa.array([], pa.int64())}))
    assert t.last_batch("q") == 0 and table_state(t.to_arrow()) == before


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_the_plan_refuses_an_unknown_op_and_an_update_without_its_row(fmt, tmp_path):
    t = _table(fmt, tmp_path)
    w = TaskWriter(t.write_spec())
    narrow = w.add(_updates())
    w.close()
    matches = lookup_local(t, narrow.column("key").combine_chunks())
    with pytest.raises(MirrorError, match=r"narrow changes holds op 'merge' \(key column 'key' = "):
        plan(_with_op(narrow, 0, "merge"), matches)
    i = narrow.column("op").to_pylist().index("update")
    files = narrow.column("_file").to_pylist()
    files[i] = None  # what the writer made of an update before the fix
    rowless = narrow.set_column(narrow.schema.get_field_index("_file"), "_file", pa.array(files, pa.string()))
    with pytest.raises(MirrorError, match=r"'update' change of key \d+ .* names no row its task wrote"):
        commit_plan(t, plan(rowless, matches), set(), query_id="q", batch_id=1)
    assert t.last_batch("q") == 0 and table_state(t.to_arrow()) == {1: ("a", 10), 2: ("b", 10), 3: ("c", 10)}
