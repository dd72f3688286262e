"""A batch's commit is fenced at the table version its plan read (#38 item 3), and the writer lock is held by a
thread, not by its process (#38 item 7): real Delta and Iceberg tables, another writer committing in between."""

from __future__ import annotations

import threading

import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.maintenance import compact
from msgstream_spark.mirror.store.writer import writer_lock
from msgstream_spark.mirror.write.batch import commit_plan
from tests.mirror.changes import FIELDS, delete, insert, model, table_state, to_arrow, upsert
from tests.mirror.writers import planned

FORMATS = ["delta", "iceberg", "lance"]


def _open(fmt, loc):
    return open_table(fmt, str(loc), collection="coll", pk="pk", arrow_schema=FIELDS)


def _fill(t) -> list:
    """Three batches: files with deleted rows (what a compaction rewrites)."""
    batches = [[insert(10, *[(p, f"a{p}") for p in range(20)])],
               [*upsert(20, (1, "b1"), (5, "b5")), delete(21, 7)],
               [*upsert(30, (2, "c2"), (9, "c9"))]]
    for i, b in enumerate(batches):
        assert apply_batch(t, to_arrow(b), "pk", "q", i)
    return [m for b in batches for m in b]



def _another_writer(fmt, loc, between) -> list:
    """Another writer of the table commits (its own table object): a compaction, or a batch of another query
    changing a key the planned batch changes too; the changes it committed."""
    other = _open(fmt, loc)
    if between == "compaction":
        assert compact(other).files_in > 1
        return []
    theirs = [*upsert(90, (1, "theirs"), (3, "theirs3"))]
    assert apply_batch(other, to_arrow(theirs), "pk", "other-query", 0)
    return theirs


@pytest.mark.parametrize("between", ["compaction", "batch"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_commit_is_refused_when_the_table_moved_since_its_plan(fmt, between, tmp_path):
    """Outside a job's run-long lock (a user's MirrorBatch, apply_batch, verify --repair) the lookup runs before
    the commit's lock: a commit in between is refused (naming both versions), nothing is committed, every key is
    in the table once, and the batch run again applies on the table as it is."""
    loc = tmp_path / "t"
    t = _open(fmt, loc)
    seen = _fill(t)
    mine = [*upsert(100, (1, "mine"), (2, "mine2")), insert(100, (50, "new"))]
    p = planned(t, mine)
    assert p.base is not None and p.deletes
    seen += _another_writer(fmt, loc, between)
    unit = "snapshot" if fmt == "iceberg" else "version"
    with pytest.raises(MirrorError, match=rf"moved from {unit} {p.base}, which batch 3 of query q was planned on, "
                                          rf"to {unit} \d+ .*nothing committed; the batch runs again"):
        commit_plan(t, p, set(), query_id="q", batch_id=3)
    assert table_state(_open(fmt, loc).to_arrow()) == model(seen)  # each key once, the batch not in it
    assert t.last_batch("q") == 2
    assert apply_batch(t, to_arrow(mine), "pk", "q", 3)  # the batch again: planned on the table as it is now
    assert table_state(_open(fmt, loc).to_arrow()) == model(seen + mine)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_commit_racing_another_writer_after_its_check_is_refused_too(fmt, tmp_path, monkeypatch):
    """Another writer lands between the commit's check and its publication: Delta's version file is taken
    (the commit is published as planned + 1 only); Iceberg's catalog refuses the snapshot and pyiceberg's retry,
    which would rebase it onto the compaction (its position deletes naming files gone), is refused by our
    producer's concurrency validation."""
    from msgstream_spark.mirror.formats.delta import table as delta_table
    from msgstream_spark.mirror.formats.iceberg import table as iceberg_table
    from msgstream_spark.mirror.formats.lance.table import LanceMirrorTable

    loc = tmp_path / "t"
    t = _open(fmt, loc)
    seen = _fill(t)
    mine = [*upsert(100, (1, "mine"), (2, "mine2"))]
    p = planned(t, mine)
    module, name = {"delta": (delta_table, "write_commit"), "iceberg": (iceberg_table, "commit_files"),
                    "lance": (LanceMirrorTable, "_commit")}[fmt]
    real = getattr(module, name)

    raced = []

    def racing(*args, **kw):
        if not raced:  # the other writer, after the commit's check, before its publication (once)
            raced.append(True)
            compact(_open(fmt, loc))
        return real(*args, **kw)

    monkeypatch.setattr(module, name, racing)
    want = {"delta": "Delta version \\d+ was written by another writer meanwhile",
            "iceberg": rf"moved from snapshot {p.base}, which batch 3 of query q was planned on, to snapshot \d+",
            "lance": "another writer committed while batch 3 of query q was committed \\(Lance refused it"}[fmt]
    with pytest.raises(MirrorError, match=want):
        t.commit(p, query_id="q", batch_id=3)
    monkeypatch.undo()
    assert table_state(_open(fmt, loc).to_arrow()) == model(seen)
    assert apply_batch(_open(fmt, loc), to_arrow(mine), "pk", "q", 3)
    assert table_state(_open(fmt, loc).to_arrow()) == model(seen + mine)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])  # (Lance compacts by its own compact_files: below)
