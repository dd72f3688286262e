"""The files a Delta table's versions within a retention still read: Delta's VACUUM rule.

A version's data files are the ``add`` actions live at it; a file stops being read when a later commit
removes it, and that ``remove`` action (a tombstone) carries the time of its removal, ``deletionTimestamp``
(PROTOCOL.md, "Add File and Remove File"). A file removed at time R may be read by any version committed
before R, so it is kept until R is older than the retention, whatever its write time: a file written 8
days ago and removed a minute ago stays for the whole retention. A ``remove`` that names a deletion vector
keeps that vector's file the same way (a batch that deletes more rows of a file removes it with its old
vector and adds it with a new one: the old vector file is what the versions before read).

The tombstones come from the last checkpoint (which keeps those younger than the table's
``delta.deletedFileRetentionDuration``, one week by default: PROTOCOL.md "Checkpoints") and from the commit
files after it; a retention longer than the table's also reads the commit files before the checkpoint, back
to the first commit older than the retention.
"""

from __future__ import annotations

import json
import logging
import re
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.mirror.formats.delta.log import checkpoint_parts, log_uri
from msgstream_spark.mirror.store import NotFound, Store

log = logging.getLogger(__name__)

TOMBSTONE_RETENTION_KEY = "delta.deletedFileRetentionDuration"
DEFAULT_TOMBSTONE_RETENTION_MS = 7 * 86400 * 1000
_UNIT_MS = {"nanosecond": 1e-6, "microsecond": 1e-3, "millisecond": 1, "second": 1000, "minute": 60_000,
            "hour": 3_600_000, "day": 86_400_000, "week": 604_800_000}


def interval_ms(text: str | None) -> int:
    """A Delta table property's interval (``interval 1 weeks``, ``interval 36 hours``) in milliseconds (the
    protocol's default for the tombstone retention when missing or not understood)."""
    m = re.fullmatch(r"\s*(?:interval\s+)?(\d+)\s+([a-z]+?)s?\s*", (text or "").lower())
    if m is None or m.group(2) not in _UNIT_MS:
        return DEFAULT_TOMBSTONE_RETENTION_MS
    return int(int(m.group(1)) * _UNIT_MS[m.group(2)])


def _commit(store: Store, root: str, version: int) -> tuple[int, list[dict]] | None:
    """(commit time in ms, remove actions) of the commit file ``version``; None when it is not there."""
    try:
        data, meta = store.get(log_uri(root, f"{version:020d}.json"))
    except NotFound:
        return None
    actions = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    mtime = int(meta.mtime * 1000)
    ts = next((int(a["commitInfo"]["timestamp"]) for a in actions
               if "commitInfo" in a and a["commitInfo"].get("timestamp") is not None), mtime)
    return ts, [{**a["remove"], "deletionTimestamp": a["remove"].get("deletionTimestamp") or ts}
                for a in actions if "remove" in a]


def _checkpoint_removes(store: Store, root: str, names: list[str]) -> list[dict]:
    out = []
    for name in names:
        data, meta = store.get(log_uri(root, name))
        pf = pq.ParquetFile(pa.BufferReader(data))
        t = pf.read(columns=["remove"]) if "remove" in pf.schema_arrow.names else None
        mtime = int(meta.mtime * 1000)
        for r in t.column("remove").to_pylist() if t is not None else []:
            if r is not None:
                dv = {k: v for k, v in (r.get("deletionVector") or {}).items() if v is not None}
                out.append({"path": r["path"], "deletionTimestamp": r.get("deletionTimestamp") or mtime,
                            "deletionVector": dv or None})
    return out


def removed_after(store: Store, location: str, cutoff_ms: int, tombstone_retention_ms: int,
                  now_ms: int) -> list[dict]:
    """The ``remove`` actions of the Delta table at ``location`` whose removal is later than ``cutoff_ms``
    (paths unquoted; ``deletionTimestamp`` filled from the commit's time when a writer left it out)."""
    version, names = checkpoint_parts(store, location)
    found = _checkpoint_removes(store, location, names)
    v = version + 1
    while (got := _commit(store, location, v)) is not None:
        found += got[1]
        v += 1
    if version >= 0 and now_ms - cutoff_ms > tombstone_retention_ms:
        v = version  # the checkpoint may have dropped tombstones the retention still covers
        while v >= 0:
            got = _commit(store, location, v)
            if got is None:
                log.warning("%s: Delta commit %d is gone (log cleanup), so vacuum cannot see what it removed; a "
                            "retention longer than %s keeps only what the checkpoint records", location, v,
                            TOMBSTONE_RETENTION_KEY)
                break
            found += got[1]
            if got[0] <= cutoff_ms:
                break
            v -= 1
    return [{**r, "path": unquote(r["path"])} for r in found if int(r["deletionTimestamp"]) > cutoff_ms]
