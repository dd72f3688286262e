"""Order-free digests of a collection's rows, column-wise (numpy over Arrow buffers, no per-row Python).

A row's hash is a 64-bit mix of the key and every field (vectors as their float32 bytes, integers as
int64, JSON as canonical text); a set of rows reduces to ``count`` and ``sum of row hashes mod 2^64``
per bucket of the key's hash. A sum (not XOR) changes when a row is duplicated; one changed byte of one
value always changes its row's hash (every step below is a bijection on 64 bits for a fixed rest).

Used by :mod:`msgstream_spark.mirror.verify.compare` on both sides (the table's files and Milvus's answers), so
equal rows hash equally whatever the side's Arrow types (int8 vs int32, string vs large_string,
list vs large_list, a dict of JSON vs its text).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import MirrorError

U64 = np.uint64
_NULL = U64(0x6A09E667F3BCC909)
_C1 = U64(0xBF58476D1CE4E5B9)
_C2 = U64(0x94D049BB133111EB)
_GOLD = U64(0x9E3779B97F4A7C15)


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise on uint64 (a bijection)."""
    with np.errstate(over="ignore"):
        x = x.astype(U64, copy=True)
        x ^= x >> U64(30)
        x *= _C1
        x ^= x >> U64(27)
        x *= _C2
        x ^= x >> U64(31)
    return x


def _salt(text: str) -> U64:
    h = 1469598103934665603
    for b in text.encode():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return U64(h)


def _fixed(arr: pa.Array) -> np.ndarray:
    t = arr.type
    if pa.types.is_boolean(t):
        return arr.fill_null(False).cast(pa.uint8()).to_numpy(zero_copy_only=False).astype(U64)
    if pa.types.is_integer(t):
        return arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).view(U64)
    if pa.types.is_float32(t):
        return arr.fill_null(0).to_numpy(zero_copy_only=False).view(np.uint32).astype(U64)
    if pa.types.is_float64(t):
        return arr.fill_null(0).to_numpy(zero_copy_only=False).view(U64)
    if pa.types.is_decimal(t) or pa.types.is_timestamp(t):
        return _fixed(arr.cast(pa.string()) if pa.types.is_decimal(t) else arr.cast(pa.int64()))
    raise MirrorError(f"cannot hash a column of type {t}")


