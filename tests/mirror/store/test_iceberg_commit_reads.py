"""An Iceberg table's batch, as the database job's driver commits it table by table (issue #44), does not read back
what its process wrote or read before (``formats/iceberg/cached.py``): no metadata file it knows, no manifest
it wrote, and the commit's metadata is built a few times, not at each of pyiceberg's reads. Counted on real
tables (the calls counted, not replaced); another writer's commit is still seen, and still fences."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.store import LeaseLost
from msgstream_spark.mirror.upkeep import Upkeep
from msgstream_spark.mirror.write.batch import commit_plan
from tests.mirror.changes import FIELDS, delete, insert, model, table_state, to_arrow, upsert
from tests.mirror.writers import planned


def _open(loc: Path):
    return open_table("iceberg", str(loc), collection="coll", pk="pk", arrow_schema=FIELDS)


def _batch(i: int) -> list:
    """Batch ``i`` (1 on): new keys, an upsert and a delete of earlier ones (a data and a delete file)."""
    ts = 10 * i
    return [insert(ts, *[(p, f"n{p}") for p in range(10 * i, 10 * i + 10)]),
            *upsert(ts + 1, (i, f"u{i}")), delete(ts + 2, 10 * i - 5)]


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """Metadata files read and parsed, a commit's metadata built (the transaction's, the catalog's), manifests
    read: counted."""
    import pyiceberg.catalog as pc
    import pyiceberg.manifest as pm
    import pyiceberg.table as pt
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.manifest import ManifestFile
    from pyiceberg.serializers import FromInputFile

    n: Counter = Counter()
    read_meta, build, read_manifest = FromInputFile.table_metadata, pt.update_table_metadata, \
        ManifestFile.fetch_manifest_entry
    cached = sys.modules.get("msgstream_spark.mirror.formats.iceberg.cached")  # (none before issue #44's cut)
    manifest_read = sys.modules.get("msgstream_spark.mirror.formats.iceberg.manifest_read")
    ours = getattr(cached, "applied", None)

    def table_metadata(input_file, *a, **kw):
        n["metadata files read"] += 1
        return read_meta(input_file, *a, **kw)

    def update_table_metadata(*a, **kw):  # pyiceberg's (a deep copy at the end)
        n["metadata built"] += 1
        return build(*a, **kw)

    def applied(*a, **kw):  # ours (cached.py)
        n["metadata built"] += 1
        return ours(*a, **kw)

    def fetch_manifest_entry(self, *a, **kw):
        n["manifests read"] += 1
        return read_manifest(self, *a, **kw)

    from pyiceberg.utils.schema_conversion import AvroSchemaConversion

    read_list, load, to_avro = pm.read_manifest_list, SqlCatalog.load_table, AvroSchemaConversion.iceberg_to_avro

    def iceberg_to_avro(self, *a, **kw):  # an Avro file's schema converted (each manifest's and list's, before)
        n["Avro schemas converted"] += 1
        return to_avro(self, *a, **kw)

    def read_manifest_list(*a, **kw):
        n["manifest lists read"] += 1
        return read_list(*a, **kw)

    def load_table(self, *a, **kw):  # pyiceberg's load: an ORM session and a statement built per call
        n["pyiceberg catalog loads"] += 1
        return load(self, *a, **kw)

    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(table_metadata))
    monkeypatch.setattr(pt, "update_table_metadata", update_table_metadata)  # the transaction's
    monkeypatch.setattr(pc, "update_table_metadata", update_table_metadata)  # the catalog's commit
    if ours is not None:
        monkeypatch.setattr(cached, "applied", applied)
    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", fetch_manifest_entry)
    monkeypatch.setattr(pm, "read_manifest_list", read_manifest_list)
    read_ours = getattr(manifest_read, "_read", None)  # our reads of both (formats/iceberg/manifest_read.py)

    def ours_read(path, io, kind):
        n["manifests read" if kind == "entries" else "manifest lists read"] += 1
        return read_ours(path, io, kind)

    if read_ours is not None:
        monkeypatch.setattr(manifest_read, "_read", ours_read)
    monkeypatch.setattr(SqlCatalog, "load_table", load_table)
    monkeypatch.setattr(AvroSchemaConversion, "iceberg_to_avro", iceberg_to_avro)
    import pyiceberg.io.pyarrow as pa_io

    to_arrow_schema = pa_io.schema_to_pyarrow

    def schema_to_pyarrow(*a, **kw):
        n["Arrow schemas converted"] += 1
        return to_arrow_schema(*a, **kw)

    monkeypatch.setattr(pa_io, "schema_to_pyarrow", schema_to_pyarrow)
    row_location = cached.row_location

    def read_row(*a, **kw):  # a read of the table's catalog row (each load: a refresh, the catalog's commit)
        n["catalog rows read"] += 1
        return row_location(*a, **kw)

    monkeypatch.setattr(cached, "row_location", read_row)
    return n


def test_a_batch_reads_back_no_metadata_and_no_manifest_it_wrote(tmp_path, counted):
    """Per batch: the batch applied (its begin, its plan's live files, its fenced commit with the batch record)
    and the job's maintenance check (the live files again); then the files an expiry keeps. No metadata file read
    (each one loaded is one this process wrote), no manifest read (the batch's own are known), the commit's new
    metadata built at most 3 times (the transaction's twice, the catalog's once; pyiceberg built it, each time
    with a deep copy, ~17 times a commit). The table stays what pyiceberg, from a catalog of its own, and DuckDB's
    iceberg extension read."""
    loc = tmp_path / "t"
    t = _open(loc)
    up = Upkeep(t)
    seen = []
    for i in range(1, 3):  # the table's first batches (its first files read once)
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
        seen += _batch(i)
    t.live_files()
    counted.clear()
    batches = 3
    for i in range(3, 3 + batches):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
        seen += _batch(i)
        assert up.after_batch() == []  # the maintenance check (nothing due)
    assert counted["metadata files read"] == 0, counted
    assert counted["manifests read"] == 0, counted
    assert counted["metadata built"] <= 3 * batches, counted
    # the snapshots' manifest lists: each one this process committed is known as written (was read once a batch)
    assert counted["manifest lists read"] == 0, counted
    # each catalog load (~9 a batch) reads the table's row with one prepared statement: pyiceberg's ORM load
    # (a session and a statement built per call) runs only for a metadata file this process does not know
    assert counted["pyiceberg catalog loads"] == 0, counted
    # the catalog's row read 4 times a batch: ``apply_batch``'s own checks (2), the batch's begin (``pin_log``:
    # its checks, schema, write spec and live files answer from that read), its commit's checks; not by the
    # catalog's commit (it swaps the row from the metadata file the commit was built on) nor by the maintenance
    # check after it (``known_files``: as the commit left them). 9 before the batch's reads were pinned.
    assert counted["catalog rows read"] <= 4 * batches, counted
    # a commit writes a data manifest, a delete manifest and the manifest list: the manifests' Avro schemas are
    # built once per table schema and spec, the list's once (``manifest_list.py``; pyiceberg's: each commit)
    assert counted["Avro schemas converted"] == 0, counted
    # the table's schema as Arrow (its ``schema``, each write spec): converted once per schema, not ~5 times a batch
    assert counted["Arrow schemas converted"] == 0, counted
    assert t.last_batch("q") == 2 + batches
    now = time.time()
    kept = t.retained_files(3600, now)  # what an expiry keeps: from the manifests the live files read
    assert counted["manifests read"] == 0, counted

    want = model(seen)
    assert table_state(t.to_arrow()) == want
    fresh = _open(loc)  # a new catalog object: everything read from the files
    assert _live(fresh) == _live(t)  # the files and deleted positions the kept entries gave
    assert fresh.retained_files(3600, now) == kept and any("/data/delete-" in f for f in kept)
    assert table_state(_plain(loc).scan().to_arrow()) == want
    assert table_state(_duckdb(_plain(loc).metadata_location)) == want


def test_a_commits_manifest_list_is_kept_as_its_file_reads(tmp_path, counted):
    """What the commits' manifest lists are taken to hold (never read back) is what their files hold: the manifests
    with the sequence numbers their writer assigned (new ones the snapshot's, carried ones their own), data and
    delete manifests; a compaction's (manifests rewritten) and a manifest merge's too."""
    from pyiceberg.manifest import ManifestContent

    from msgstream_spark.mirror.formats.iceberg.cached import manifests
    from msgstream_spark.mirror.formats.iceberg.upkeep import merge_manifests

    loc = tmp_path / "t"
    t = _open(loc)
    for i in range(1, 4):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
    t.swap_files(list(t.live_files())[:1], [], None)  # a replace snapshot: the first data file removed
    assert apply_batch(t, to_arrow(_batch(4)), "pk", "q", 4)
    assert merge_manifests(t, None) >= 2  # a replace snapshot of the manifests merged
    assert apply_batch(t, to_arrow(_batch(5)), "pk", "q", 5)
    tbl = t._table()
    snaps = tbl.snapshots()
    assert counted["manifest lists read"] == 1, counted  # the compaction's plan_files (pyiceberg's own read)
    seqs = set()
    for snap in snaps:
        kept = manifests(snap, tbl.io)
        on_file = list(counted_read(snap.manifest_list, tbl.io))
        assert list(kept) == on_file
        seqs |= {m.sequence_number for m in on_file}
    assert {m.content for m in kept} == {ManifestContent.DATA, ManifestContent.DELETES}
    assert seqs == {s.sequence_number for s in snaps}  # the carried manifests keep their snapshots' numbers
    assert table_state(_plain(loc).scan().to_arrow()) == table_state(t.to_arrow())


def test_a_manifest_is_written_as_pyiceberg_writes_it(tmp_path, monkeypatch):
    """A data and a delete manifest written with their Avro schemas built once (``cached.manifest_output``) are
    byte for byte what pyiceberg's own writer (its ``new_writer``) writes with the same entries and sync marker."""
    from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus, ManifestWriterV2

    from msgstream_spark.mirror.formats.iceberg.commit import _data_writer_type, _delete_writer_type

    loc = tmp_path / "t"
    t = _open(loc)
    for i in range(1, 3):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
    tbl = t._table()
    meta = tbl.metadata
    entries = {m.content: [e.data_file for e in m.fetch_manifest_entry(tbl.io)]
               for m in tbl.current_snapshot().manifests(tbl.io)}
    monkeypatch.setattr("os.urandom", lambda n: b"s" * n)  # the files' sync markers
    for kind in (_data_writer_type(), _delete_writer_type()):
        for _ in range(2):  # the second: the schemas built by the first reused
            got = []
            for theirs in (False, True):
                out = tbl.io.new_output(str(tmp_path / f"m-{len(got)}.avro"))
                w = kind(meta.spec(), meta.schema(), out, 7, "deflate")
                if theirs:
                    w.new_writer = lambda w=w: ManifestWriterV2.new_writer(w)  # pyiceberg's Avro file
                with w:
                    for f in entries[w.content()]:
                        w.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=7,
                                                      sequence_number=None, file_sequence_number=None, data_file=f))
                got.append((tmp_path / f"m-{len(got)}.avro").read_bytes())
            assert got[0] == got[1] and len(got[0]) > 100


def counted_read(path: str, io) -> list:
    from pyiceberg.manifest import read_manifest_list

    return list(read_manifest_list(io.new_input(path)))


def test_another_writers_commit_is_seen_and_still_fences(tmp_path, counted):
    """Two writers of one table, each with its own catalog object (its own kept metadata): each sees the other's
    commits (the catalog's row is read at each refresh); a commit planned before the other's lands is refused;
    an epoch the other published deposes this one's commit."""
    loc = tmp_path / "t"
    mine, theirs = _open(loc), _open(loc)
    seen = []
    for i in range(1, 3):
        assert apply_batch(mine, to_arrow(_batch(i)), "pk", "q", i)
        seen += _batch(i)
    counted.clear()
    other = [*upsert(100, (1, "theirs"))]
    assert apply_batch(theirs, to_arrow(other), "pk", "other", 0)
    seen += other
    assert counted["metadata files read"] >= 1  # theirs had not read mine's newest metadata file
    assert mine.last_batch("other") == 0 and table_state(mine.to_arrow()) == model(seen)
    assert mine.live_files().version == theirs.live_files().version

    p = planned(mine, _batch(3))
    assert apply_batch(theirs, to_arrow([*upsert(110, (2, "theirs2"))]), "pk", "other", 1)
    seen += [*upsert(110, (2, "theirs2"))]
    with pytest.raises(MirrorError, match=rf"moved from snapshot {p.base}, which batch 3 of query q was planned on"):
        commit_plan(mine, p, set(), query_id="q", batch_id=3)

    p = planned(mine, _batch(3))
    theirs.publish_epoch(7)  # a newer writer took the table over
    with pytest.raises(LeaseLost):
        mine.commit(p, query_id="q", batch_id=3, epoch=6)
    assert table_state(_plain(loc).scan().to_arrow()) == model(seen)  # nothing of the refused commits
    assert mine.last_batch("q") == 2



def test_a_commit_landing_while_a_batch_is_pinned_still_fences_it(tmp_path):
    """A batch reads the catalog once at its begin (``pin_log``); another writer's commit landing while its files
    are written is seen by its commit, which refuses (nothing of it lands); the next batch reads the table anew."""
    from msgstream_spark.mirror.write.batch import LocalRunner, run_batch

    loc = tmp_path / "t"
    mine, theirs = _open(loc), _open(loc)
    assert apply_batch(mine, to_arrow(_batch(1)), "pk", "q", 1)
    seen = [*_batch(1), *upsert(100, (1, "theirs"))]

    class Meanwhile(LocalRunner):
        def write(self, spec):
            assert apply_batch(theirs, to_arrow(seen[-1:]), "pk", "other", 0)
            return super().write(spec)

    with pytest.raises(MirrorError, match="moved from snapshot"):
        run_batch(mine, Meanwhile(to_arrow(_batch(2))), query_id="q", batch_id=2)
    assert table_state(_plain(loc).scan().to_arrow()) == model(seen) and mine.last_batch("q") == 1
    assert apply_batch(mine, to_arrow(_batch(2)), "pk", "q", 2)
    assert table_state(_plain(loc).scan().to_arrow()) == model([*seen, *_batch(2)])

def _live(t) -> list:
    files = t.live_files()
    return sorted((f.path, f.key_min, f.key_max, f.deleted.tolist(), f.num_rows, f.size) for f in files)


def _plain(loc: Path):
    """The table as pyiceberg's own SQL catalog loads it (none of the mirror's objects)."""
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("msgstream", uri=f"sqlite:///{loc}_catalog.sqlite", warehouse=f"file://{loc}")
    return cat.load_table(("msgstream", "coll"))


def _duckdb(metadata_location: str):
    import duckdb
    import duckdb_ext

    ext_dir = Path(next(iter(duckdb_ext.__path__))) / "extensions"
    con = duckdb.connect(config={"extension_directory": str(ext_dir), "autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    for ext in ("avro", "iceberg"):
        con.load_extension(ext)
    return con.execute(f"SELECT * FROM iceberg_scan('{metadata_location}')").fetch_arrow_table()
