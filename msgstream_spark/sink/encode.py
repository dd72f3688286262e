"""Arrow rows -> Milvus InsertRequest / DeleteRequest payloads, column-wise.

The sink's hot path. Per Arrow batch: validate (null primary key, unknown op, vector
dimension), shard rows with Milvus's hash, group them per (op run, shard), split each
group so a message stays below ``maxMessageSize`` and serialize one request per group.
Only numpy / pyarrow work is done per row; Python loops run per message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import MsgStreamError, SchemaError
from msgstream_spark.msg.columns import arrow_to_field_data
from msgstream_spark.msg.hashing import shard_indices
from msgstream_spark.msg.pb import common_pb2, msg_pb2
from msgstream_spark.msg.structs import flatten_struct_column
from msgstream_spark.sink import wire
from msgstream_spark.sink.options import OP_COLUMN, SinkOptions
from msgstream_spark.sink.plan import STRUCT_TYPE, FieldPlan, WritePlan

log = logging.getLogger(__name__)

OP_INSERT = 0
OP_DELETE = 1
_OP_NAMES = {"insert": OP_INSERT, "i": OP_INSERT, "upsert": OP_INSERT, "delete": OP_DELETE, "d": OP_DELETE}
_VECTOR_TYPES = ("FloatVector", "Float16Vector", "BFloat16Vector", "Int8Vector", "BinaryVector")
# -- per-row byte estimates (Milvus splits by estimated size) ----------------------------------
def _row_sizes(batch: pa.RecordBatch, plan: WritePlan) -> np.ndarray:
    n = batch.num_rows
    sizes = np.full(n, 16 + 4, dtype=np.int64)  # timestamp + rowID + per-row framing
    for f in plan.fields:
        arr = batch.column(f.name)
        sizes += _column_sizes(arr, n)
    return sizes


def _column_sizes(arr: pa.Array, n: int) -> np.ndarray:
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        lens = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        return lens + 2
    if pa.types.is_fixed_size_list(t):
        return np.full(n, t.list_size * max(1, t.value_type.bit_width // 8) + 4, dtype=np.int64)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        lens = np.diff(arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64))
        vt = t.item_type if pa.types.is_map(t) else t.value_type
        width = 8 if pa.types.is_map(t) else max(1, (vt.bit_width // 8) if _fixed(vt) else 8)
        return lens * width + 4
    if _fixed(t):
        return np.full(n, max(1, t.bit_width // 8), dtype=np.int64)
    return np.full(n, 16, dtype=np.int64)


def _fixed(t: pa.DataType) -> bool:
    try:
        return t.bit_width > 0
    except ValueError:
        return False


def split_points(sizes: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Greedy [start, end) ranges whose summed sizes stay <= limit (at least one row each)."""
    n = len(sizes)
    if n == 0:
        return []
    csum = np.cumsum(sizes)
    out = []
    start = 0
    base = 0
    while start < n:
        end = int(np.searchsorted(csum, base + limit, side="right"))
        end = max(end, start + 1)
        out.append((start, end))
        base = int(csum[end - 1])
        start = end
    return out


# -- validation --------------------------------------------------------------------------------
def op_codes(batch: pa.RecordBatch, plan: WritePlan) -> np.ndarray:
    """int8 per row: 0 insert, 1 delete (null op = insert); SchemaError on anything else."""
    n = batch.num_rows
    if OP_COLUMN not in batch.schema.names:
        return np.zeros(n, dtype=np.int8)
    ops = pc.utf8_lower(pc.utf8_trim_whitespace(batch.column(OP_COLUMN)))
    is_delete = pc.is_in(ops, value_set=pa.array(["delete", "d"]))
    is_insert = pc.or_kleene(pc.is_null(ops), pc.is_in(ops, value_set=pa.array(["insert", "i", "upsert"])))
    bad = pc.invert(pc.or_(is_delete.fill_null(False), is_insert.fill_null(True)))
    if pc.any(bad).as_py():
        example = pc.filter(batch.column(OP_COLUMN), bad)[0].as_py()
        raise SchemaError(f"column {OP_COLUMN!r} has value {example!r}; expected 'insert' or 'delete'")
    return is_delete.fill_null(False).to_numpy(zero_copy_only=False).astype(np.int8)