def test_a_compaction_is_fenced_at_the_version_it_read(fmt, tmp_path, monkeypatch):
    """A compaction reads the live files, rewrites them, then swaps: a batch committed meanwhile (its deletes
    on the files being rewritten) refuses the swap instead of bringing its deleted rows back."""
    from msgstream_spark.mirror import maintenance

    loc = tmp_path / "t"
    t = _open(fmt, loc)
    seen = _fill(t)
    theirs = [*upsert(90, (4, "theirs4")), delete(91, 6)]
    real = maintenance._rewrite

    def rewrite_then_a_batch(*args, **kw):
        got = real(*args, **kw)
        assert apply_batch(_open(fmt, loc), to_arrow(theirs), "pk", "other-query", 0)  # (no lock: one process)
        return got

    monkeypatch.setattr(maintenance, "_rewrite", rewrite_then_a_batch)
    with pytest.raises(MirrorError, match=r"which the compaction was planned on.*nothing committed; compact again"):
        compact(t)  # (the batch's commit is a nested hold of the compaction's lock: one thread)
    assert table_state(_open(fmt, loc).to_arrow()) == model(seen + theirs)


def test_a_lance_compaction_is_fenced_at_the_version_it_read(tmp_path, monkeypatch):
    """Lance's compaction (its compact_files) is refused when a batch committed after the compaction read the
    table's fragments: the batch's deleted rows do not come back."""
    from msgstream_spark.mirror.formats.lance.table import LanceMirrorTable

    loc = tmp_path / "t"
    t = _open("lance", loc)
    seen = _fill(t)
    theirs = [*upsert(90, (4, "theirs4")), delete(91, 6)]
    real = LanceMirrorTable.live_files
    done = []

    def read_then_a_batch(self):
        got = real(self)
        if not done:
            done.append(True)
            assert apply_batch(_open("lance", loc), to_arrow(theirs), "pk", "other-query", 0)
        return got

    monkeypatch.setattr(LanceMirrorTable, "live_files", read_then_a_batch)
    with pytest.raises(MirrorError, match=r"which the compaction was planned on.*nothing committed; compact again"):
        compact(t)
    monkeypatch.undo()
    assert table_state(_open("lance", loc).to_arrow()) == model(seen + theirs)
    assert compact(_open("lance", loc)).files_in >= 1  # compacted again: the rows stay
    assert table_state(_open("lance", loc).to_arrow()) == model(seen + theirs)


def test_the_writer_lock_is_held_by_a_thread_not_by_its_process(tmp_path):
    """Two threads of one process (two queries in one driver): the second is refused; the holder's own nested
    holds pass, and so does a thread handed the hold (a job's foreachBatch on Spark's callback thread)."""
    from msgstream_spark.mirror.store import open_store

    loc = str(tmp_path / "t")
    store = open_store(loc)
    got: dict = {}

    def in_thread(key, **kw):
        def run():
            try:
                with writer_lock(store, loc, f"{key}'s commit", **kw), writer_lock(store, loc, f"{key}'s nested hold"):
                    got[key] = "in"
            except MirrorError as e:
                got[key] = str(e)
        th = threading.Thread(target=run)
        th.start()
        th.join(timeout=60)
        assert not th.is_alive()

    with writer_lock(store, loc, "the first query's commit") as hold:
        with writer_lock(store, loc, "a compaction inside it"):  # the same call stack: nested
            pass
        in_thread("second")
        in_thread("handed", share=hold)
    assert got["handed"] == "in"
    assert "being written by another thread of this process" in got["second"]
    assert "the first query's commit" in got["second"] and "second's commit refused" in got["second"]
    in_thread("after")  # released: another thread takes it
    assert got["after"] == "in"
