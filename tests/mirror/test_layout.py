"""The write path's steps as Spark tasks run them: a task's share in chunks, a key in two chunks or two tasks,
the driver's plan deleting the losing rows in the commit that adds them."""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.mirror import open_table
from msgstream_spark.mirror.write.batch import commit_plan, lookup_local
from msgstream_spark.mirror.write.layout import TaskWriter, plan
from tests.mirror.changes import FIELDS, delete, insert, model, table_state, to_arrow, upsert


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_key_in_two_chunks_and_two_tasks_keeps_only_its_newest_row(fmt, tmp_path):
    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    first = [insert(10, (1, "a"), (2, "b"), (3, "c"))]
    w = TaskWriter(t.write_spec())
    narrow = w.add(to_arrow(first))
    w.close()
    _commit(t, narrow, query_id="q", batch_id=0)
    chunks = [[insert(20, (1, "a2"), (4, "d"))], [*upsert(30, (1, "a3")), delete(31, 2)],
              [insert(25, (4, "d-older"))], [insert(40, (5, "e")), delete(41, 5)]]
    spec = t.write_spec()
    task1, task2 = TaskWriter(spec), TaskWriter(spec)  # two tasks, two chunks each
    parts = [task1.add(to_arrow(chunks[0])), task1.add(to_arrow(chunks[1])),
             task2.add(to_arrow(chunks[2])), task2.add(to_arrow(chunks[3]))]
    task1.close()
    task2.close()
    narrow = pa.concat_tables(parts)
    assert len(set(narrow.column("_file").drop_null().to_pylist())) == 2  # one file per task
    done = _commit(t, narrow, query_id="q", batch_id=1)
    assert done is not None and len(done.adds) == 2
    assert table_state(t.to_arrow()) == model(first + [m for c in chunks for m in c])
    assert table_state(t.to_arrow()) == {1: ("a3", 30), 3: ("c", 10), 4: ("d-older", 25)}  # ts 25 > 20


def _commit(t, narrow, *, query_id: str, batch_id: int):
    """The batch's tasks' narrow rows looked up in this process, planned and committed (``write.batch``'s steps)."""
    return commit_plan(t, plan(narrow, lookup_local(t, narrow.column("key").combine_chunks())), set(),
                       query_id=query_id, batch_id=batch_id)
