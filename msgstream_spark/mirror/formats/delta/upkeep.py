"""A Delta table's history kept bounded by a running mirror: its versions, log cleanup, figures.

The mirror writes its own commit files (``log.write_commit``): no delta-rs post-commit hook runs, so the log
cleanup Delta's writers do after a checkpoint is done here. A version is readable (time travel, a reader
pinned to it) while a checkpoint at or before it and every commit file from that checkpoint up to it are
there; so the files of the versions before the newest checkpoint at or before the oldest version kept are
deleted, never a file a kept version needs. ``delta.enableExpiredLogCleanup=false`` on the table switches
this off; ``delta.logRetentionDuration``, when the table sets it, keeps the log of that duration whatever
the policy's ``retain.max`` (the policy's ``retain.age`` otherwise).
"""

from __future__ import annotations

import logging
import re

from msgstream_spark.mirror.common import PROP_WRITER_EPOCH, check_epoch
from msgstream_spark.mirror.formats.delta.log import log_uri
from msgstream_spark.mirror.formats.delta.retention import TOMBSTONE_RETENTION_KEY, interval_ms
from msgstream_spark.mirror.store import ObjectMeta

log = logging.getLogger(__name__)

LOG_RETENTION_KEY = "delta.logRetentionDuration"
LOG_CLEANUP_KEY = "delta.enableExpiredLogCleanup"
_NAME = re.compile(r"^(\d{20})\.(json|crc|checkpoint(?:\.\d{10}\.\d{10})?\.parquet)$")


def _listing(table) -> list[tuple[int, str, ObjectMeta]]:
    """(version, kind, object) of the versioned files in the table's ``_delta_log``, by version."""
    out = []
    for m in table.store.list(log_uri(table.root)):
        got = _NAME.match(m.uri.rsplit("/", 1)[-1])
        if got:
            out.append((int(got.group(1)), got.group(2), m))
    return sorted(out, key=lambda x: (x[0], x[1]))


def versions(table) -> list[tuple[int, int]]:
    """(version, committed ms: its commit file's modification time) of the versions whose commit file is in
    the log, oldest first."""
    return [(v, int(m.mtime * 1000)) for v, kind, m in _listing(table) if kind == "json"]


def log_age_ms(table) -> int | None:
    """The table's own ``delta.logRetentionDuration`` in ms (None: not set)."""
    conf = table._table().metadata().configuration
    return interval_ms(conf[LOG_RETENTION_KEY]) if LOG_RETENTION_KEY in conf else None


def configure(table, retain_age_s: float) -> bool:
    """Bound what each checkpoint carries: Delta checkpoints keep the ``remove`` tombstones younger than
    ``delta.deletedFileRetentionDuration`` (1 week by default: at a commit a second, hundreds of thousands of
    tombstones rewritten at each checkpoint), so a table that does not set it gets the policy's
    ``retain.age`` (at least an hour; vacuum reads the commits before the checkpoint for a longer retention).
    True if it was set now (one metadata commit)."""
    conf = table._table().metadata().configuration
    if TOMBSTONE_RETENTION_KEY in conf:
        return False
    seconds = int(max(retain_age_s, 3600))
    table._table().alter.set_table_properties({TOMBSTONE_RETENTION_KEY: f"interval {seconds} seconds"},
                                              raise_if_not_exists=False)
    return True


def expired(table, floor_ms: int) -> None:
    """The job's expiry has deleted the files removed at or before ``floor_ms`` (no kept version reads them):
    the checkpoints the table writes from now on leave their tombstones out (``delta/checkpoint``), so what a
    checkpoint carries is bounded by the versions kept, not by ``delta.deletedFileRetentionDuration``."""
    table.tombstone_floor_ms = floor_ms


def trim(table, keep: int, epoch: int | None) -> dict[str, int]:
    """Delete the log files of the versions before the newest checkpoint at or before version ``keep`` (the
    oldest version kept); the counts of files and bytes deleted."""
    conf = table._table().metadata().configuration
    if conf.get(LOG_CLEANUP_KEY, "true").lower() == "false":
        return {"log_files_deleted": 0, "log_bytes_deleted": 0}
    listing = _listing(table)
    points = [v for v, kind, _ in listing if kind.startswith("checkpoint") and v <= keep]
    if not points:
        return {"log_files_deleted": 0, "log_bytes_deleted": 0}
    floor = max(points)
    check_epoch(table.location, table._state().txns.get(PROP_WRITER_EPOCH, 0), epoch, "the log cleanup")
    gone = [m for v, _, m in listing if v < floor]
    for m in gone:
        table.store.delete(m.uri)
    if gone:
        log.info("%s: Delta log cleanup removed %d file(s) of versions before checkpoint %d", table.location,
                 len(gone), floor)
    return {"log_files_deleted": len(gone), "log_bytes_deleted": sum(m.size for m in gone)}


def figures(table) -> dict[str, int]:
    """The log's size: versions and files in it, their bytes, the newest checkpoint's version (-1: none)."""
    listing = _listing(table)
    points = [v for v, kind, _ in listing if kind.startswith("checkpoint")]
    return {"versions": sum(1 for _, kind, _ in listing if kind == "json"), "metadata_files": len(listing),
            "metadata_bytes": sum(m.size for _, _, m in listing), "checkpoint": max(points, default=-1),
            "version": version_number(table)}


def version_number(table) -> int:
    """The table's log version as this writer last read it or committed it (a batch's metrics line: no read)."""
    known = table._log
    return int(known.version if known is not None and known.version >= 0 else table._state().version)


def manifests(table) -> int:
    """Delta has no manifests: 0."""
    return 0


def merge_manifests(table, epoch: int | None) -> int:
    """Nothing to merge in Delta."""
    return 0