def check_batch(batch: pa.RecordBatch, plan: WritePlan, dims: dict[str, int], ops: np.ndarray | None = None) -> None:
    """Null primary keys and (on insert rows) vectors; ``dims`` learns dims from the first rows."""
    pk = batch.column(plan.pk)
    if pk.null_count:
        raise SchemaError(f"primary key column {plan.pk!r} is null in {pk.null_count} row(s)")
    if ops is not None and ops.any():
        if ops.all():
            return
        batch = batch.filter(pa.array(ops == 0))
    for f in plan.fields:
        if f.name not in batch.schema.names:  # a delete-only batch carries just op and the key
            continue
        if f.type_name not in _VECTOR_TYPES or f.type_name == "BinaryVector":
            if f.type_name == "BinaryVector":
                _check_binary_dim(batch.column(f.name), f, dims)
            continue
        arr = batch.column(f.name)
        if arr.null_count:
            raise SchemaError(f"vector column {f.name!r} is null in {arr.null_count} row(s); vectors cannot be null")
        if len(arr) == 0:
            continue
        lens = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        want = dims.setdefault(f.name, int(lens[0]))
        if want <= 0:
            raise SchemaError(f"vector column {f.name!r} has an empty vector")
        wrong = np.nonzero(lens != want)[0]
        if len(wrong):
            raise SchemaError(f"vector column {f.name!r} has dimension {int(lens[wrong[0]])} in a row where "
                              f"dimension {want} is expected ({len(wrong)} row(s) differ)")


def _check_binary_dim(arr: pa.Array, f: FieldPlan, dims: dict[str, int]) -> None:
    if arr.null_count:
        raise SchemaError(f"vector column {f.name!r} is null in {arr.null_count} row(s); vectors cannot be null")
    if len(arr) == 0:
        return
    lens = pc.binary_length(arr).to_numpy(zero_copy_only=False)
    want_bytes = dims[f.name] // 8 if f.name in dims else int(lens[0])
    dims.setdefault(f.name, want_bytes * 8)
    wrong = np.nonzero(lens != want_bytes)[0]
    if len(wrong):
        raise SchemaError(f"binary vector column {f.name!r} has {int(lens[wrong[0]])} bytes in a row where "
                          f"{want_bytes} bytes (dim {want_bytes * 8}) are expected")


# -- grouping ------------------------------------------------------------------------------------
def shard_of(batch: pa.RecordBatch, plan: WritePlan, n_shards: int) -> np.ndarray:
    """Shard index per row with Milvus's hash of the primary key (wire doc §5.4)."""

    pk = batch.column(plan.pk)
    if plan.pk_is_string:
        keys = pk.to_pylist()
    else:
        keys = pk.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return np.asarray(shard_indices(keys, n_shards), dtype=np.int64)


