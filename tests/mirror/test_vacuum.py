"""Vacuum's retention rule (mirror/maintenance.py, Delta's VACUUM rule): a file stays while a version committed
within the retention reads it, whenever it was written. Readers pinned to a version from before a compaction
(delta-rs at a version, pyiceberg at a snapshot id, ``mirror verify``'s pinned read) read it whole after a vacuum
with the default retention, though every file is 8 days old; with retention 0 the files they read are gone.
Files no version ever referenced go by their age; Iceberg's metadata files expire with the snapshots."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pyarrow as pa
import pytest

from msgstream_spark.mirror import open_table
from msgstream_spark.mirror.maintenance import compact, vacuum
from msgstream_spark.mirror.verify.pinned import PinnedTable
from tests.mirror.changes import FIELDS, fill, mixed_batches, model, table_state

DAY = 86400.0


def _open(fmt, loc):
    return open_table(fmt, str(loc), collection="coll", pk="pk", arrow_schema=FIELDS)


def _files(root: str) -> list[str]:
    """The data files, deletion vectors and delete files under the table (not its log or metadata)."""
    out = [os.path.join(root, n) for n in os.listdir(root) if n.startswith("deletion_vector_")]
    return out + [os.path.join(root, "data", n) for n in os.listdir(os.path.join(root, "data"))
                  if n.endswith(".parquet")]


def _age(paths: list[str], seconds: float) -> None:
    then = time.time() - seconds
    for p in paths:
        os.utime(p, (then, then))


def _string_views_as_strings(t: pa.Table) -> pa.Table:
    return t.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in t.schema]))


def _read_pinned(fmt: str, handle) -> dict:
    """The pinned version read whole by the format's own library."""
    if fmt == "delta":
        import deltalake

        got = deltalake.QueryBuilder().register("t", handle).execute("SELECT * FROM t").read_all()
        return table_state(_string_views_as_strings(pa.table(got)))
    tbl, snapshot_id = handle
    return table_state(tbl.scan(snapshot_id=snapshot_id).to_arrow())


def _pin(fmt: str, t):
    if fmt == "delta":
        import deltalake

        return deltalake.DeltaTable(t.location, version=t._table().version())
    tbl = _catalog(t.root).load_table(("msgstream", "coll"))  # its own handle, as another process has
    return tbl, tbl.current_snapshot().snapshot_id


def _catalog(root: str):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("msgstream", uri=f"sqlite:///{root}_catalog.sqlite", warehouse=f"file://{root}")


@pytest.fixture
def eight_days_ago(monkeypatch):
    """While active, pyiceberg stamps its snapshots 8 days in the past (Delta needs no such thing: its
    removes are stamped when they are committed, the files' ages are set with ``os.utime``)."""
    import pyiceberg.table.snapshots as snapshots

    def set_on(on: bool) -> None:
        if on:
            monkeypatch.setattr(snapshots, "time", SimpleNamespace(time=lambda: time.time() - 8 * DAY))
        else:
            monkeypatch.undo()
    return set_on


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_reader_pinned_before_a_compaction_reads_its_version_after_a_vacuum(fmt, tmp_path, eight_days_ago):
    t = _open(fmt, tmp_path / "t")
    eight_days_ago(fmt == "iceberg")
    seen = fill(t, mixed_batches(4, 0), 0)
    more = mixed_batches(1, 4)  # Delta: a batch after the pin supersedes the pinned version's deletion vectors
    if fmt == "iceberg":  # Iceberg: the pinned snapshot (8 days old) is replaced by the compaction only
        seen += fill(t, more, 4)
    eight_days_ago(False)
    _age(_files(t.root), 8 * DAY)  # every file of the pinned version was written 8 days ago
    old_files = set(_files(t.root))
    pinned, verify_pin = _pin(fmt, t), PinnedTable(_open(fmt, tmp_path / "t"))  # a reader; verify's pinned read
    want = model(seen)
    if fmt == "delta":
        fill(t, more, 4)
    assert compact(t).files_in > 1
    assert not old_files & {f.path for f in t.live_files()}

    gone = vacuum(t)  # the default retention (168 hours): every file was removed a moment ago
    assert not set(gone) & old_files
    assert _read_pinned(fmt, pinned) == want
    verified = pa.Table.from_batches(list(verify_pin.batches()))
    assert table_state(_string_views_as_strings(verified)) == want
    everything = model(seen + ([m for b in more for m in b] if fmt == "delta" else []))
    assert table_state(t.to_arrow()) == everything

    gone = vacuum(t, retain_s=0)  # now nothing reads them within the retention
    assert old_files <= set(gone) and not any(os.path.exists(p) for p in old_files)
    with pytest.raises(Exception, match=r"(?i)not found|no such file|does not exist"):
        _read_pinned(fmt, pinned)
    assert table_state(_open(fmt, tmp_path / "t").to_arrow()) == everything


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_file_written_8_days_ago_and_removed_a_minute_ago_is_kept(fmt, tmp_path, eight_days_ago):
    t = _open(fmt, tmp_path / "t")
    eight_days_ago(fmt == "iceberg")
    seen = fill(t, mixed_batches(2, 0), 0)
    eight_days_ago(False)
    _age(_files(t.root), 8 * DAY)
    before = {f.path for f in t.live_files()}
    compact(t)
    removed = before - {f.path for f in t.live_files()}
    assert removed
    assert vacuum(t, retain_s=7 * DAY, dry_run=True) == []
    assert vacuum(t, retain_s=7 * DAY) == []
    assert all(os.path.exists(p) for p in removed)
    assert removed <= set(vacuum(t, retain_s=0, dry_run=True))  # a retention shorter than since the compaction
    assert table_state(t.to_arrow()) == model(seen)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_files_no_version_references_go_by_their_age(fmt, tmp_path):
    t = _open(fmt, tmp_path / "t")
    seen = fill(t, mixed_batches(2, 0), 0)
    live = set(_files(t.root))
    old, young = os.path.join(t.root, "data", "killed-old.parquet"), os.path.join(t.root, "data", "killed-new.parquet")
    for p in (old, young):
        with open(p, "wb") as f:
            f.write(b"PAR1 half written")
    _age([old], 8 * DAY)
    _age([young], 6 * DAY)
    _age(list(live), 30 * DAY)  # the live files: old, still referenced
    assert vacuum(t) == [old]
    assert os.path.exists(young) and all(os.path.exists(p) for p in live)
    assert table_state(t.to_arrow()) == model(seen)


