"""How often a batch's end lists its attempts' directory (issue #44: the database job ends every table's batch, and
on S3 each listing is a request). After this holder's commit ``write.attempts.end_batch`` lists the batch's
directory once, and that one listing serves both the deletion of the files no task result named (a lost task
attempt's) and the removal of the attempts' changes files and claims; it listed twice before (once per step)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.mirror import open_table
from msgstream_spark.mirror.write.attempts import begin_batch, end_batch
from msgstream_spark.mirror.write.batch import commit_plan
from msgstream_spark.mirror.write.layout import TaskWriter
from msgstream_spark.mirror.write.taskplan import (
    ChangesFile,
    changes_dir,
    claims_dir,
    data_files,
    merge_plans,
    plan_out_schema,
)
from tests.mirror.changes import FIELDS, model, table_state, to_arrow
from tests.mirror.writers import BATCHES, Clock, staged_files


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_batch_end_lists_its_directory_once_and_still_drops_a_lost_attempts_files(fmt, tmp_path, monkeypatch):
    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    hold = Clock().hold(t.store, t.location, "writer A")
    attempt = begin_batch(t, hold, "q", 0)
    spec = t.write_spec()

    def task() -> pa.Table:
        w, ch = TaskWriter(spec, claims=claims_dir(attempt)), ChangesFile(t.store, attempt, spec.key_type)
        ch.add(w.add(to_arrow(BATCHES[0])))
        return ch.close(w.close())

    kept, lost = task(), task()  # the second: a task attempt whose result never reached the driver
    kept_files, lost_files = staged_files(t, data_files(kept)), staged_files(t, data_files(lost))
    planned = plan_out_schema(pa.int64()).empty_table()
    assert commit_plan(t, merge_plans(kept, planned, t.live_files().version), set(), query_id="q", batch_id=0,
                       hold=hold) is not None

    batch = changes_dir(spec.data_dir, "q", 0)
    lists: list[str] = []
    real = type(t.store).list

    def counted(store, prefix: str):
        if prefix.startswith(batch):
            lists.append(prefix)
        return real(store, prefix)

    monkeypatch.setattr(type(t.store), "list", counted)
    end_batch(t, hold, attempt, kept)
    monkeypatch.undo()

    assert lists == [batch]  # one listing (two before: the lost files' and the attempts' removal)
    assert all(t.store.head(p) is not None for p in kept_files)
    assert lost_files and all(t.store.head(p) is None for p in lost_files)
    assert not list(t.store.list(batch))
    assert table_state(t.to_arrow()) == model(BATCHES[0])
