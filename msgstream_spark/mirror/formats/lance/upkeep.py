"""A Lance table's history kept bounded by a running mirror (``mirror.upkeep``): its versions, their trim,
figures.

Lance keeps every version's manifest under ``_versions/`` (and its transaction under ``_transactions/``) until
``cleanup_old_versions`` removes it; a reader pinned to a version reads it while its manifest and the files it
names are there. The trim removes exactly the versions before the oldest one the policy keeps (Lance's
``versions=``: never the current one), after copying the batch records into the dataset's config (the versions
that carried them may go) and refusing a deposed writer (the table's writer epoch above this writer's). The
files no kept version reads go with the vacuum that follows (``maintenance.vacuum``)."""

from __future__ import annotations

import logging
from typing import Any

from msgstream_spark.mirror.common import check_epoch
from msgstream_spark.mirror.formats.lance import records as rec
from msgstream_spark.mirror.formats.lance.maintain import _ts
from msgstream_spark.mirror.store import uri

log = logging.getLogger(__name__)
_META_DIRS = ("_versions", "_transactions")


def versions(table: Any) -> list[tuple[int, int]]:
    """(version, committed ms) of the versions the dataset keeps, oldest first."""
    got = sorted(table._table().versions(), key=lambda v: v["version"])
    return [(int(v["version"]), int(_ts(v) * 1000)) for v in got]


def trim(table: Any, keep: int, epoch: int | None) -> dict[str, int]:
    """Remove the versions before version ``keep`` (the oldest kept); the counts of versions and bytes
    Lance reports removed."""
    ds = table._table()
    got = rec.read_records(ds)
    check_epoch(table.location, rec.epoch(got), epoch, "the history trim")
    old = [v for v, _ in versions(table) if v < keep]
    if not old:
        return {"versions_removed": 0, "bytes_removed": 0}
    if got and {k: v for k, v in ds.config().items() if rec.is_record(k)} != got:
        ds.update_config(got)  # the records outlive the versions that carried them
    stats = table._table().cleanup_old_versions(versions=old, error_if_tagged_old_versions=False)
    removed = int(getattr(stats, "old_versions", len(old)))
    log.info("%s: Lance cleanup removed %d version(s) before %d", table.location, removed, keep)
    return {"versions_removed": removed, "bytes_removed": int(getattr(stats, "bytes_removed", 0))}


def figures(table: Any) -> dict[str, int]:
    """The history's size: versions kept, Lance's metadata files (manifests, transactions) and their bytes."""
    metas = [m for d in _META_DIRS for m in table.store.list(uri.join(table.root, d))]
    return {"versions": len(versions(table)), "metadata_files": len(metas),
            "metadata_bytes": sum(m.size for m in metas), "version": version_number(table)}


def version_number(table: Any) -> int:
    """The dataset's version."""
    return int(table._table().version)


def manifests(table: Any) -> int:
    """Lance has one manifest per version, nothing to merge: 0."""
    return 0


def merge_manifests(table: Any, epoch: int | None) -> int:
    """Nothing to merge in Lance."""
    return 0
