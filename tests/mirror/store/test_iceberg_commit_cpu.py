"""The CPU an Iceberg table's commit costs the database job's driver (issue #44, ``formats/iceberg/cached.py``):
the SQL catalog's row swapped by one prepared statement (no ORM session a commit), still a compare-and-swap
(another writer's commit landing between our load and our swap refuses ours), the row naming the new metadata
file and the previous one as pyiceberg's commit leaves it. Counted and read on real tables."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.write.batch import commit_plan
from tests.mirror.changes import FIELDS, delete, insert, model, table_state, to_arrow, upsert
from tests.mirror.writers import planned


def _open(loc: Path):
    return open_table("iceberg", str(loc), collection="coll", pk="pk", arrow_schema=FIELDS)


def _batch(i: int) -> list:
    ts = 10 * i
    return [insert(ts, *[(p, f"n{p}") for p in range(10 * i, 10 * i + 10)]),
            *upsert(ts + 1, (i, f"u{i}")), delete(ts + 2, 10 * i - 5)]


def _row(loc: Path) -> tuple[str, str]:
    with sqlite3.connect(f"{loc}_catalog.sqlite") as con:
        return con.execute("SELECT metadata_location, previous_metadata_location FROM iceberg_tables").fetchone()


def _plain(loc: Path):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("msgstream", uri=f"sqlite:///{loc}_catalog.sqlite",
                      warehouse=f"file://{loc}").load_table(("msgstream", "coll"))


def test_a_commit_swaps_the_catalog_row_without_an_orm_session(tmp_path, monkeypatch):
    """A batch's commit (and the maintenance check's reads) opens no ORM session (pyiceberg's commit built one and
    its statement at each commit); the row names the new metadata file and the one before, as pyiceberg's does."""
    from sqlalchemy.orm import Session

    loc = tmp_path / "t"
    t = _open(loc)
    seen = []
    assert apply_batch(t, to_arrow(_batch(1)), "pk", "q", 1)
    seen += _batch(1)
    sessions = []
    init = Session.__init__

    def counted(self, *a, **kw):
        sessions.append(1)
        init(self, *a, **kw)

    monkeypatch.setattr(Session, "__init__", counted)
    for i in range(2, 5):
        before = t._table().metadata_location
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
        seen += _batch(i)
        assert _row(loc) == (t._table().metadata_location, before) and before != t._table().metadata_location
    assert sessions == []
    monkeypatch.setattr(Session, "__init__", init)
    plain = _plain(loc)  # pyiceberg's own catalog reads what the row names
    assert plain.metadata_location == t._table().metadata_location and plain.metadata == t._table().metadata
    assert table_state(plain.scan().to_arrow()) == model(seen) and t.last_batch("q") == 4


def test_another_writers_commit_between_our_load_and_swap_refuses_ours(tmp_path, monkeypatch, caplog):
    """The catalog's compare-and-swap: another writer's commit landing after our commit loaded the table's row
    (our requirements checked, our metadata file being written) makes the row swap fail (pyiceberg's retry then
    finds the table moved from the planned snapshot: refused): nothing of ours in the table, theirs kept, our
    batch not recorded."""
    loc = tmp_path / "t"
    mine, theirs = _open(loc), _open(loc)
    seen = []
    assert apply_batch(mine, to_arrow(_batch(1)), "pk", "q", 1)
    seen += _batch(1)
    theirs._table().refresh()
    cat = mine._table().catalog
    write = cat._write_metadata
    landed = []

    def write_then_theirs(metadata, io, metadata_path):
        write(metadata=metadata, io=io, metadata_path=metadata_path)
        if not landed:  # their commit lands now, once
            landed.append(1)
            assert apply_batch(theirs, to_arrow([*upsert(100, (3, "theirs"))]), "pk", "other", 0)

    monkeypatch.setattr(cat, "_write_metadata", write_then_theirs)
    p = planned(mine, _batch(2))
    with pytest.raises(MirrorError, match=rf"moved from snapshot {p.base}, which batch 2 of query q was planned on"):
        commit_plan(mine, p, set(), query_id="q", batch_id=2)
    assert landed and "Commit failed due to a concurrent update" in caplog.text  # the row swap refused
    seen += [*upsert(100, (3, "theirs"))]
    assert table_state(_plain(loc).scan().to_arrow()) == model(seen)
    assert mine.last_batch("q") == 1 and mine.last_batch("other") == 0


def _schema_work(monkeypatch) -> dict[str, int]:
    """pyiceberg's per-schema work for a data file's entry, counted from now: a file schema checked against the
    table's, a statistics plan built."""
    import pyiceberg.io.pyarrow as pa_io

    n = {"checked": 0, "planned": 0}
    check, plan = pa_io._check_pyarrow_schema_compatible, pa_io.compute_statistics_plan

    def checked(*a, **kw):
        n["checked"] += 1
        return check(*a, **kw)

    def planned_stats(*a, **kw):
        n["planned"] += 1
        return plan(*a, **kw)

    monkeypatch.setattr(pa_io, "_check_pyarrow_schema_compatible", checked)
    monkeypatch.setattr(pa_io, "compute_statistics_plan", planned_stats)
    return n


