"""The driver's part of a snapshot from storage: flush, plan at one etcd revision, the delete logs.

``prepare`` flushes the collection (pymilvus waits for ``GetFlushState``), reads its segments, their logs
and every vchannel checkpoint at one etcd revision, and loads the delete logs and the
primary key's stats logs (each segment's key bounds). Spark tasks then read the plan's insert binlogs
(``msgstream_spark.spark.storage_snapshot``). A file gone mid-read (garbage collection after a
compaction) raises :class:`SegmentGoneError`; the caller plans again (``attempts``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.snapshot.storage.access import SegmentGoneError, etcd_settings, storage_settings
from msgstream_spark.mirror.snapshot.storage.etcdmeta import EtcdGateway, read_collection
from msgstream_spark.mirror.snapshot.storage.plan import StoragePlan, build_plan
from msgstream_spark.mirror.snapshot.storage.reader import StorageReader, collection_fields
from msgstream_spark.mirror.snapshot.storage.units import Bounds, Packing, pack, read_bounds

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Prepared:
    plan: StoragePlan
    reader: StorageReader
    collection_id: int
    bounds: dict[int, Bounds]  # segment -> its keys' bounds from its stats logs

    def packing(self, parallelism: int) -> Packing:
        """The plan's binlog groups as units in at most about ``parallelism`` tasks (more for big plans)."""
        return pack(self.plan, self.bounds, parallelism)


def prepare(config: Any, mc, collection: str, schema: pa.Schema, pk: str, flush: bool = True) -> Prepared:
    """Flush ``collection`` (through the pymilvus client ``mc``), plan its snapshot, load its deletes."""
    if flush:
        mc.flush(collection)
    desc = mc.describe_collection(collection)
    cid = int(desc["collection_id"])
    endpoint, root = etcd_settings(config)
    meta = read_collection(EtcdGateway(endpoint), root, cid)
    fields = collection_fields(desc, {fid for s in meta.segments for fid in s.binlogs})
    reader = StorageReader(storage_settings(config), fields, schema, pk)
    pk_id = reader.pk_field.id
    plan = build_plan(meta, cid, [f for f in reader.read_field_ids() if f != pk_id] + [pk_id], pk_id)
    milvus = reader.settings.store()
    n = reader.load_deletes(plan, milvus)
    bounds = read_bounds(reader.settings, plan, milvus)
    log.info("storage snapshot of %s: etcd revision %d, %d segment(s), %d task(s), %d row(s) in binlogs, %d delete "
             "log row(s), checkpoints %s", collection, plan.revision, len(plan.segments), len(plan.tasks), plan.rows,
             n, {ch: p.timestamp for ch, p in sorted(plan.checkpoints.items())})
    return Prepared(plan, reader, cid, bounds)


def with_replans(attempt: Callable[[], T], attempts: int = 3) -> T:
    """``attempt()`` again (it plans afresh) when a planned file was garbage-collected; the last error
    names the segment and Milvus's GC setting."""
    for i in range(1, attempts + 1):
        try:
            return attempt()
        except SegmentGoneError as exc:
            if i == attempts:
                raise MirrorError(f"{exc} (planned {attempts} times)") from exc
            log.warning("storage snapshot: %s; planning again (%d of %d)", exc, i + 1, attempts)
    raise AssertionError("unreachable")