def test_iceberg_metadata_expires_with_its_snapshots(tmp_path):
    """Retention 0: one snapshot left, its manifest list and manifests, the current metadata file and those its
    metadata log keeps (``write.metadata.previous-versions-max``); the table reads the same through a fresh
    catalog."""
    t = _open("iceberg", tmp_path / "t")
    with t._table().transaction() as tx:
        tx.set_properties({"write.metadata.previous-versions-max": "3"})
    seen = fill(t, mixed_batches(5, 0), 0)
    compact(t)
    meta_dir = os.path.join(t.root, "metadata")
    before = set(os.listdir(meta_dir))
    vacuum(t, retain_s=0)
    tbl = t._table()
    tbl.refresh()
    snap = tbl.current_snapshot()
    assert [s.snapshot_id for s in tbl.snapshots()] == [snap.snapshot_id]
    want = {tbl.metadata_location, *(e.metadata_file for e in tbl.metadata.metadata_log), snap.manifest_list,
            *(m.manifest_path for m in snap.manifests(tbl.io))}
    assert {os.path.join(meta_dir, n) for n in os.listdir(meta_dir)} == {p.removeprefix("file://") for p in want}
    assert len(tbl.metadata.metadata_log) == 3 and len(before) > len(want) + 10
    assert table_state(_catalog(t.root).load_table(("msgstream", "coll")).scan().to_arrow()) == model(seen)


@pytest.mark.parametrize("tombstones", [None, "interval 0 seconds"])
def test_delta_removes_are_found_in_a_checkpoint_and_before_it(tombstones, tmp_path):
    """A checkpoint after the compaction holds its removes (delta-rs keeps them for the table's
    ``delta.deletedFileRetentionDuration``); with a table retention shorter than vacuum's, the checkpoint has
    dropped them and the commits before it are read."""
    t = _open("delta", tmp_path / "t")
    if tombstones:
        t._table().alter.set_table_properties({"delta.deletedFileRetentionDuration": tombstones},
                                              raise_if_not_exists=False)
    seen = fill(t, mixed_batches(3, 0), 0)
    _age(_files(t.root), 8 * DAY)
    before = set(_files(t.root))
    compact(t)
    t._table().create_checkpoint()
    seen += fill(t, mixed_batches(1, 3), 3)  # a commit after the checkpoint
    import pyarrow.parquet as pq

    ck = [n for n in os.listdir(os.path.join(t.root, "_delta_log")) if n.endswith(".checkpoint.parquet")]
    removes = [r for r in pq.read_table(os.path.join(t.root, "_delta_log", ck[0])).column("remove").to_pylist() if r]
    assert len(ck) == 1 and (not removes) == bool(tombstones)
    assert not set(vacuum(t)) & before and all(os.path.exists(p) for p in before)
    assert before - {f.path for f in t.live_files()} <= set(vacuum(t, retain_s=0))
    assert table_state(t.to_arrow()) == model(seen)
