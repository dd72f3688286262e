"""A Lance mirror table's batch fragments are made by the writing tasks (``formats/lance/staged.py``): the
driver's commit reads none of the batch's rows (its store traffic does not grow with them), a key a task
changed in two chunks leaves one row in the task's fragment, and a key two tasks changed is settled by the
driver rewriting the losing fragment (the one case it reads rows)."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pytest

from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.formats.lance.options import dataset_uri
from msgstream_spark.mirror.formats.lance.staged import report_path
from msgstream_spark.mirror.store import io_since, io_totals
from msgstream_spark.mirror.write.batch import LocalRunner, commit_plan, lookup_local, run_batch
from msgstream_spark.mirror.write.layout import TaskWriter, plan
from tests.mirror.changes import FIELDS, insert, model, table_state, to_arrow, upsert


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    if request.param == "s3":
        s3 = request.getfixturevalue("s3")
        return s3.uri("lake", "t"), s3.options()
    return str(tmp_path / "t"), None


def _open(where):
    return open_table("lance", where[0], collection="coll", pk="pk", arrow_schema=FIELDS, storage_options=where[1])


class Counting(LocalRunner):
    """The local runner, counting what this process reads through the store from the plan to the end (the
    commit: the driver's step)."""

    def plan(self, table, written):
        got = super().plan(table, written)
        self.before = io_totals()
        return got

    def end(self, table, hold, written, committed):
        self.read = io_since(self.before)["read"]


def _fragments(where):
    import lance

    opts = None if where[1] is None else {**where[1], "allow_http": "true"}
    return lance.dataset(dataset_uri(where[0]), storage_options=opts).get_fragments()


def test_the_commit_reads_none_of_the_batchs_rows(where):
    t = _open(where)
    assert apply_batch(t, to_arrow([insert(10, *[(p, f"a{p}") for p in range(100)])]), "pk", "q", 0)
    reads, staged = [], []
    seen = [insert(10, *[(p, f"a{p}") for p in range(100)])]
    for i, n in enumerate((200, 20_000), start=1):
        ts = 10 + 10 * i
        batch = [*upsert(ts, *[(p, f"u{i}.{p}") for p in range(0, 100, 3)]),
                 insert(ts + 1, *[(p, f"n{i}.{p}" * 8) for p in range(1000 * i, 1000 * i + n)])]
        run = Counting(to_arrow(batch))
        assert run_batch(t, run, query_id="q", batch_id=i) is not None
        seen += batch
        reads.append(run.read)
        staged.append(sum(f.size for f in run.files))
        assert all(t.store.head(f.path) is None for f in run.files)  # no staged Parquet file is left
        assert all(t.store.head(report_path(f.path)) is None for f in run.files)
    assert table_state(t.to_arrow()) == model(seen)
    assert staged[1] > 100_000  # the larger batch's rows
    # the driver's reads at commit do not grow with the batch's rows (before: it read every staged file)
    assert reads[1] <= reads[0] + 4096 and reads[1] < staged[1] // 20, (reads, staged)
    # the upserted keys' old rows: Lance deletion files on the earlier batches' fragments; the last batch's
    # fragment as its task wrote it
    frags = _fragments(where)
    assert [f.metadata.deletion_file is not None for f in frags] == [True, True, False]


def test_a_key_a_task_changed_in_two_chunks_leaves_one_row_in_its_fragment(tmp_path):
    where = (str(tmp_path / "t"), None)
    t = _open(where)
    first = [insert(10, *[(p, f"a{p}") for p in range(10)])]
    second = [*upsert(20, (3, "b3"), (11, "b11")), insert(21, (12, "b12"))]
    t.prepare(to_arrow(first).schema)
    w = TaskWriter(t.write_spec())
    narrow = pa.concat_tables([w.add(to_arrow(first)), w.add(to_arrow(second))])  # two chunks of one task
    written = w.close()
    files = t.live_files()
    p = plan(narrow, lookup_local(t, narrow.column("key").combine_chunks(), files), files.version)
    p.info = {f.path: (f.size, f.stats) for f in written}
    assert len(p.deletes[written[0].path]) == 1  # the plan deletes key 3's first row ...
    assert commit_plan(t, p, set(), query_id="q", batch_id=0) is not None
    assert table_state(t.to_arrow()) == model(first + second)
    (frag,) = _fragments(where)  # ... which the task left out of its fragment: committed as the task wrote it
    assert frag.metadata.physical_rows == 12 and frag.metadata.deletion_file is None


def test_a_key_two_tasks_changed_is_settled_by_rewriting_the_losing_fragment(tmp_path):
    where = (str(tmp_path / "t"), None)
    t = _open(where)
    old, new = [insert(10, (1, "a1"), (2, "a2"))], [*upsert(20, (1, "b1")), insert(20, (3, "b3"))]
    t.prepare(to_arrow(old).schema)
    spec = t.write_spec()
    parts, written = [], []
    for msgs in (new, old):  # two tasks, each with one of the key's changes
        w = TaskWriter(spec)
        parts.append(w.add(to_arrow(msgs)))
        written += w.close()
    narrow = pa.concat_tables(parts)
    files = t.live_files()
    p = plan(narrow, lookup_local(t, narrow.column("key").combine_chunks(), files), files.version)
    assert commit_plan(t, p, set(), query_id="q", batch_id=0) is not None  # (no info: the tasks' reports read)
    assert table_state(t.to_arrow()) == model(old + new)
    frags = _fragments(where)
    assert sorted(f.metadata.physical_rows for f in frags) == [1, 2]  # key 1's old row rewritten away
    assert all(f.metadata.deletion_file is None for f in frags)
    data = {m.uri.rsplit("/", 1)[-1] for m in t.store.list(t.root + "/data") if m.uri.endswith(".lance")}
    assert data == {f.metadata.files[0].path for f in frags}  # the rewritten fragment's first file is gone


def test_first_rows_from_tasks_that_disagree_on_the_vector_type_keep_the_variable_list(tmp_path):
    """The first batch of a table whose vectors are variable lists: each task fixes its vectors' length from its
    own rows; a task whose rows carry no vector keeps the variable list, so the table keeps it and the driver
    rewrites the other task's fragment to it (one type in the table, every row readable)."""
    fields = pa.schema([pa.field("pk", pa.int64()), pa.field("v", pa.string()), pa.field("fv", pa.list_(pa.float32()))])
    t = open_table("lance", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=fields)
    a = to_arrow([insert(10, (1, "a1"), (2, "a2"))])
    b = to_arrow([insert(10, (3, "b3"))])
    b = b.set_column(b.schema.get_field_index("fv"), "fv", pa.nulls(1, pa.list_(pa.float32())))
    t.prepare(a.schema)
    spec = t.write_spec()
    parts, written = [], []
    for changes in (a, b):
        w = TaskWriter(spec)
        parts.append(w.add(changes))
        written += w.close()
    assert sorted(json.loads(f.stats)["vectors"]["fv"] for f in written) == [-1, 2]
    narrow = pa.concat_tables(parts)
    files = t.live_files()
    p = plan(narrow, lookup_local(t, narrow.column("key").combine_chunks(), files), files.version)
    p.info = {f.path: (f.size, f.stats) for f in written}
    assert commit_plan(t, p, set(), query_id="q", batch_id=0) is not None
    got = t.to_arrow()
    assert got.schema.field("fv").type == pa.list_(pa.float32())
    assert {r["pk"]: r["fv"] for r in got.select(["pk", "fv"]).to_pylist()} == {
        1: [2.0, float(sum(map(ord, "a1")) % 97)], 2: [2.0, float(sum(map(ord, "a2")) % 97)], 3: None}
    assert apply_batch(t, to_arrow([insert(20, (4, "c4"))]), "pk", "q", 1)  # later batches append to it
    assert t.to_arrow().num_rows == 4


def test_a_tasks_rows_go_straight_into_its_fragment_without_a_staged_parquet_file(where):
    """Once the table has rows (its vector type settled) a writing task streams its rows into the Lance fragment:
    the store moves only the fragment's key file and the task's report, no Parquet copy of the rows written and
    read back (before: the staged file was written whole, then read whole to make the fragment)."""
    t = _open(where)
    assert apply_batch(t, to_arrow([insert(10, (1, "a1"))]), "pk", "q", 0)
    msgs = [insert(20, *[(p, hashlib.sha256(str(p).encode()).hexdigest() * 2) for p in range(100, 5100)])]
    changes = to_arrow(msgs)
    t.prepare(changes.schema)
    before = io_totals()
    w = TaskWriter(t.write_spec())
    w.add(changes)
    (written,) = w.close()
    moved = io_since(before)
    assert written.rows == 5000
    # (before: the rows written as a Parquet file, ~250 KB here, and read back whole)
    assert moved["read"] == 0 and moved["written"] < changes.nbytes // 10, (moved, changes.nbytes)
    data = [m.uri for m in t.store.list(t.root + "/data") if m.uri.endswith(".parquet") and "/_keys_of/" not in m.uri]
    assert data == []  # no staged Parquet file was ever left
    assert apply_batch(t, to_arrow([insert(30, (2, "b2"))]), "pk", "q", 1)  # later batches go on as before


def test_a_key_changed_in_two_chunks_of_a_streaming_task_leaves_one_row(tmp_path):
    """A task streaming into its fragment learns only at close that a later chunk replaced a row it streamed:
    it rewrites the fragment without it (the first one's files deleted), and the commit takes it as written."""
    where = (str(tmp_path / "t"), None)
    t = _open(where)
    first = [insert(10, *[(p, f"a{p}") for p in range(10)])]
    assert apply_batch(t, to_arrow(first), "pk", "q", 0)
    one, two = [*upsert(20, (3, "b3")), insert(20, (11, "b11"))], [*upsert(21, (11, "c11")), insert(21, (12, "c12"))]
    t.prepare(to_arrow(one).schema)
    w = TaskWriter(t.write_spec())
    narrow = pa.concat_tables([w.add(to_arrow(one)), w.add(to_arrow(two))])
    written = w.close()
    files = t.live_files()
    p = plan(narrow, lookup_local(t, narrow.column("key").combine_chunks(), files), files.version)
    p.info = {f.path: (f.size, f.stats) for f in written}
    assert commit_plan(t, p, set(), query_id="q", batch_id=1) is not None
    assert table_state(t.to_arrow()) == model(first + one + two)
    frags = _fragments(where)
    assert [f.metadata.physical_rows for f in frags] == [10, 3]  # keys 3, 11 (its newer row), 12
    data = {m.uri.rsplit("/", 1)[-1] for m in t.store.list(t.root + "/data") if m.uri.endswith(".lance")}
    assert data == {f.metadata.files[0].path for f in frags}  # the streamed fragment with key 11's old row: gone


def test_an_aborted_streaming_task_stops_its_fragment_writer(tmp_path):
    import threading

    t = _open((str(tmp_path / "t"), None))
    assert apply_batch(t, to_arrow([insert(10, (1, "a1"))]), "pk", "q", 0)
    changes = to_arrow([insert(20, *[(p, f"n{p}") for p in range(100, 200)])])
    w = TaskWriter(t.write_spec())
    w.add(changes)
    assert [th for th in threading.enumerate() if th.name.startswith("lance-fragment-")]
    w.abort()
    assert not [th for th in threading.enumerate() if th.name.startswith("lance-fragment-")]
    assert table_state(t.to_arrow()) == model([insert(10, (1, "a1"))])
    assert apply_batch(t, changes, "pk", "q", 1)
    assert t.to_arrow().num_rows == 101


def test_a_fragment_lance_cannot_write_fails_the_task_naming_it(tmp_path):
    """Lance's writer failing (here: the dataset's directory is a file) fails the task with a MirrorError naming
    the file and the table, Lance's error as its cause; the writer thread ends (no task waits on it forever)."""
    import threading

    from msgstream_spark.errors import MirrorError
    from msgstream_spark.mirror.formats.lance.direct import FragmentOut

    t = _open((str(tmp_path / "t"), None))
    assert apply_batch(t, to_arrow([insert(10, (1, "a1"))]), "pk", "q", 0)
    (tmp_path / "blocked").write_text("a file where the dataset should be")
    spec = t.write_spec()
    out = FragmentOut(t.store, t.root, str(tmp_path / "blocked" / "ds"), {}, spec.schema, spec.pk,
                      t.root + "/data/x.parquet")
    rows = t.to_arrow()
    with pytest.raises(MirrorError, match=r"x\.parquet under .*/t") as got:
        for _ in range(8):  # more chunks than the queue holds: the writer's failure reaches the task
            out.write_table(rows)
        out.close()
    assert got.value.__cause__ is not None
    assert not [th for th in threading.enumerate() if th.name.startswith("lance-fragment-")]


def test_rows_in_memory_off_an_8_byte_boundary_are_written_to_a_fragment(tmp_path):
    """Rows passed on without a copy can lie in foreign memory at any byte (an IPC stream read in place, a vector
    viewed in a message's payload); Lance reads them through the C data interface, whose Rust side panicked on such a
    buffer ("Memory pointer from external source ... is not aligned"): the fragment writer copies those columns."""
    from msgstream_spark.mirror.formats.lance.direct import FragmentOut

    t = _open((str(tmp_path / "t"), None))
    assert apply_batch(t, to_arrow([insert(10, *[(p, f"n{p}") for p in range(50)])]), "pk", "q", 0)
    rows = t.to_arrow().combine_chunks()
    pk = rows.column("pk").chunk(0)
    raw = pa.py_buffer(b"\0" + pk.to_numpy().tobytes()).slice(1)  # the same keys, one byte past a boundary
    odd = pa.Array.from_buffers(pk.type, len(pk), [None, raw])
    assert odd.buffers()[1].address % 8 and odd.to_pylist() == pk.to_pylist()
    rows = rows.set_column(rows.schema.get_field_index("pk"), rows.schema.field("pk"), odd)
    spec = t.write_spec()
    out = FragmentOut(t.store, t.root, str(tmp_path / "ds"), {}, spec.schema, spec.pk, t.root + "/data/x.parquet")
    out.write_table(rows)
    written = out.close()
    assert written.rows == 50 and written.size > 0
    assert json.loads(written.stats)["lance.direct"]["physical_rows"] == 50
