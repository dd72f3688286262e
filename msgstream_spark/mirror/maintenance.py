"""Keeping a merge-on-read table small and fast to read: compaction, orphaned files, vacuum.

- ``compact``: the data files that have deleted rows, and the small ones, are read one at a time, their
  live rows written into new files of about ``target_bytes``, and one commit swaps them (Delta: removes
  and adds; Iceberg: one snapshot removing the data files and every position-delete file, adding the new
  files). Exactly once: the swap is one commit; a compaction killed before it leaves only unreferenced new
  files (``orphans``), after it there is nothing left to compact. It holds the table's writer lease.
- ``orphans``: files under the table's data directories that no current version references and that are older
  than ``min_age_s`` (``classify_orphans`` tells expired history, which an earlier version read, from what a batch,
  a compaction or a snapshot task killed before its commit left); and the temporary files a writer
  killed mid-write left on a local store (a Delta commit's ``_delta_log/.N.json.*.tmp``, a data or key index
  file's ``.*.tmp``), once older than ``TMP_MIN_AGE_S`` too (an object store publishes a file whole or not at
  all: a killed multipart upload is S3's ``AbortIncompleteMultipartUpload`` lifecycle rule's to clean).
- ``vacuum``: keeps every file a version committed within ``retain_s`` reads, as Delta's VACUUM does: a file
  removed at time R (Delta: the ``remove``'s ``deletionTimestamp``, deletion vector files alike; Iceberg:
  the snapshot that replaced the one reading it) goes once R is older than ``retain_s``, whenever it was
  written; files no version references (a killed writer's) go once written more than ``retain_s`` ago.
  Iceberg: the snapshots not current within ``retain_s`` are expired first, and the metadata files beyond
  the metadata log, the expired snapshots' manifest lists and unlisted manifests go too. Time travel to a
  moment before ``now - retain_s`` then fails.

Everything goes through the table's store: listings (with each object's modification time), reads of the
files compacted (whole, one read each), the new files (streamed out), deletes.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror.common import conform
from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.formats.base import DATA_DIR, LiveFile
from msgstream_spark.mirror.store import ObjectMeta, Store, uri
from msgstream_spark.mirror.store.parquet import ParquetOut, read_parquet
from msgstream_spark.mirror.store.writer import writer_lock
from msgstream_spark.mirror.write.keyindex import remove_side_file

TARGET_BYTES = 256 << 20
# tests: kill-in-compaction-write (a new file half written), kill-in-compaction (the new files written, before
# the commit), kill-after-compaction-commit: the process SIGKILLs itself there
FAILPOINT_ENV = "MSGSTREAM_MIRROR_FAILPOINT"


def _failpoint(step: str) -> None:
    if os.environ.get(FAILPOINT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Compaction:
    files_in: int
    files_out: int
    rows: int
    deleted_rows: int


def _live_rows(store: Store, f: LiveFile) -> pa.Table:
    t = read_parquet(store, f.path)
    if len(f.deleted):
        keep = np.ones(t.num_rows, dtype=bool)
        keep[f.deleted.astype(np.int64)] = False
        t = t.filter(pa.array(keep))
    return t


def pick(files: list[LiveFile], target_bytes: int, store: Store | None = None) -> list[LiveFile]:
    """The files a compaction rewrites: every file with deleted rows, and the files under half the target
    size when there are at least two of them in one partition (files of two partitions never merge). Sizes as
    the table's metadata records them (a file without one: asked of the store)."""
    small: dict = {}
    for f in files:
        if not len(f.deleted) and _size(store, f) < target_bytes // 2:
            small.setdefault(f.partition, []).append(f)
    return [f for f in files if len(f.deleted)] + [f for g in small.values() if len(g) > 1 for f in g]


def compact(table, target_bytes: int = TARGET_BYTES) -> Compaction:
    """Rewrite the files with deletes and the small files of ``table`` into files of about ``target_bytes``,
    each of one partition (an Iceberg table's identity partition: its files each hold one value)."""
    with writer_lock(table.store, table.location, "the compaction") as hold:
        files = table.live_files()
        own = registry.of(table).compact  # a format with a compaction of its own (Lance's compact_files)
        if own is not None:
            return Compaction(*hold.commit(table, lambda epoch: own(table, target_bytes, files.version, epoch)))
        picked = pick(files, target_bytes, table.store)
        if not picked:
            return Compaction(0, 0, 0, 0)
        spec = table.write_spec()
        groups: dict = {}
        for f in picked:
            groups.setdefault(f.partition, []).append(f)
        out, rows = [], 0
        for group in groups.values():
            rows += _rewrite(table.store, group, spec, target_bytes, out)
        _failpoint("kill-in-compaction")
        hold.commit(table, lambda epoch: table.swap_files(picked, out, base=files.version, epoch=epoch))
        _failpoint("kill-after-compaction-commit")
        deleted = sum(len(f.deleted) for f in picked)
        return Compaction(len(picked), len(out), rows, deleted)


def _size(store: Store | None, f: LiveFile) -> int:
    if f.size or store is None:
        return f.size
    meta = store.head(f.path)
    return meta.size if meta is not None else 0


def _rewrite(store: Store, files: list[LiveFile], spec, target_bytes: int, out: list[str]) -> int:
    """The live rows of ``files`` (one partition) written into new files of about ``target_bytes`` (their paths
    appended to ``out``); the rows written."""
    writer, size, rows = None, 0, 0
    try:
        for f in files:
            t = conform(_live_rows(store, f), spec.schema)
            if t.num_rows == 0:
                continue
            if writer is None or size >= target_bytes:
                if writer is not None:
                    writer.close()
                out.append(uri.join(spec.data_dir, f"{uuid.uuid4().hex}.parquet"))
                writer, size = ParquetOut(store, out[-1], spec.schema, spec.pk, compression="zstd"), 0
            writer.write_table(t, row_group_size=128 * 1024)
            _failpoint("kill-in-compaction-write")
            size += _size(store, f)
            rows += t.num_rows
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return rows


