"""Compaction and cleanup of a Lance mirror table through Lance's own operations (``optimize.compact_files``,
``cleanup_old_versions``), fenced like the other formats' (the version read, the writer epoch), and the files
the versions within a retention read (what vacuum keeps)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import check_epoch
from msgstream_spark.mirror.formats.base import fence_message
from msgstream_spark.mirror.formats.lance import records as rec
from msgstream_spark.mirror.formats.lance.fragments import key_file, write_key_file
from msgstream_spark.mirror.order import SEQ

log = logging.getLogger(__name__)

TARGET_ROWS = 1 << 20  # rows per compacted fragment (Lance's default)


def compact(table: Any, target_bytes: int, base: int | None, epoch: int | None) -> tuple[int, int, int, int]:
    """Lance's ``compact_files`` (every fragment with deleted rows rewritten, its deletions materialized; small
    ones merged up to about ``target_bytes``), then a key file for each fragment it wrote. Refused, nothing
    committed, if the table moved from ``base`` or holds a writer epoch above ``epoch``. (fragments in, fragments
    out, rows they hold, deleted rows dropped)."""
    ds = table._table()
    check_epoch(table.location, rec.epoch(rec.read_records(ds)), epoch, "the compaction")
    if base is not None and base != ds.version:
        raise MirrorError(fence_message(table.location, "version", base, ds.version, "the compaction"))
    before = {f.fragment_id: (f.metadata.physical_rows, f.count_rows()) for f in ds.get_fragments()}
    rows = sum(live for _, live in before.values())
    size = sum(d.file_size_bytes or 0 for f in ds.get_fragments() for d in f.metadata.files)
    per_row = size / rows if rows else 1.0
    ds.optimize.compact_files(target_rows_per_fragment=max(1024, int(target_bytes / max(per_row, 1.0))),
                              materialize_deletions=True, materialize_deletions_threshold=0.0)
    after = table._table()
    write_missing_key_files(table, after)
    gone = set(before) - {f.fragment_id for f in after.get_fragments()}
    new = {f.fragment_id for f in after.get_fragments()} - set(before)
    return (len(gone), len(new), sum(before[i][1] for i in gone), sum(before[i][0] - before[i][1] for i in gone))


def write_missing_key_files(table: Any, ds: Any) -> int:
    """A key file for each fragment of ``ds`` without one (written by Lance: a compaction); how many."""
    n = 0
    for f in ds.get_fragments():
        if table.store.head(key_file(table.root, f.metadata.files[0].path)) is None:
            write_key_file_of(table, f)
            n += 1
    return n


def write_key_file_of(table: Any, fragment: Any) -> None:
    """The key file of a fragment another writer made (its rows' key and ``_seq`` in their order); MirrorError
    for one with deleted rows (its row positions can no longer be read in order)."""
    md = fragment.metadata
    if fragment.deletion_file():
        raise MirrorError(f"fragment {md.id} of table {table.location} has deleted rows and no key file: written "
                          "by another tool; compact the table (msgstream mirror compact) before the next batch")
    keys = fragment.to_table(columns=[table.pk, SEQ])
    write_key_file(table.store, table.root, md.files[0].path, keys, table.pk)


def retained(table: Any, retain_s: float, now: float) -> set[str]:
    """Every file a version current at some moment within ``retain_s`` before ``now`` reads."""
    ds = table._table()
    cutoff = now - retain_s
    versions = sorted(ds.versions(), key=lambda v: v["version"])
    keep = [v["version"] for v in versions if _ts(v) >= cutoff]
    older = [v["version"] for v in versions if _ts(v) < cutoff]
    if older:
        keep.append(older[-1])  # the version current at the cutoff
    out: set[str] = set()
    for v in keep:
        try:
            out |= table._files_of(ds.checkout_version(v))
        except (OSError, ValueError) as e:  # a version cleaned up meanwhile reads nothing any more
            log.info("version %s of %s is gone (%s)", v, table.location, e)
    return out


def _ts(v: dict) -> float:
    t = v["timestamp"]
    return t.timestamp() if hasattr(t, "timestamp") else float(t) / 1e9


def expire(table: Any, retain_s: float, now: float) -> None:
    """The batch records copied into the config (the versions that carry them may go), then Lance's
    ``cleanup_old_versions`` of the versions older than the retention (the latest is always kept)."""
    ds = table._table()
    got = rec.read_records(ds)
    if got and {k: v for k, v in ds.config().items() if rec.is_record(k)} != got:
        ds.update_config(got)
    table._table().cleanup_old_versions(older_than=timedelta(seconds=max(retain_s, 0.0)))