def _segments(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per segment [offsets[i], offsets[i+1]) of ``values``: sum of mix(position-in-segment, value), mixed
    with the segment's length (an empty segment hashes its length alone)."""
    n = len(offsets) - 1
    lens = np.diff(offsets).astype(np.int64)
    out = np.zeros(n, dtype=U64)
    if len(values):
        seg = np.repeat(np.arange(n), lens)
        pos = np.arange(len(values), dtype=np.int64) - offsets[:-1].astype(np.int64)[seg]
        with np.errstate(over="ignore"):
            terms = mix(values.astype(U64) + mix(pos.astype(U64) + _GOLD))
        nonempty = lens > 0
        out[nonempty] = np.add.reduceat(terms, offsets[:-1][nonempty].astype(np.int64))
    with np.errstate(over="ignore"):
        return mix(out + mix(lens.astype(U64) * _GOLD + _C1))


def _binary(arr: pa.Array) -> np.ndarray:
    arr = arr.cast(pa.large_binary()) if not pa.types.is_large_binary(arr.type) else arr
    arr = pc.if_else(arr.is_null(), pa.scalar(b"", pa.large_binary()), arr) if arr.null_count else arr
    arr = pa.concat_arrays([arr]) if arr.offset else arr
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[: len(arr) + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    base = offsets[0]
    return _segments(data[base:offsets[-1]], offsets - base)


def _list(arr: pa.Array) -> np.ndarray:
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.large_list(arr.type.value_type))
    elif pa.types.is_list(arr.type):
        arr = arr.cast(pa.large_list(arr.type.value_type))
    if arr.null_count:
        arr = pc.if_else(arr.is_null(), pa.scalar([], arr.type), arr)
    arr = pa.concat_arrays([arr]) if arr.offset else arr
    offsets = arr.offsets.to_numpy().astype(np.int64)
    base = offsets[0]
    inner = column_hash(arr.values.slice(base, offsets[-1] - base))
    return _segments(inner, offsets - base)


def column_hash(arr: pa.Array | pa.ChunkedArray, json_text: bool = False) -> np.ndarray:
    """One uint64 per value; nulls hash to a constant. ``json_text``: the strings are JSON, hashed in a
    canonical form (keys sorted, no spaces; an empty text, ``{}`` and null are one value)."""
    if isinstance(arr, pa.ChunkedArray):
        parts = [column_hash(c, json_text) for c in arr.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=U64)
    if json_text:
        arr = canonical_json(arr)
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        h = _binary(arr)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        h = _list(arr)
    else:
        h = mix(_fixed(arr))
    if arr.null_count:
        h[arr.is_null().to_numpy(zero_copy_only=False)] = _NULL
    return h


def canonical_json(arr: pa.Array) -> pa.Array:
    """JSON text in one form per value (the one per-value step: JSON has no column-wise canonical form)."""
    out = []
    for v in arr.to_pylist():
        if v is None or v == "" or v == b"":
            out.append("{}")
            continue
        try:
            out.append(json.dumps(json.loads(v), sort_keys=True, separators=(",", ":"), ensure_ascii=False))
        except (TypeError, ValueError) as exc:
            raise MirrorError(f"a JSON column holds text that is not JSON ({str(v)[:60]!r}): {exc}") from exc
    return pa.array(out, pa.large_string())


def row_hashes(batch: pa.RecordBatch | pa.Table, columns: list[str], json_columns: Iterable[str] = ()) -> np.ndarray:
    """A uint64 hash per row over ``columns`` (in that order; a column the batch lacks counts as null)."""
    jc = set(json_columns)
    h = np.full(batch.num_rows, _salt("row"), dtype=U64)
    with np.errstate(over="ignore"):
        for name in columns:
            if name in batch.schema.names:
                c = column_hash(batch.column(name), name in jc)
            else:
                c = np.full(batch.num_rows, _NULL, dtype=U64)
            h = mix(h * _GOLD + mix(c ^ _salt(name)))
    return h


def key_hashes(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The key's own hash (what buckets are cut by): int keys as int64, string keys as their bytes."""
    return mix(column_hash(keys) ^ _salt("key"))


@dataclass
class Digest:
    """count and sum (mod 2^64) of row hashes per (partition, bucket)."""

    buckets: int
    counts: dict[tuple[int | None, int], int] = field(default_factory=dict)
    sums: dict[tuple[int | None, int], int] = field(default_factory=dict)

    def add(self, partitions: np.ndarray | None, buckets: np.ndarray, hashes: np.ndarray) -> None:
        """Fold rows in: ``partitions`` (int64 ids or None: one group), their bucket and row hash."""
        if len(hashes) == 0:
            return
        part = np.zeros(len(hashes), dtype=np.int64) if partitions is None else partitions.astype(np.int64)
        key = part * np.int64(self.buckets) + buckets.astype(np.int64)
        order = np.argsort(key, kind="stable")
        k, hs = key[order], hashes[order]
        starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        sums = np.add.reduceat(hs, starts)
        counts = np.diff(np.r_[starts, len(k)])
        for kk, s, c in zip(k[starts].tolist(), sums.tolist(), counts.tolist()):
            g = (None if partitions is None else kk // self.buckets, kk % self.buckets)
            self.counts[g] = self.counts.get(g, 0) + c
            self.sums[g] = (self.sums.get(g, 0) + s) & 0xFFFFFFFFFFFFFFFF

    def differing(self, other: Digest) -> list[tuple[int | None, int]]:
        """The groups whose count or sum differ."""
        groups = set(self.counts) | set(other.counts)
        return sorted((g for g in groups if self.counts.get(g) != other.counts.get(g)
                       or self.sums.get(g) != other.sums.get(g)), key=lambda g: (g[0] is None, g[0] or 0, g[1]))

    @property
    def rows(self) -> int:
        return sum(self.counts.values())
