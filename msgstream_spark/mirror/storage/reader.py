"""Reads a storage plan's tasks into record batches of the table's columns (Spark-free; a task per call).

A task reads the timestamps (field 1) and the primary key first, keeps the rows the plan's rules keep
(at or before the channel's checkpoint, not deleted, the newest row of a key written more than once), then
reads the other fields' binlogs and takes those rows. ``_ts`` is the row's own timestamp, ``_seq`` an
insert at it (the row's place in its segment orders rows of one timestamp: the earlier row wins, as
``query`` returns it), ``_partition`` the segment's partition.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PARTITION, TS
from msgstream_spark.mirror.order import SEQ, seq_array
from msgstream_spark.mirror.storage.access import StorageSettings, read_bytes
from msgstream_spark.mirror.storage.binlog import read_column, read_deletes
from msgstream_spark.mirror.storage.convert import to_table_column
from msgstream_spark.mirror.storage.plan import TIMESTAMP, ReadTask, StoragePlan
from msgstream_spark.msg.dtypes import JSON

META = "$meta"


@dataclass(frozen=True)
class FieldSpec:
    id: int
    name: str
    data_type: int


def collection_fields(description: dict, stored_ids: set[int]) -> list[FieldSpec]:
    """The fields of a pymilvus ``describe_collection`` answer. Its answer leaves out the dynamic field
    (JSON, named ``$meta``); with ``enable_dynamic_field`` it is the one user field id (>= 100) the
    binlogs hold that the description does not name."""
    out = [FieldSpec(int(f["field_id"]), META if f.get("is_dynamic") else f["name"], int(f["type"]))
           for f in description["fields"]]
    unnamed = sorted(i for i in stored_ids if i >= 100 and i not in {f.id for f in out})
    if description.get("enable_dynamic_field") and not any(f.name == META for f in out):
        if len(unnamed) > 1:
            raise MirrorError(f"the binlogs hold field ids {unnamed} that the collection's description does not "
                              "name: which one is the dynamic field is ambiguous")
        out += [FieldSpec(i, META, JSON) for i in unnamed]
    return out


@dataclass
class StorageReader:
    """Reads tasks of one plan (picklable: Spark tasks get a copy). ``deletes``: pk -> newest delete time at or
    before its channel's checkpoint; ``winners``: pk -> the ``_seq`` of the row kept for keys seen twice."""

    settings: StorageSettings
    fields: list[FieldSpec]
    schema: pa.Schema  # the table's columns
    pk: str
    deletes: dict = field(default_factory=dict)
    winners: dict = field(default_factory=dict)

    @property
    def pk_field(self) -> FieldSpec:
        for f in self.fields:
            if f.name == self.pk:
                return f
        raise MirrorError(f"the stream's primary key {self.pk!r} is not a field of the collection in Milvus "
                          f"({[f.name for f in self.fields]}): is the config's log the same cluster?")

    def read_field_ids(self) -> list[int]:
        return [f.id for f in self.fields if f.name in self.schema.names]

    def load_deletes(self, plan: StoragePlan, filesystem=None) -> int:
        """The plan's delete logs -> ``deletes`` (driver side: a delete log holds keys and times only)."""
        fs_ = filesystem or self.settings.filesystem()
        is_str = pa.types.is_string(self.schema.field(self.pk).type)
        n = 0
        for seg, cp_ts, path in plan.deltas:
            pks, tss = read_deletes(read_bytes(self.settings, path, seg, fs_), path, is_str)
            for pk, ts in zip(pks, tss.tolist()):
                if ts <= cp_ts and ts > self.deletes.get(pk, 0):
                    self.deletes[pk] = ts
                n += 1
        return n

    def _column(self, task: ReadTask, fid: int, fs_) -> pa.Array:
        path = task.path(fid)
        _, arr = read_column(read_bytes(self.settings, path, task.segment, fs_), path)
        if len(arr) != task.rows:
            raise MirrorError(f"segment {task.segment}: binlog {path} holds {len(arr)} rows, its metadata says "
                              f"{task.rows}")
        return arr

    def _keep(self, task: ReadTask, fs_) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """(row indices kept, their timestamps, their keys)."""
        ts = self._column(task, TIMESTAMP, fs_).to_numpy(zero_copy_only=False).astype(np.uint64)
        pks = self._column(task, self.pk_field.id, fs_)
        keep = ts <= np.uint64(task.checkpoint_ts)
        if self.deletes:
            dts = np.array([self.deletes.get(k, 0) for k in pks.to_pylist()], dtype=np.uint64)
            keep &= ~(ts < dts)
        idx = np.nonzero(keep)[0]
        if self.winners and len(idx):
            seqs = self._seq(task, idx, ts[idx])
            sub = pks.take(pa.array(idx)).to_pylist()
            ok = [self.winners.get(k, s) == s for k, s in zip(sub, seqs.to_pylist())]
            idx = idx[np.array(ok, dtype=bool)]
        return idx, ts[idx], pks.take(pa.array(idx))

    @staticmethod
    def _seq(task: ReadTask, idx: np.ndarray, ts: np.ndarray) -> pa.Array:
        return seq_array(ts, "insert", row=(idx + task.offset).astype(np.int64))

    def read_keys(self, task: ReadTask, filesystem=None) -> pa.RecordBatch:
        """The kept rows' keys and ``_seq`` (the pass that finds keys written more than once)."""
        fs_ = filesystem or self.settings.filesystem()
        idx, ts, pks = self._keep(task, fs_)
        return pa.RecordBatch.from_arrays([pks, self._seq(task, idx, ts)], names=[self.pk, SEQ])

    def read(self, task: ReadTask, filesystem=None) -> pa.RecordBatch:
        fs_ = filesystem or self.settings.filesystem()
        idx, ts, pks = self._keep(task, fs_)
        take = pa.array(idx)
        by_name = {f.name: f for f in self.fields}
        extra = {TS: pa.array(ts.astype(np.int64)), SEQ: self._seq(task, idx, ts),
                 PARTITION: pa.array(np.full(len(idx), task.partition, dtype=np.int64))}
        cols = []
        for f in self.schema:
            if f.name in extra:
                cols.append(extra[f.name].cast(f.type))
            elif f.name == self.pk:
                cols.append(to_table_column(pks, by_name[f.name].data_type, f.type, f.name))
            elif f.name in by_name:
                spec = by_name[f.name]
                arr = self._column(task, spec.id, fs_).take(take)
                cols.append(to_table_column(arr, spec.data_type, f.type, f.name))
            else:
                cols.append(pa.nulls(len(idx), f.type))
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)


def duplicate_winners(keys: pa.Table, pk: str) -> dict:
    """pk -> the largest ``_seq`` among keys that appear more than once in ``keys`` (pk, _seq)."""
    if keys.num_rows == 0:
        return {}
    g = keys.group_by(pk).aggregate([(SEQ, "max"), (SEQ, "count")])
    dup = g.filter(pc.greater(g.column(f"{SEQ}_count"), 1))
    return dict(zip(dup.column(pk).to_pylist(), dup.column(f"{SEQ}_max").to_pylist()))
