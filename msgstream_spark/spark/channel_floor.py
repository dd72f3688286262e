"""A table snapshotted from Milvus's storage inside the database job: its rows after each channel's checkpoint.

The storage route's files hold, per channel, every change at or before that channel's vchannel checkpoint, and
the table records S, the oldest of them (``msgstream.snapshot_ts``). The one-collection job starts each channel
right after its checkpoint, so S is all its batches need. The database job reads the channels once for every
table and starts each channel at the earliest of its collections' positions: a storage table would be handed,
again, its channel's changes between S and that channel's checkpoint, and a key changed twice in that span
would go back to its older row until the later change is replayed. :class:`FlooredBatch` leaves them out:
a row is kept only after its channel's floor (the checkpoint's time recorded with the table's start positions).
"""

from __future__ import annotations

import json
import logging

from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.spark.mirror import MirrorBatch

log = logging.getLogger(__name__)


def channel_floors(starting: str | None, s: int | None) -> dict[str, int]:
    """Per channel the Milvus time of its recorded start position where it is later than S (the channels whose
    rows a snapshot holds beyond S); {} for a snapshot read at one S (``query``) or a table with no start."""
    if not starting or s is None:
        return {}
    try:
        recorded = json.loads(starting)
    except json.JSONDecodeError:
        return {}
    out = {}
    for ch, pos in recorded.items() if isinstance(recorded, dict) else ():
        if pos in ("earliest", "latest"):
            continue
        ts = MsgPosition.from_base64(pos).timestamp
        if ts > s:
            out[ch] = ts
    return out


def floored(df, floors: dict[str, int]):
    """``df`` (a ``rows`` DataFrame) without the rows at or before their channel's floor (rows of no channel,
    e.g. a DropPartition's deletes, and of other channels kept)."""
    if not floors:
        return df
    from pyspark.sql import functions as F

    keep = None
    for ch, ts in sorted(floors.items()):
        cond = ~F.col("_channel").eqNullSafe(ch) | (F.col("_ts") > F.lit(ts))
        keep = cond if keep is None else keep & cond
    return df.where(keep)


class FlooredBatch(MirrorBatch):
    """A :class:`MirrorBatch` whose batches leave out each channel's rows at or before its floor."""

    def __init__(self, table, pk: str, floors: dict[str, int], **kw) -> None:
        super().__init__(table, pk, **kw)
        self.floors = dict(floors)
        if self.floors:
            log.info("table %s: the stream's rows taken after each channel's snapshot checkpoint %s",
                     table.location, self.floors)

    def __call__(self, df, batch_id: int) -> None:
        return super().__call__(floored(df, self.floors), batch_id)
