"""The snapshots and files of an Iceberg table a vacuum keeps, by Delta's VACUUM rule.

A snapshot is read by readers from its commit until the next snapshot became current (the table's
``snapshot-log``), and by time travel to any moment in between. So a snapshot is kept while it is the
current one, a branch or tag head, or was current at some moment within the retention: a snapshot
replaced by a compaction a minute ago is kept for the whole retention however old it is, and so are its
data files, delete files, manifest list and manifests. The others are expired (removed from the table's
metadata in one commit) and what only they referenced can go.

The table's metadata files: the current one and those its ``metadata-log`` lists (at most
``write.metadata.previous-versions-max``, 100 by default: Iceberg's own count, the ones
``write.metadata.delete-after-commit.enabled`` would keep) are kept; older metadata files, the manifest lists
of expired snapshots and the manifests no kept snapshot lists are not referenced any more.

Every file is returned in the store's spelling (``files.store_path``), as the store lists them.
"""

from __future__ import annotations

from msgstream_spark.mirror.formats.iceberg.cached import manifests
from msgstream_spark.mirror.formats.iceberg.files import store_path
from msgstream_spark.mirror.formats.iceberg.manifest_read import manifest_entries
from msgstream_spark.mirror.store import Store


def split_snapshots(meta, cutoff_ms: int) -> tuple[list, list]:
    """(kept, expired) snapshots of table metadata ``meta`` for a retention that began at ``cutoff_ms``."""
    logged = {e.snapshot_id for e in meta.snapshot_log}
    until: dict[int, int] = {}  # snapshot id -> when another snapshot replaced it as the current one
    for a, b in zip(meta.snapshot_log, meta.snapshot_log[1:]):
        until[a.snapshot_id] = max(until.get(a.snapshot_id, 0), b.timestamp_ms)
    for s in meta.snapshots:  # a snapshot the log does not name (e.g. a branch's): its children's commits
        if s.parent_snapshot_id is not None and s.parent_snapshot_id not in logged:
            until[s.parent_snapshot_id] = max(until.get(s.parent_snapshot_id, 0), s.timestamp_ms)
    heads = {ref.snapshot_id for ref in meta.refs.values()} | {meta.current_snapshot_id}
    kept, expired = [], []
    for s in meta.snapshots:
        if s.snapshot_id in heads or max(s.timestamp_ms, until.get(s.snapshot_id, 0)) > cutoff_ms:
            kept.append(s)
        else:
            expired.append(s)
    return kept, expired


def snapshot_files(store: Store, tbl, snapshots: list, known: dict[str, list] | None = None) -> set[str]:
    """The data and delete files the ``snapshots`` read, with their manifest lists and manifests. A manifest is
    shared by the snapshots that carry it: each is read once, and not at all if ``known`` (manifest path -> the
    data files of its live entries, e.g. the table's ``live_files`` read them) has it."""
    out: set[str] = set()
    seen: set[str] = set()
    for snap in snapshots:
        out.add(store_path(store, snap.manifest_list))
        for m in manifests(snap, tbl.io):
            if m.manifest_path in seen:
                continue
            seen.add(m.manifest_path)
            out.add(store_path(store, m.manifest_path))
            files = (known or {}).get(m.manifest_path)
            if files is None:
                files = [e.data_file for e in manifest_entries(m, tbl.io)]
            out.update(store_path(store, f.file_path) for f in files)
    return out


def metadata_json_files(store: Store, tbl) -> set[str]:
    """The table's current metadata file and the previous ones its metadata log keeps."""
    return {store_path(store, tbl.metadata_location),
            *(store_path(store, e.metadata_file) for e in tbl.metadata.metadata_log)}


def metadata_dir_files(store: Store, tbl) -> list[str]:
    """The metadata files, manifest lists and manifests in the directory of the current metadata file (listed
    through the store)."""
    meta = store_path(store, tbl.metadata_location)
    folder = meta[:meta.rstrip("/").rfind("/")]
    return [m.uri for m in store.list(folder) if m.uri.endswith((".metadata.json", ".avro"))]
