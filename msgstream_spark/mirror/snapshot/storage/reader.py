"""Reads a storage plan's units into record batches and Parquet files of the table's columns (Spark-free).

A unit (:mod:`msgstream_spark.mirror.snapshot.storage.units`) is read binlog group by group: the timestamps (field 1)
and the primary keys of every group first, the rows the plan's rules keep (at or before the channel's
checkpoint, not deleted, one row per key: the newest ``_seq`` across the unit, and a key pass's winner
where one ran), then the other fields' binlogs of each group, taking those rows. Everything is
column-wise (numpy masks, ``index_in`` lookups of the deletes, a sort for repeated keys); each binlog is
read once. A Spark task writes its units as one Parquet file (:func:`write_units`). ``_ts`` is the row's
own timestamp, ``_seq`` an insert at it (the row's place in its segment orders rows of one timestamp: the
earlier row wins, as
``query`` returns it), ``_partition`` the segment's partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PARTITION, TS
from msgstream_spark.mirror.order import SEQ, seq_array
from msgstream_spark.mirror.snapshot.storage.access import StorageSettings, read_bytes
from msgstream_spark.mirror.snapshot.storage.binlog import read_column, read_deletes
from msgstream_spark.mirror.snapshot.storage.convert import to_table_column
from msgstream_spark.mirror.snapshot.storage.plan import TIMESTAMP, ReadTask, StoragePlan
from msgstream_spark.mirror.snapshot.storage.units import Bounds, Unit
from msgstream_spark.mirror.store import Store, store_for
from msgstream_spark.mirror.store.parquet import ParquetOut, snapshot_options
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
    """Reads tasks of one plan (picklable: Spark tasks get a copy). ``deletes``: (pk, ts) the newest delete
    time of each key at or before its channel's checkpoint; ``winners``: (pk, ``_seq``) the row kept for keys
    a key pass found in several units. Both are Arrow tables, looked up column-wise (``index_in``)."""

    settings: StorageSettings
    fields: list[FieldSpec]
    schema: pa.Schema  # the table's columns
    pk: str
    deletes: pa.Table | None = None
    winners: pa.Table | None = None

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
        key_type = self.schema.field(self.pk).type
        newest: dict = {}
        n = 0
        for seg, cp_ts, path in plan.deltas:
            pks, tss = read_deletes(read_bytes(self.settings, path, seg, fs_), path, pa.types.is_string(key_type))
            for pk, ts in zip(pks, tss.tolist()):
                if ts <= cp_ts and ts > newest.get(pk, 0):
                    newest[pk] = ts
                n += 1
        self.deletes = pa.table({"pk": pa.array(list(newest), key_type), "ts": pa.array(list(newest.values()),
                                                                                         pa.uint64())})
        return n

    def _column(self, task: ReadTask, fid: int, fs_) -> pa.Array:
        path = task.path(fid)
        _, arr = read_column(read_bytes(self.settings, path, task.segment, fs_), path)
        if len(arr) != task.rows:
            raise MirrorError(f"segment {task.segment}: binlog {path} holds {len(arr)} rows, its metadata says "
                              f"{task.rows}")
        return arr

    def _keep(self, task: ReadTask, fs_, bounds: Bounds | None = None) -> _Kept:
        """The rows of ``task`` kept by the checkpoint, the deletes and the key pass's winners."""
        ts = self._column(task, TIMESTAMP, fs_).to_numpy(zero_copy_only=False).astype(np.uint64)
        pks = self._column(task, self.pk_field.id, fs_)
        if bounds is not None and bounds.known and len(pks):
            mm = pc.min_max(pks)
            if mm["min"].as_py() < bounds.lo or mm["max"].as_py() > bounds.hi:
                raise MirrorError(f"segment {task.segment}: binlog {task.path(self.pk_field.id)} holds keys "
                                  f"{mm['min'].as_py()!r}..{mm['max'].as_py()!r} outside its stats log's "
                                  f"{bounds.lo!r}..{bounds.hi!r}: the plan's rule that no key is in two units "
                                  "does not hold for it")
        keep = ts <= np.uint64(task.checkpoint_ts)
        if self.deletes is not None and self.deletes.num_rows:
            dts = _lookup(pks, self.deletes, "ts").fill_null(0).to_numpy(zero_copy_only=False)
            keep &= ~(ts < dts.astype(np.uint64))
        idx = np.nonzero(keep)[0]
        sub, seq = pks.take(pa.array(idx)), self._seq(task, idx, ts[idx])
        if self.winners is not None and self.winners.num_rows and len(idx):
            top = _lookup(sub, self.winners, SEQ)
            ok = pc.fill_null(pc.equal(top, seq), True).to_numpy(zero_copy_only=False)
            idx, sub, seq = idx[ok], sub.filter(pa.array(ok)), seq.filter(pa.array(ok))
        return _Kept(task, idx, ts[idx], sub, seq)

    @staticmethod
    def _seq(task: ReadTask, idx: np.ndarray, ts: np.ndarray) -> pa.Array:
        return seq_array(ts, "insert", row=(idx + task.offset).astype(np.int64))

    def read_keys(self, task: ReadTask, filesystem=None) -> pa.RecordBatch:
        """The kept rows' keys and ``_seq`` (the pass that finds keys written more than once)."""
        fs_ = filesystem or self.settings.filesystem()
        k = self._keep(task, fs_)
        return pa.RecordBatch.from_arrays([k.pks, k.seq], names=[self.pk, SEQ])

    def read_unit(self, unit: Unit, filesystem=None) -> Iterator[pa.RecordBatch]:
        """The unit's kept rows, one batch per binlog group: the timestamps and keys of every group first (each
        binlog is read once), one row per key across the unit, then the other fields of each group."""
        fs_ = filesystem or self.settings.filesystem()
        kept = _one_per_key([self._keep(t, fs_, unit.bounds.get(t.segment)) for t in unit.tasks])
        for k in kept:
            yield self._batch(k, fs_)

    def read(self, task: ReadTask, filesystem=None) -> pa.RecordBatch:
        """One binlog group's kept rows (a unit of its own)."""
        return next(self.read_unit(Unit([task]), filesystem))

    def _batch(self, k: _Kept, fs_) -> pa.RecordBatch:
        take = pa.array(k.idx)
        by_name = {f.name: f for f in self.fields}
        extra = {TS: pa.array(k.ts.astype(np.int64)), SEQ: k.seq,
                 PARTITION: pa.array(np.full(len(k.idx), k.task.partition, dtype=np.int64))}
        cols = []
        for f in self.schema:
            if f.name in extra:
                cols.append(extra[f.name].cast(f.type))
            elif f.name == self.pk:
                cols.append(to_table_column(k.pks, by_name[f.name].data_type, f.type, f.name))
            elif f.name in by_name:
                spec = by_name[f.name]
                arr = self._column(k.task, spec.id, fs_)
                arr = arr if len(k.idx) == len(arr) else arr.take(take)  # all kept: no copy
                cols.append(to_table_column(arr, spec.data_type, f.type, f.name))
            else:
                cols.append(pa.nulls(len(k.idx), f.type))
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)


