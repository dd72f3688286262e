"""Where a mirrored table is in the log: per channel the position and Milvus time it is complete up to.

A commit of the mirror job records them itself (``msgstream.watermark``: the batch's end offset, the
source's ``{channel: {"msgID", "ts"}}``, in Delta's commit info / Iceberg's snapshot summary). Tables
written before that record them through Spark's checkpoint: ``offsets/<batch id>`` of the table's last
batch is that batch's end. A table holding only its snapshot is complete up to the snapshot's positions
(``msgstream.mirror.start``; time S). Spark-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_SNAPSHOT_TS
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.source.offsets import Offset, entry, normalize

START_PROPERTY = "msgstream.mirror.start"  # the snapshot's stream start (jobs/mirror_start.py writes it)
PROP_WATERMARK = "msgstream.watermark"


@dataclass
class Watermark:
    """``offset``: per channel the last message the table holds (``msgID`` base64, ``ts`` its Milvus time;
    ``""`` / 0: nothing of that channel yet). ``source``: where it was read (commit, checkpoint, snapshot)."""

    offset: Offset
    source: str
    batch: int | None = None
    query_id: str | None = None
    version: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ts(self) -> int:
        """The table's time: every channel is complete up to at least this Milvus time (its oldest)."""
        times = [int(e.get("ts", 0)) for e in self.offset.values()]
        return min(times) if times else 0


def physical_ms(ts: int) -> int:
    """The wall-clock milliseconds of a Milvus hybrid timestamp (``ts >> 18``)."""
    return int(ts) >> 18


def freshness_ms(offset: Offset, now_ms: int) -> int | None:
    """``now_ms`` minus the oldest Milvus time among the offset's channels (None: no channel has one)."""
    times = [int(e.get("ts", 0)) for e in offset.values() if int(e.get("ts", 0)) > 0]
    return None if not times else now_ms - physical_ms(min(times))


def checkpoint_query_id(checkpoint: str | None) -> str | None:
    """Spark's query id from ``<checkpoint>/metadata`` (None: no checkpoint (yet), or none given). Spark's
    checkpoint is read on the driver's disk (docs/mirror.md, "Where the table lives")."""
    if checkpoint is None:
        return None
    path = os.path.join(checkpoint, "metadata")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return str(json.loads(f.readline())["id"])
    except (OSError, ValueError, KeyError) as exc:
        raise MirrorError(f"cannot read the query id from {path} (the streaming checkpoint's metadata): {exc}") from exc


def checkpoint_offset(checkpoint: str, batch: int) -> Offset | None:
    """The end offset of ``batch`` (Spark writes ``offsets/<batch>`` before the batch runs)."""
    path = os.path.join(checkpoint, "offsets", str(batch))
    if not os.path.exists(path):
        return None
    with open(path) as f:
        lines = f.read().splitlines()
    try:
        return normalize(json.loads(lines[2]))
    except (IndexError, ValueError) as exc:
        raise MirrorError(f"checkpoint offsets file {path} is not Spark's (version, metadata, offset): {exc}") from exc


def start_offset(props: dict[str, str]) -> Offset | None:
    """The snapshot's positions as an offset (the table is complete up to them), or None."""
    spec = props.get(START_PROPERTY)
    if not spec:
        return None
    s = int(props.get(PROP_SNAPSHOT_TS, "0") or 0)
    out: Offset = {}
    for ch, v in json.loads(spec).items():
        if v == "earliest":
            out[ch] = entry(b"", s)
        else:
            p = MsgPosition.from_base64(v)
            out[ch] = entry(p.msg_id, max(int(p.timestamp), s))
    return normalize(out)


def parse_recorded(text: str | None) -> Offset | None:
    """A commit's recorded ``msgstream.watermark`` (JSON offset), or None."""
    if not text:
        return None
    try:
        return normalize(json.loads(text))
    except ValueError as exc:
        raise MirrorError(f"table property {PROP_WATERMARK} is not a JSON offset: {text[:80]!r}") from exc


def table_watermark(props: dict[str, str], recorded: str | None, last_batch: int | None, query_id: str | None,
                    checkpoint: str | None) -> Watermark | None:
    """The table's watermark from (in order) its last commit's record, the checkpoint's offset of its last
    batch, its snapshot's positions; None when none of them is known."""
    off = parse_recorded(recorded)
    if off is not None:
        return Watermark(off, "commit", last_batch, query_id)
    if last_batch is not None and checkpoint:
        off = checkpoint_offset(checkpoint, last_batch)
        if off is not None:
            return Watermark(off, "checkpoint", last_batch, query_id)
    off = start_offset(props)
    if off is not None:
        return Watermark(off, "snapshot", None, query_id)
    return None
