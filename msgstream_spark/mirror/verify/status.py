"""``msgstream mirror status``: per channel how fresh a mirrored table is, its backlog, and whether it stalled.

Spark-free. The table's watermark (:mod:`~msgstream_spark.mirror.watermark`) against the log after it:
the log's newest Milvus time is "now" (Milvus's clock: its time ticks reach every channel every 200 ms),
``freshness_ms`` is now minus the time the table is complete to (``ts >> 18`` of both), ``backlog`` the
data messages and rows after the watermark (every collection's on the channel: a channel is shared),
``stalled`` when the log holds data the table lacks and the table's last commit is older than a bound.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from msgstream_spark.mirror.verify.pinned import PinnedTable
from msgstream_spark.mirror.watermark import Watermark, physical_ms
from msgstream_spark.source.scan import Scanner

DEFAULT_STALLED_AFTER_S = 60.0


def _iso(ts: int) -> str | None:
    if ts <= 0:
        return None
    return dt.datetime.fromtimestamp(physical_ms(ts) / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")


def channel_status(wm_ts: int, items: list, commit_age_s: float | None, stalled_after_s: float,
                   now_wall_ms: int) -> dict[str, Any]:
    """One channel: ``items`` are the scanned messages after the watermark (``ts``, ``tick``, ``rows``)."""
    data = [it for it in items if not it.tick]
    latest = max([wm_ts, *(int(it.ts) for it in items)])
    complete = wm_ts if data else latest  # nothing but ticks after the watermark: complete to the log's time
    return {"watermark_ts": wm_ts, "watermark_time": _iso(wm_ts), "complete_to_ts": complete,
            "log_ts": latest, "log_time": _iso(latest),
            "freshness_ms": physical_ms(latest) - physical_ms(complete) if complete else None,
            "wall_lag_ms": now_wall_ms - physical_ms(complete) if complete else None,
            "backlog_messages": len(data), "backlog_rows": sum(int(it.rows) for it in data),
            "stalled": bool(data) and commit_age_s is not None and commit_age_s > stalled_after_s}


def table_status(pinned: PinnedTable, wm: Watermark | None, client: Any, now_wall_ms: int,
                 stalled_after_s: float = DEFAULT_STALLED_AFTER_S) -> dict[str, Any]:
    """The status document (JSON-ready) of the table ``pinned`` with watermark ``wm`` in ``client``'s log."""
    age = None if pinned.committed_ms is None else max(0.0, (now_wall_ms - pinned.committed_ms) / 1000)
    out: dict[str, Any] = {"table": pinned.table.location, "collection": pinned.table.collection,
                           "format": pinned.fmt, "version": pinned.version, "last_commit_age_s": age,
                           "watermark_source": None if wm is None else wm.source,
                           "batch": None if wm is None else wm.batch}
    if wm is None:
        out["channels"] = {}
        out["error"] = "the table records no position in the log (no snapshot positions, commit or checkpoint)"
        return out
    scan = Scanner(client, "rows", False)
    try:
        scan.refresh(wm.offset)
        chans = {ch: channel_status(int(e.get("ts", 0)), scan.chans[ch].items if ch in scan.chans else [], age,
                                    stalled_after_s, now_wall_ms) for ch, e in sorted(wm.offset.items())}
    finally:
        scan.close()
    out["channels"] = chans
    fresh = [c["freshness_ms"] for c in chans.values() if c["freshness_ms"] is not None]
    out["freshness_ms"] = max(fresh) if fresh else None
    out["backlog_rows"] = sum(c["backlog_rows"] for c in chans.values())
    out["stalled"] = any(c["stalled"] for c in chans.values())
    return out