def groups(batch: pa.RecordBatch, plan: WritePlan, n_shards: int,
           ops: np.ndarray | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (op, shard, row indices) in row order of op runs, shards ascending within a run.

    Consecutive rows with the same op form a run; runs keep their order so a delete
    after an insert of the same key gets the later timestamp.
    """
    n = batch.num_rows
    if n == 0:
        return
    if ops is None:
        ops = op_codes(batch, plan)
    shards = shard_of(batch, plan, n_shards)
    cuts = np.flatnonzero(np.diff(ops)) + 1
    bounds = np.concatenate(([0], cuts, [n]))
    for a, b in zip(bounds[:-1], bounds[1:]):
        sh = shards[a:b]
        order = np.argsort(sh, kind="stable")
        counts = np.bincount(sh, minlength=n_shards)
        ends = np.cumsum(counts)
        for s in range(n_shards):
            if counts[s]:
                yield int(ops[a]), s, order[ends[s] - counts[s]:ends[s]] + a


def _small(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t):
        return pa.list_(_small(t.value_type))
    return t


def normalize(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Cast 64-bit-offset Arrow types (large_string, large_list, ...) to the plain ones."""
    types = [_small(f.type) for f in batch.schema]
    if all(t == f.type for t, f in zip(types, batch.schema)):
        return batch
    return pa.RecordBatch.from_arrays([c.cast(t) for c, t in zip(batch.columns, types)], names=batch.schema.names)


@dataclass
class EncodedMessage:
    """One serialized request ready to produce."""

    shard: int
    op: int
    payload: bytes
    rows: int
    timestamp: int
    msg_id: int
    seq: int  # position among this task's messages to the same channel


class Encoder:
    """Turns Arrow batches into serialized Insert/Delete requests for one write task.

    ``next_ts`` hands out strictly increasing hybrid timestamps; ``next_msg_id(shard)``
    a unique message id and its sequence number on that shard. Both come from the task,
    so a retried task reproduces the same ids.
    """

    def __init__(self, opts: SinkOptions, plan: WritePlan, next_ts, next_msg_id, next_row_ids) -> None:
        self.opts = opts
        self.plan = plan
        self.next_ts = next_ts
        self.next_msg_id = next_msg_id
        self.next_row_ids = next_row_ids
        self.dims: dict[str, int] = dict(plan.dims)
        self.vchannels = opts.vchannels
        self._schemas = plan.field_schemas()

    def encode(self, batch: pa.RecordBatch) -> list[EncodedMessage]:
        """Validate the whole batch first, then encode it (nothing partial on bad input)."""
        if batch.num_rows == 0:
            return []
        batch = normalize(batch)
        ops = op_codes(batch, self.plan)
        missing = [f.name for f in self.plan.fields if f.name not in batch.schema.names]
        if self.plan.pk in missing:
            raise SchemaError(f"primary key column {self.plan.pk!r} is missing from the batch")
        if missing and not ops.all():
            raise SchemaError(f"column(s) {', '.join(missing)} missing: only a batch of deletes may carry "
                              f"just {OP_COLUMN!r} and the primary key")
        check_batch(batch, self.plan, self.dims, ops)
        plan_groups = list(groups(batch, self.plan, len(self.opts.channels), ops))
        vectors = self._dense_vectors(batch) if not ops.all() else {}
        sizes = _row_sizes(batch, self.plan) if not ops.all() else None
        out: list[EncodedMessage] = []
        for op, shard, idx in plan_groups:
            if op == OP_INSERT:
                out.extend(self._inserts(batch, idx, shard, vectors, sizes))
            else:
                out.extend(self._deletes(batch.select([self.plan.pk]).take(pa.array(idx)), shard))
        return out

    def _dense_vectors(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        """FloatVector columns as (rows, dim) float32 arrays (zero copy where Arrow allows)."""
        out = {}
        for f in self.plan.fields:
            if f.type_name != "FloatVector" or f.name not in batch.schema.names or f.name not in self.dims:
                continue
            col = batch.column(f.name)
            if col.null_count:
                continue
            flat = col.flatten()
            if flat.type != pa.float32() or flat.null_count or len(flat) != len(col) * self.dims[f.name]:
                continue
            out[f.name] = flat.to_numpy(zero_copy_only=False).reshape(len(col), self.dims[f.name])
        return out

    def _inserts(self, batch: pa.RecordBatch, idx: np.ndarray, shard: int, vectors: dict[str, np.ndarray],
                 sizes: np.ndarray) -> list[EncodedMessage]:

        others = [f.name for f in self.plan.fields if f.name not in vectors]
        rows = batch.select(others).take(pa.array(idx))
        dense = {name: v[idx] for name, v in vectors.items()}
        out = []
        for a, b, fields in self._insert_pieces(rows, dense, sizes[idx], shard):
            n = b - a
            ts = self.next_ts()
            mid, seq = self.next_msg_id(shard)
            # Serialized in field-number order from parts: header (1-11), fields_data (13),
            # tail (14-15); byte-identical to serializing one InsertRequest.
            head = msg_pb2.InsertRequest(**self._request_fields(common_pb2.Insert, mid, ts, shard),
                                         segmentID=self._segment(shard))
            head.timestamps.extend(np.full(n, ts, dtype=np.uint64).tolist())
            head.rowIDs.extend(self.next_row_ids(n).tolist())
            parts: list = [head.SerializeToString(), *fields]
            parts.append(msg_pb2.InsertRequest(num_rows=n, version=msg_pb2.ColumnBased).SerializeToString())
            out.append(EncodedMessage(shard, OP_INSERT, b"".join(parts), n, ts, mid, seq))
        return out

    def _segment(self, shard: int) -> int:
        """2.6 leaves the body's segmentID 0, as Milvus's proxy does: the segment is in ``_h``."""
        return 0 if self.opts.wire_format == "2.6" else self.opts.partition_id + shard

    def _insert_pieces(self, rows: pa.RecordBatch, dense: dict[str, np.ndarray], sizes: np.ndarray, shard: int):
        """``(start, end, fields_data parts)`` per message, each message within ``max_message_size``.

        Ranges come from the per-row estimates (as Milvus splits); a range whose encoded fields
        plus the largest possible header still exceed the limit is halved (one row is never split).
        """
        limit = self.opts.max_message_size
        head = self._head_bound(shard)
        todo = list(reversed(split_points(sizes, max(1, limit - head))))
        while todo:
            a, b = todo.pop()
            fields = []
            for f, fs in zip(self.plan.fields, self._schemas):
                if f.name in dense:
                    fields.extend(wire.float_vector_entry(dense[f.name][a:b], f.name, f.field_id))
                else:
                    fields.extend(wire.fields_data_entry(x)
                                  for x in self._field_bytes(rows.column(f.name).slice(a, b - a), f, fs))
            if b - a > 1 and head + 20 * (b - a) + sum(len(x) for x in fields) > limit:
                mid = (a + b) // 2
                todo += [(mid, b), (a, mid)]
                continue
            yield a, b, fields

    def _head_bound(self, shard: int) -> int:
        """Bytes of an Insert's header and tail without rows, with the largest ids and timestamps."""
        big = (1 << 63) - 1
        head = msg_pb2.InsertRequest(**self._request_fields(common_pb2.Insert, big, (1 << 64) - 1, shard),
                                     segmentID=self._segment(shard) or big)
        return len(head.SerializeToString()) + 32

    def _request_fields(self, msg_type: int, mid: int, ts: int, shard: int) -> dict:
        """The MsgBase and collection fields an Insert and a Delete request share."""
        return dict(base=common_pb2.MsgBase(msg_type=msg_type, msgID=mid, timestamp=ts, sourceID=self.opts.source_id),
                    shardName=self.vchannels[shard], db_name=self.opts.db_name,
                    collection_name=self.opts.collection, partition_name=self.opts.partition,
                    collectionID=self.opts.collection_id, partitionID=self.opts.partition_id)

    def _field_bytes(self, col: pa.Array, f: FieldPlan, fs) -> list[bytes]:
        """One column as serialized FieldData (via the codec's arrow_to_field_data); a struct array as
        its sub-field columns, flattened as Milvus's proxy writes them to the WAL."""

        if f.name == self.plan.pk and not self.plan.pk_is_string:
            col = col.cast(pa.int64())
        try:
            if f.type_name == STRUCT_TYPE:
                return [fd.SerializeToString() for fd in flatten_struct_column(col, fs)]
            return [arrow_to_field_data(col, fs).SerializeToString()]
        except SchemaError:
            raise
        except (MsgStreamError, TypeError, ValueError, pa.ArrowException) as exc:
            raise SchemaError(f"column {f.name!r}: {exc}") from exc

    def _deletes(self, rows: pa.RecordBatch, shard: int) -> list[EncodedMessage]:
        pk = rows.column(self.plan.pk)
        if self.plan.pk_is_string:
            sizes = pc.binary_length(pk).to_numpy(zero_copy_only=False).astype(np.int64) + 16
        else:
            pk = pk.cast(pa.int64())
            sizes = np.full(len(pk), 16 + 8, dtype=np.int64)
        out = []
        for a, b in split_points(sizes, max(1, self.opts.max_message_size - self._head_bound(shard))):
            n = b - a
            ts = self.next_ts()
            mid, seq = self.next_msg_id(shard)
            req = msg_pb2.DeleteRequest(**self._request_fields(common_pb2.Delete, mid, ts, shard), num_rows=n)
            part = pk.slice(a, n)
            if self.plan.pk_is_string:
                req.primary_keys.str_id.data.extend(part.to_pylist())
            else:
                req.primary_keys.int_id.data.extend(part.to_numpy(zero_copy_only=False).tolist())
            req.timestamps.extend([ts] * n)
            out.append(EncodedMessage(shard, OP_DELETE, req.SerializeToString(), n, ts, mid, seq))
        return out