# a temporary file lives while one file is written (a Delta commit, a key index, a snapshot file) and is then
# renamed or unlinked; one older than this was left by a killed writer (never a live writer's in-flight file)
TMP_MIN_AGE_S = 3600.0


def _candidates(store: Store, root: str, suffixes: tuple[str, ...] = ()) -> tuple[list[ObjectMeta], list[ObjectMeta]]:
    """Files the write path and the snapshot put under the table (data/, snapshot-*/, deletion vectors), and
    the temporary files a killed writer leaves on a local store (``*.tmp`` there, e.g. ``_keys/*.tmp``, and
    Delta's ``_delta_log/.N.json.*.tmp``), and under data/ those ending in ``suffixes`` (the format's own:
    ``Format.file_suffixes``); listed with their modification times."""
    out, tmps = [], []
    rel_of = uri.relative_to(root)  # the root parsed once: a table's listing is thousands of paths
    for m in store.list(root):
        rel = rel_of(m.uri) or ""
        top, _, rest = rel.partition("/")
        name = rel.rsplit("/", 1)[-1]
        if not rest and top.startswith("deletion_vector_") and top.endswith(".bin"):
            out.append(m)
        elif top == "_delta_log" and "/" not in rest and name.startswith(".") and name.endswith(".tmp") \
                and ".json." in name:
            tmps.append(m)
        elif rest and (top == DATA_DIR or top.startswith("snapshot-")):
            if name.endswith((".parquet", ".bin", *suffixes)):
                out.append(m)
            elif name.endswith(".tmp"):
                tmps.append(m)
    return out, tmps


def _key(table, path: str) -> str:
    """A path as the table's own lists name it (a local path for a local table)."""
    loc = uri.parse(path)
    return loc.key if loc.kind == "local" else path


def orphans(table, min_age_s: float = 0.0) -> list[str]:
    """Files under the table's data directories that no current version references, older than ``min_age_s``,
    and the temporary files killed writers left, older than that and than ``TMP_MIN_AGE_S``."""
    live = {_key(table, p) for p in table.referenced_files()}
    now = time.time()
    files, tmps = _candidates(table.store, table.root, registry.of(table).file_suffixes)
    return sorted([m.uri for m in files if _key(table, m.uri) not in live and now - m.mtime >= min_age_s]
                  + [m.uri for m in tmps if now - m.mtime >= max(min_age_s, TMP_MIN_AGE_S)])


ORPHAN_KINDS = {
    "expired_history": "an earlier version of the table read it (a superseded deletion vector or position-delete "
                       "file, a data file a compaction or a re-snapshot removed): normal history, which vacuum "
                       "deletes once it was removed longer ago than the retention (--retain-hours)",
    "left_by_writers": "no version ever referenced it: what a batch, a compaction or a snapshot task killed or failed "
                       "before its commit wrote (or a killed writer's temporary file); vacuum deletes it once it was "
                       "written longer ago than the retention (--retain-hours)",
}


@dataclass
class OrphanKinds:
    """``orphans``' files split by what left them (:data:`ORPHAN_KINDS`)."""

    expired_history: list[str]
    left_by_writers: list[str]


def classify_orphans(table, paths: list[str]) -> OrphanKinds:
    """Which of ``paths`` (``orphans``' answer) a version the table's history still records read (Delta: a
    ``remove`` of its log names it; Iceberg: a snapshot the table keeps reads it) and which no version ever did."""
    now = time.time()
    seen = {_key(table, p) for p in table.retained_files(now, now)}  # a retention reaching back to the epoch
    history = [p for p in paths if _key(table, p) in seen]
    return OrphanKinds(history, [p for p in paths if _key(table, p) not in seen])


def vacuum(table, retain_s: float = 7 * 86400, dry_run: bool = False, now: float | None = None) -> list[str]:
    """Delete the files no version committed within ``retain_s`` reads; their paths. A file a commit removed
    at time R stays until R is older than ``retain_s`` (Delta: its ``remove``'s ``deletionTimestamp``;
    Iceberg: the snapshots current within it are kept, the others expired first); a file no version ever
    referenced (a killed writer's) goes once it was written more than ``retain_s`` ago. ``now``: the moment the
    retention is counted back from (default: when the vacuum begins)."""
    with writer_lock(table.store, table.location, "the vacuum") as hold:
        if not dry_run:  # a deposed writer's commit of files deleted below is refused from here on
            hold.fence(table)
        now = time.time() if now is None else now
        if not dry_run:  # Iceberg: one commit expires the snapshots not current within the retention
            table.expire(retain_s, now)
        keep = {_key(table, p) for p in table.retained_files(retain_s, now)}
        files, tmps = _candidates(table.store, table.root, registry.of(table).file_suffixes)
        files += [m for p in table.metadata_files() if (m := table.store.head(p)) is not None]
        gone = sorted([m.uri for m in files if _key(table, m.uri) not in keep and now - m.mtime >= retain_s]
                      + [m.uri for m in tmps if now - m.mtime >= max(retain_s, TMP_MIN_AGE_S)])
        if not dry_run:
            for p in gone:
                table.store.delete(p)
                remove_side_file(p, table.store)
        return gone
