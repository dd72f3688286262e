"""An Iceberg table's history kept bounded by a running mirror: snapshot expiry, manifest merging, figures.

pyiceberg 0.12 rewrites the whole ``metadata.json`` (every snapshot, the snapshot log) at each commit and
deep-copies it several times per commit, so a commit's cost grows with the snapshots kept
(service-notes.md: 78 ms at 1, 1.7 s at 1,000). ``trim`` expires, in one commit fenced at the head and at the
writer's epoch, the snapshots no kept version needs (``expiry.split_snapshots``: a snapshot that was current
at the moment the kept history begins is kept), and bounds the metadata files the log keeps
(``write.metadata.previous-versions-max``, when the table does not set it, to :data:`METADATA_VERSIONS`);
the files only they read go with the job's vacuum.

pyiceberg merges manifests only in its own ``append`` (``commit.manifest-merge.enabled``); the mirror's
snapshots (``commit.py``) carry the parent's manifests and add one or two per batch, and a compaction leaves
manifests of deleted entries only. ``merge_manifests`` is a ``replace`` snapshot that rewrites the current
snapshot's manifests of the default spec into one data and one delete manifest of their live entries
(sequence numbers kept: position deletes apply to the same data files as before).
"""

from __future__ import annotations

from msgstream_spark.mirror.common import check_epoch
from msgstream_spark.mirror.formats.iceberg.cached import manifests as manifest_files
from msgstream_spark.mirror.formats.iceberg.cached import transaction
from msgstream_spark.mirror.formats.iceberg.commit import (
    _producer_type,
    assert_head,
    fenced,
    head_id,
    table_epoch,
)
from msgstream_spark.mirror.formats.iceberg.expiry import split_snapshots
from msgstream_spark.mirror.formats.iceberg.files import store_path
from msgstream_spark.mirror.formats.iceberg.manifest_read import manifest_entries

PREVIOUS_VERSIONS_KEY = "write.metadata.previous-versions-max"
METADATA_VERSIONS = 10  # metadata.json files the metadata log keeps (Iceberg's default: 100)


def versions(table) -> list[tuple[int, int]]:
    """(snapshot id, ms it became current) of the kept snapshots in the table's snapshot log, oldest first."""
    tbl = table._table()
    tbl.refresh()
    have = {s.snapshot_id for s in tbl.metadata.snapshots}
    return [(e.snapshot_id, int(e.timestamp_ms)) for e in tbl.metadata.snapshot_log if e.snapshot_id in have]


def trim(table, keep: int, epoch: int | None) -> dict[str, int]:
    """Expire the snapshots no version from snapshot ``keep`` on needs (one commit); the count expired."""
    from pyiceberg.table.update import RemoveSnapshotsUpdate

    tbl = table._table()
    tbl.refresh()
    meta = tbl.metadata
    since = next((e.timestamp_ms for e in meta.snapshot_log if e.snapshot_id == keep), None)
    if since is None:
        return {"snapshots_expired": 0}
    _, expired = split_snapshots(meta, int(since))
    props = {} if PREVIOUS_VERSIONS_KEY in meta.properties else {PREVIOUS_VERSIONS_KEY: str(METADATA_VERSIONS)}
    if not expired and not props:
        return {"snapshots_expired": 0}
    check_epoch(table.location, table_epoch(meta), epoch, "the snapshot expiry")
    ids = [s.snapshot_id for s in expired]
    with fenced(table.location, f"expiring {len(ids)} snapshot(s)"), transaction(tbl) as tx:
        assert_head(tx, head_id(meta))  # refused if a writer committed meanwhile (a deposed one included)
        if ids:
            tx._apply((RemoveSnapshotsUpdate(snapshot_ids=ids),), ())
        if props:
            tx.set_properties(props)
    return {"snapshots_expired": len(ids)}


def figures(table) -> dict[str, int]:
    """The metadata's size: snapshots kept, files and bytes under the metadata directory, manifests of the
    current snapshot."""
    tbl = table._table()
    tbl.refresh()
    meta = store_path(table.store, tbl.metadata_location)
    metas = [m for m in table.store.list(meta[:meta.rstrip("/").rfind("/")])
             if m.uri.endswith((".metadata.json", ".avro"))]
    return {"versions": len(tbl.metadata.snapshots), "metadata_files": len(metas),
            "metadata_bytes": sum(m.size for m in metas), "manifests": manifests(table),
            "version": version_number(table)}


def version_number(table) -> int:
    """The table's version as a number that grows by one a commit: its last sequence number (a snapshot id is
    random)."""
    return int(table._table().metadata.last_sequence_number)


_listed: dict[str, int] = {}  # manifest list -> its manifests (a manifest list never changes)


def manifests(table) -> int:
    """The manifests the current snapshot lists (its manifest list read once)."""
    tbl = table._table()
    snap = tbl.current_snapshot()
    if snap is None:
        return 0
    if snap.manifest_list not in _listed:
        if len(_listed) > 1000:
            _listed.clear()
        _listed[snap.manifest_list] = len(manifest_files(snap, tbl.io))
    return _listed[snap.manifest_list]


def merge_manifests(table, epoch: int | None) -> int:
    """One ``replace`` snapshot whose manifests of the default spec are merged into one per content (data,
    deletes), holding their live entries; the manifests merged (0: nothing to merge)."""
    from pyiceberg.table.snapshots import Operation

    tbl = table._table()
    tbl.refresh()
    snap = tbl.current_snapshot()
    if snap is None:
        return 0
    spec = tbl.metadata.default_spec_id
    mergeable = [m for m in manifest_files(snap, tbl.io) if m.partition_spec_id == spec]
    if len(mergeable) < 2:
        return 0
    check_epoch(table.location, table_epoch(tbl.metadata), epoch, "the manifest merge")
    with fenced(table.location, "the manifest merge"), transaction(tbl) as tx:
        p = _merger_type()(Operation.REPLACE, tx, tbl.io, snapshot_properties={"msgstream.operation": "merge"})
        p.adds, p.removes, p.what, p.location = [], set(), "the manifest merge", table.location
        p.want, p.spec_id = snap.snapshot_id, spec
        p._validate_concurrency()
        with p:
            pass
    return len(mergeable)


_TYPES: dict[str, type] = {}


def _merger_type() -> type:
    """Our snapshot producer whose manifests are the parent's, those of spec ``spec_id`` merged."""
    if "merger" in _TYPES:
        return _TYPES["merger"]
    from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus

    class Merger(_producer_type()):
        def _made(self) -> list:
            parent = self._meta().snapshot_by_id(self._parent_snapshot_id)
            out, groups = [], {ManifestContent.DATA: [], ManifestContent.DELETES: []}
            for m in manifest_files(parent, self._io):
                if m.partition_spec_id != self.spec_id:
                    out.append(m)
                    continue
                groups[m.content] += manifest_entries(m, self._io)
            for content, entries in groups.items():
                if not entries:
                    continue
                with self._writer(content) as w:
                    for e in entries:
                        w.add_entry(ManifestEntry.from_args(
                            status=ManifestEntryStatus.EXISTING, snapshot_id=e.snapshot_id,
                            sequence_number=e.sequence_number, file_sequence_number=e.file_sequence_number,
                            data_file=e.data_file))
                out.append(w.to_manifest_file())
            return out

    _TYPES["merger"] = Merger
    return Merger
