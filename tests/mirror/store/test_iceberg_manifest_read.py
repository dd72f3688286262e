"""Our manifest and manifest-list reads (``formats/iceberg/manifest_read.py``: pyiceberg's Avro reader tree built
once per file schema, not at every file) give what pyiceberg's own reads give, on a real table's manifests: data
and position-delete manifests, live and deleted entries, inherited sequence numbers."""

from __future__ import annotations

from pathlib import Path

from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.formats.iceberg import manifest_read
from tests.mirror.changes import FIELDS, delete, insert, to_arrow, upsert


def _entry(e) -> tuple:
    d = e.data_file
    return (e.status, e.snapshot_id, e.sequence_number, e.file_sequence_number, d.content, d.file_path,
            d.file_format, d.record_count, d.file_size_in_bytes, dict(d.lower_bounds or {}),
            dict(d.upper_bounds or {}), dict(d.null_value_counts or {}))


def test_our_reads_give_pyiceberg_s_entries_and_build_one_reader_per_schema(tmp_path: Path):
    t = open_table("iceberg", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    for i in range(1, 5):  # data files, then upserts and deletes (position-delete files)
        ts = 10 * i
        assert apply_batch(t, to_arrow([insert(ts, *[(p, f"n{p}") for p in range(10 * i, 10 * i + 10)]),
                                        *upsert(ts + 1, (i + 10, f"u{i}")), delete(ts + 2, 10 * i + 3)]),
                           "pk", "q", i)
    tbl = t._table()
    tbl.refresh()
    snap = tbl.current_snapshot()
    theirs = snap.manifests(tbl.io)
    before = manifest_read.built
    ours = manifest_read.list_manifests(snap.manifest_list, tbl.io)
    assert [(m.manifest_path, m.content, m.sequence_number, m.added_files_count, m.existing_files_count,
             m.deleted_files_count) for m in ours] == \
           [(m.manifest_path, m.content, m.sequence_number, m.added_files_count, m.existing_files_count,
             m.deleted_files_count) for m in theirs]
    assert {m.content.name for m in ours} == {"DATA", "DELETES"}
    for discard in (True, False):
        for m in ours:
            assert [_entry(e) for e in manifest_read.manifest_entries(m, tbl.io, discard)] == \
                   [_entry(e) for e in m.fetch_manifest_entry(tbl.io, discard)], m.manifest_path
    # a reader tree per file schema, not per file: the lists' and the manifests' (data and delete manifests share
    # theirs), however many files were read
    assert len(ours) >= 4 and manifest_read.built - before <= 3, manifest_read.built - before
    again = manifest_read.built
    for m in ours:
        manifest_read.manifest_entries(m, tbl.io)
    assert manifest_read.built == again
