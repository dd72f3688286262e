"""The plan of a snapshot from Milvus's storage: which files hold the rows up to each channel's checkpoint.

Milvus recovers a channel the same way (``datacoord``'s ``GetRecoveryInfo`` + the data node's seek): every
change at or before the vchannel's checkpoint (``channel-cp``) is in the binlogs of the collection's
segments that are neither dropped nor compacted away; the log, replayed from the checkpoint, holds the
rest. A task reads the i-th insert binlog of every field of one segment (they cover the same rows). A row
is kept when its timestamp (field 1) is at or before its channel's checkpoint and no delete (from the
delete logs, itself at or before its segment's channel checkpoint) has a larger timestamp: Milvus's rule
``row_ts < delete_ts`` (segcore ``get_deleted_bitmap``), so an upsert's new row, written at its delete's
own timestamp, survives. A key written more than once keeps its newest row (``_seq``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.snapshot.storage.etcdmeta import DROPPED, LEVEL_L0, CollectionMeta, LogFile, Segment
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.stream.names import to_physical_channel

ROW_ID, TIMESTAMP = 0, 1  # the system fields of every segment
COMPOUND_STATS_LOG = 1  # the log id of a segment's compound stats log (all its flushes' pk stats)
READABLE_VERSIONS = (0, 1)  # storage_version: 0 unset (2.3, 2.4), 1 = v1 binlogs; 2 = v2 packed Parquet, 3 = v3


@dataclass(frozen=True)
class ReadTask:
    """The ``index``-th insert binlog of every field of one segment; its rows start at ``offset``."""

    segment: int
    partition: int
    channel: str
    checkpoint_ts: int
    index: int
    offset: int
    rows: int
    files: tuple[tuple[int, str], ...]  # (field id, path under the storage root)
    size: int = 0  # the files' bytes (log_size), or 0 where etcd does not say

    def path(self, field_id: int) -> str:
        for fid, p in self.files:
            if fid == field_id:
                return p
        raise MirrorError(f"segment {self.segment}: no insert binlog of field {field_id} (file {self.index})")


@dataclass
class StoragePlan:
    collection_id: int
    revision: int
    checkpoints: dict[str, MsgPosition]  # vchannel -> position
    tasks: list[ReadTask]
    deltas: list[tuple[int, int, str]] = field(default_factory=list)  # (segment, checkpoint ts, path)
    segments: list[int] = field(default_factory=list)
    stats: dict[int, list[str]] = field(default_factory=dict)  # segment -> its primary key's stats logs

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tasks)

    @property
    def snapshot_ts(self) -> int:
        """S: the oldest checkpoint (every change at or before it, on every channel, is in the files)."""
        return min((p.timestamp for p in self.checkpoints.values()), default=0)

    def starting_positions(self, channels: list[str]) -> dict[str, str]:
        """The stream's start per physical channel: its vchannel's checkpoint; ``latest`` where the collection
        has no vchannel (none of its rows can be there)."""
        out = {ch: "latest" for ch in channels}
        for vch, pos in self.checkpoints.items():
            out[to_physical_channel(vch)] = pos.to_base64()
        return out


def insert_path(seg: Segment, fid: int, log: LogFile) -> str:
    return log.path if not log.log_id and log.path else \
        f"insert_log/{seg.collection_id}/{seg.partition_id}/{seg.id}/{fid}/{log.log_id}"


def delta_path(seg: Segment, log: LogFile) -> str:
    return log.path if not log.log_id and log.path else \
        f"delta_log/{seg.collection_id}/{seg.partition_id}/{seg.id}/{log.log_id}"


def stats_path(seg: Segment, fid: int, log: LogFile) -> str:
    return log.path if not log.log_id and log.path else \
        f"stats_log/{seg.collection_id}/{seg.partition_id}/{seg.id}/{fid}/{log.log_id}"


def _pk_stats(seg: Segment, pk_field: int) -> list[str]:
    """The paths of the segment's primary-key stats logs; only the compound one (log id 1, every flush's stats
    in one JSON list: ``CompoundStatsType`` of ``internal/storage``) where it is listed."""
    logs = seg.statslogs.get(pk_field, [])
    compound = [lg for lg in logs if lg.log_id == COMPOUND_STATS_LOG]
    return [stats_path(seg, pk_field, lg) for lg in (compound or logs)]


def _check_version(seg: Segment) -> None:
    if seg.storage_version not in READABLE_VERSIONS:
        raise MirrorError(f"segment {seg.id} of collection {seg.collection_id} is in storage version "
                          f"{seg.storage_version} (Milvus 2.6's packed Parquet v2 or v3), which the storage snapshot "
                          "does not read: use --snapshot-source query (the default) for this collection")


def _segment_tasks(seg: Segment, cp_ts: int, field_ids: list[int]) -> list[ReadTask]:
    counts = {fid: len(seg.binlogs.get(fid, [])) for fid in [ROW_ID, TIMESTAMP, *field_ids]}
    n = counts[TIMESTAMP]
    missing = [fid for fid, c in counts.items() if c != n and fid != ROW_ID]
    if missing:
        raise MirrorError(f"segment {seg.id}: fields {missing} have other numbers of insert binlogs than the "
                          f"timestamps' {n} ({counts}): a field added after the segment was written?")
    tasks, offset = [], 0
    for i in range(n):
        rows = seg.binlogs[TIMESTAMP][i].entries
        logs = [(fid, seg.binlogs[fid][i]) for fid in [TIMESTAMP, *field_ids]]
        files = tuple((fid, insert_path(seg, fid, lg)) for fid, lg in logs)
        size = sum(max(0, lg.size) for _, lg in logs)
        tasks.append(ReadTask(seg.id, seg.partition_id, seg.channel, cp_ts, i, offset, rows, files, size))
        offset += rows
    return tasks


def build_plan(meta: CollectionMeta, collection_id: int, field_ids: list[int],
               pk_field: int | None = None) -> StoragePlan:
    """The tasks and delete logs of ``meta`` (one etcd revision); ``field_ids``: the user fields to read;
    ``pk_field``: the primary key's field id (its stats logs bound each segment's keys)."""
    if not meta.checkpoints:
        raise MirrorError(f"collection {collection_id}: etcd holds no channel checkpoint (datacoord-meta/channel-cp) "
                          "for it at revision {meta.revision}: has the data node watched its channels yet?")
    plan = StoragePlan(collection_id, meta.revision, dict(meta.checkpoints), [])
    for seg in sorted(meta.segments, key=lambda s: s.id):
        if seg.state == DROPPED or seg.compacted:
            continue
        _check_version(seg)
        cp = meta.checkpoints.get(seg.channel)
        if cp is None:
            raise MirrorError(f"segment {seg.id} is on channel {seg.channel}, which has no checkpoint in etcd "
                              f"(channels with one: {sorted(meta.checkpoints)})")
        plan.deltas += [(seg.id, cp.timestamp, delta_path(seg, log)) for log in seg.deltalogs]
        if seg.level != LEVEL_L0 and seg.binlogs:
            plan.tasks += _segment_tasks(seg, cp.timestamp, field_ids)
            plan.segments.append(seg.id)
            if pk_field is not None:
                plan.stats[seg.id] = _pk_stats(seg, pk_field)
    return plan
