"""The ``remove`` tombstones a Delta checkpoint carries, bounded by what a running mirror's expiry keeps.

A checkpoint holds the table's live ``add`` actions and the ``remove`` tombstones that have not expired
(PROTOCOL.md, "Checkpoints"; delta-rs keeps those younger than ``delta.deletedFileRetentionDuration``, which the
job sets to ``retain.age``, at least an hour). Tombstones exist for the benefit of VACUUM alone: a snapshot is
its ``add`` actions ("Action Reconciliation"); a tombstone keeps a removed file from being deleted while a
version that reads it may still be read. The job's expiry (``mirror.upkeep``) deletes the files removed at or
before its floor (the oldest kept version's commit, less the vacuum's slack): no kept version reads them and
they are gone, so their tombstones protect nothing. Kept to their hour, a job committing every second carries
thousands of them into every checkpoint (delta-rs rewrites them all at each one, and every reader loads them).

So the job writes its checkpoints itself (``delta/checkpoint``), once, without the tombstones removed at or
before the floor; every other row (adds, metadata, protocol, txns, later tombstones) is what delta-rs would
write. This module counts what a checkpoint carries (the upkeep figures and the tests read it).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgstream_spark.mirror.formats.delta.log import log_uri
from msgstream_spark.mirror.store import NotFound, Store


def _removes(store: Store, root: str, version: int) -> pa.ChunkedArray | None:
    try:
        data, _ = store.get(log_uri(root, f"{version:020d}.checkpoint.parquet"))
    except NotFound:
        return None
    pf = pq.ParquetFile(pa.BufferReader(data))
    return pf.read(columns=["remove"]).column("remove") if "remove" in pf.schema_arrow.names else None


def count(store: Store, root: str, version: int) -> int:
    """The ``remove`` tombstones in the single-part checkpoint of ``version`` (0: none, or no such checkpoint)."""
    col = _removes(store, root, version)
    return 0 if col is None else len(col) - col.null_count


def oldest(store: Store, root: str, version: int) -> int | None:
    """The earliest ``deletionTimestamp`` of the tombstones in the checkpoint of ``version`` (None: none)."""
    col = _removes(store, root, version)
    return None if col is None else pc.min(pc.struct_field(col, "deletionTimestamp")).as_py()