def test_a_data_files_schema_work_is_done_once_per_table_schema(tmp_path, monkeypatch):
    """A data file's manifest entry: the table schema's statistics plan and column mapping built, and a file's
    Arrow schema checked against it, once (not at each file); a file of another schema is still checked (and
    refused when incompatible), and a change of the metrics modes still changes the entries' statistics."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from msgstream_spark.mirror.formats.iceberg.files import data_file

    loc = tmp_path / "t"
    t = _open(loc)
    assert apply_batch(t, to_arrow(_batch(1)), "pk", "q", 1)
    n = _schema_work(monkeypatch)
    for i in range(2, 5):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
    assert n == {"checked": 0, "planned": 0}  # done at the first batch's file (pyiceberg's: once a file)
    tbl = t._table()
    field = tbl.schema().find_field("pk").field_id
    path = planned(t, _batch(5)).adds[0]
    assert field in data_file(t.store, tbl.metadata, path).lower_bounds
    assert n == {"checked": 0, "planned": 0}

    bad = loc / "data" / "bad.parquet"  # the key as a string: not the table's schema
    pq.write_table(pa.table({"pk": pa.array(["x"])}), bad)
    with pytest.raises(ValueError, match="pk"):
        data_file(t.store, tbl.metadata, str(bad))
    assert n["checked"] == 1

    with tbl.transaction() as tx:  # statistics: counts only (no bounds)
        tx.set_properties({"write.metadata.metrics.default": "counts"})
    assert field not in data_file(t.store, t._table().metadata, path).lower_bounds
    assert n["planned"] == 1


def test_tables_of_one_schema_share_its_statistics_plan_and_checks(tmp_path, monkeypatch):
    """The plan and the file schema's check are kept by the schema's content, not its object: a second table of
    the same collection schema (a restarted database job's tables, each loaded anew) builds and checks nothing
    again, while a table of another schema (a field more) gets its own and its entries its own statistics."""
    import pyarrow as pa

    from msgstream_spark.mirror.formats.iceberg.files import data_file

    first, second = _open(tmp_path / "a"), _open(tmp_path / "b")
    assert apply_batch(first, to_arrow(_batch(1)), "pk", "q", 1)
    n = _schema_work(monkeypatch)
    assert second._table().schema() is not first._table().schema()
    assert apply_batch(second, to_arrow(_batch(1)), "pk", "q", 1)
    assert n == {"checked": 0, "planned": 0}
    assert sorted(r["pk"] for r in second.to_arrow().to_pylist()) == sorted(
        r["pk"] for r in first.to_arrow().to_pylist())

    wider = open_table("iceberg", str(tmp_path / "c"), collection="coll", pk="pk",
                       arrow_schema=pa.schema([*FIELDS, pa.field("extra", pa.int64())]))
    tbl = wider._table()
    path = planned(wider, _batch(1)).adds[0]
    entry = data_file(wider.store, tbl.metadata, path)
    assert n == {"checked": 1, "planned": 1}
    assert tbl.schema().find_field("extra").field_id in entry.value_counts


def test_a_manifest_list_is_written_as_pyiceberg_writes_it(tmp_path, monkeypatch):
    """A v2 manifest list written by ``manifest_list.write_list`` (its schemas built once, each carried manifest's
    record encoded once) is byte for byte what pyiceberg's ``ManifestListWriterV2`` writes with the same manifests
    and sync marker, the second time too (records reused), with new sequence numbers assigned as pyiceberg does;
    and a table of such lists reads the same in pyiceberg and DuckDB."""
    from copy import copy

    from pyiceberg.manifest import UNASSIGNED_SEQ, write_manifest_list

    from msgstream_spark.mirror.formats.iceberg.cached import manifests
    from msgstream_spark.mirror.formats.iceberg.manifest_list import write_list
    from tests.mirror.store.test_iceberg_commit_reads import _duckdb

    loc = tmp_path / "t"
    t = _open(loc)
    seen = []
    for i in range(1, 4):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
        seen += _batch(i)
    tbl = t._table()
    carried = list(manifests(tbl.current_snapshot(), tbl.io))
    head = tbl.current_snapshot().snapshot_id
    fresh = copy(next(m for m in carried if m.added_snapshot_id == head))  # as a new snapshot's: unassigned
    fresh.sequence_number, fresh.min_sequence_number = UNASSIGNED_SEQ, UNASSIGNED_SEQ
    got = []
    monkeypatch.setattr("os.urandom", lambda n: b"s" * n)
    for attempt in range(2):
        for ours in (True, False):
            out = tbl.io.new_output(str(tmp_path / f"list-{attempt}-{ours}.avro"))
            w = write_manifest_list(format_version=2, output_file=out, snapshot_id=head, parent_snapshot_id=7,
                                    sequence_number=5, avro_compression="deflate")
            if ours:
                write_list(out, w._meta, tuple(w.prepare_manifest(m) for m in [fresh, *carried]))
            else:
                with w:
                    w.add_manifests([fresh, *carried])
            got.append((tmp_path / f"list-{attempt}-{ours}.avro").read_bytes())
    assert got[0] == got[1] == got[2] == got[3] and len(got[0]) > 100
    assert table_state(_plain(loc).scan().to_arrow()) == model(seen)
    assert table_state(_duckdb(_plain(loc).metadata_location)) == model(seen)


def test_a_table_load_of_a_known_metadata_file_reuses_its_file_io(tmp_path, monkeypatch):
    """The catalog's loads of a metadata file it knows (~10 a batch: each refresh) build no new FileIO: one a
    metadata file (its first load), one for the commit's staged table; the tables still read and write."""
    from pyiceberg.catalog import Catalog

    from msgstream_spark.mirror.upkeep import Upkeep

    loc = tmp_path / "t"
    t = _open(loc)
    up = Upkeep(t)
    seen = []
    assert apply_batch(t, to_arrow(_batch(1)), "pk", "q", 1)
    seen += _batch(1)
    loads = []
    load = Catalog._load_file_io

    def counted(self, *a, **kw):
        loads.append(1)
        return load(self, *a, **kw)

    monkeypatch.setattr(Catalog, "_load_file_io", counted)
    for i in range(2, 5):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
        seen += _batch(i)
        up.after_batch()
        t.write_spec()
    assert len(loads) <= 2 * 3 + 1, len(loads)  # (+1: batch 1's metadata file, first loaded here; pyiceberg: 33)
    assert table_state(t.to_arrow()) == model(seen) and table_state(_plain(loc).scan().to_arrow()) == model(seen)


def test_a_tasks_data_file_footer_is_shipped_and_the_commit_reads_no_data_file(tmp_path, monkeypatch):
    """An Iceberg table's write spec asks the writing tasks for each data file's footer (``WriteSpec.footers``):
    the task's rows carry it, the plan keeps it, and the commit takes the file's statistics from it; a driver
    that did not write the file (another process: its kept footers forgotten here) reads nothing of it back,
    where it read its footer by range (on object storage a HEAD and ranged GETs per file and commit). The
    entry's statistics are the file's own; a Delta table's spec asks for none."""
    import pyarrow.parquet as pq

    from msgstream_spark.mirror.formats.iceberg.files import data_file
    from msgstream_spark.mirror.store import parquet
    from msgstream_spark.mirror.write.layout import TaskWriter
    from msgstream_spark.mirror.write.taskplan import ChangesFile, merge_plans, plan_share

    loc = tmp_path / "t"
    t = _open(loc)
    assert apply_batch(t, to_arrow(_batch(1)), "pk", "q", 1)
    spec = t.write_spec()
    assert spec.footers
    changes = to_arrow(_batch(2))
    w = TaskWriter(spec)
    narrow = w.add(changes)
    files = w.close()
    out = ChangesFile(t.store, str(loc / "attempt"), spec.key_type)
    out.add(narrow)
    written = out.close(files)
    live = t.live_files()
    planned_rows = plan_share(narrow, list(live), "pk", spec.key_type)
    p = merge_plans(written, planned_rows, live.version)
    assert p.adds and set(p.footers) == set(p.adds)
    want = {a: data_file(t.store, t._table().metadata, a) for a in p.adds}  # read from the file itself
    parquet._FOOTERS.clear()  # the driver is another process than the task that wrote the files
    opened = []
    real_open, real_head = type(t.store).open_input, type(t.store).head

    def open_input(store, target, *a, **kw):
        opened.append(target)
        return real_open(store, target, *a, **kw)

    def head(store, target, *a, **kw):
        opened.append(target)
        return real_head(store, target, *a, **kw)

    monkeypatch.setattr(type(t.store), "open_input", open_input)
    monkeypatch.setattr(type(t.store), "head", head)
    assert commit_plan(t, p, set(), query_id="q", batch_id=2)
    assert not [o for o in opened if str(o).endswith(tuple(p.adds))], opened
    monkeypatch.undo()
    got = {e.file_path: e for e in _entries(t)}
    for a, entry in want.items():
        mine = got[entry.file_path]
        assert (mine.record_count, mine.file_size_in_bytes, mine.lower_bounds, mine.upper_bounds,
                mine.value_counts) == (entry.record_count, entry.file_size_in_bytes, entry.lower_bounds,
                                       entry.upper_bounds, entry.value_counts)
        assert pq.read_metadata(a).num_rows == mine.record_count
    assert table_state(t.to_arrow()) == model([*_batch(1), *_batch(2)])
    delta = open_table("delta", str(tmp_path / "d"), collection="coll", pk="pk", arrow_schema=FIELDS)
    assert not delta.write_spec().footers


def _entries(t) -> list:
    from msgstream_spark.mirror.formats.iceberg.manifest_read import manifest_entries

    tbl = t._table()
    tbl.refresh()
    from pyiceberg.manifest import ManifestContent

    return [e.data_file for m in tbl.current_snapshot().manifests(tbl.io) if m.content == ManifestContent.DATA
            for e in manifest_entries(m, tbl.io)]