@dataclass
class _Kept:
    task: ReadTask
    idx: np.ndarray  # kept row positions in the group
    ts: np.ndarray
    pks: pa.Array
    seq: pa.Array

    def take(self, mask: np.ndarray) -> _Kept:
        m = pa.array(mask)
        return _Kept(self.task, self.idx[mask], self.ts[mask], self.pks.filter(m), self.seq.filter(m))


def _lookup(keys: pa.Array, table: pa.Table, column: str) -> pa.Array:
    """``table[column]`` of each key (null where the key is not in ``table``'s ``pk``)."""
    pos = pc.index_in(keys, value_set=table.column("pk").combine_chunks())
    return table.column(column).combine_chunks().take(pos)


def _one_per_key(kept: list[_Kept]) -> list[_Kept]:
    """Of rows sharing a key across ``kept``, only the largest ``_seq`` (one of them where two tie)."""
    if len(kept) == 0:
        return kept
    keys = pa.concat_arrays([k.pks for k in kept])
    n = len(keys)
    if n < 2 or pc.all(pc.greater(keys.slice(1), keys.slice(0, n - 1))).as_py():
        return kept  # keys in increasing order (auto ids, keys inserted in order): no key twice, no hash table
    if pc.count_distinct(keys).as_py() == n:
        return kept
    t = pa.table({"k": keys, "s": pa.concat_arrays([k.seq for k in kept])})
    order = pc.sort_indices(t, [("k", "ascending"), ("s", "descending")])
    sorted_keys = keys.take(order)
    first = np.ones(n, dtype=bool)
    first[1:] = pc.not_equal(sorted_keys.slice(1), sorted_keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    win = np.zeros(n, dtype=bool)
    win[order.to_numpy()[first]] = True
    out, at = [], 0
    for k in kept:
        out.append(k.take(win[at:at + len(k.idx)]))
        at += len(k.idx)
    return out


def write_units(reader: StorageReader, units: list[Unit], path: str, filesystem=None, acc=None,
                store: Store | None = None) -> int:
    """The units' rows as one Parquet file at ``path`` in ``store`` (default: the local one of ``path``; the file
    appears whole when complete: a retried task replaces it whole) with the snapshot's write options
    (:func:`msgstream_spark.mirror.store.parquet.snapshot_options`); the rows written (the file is written even
    when empty)."""
    with ParquetOut(store if store is not None else store_for(path), path, reader.schema, reader.pk,
                    **snapshot_options(reader.schema)) as out:
        for unit in units:
            for batch in reader.read_unit(unit, filesystem):
                if batch.num_rows:
                    out.write_batch(batch, row_group_size=128 * 1024)
                    if acc is not None:
                        acc.add(batch.num_rows)
        return out.close().rows


def duplicate_winners(keys: pa.Table, pk: str) -> pa.Table:
    """(pk, the largest ``_seq``) of the keys that appear more than once in ``keys`` (pk, _seq)."""
    if keys.num_rows == 0:
        return pa.table({"pk": keys.column(pk), SEQ: keys.column(SEQ)})
    g = keys.group_by(pk).aggregate([(SEQ, "max"), (SEQ, "count")])
    dup = g.filter(pc.greater(g.column(f"{SEQ}_count"), 1))
    return pa.table({"pk": dup.column(pk), SEQ: dup.column(f"{SEQ}_max")})
