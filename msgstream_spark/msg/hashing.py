"""Milvus's sharding hash (wire doc §5.4): murmur3 for int64 keys, CRC32 for strings.

``hash_int64_array`` is a vectorised murmur3_x86_32 (seed 0) over the 8-byte
little-endian key: no per-row Python.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_MASK31 = np.uint32(0x7FFFFFFF)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_block(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    k = k * _C1
    k = _rotl(k, 15)
    k = k * _C2
    h = h ^ k
    h = _rotl(h, 13)
    return h * np.uint32(5) + np.uint32(0xE6546B64)


def hash_int64_array(pks: np.ndarray | Sequence[int]) -> np.ndarray:
    """``murmur3_x86_32(seed=0, pk as 8 LE bytes) & 0x7fffffff`` for every key (uint32)."""
    a = np.ascontiguousarray(np.asarray(pks, dtype=np.int64))
    words = a.view(np.uint32).reshape(-1, 2) if a.size else np.zeros((0, 2), np.uint32)
    if words.dtype.byteorder == ">":  # pragma: no cover - big-endian hosts
        words = words.byteswap()
    with np.errstate(over="ignore"):
        h = np.zeros(len(a), dtype=np.uint32)
        h = _mix_block(h, words[:, 0].copy())
        h = _mix_block(h, words[:, 1].copy())
        h ^= np.uint32(8)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h & _MASK31


def hash_int64(pk: int) -> int:
    return int(hash_int64_array(np.array([pk], dtype=np.int64))[0])


def hash_string(s: str) -> int:
    """CRC-32/IEEE over the first 100 UTF-8 bytes (no mask)."""
    return zlib.crc32(s.encode("utf-8")[:100]) & 0xFFFFFFFF


def hash_strings(values: Sequence[str]) -> np.ndarray:
    return np.fromiter((hash_string(v) for v in values), dtype=np.uint32, count=len(values))


def shard_indices(pks: np.ndarray | Sequence, num_shards: int) -> np.ndarray:
    """Shard index of every primary key (int64 keys or strings) modulo ``num_shards``."""
    if num_shards <= 0:
        raise ValueError(f"num_shards must be > 0, got {num_shards}")
    arr = pks if isinstance(pks, np.ndarray) else None
    if arr is not None and arr.dtype.kind in "iu":
        h = hash_int64_array(arr)
    else:
        values = list(pks)
        if values and isinstance(values[0], str):
            h = hash_strings(values)
        else:
            h = hash_int64_array(np.asarray(values, dtype=np.int64))
    return (h % np.uint32(num_shards)).astype(np.int64)
