"""A data file's keys, sorted, in a side file: the lookup's index (integer keys).

Finding which live rows of the table hold a batch's keys is the per-batch cost that grows with the table:
without an index every data file whose key bounds hold a batch key has its key and ``_seq`` columns read
and decoded whole (random keys touch every file). A data file never changes once written, so its sorted
keys, their row positions and their ``_seq`` can be kept beside it: the first lookup that reads the file
writes them (``<dir>/_keys/<file>.keys``: a header and three fixed-width arrays, 32 bytes a row), and every
later lookup memory-maps them and binary-searches the batch's keys: it touches the pages that hold those
keys, O(batch x log rows) instead of decoding the whole column. The side files are a cache: a missing, short
or unreadable one is rebuilt from the Parquet file; one that cannot be written is logged and the lookup
goes on without it. Readers of the table never see them (Delta and Iceberg list files from their logs, and
``_``-named directories are hidden to Spark and to delta-rs's vacuum); ``msgstream mirror vacuum`` removes
a side file with its data file. See docs/mirror.md "The write path".
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.mirror.order import SEQ, SEQ_TYPE

log = logging.getLogger(__name__)

KEYS_DIR = "_keys"
MAGIC = b"MSKEYS01"
_HEADER = 16  # magic, row count (int64)


def side_path(data_path: str) -> str:
    """Where the side file of data file ``data_path`` lives."""
    d, name = os.path.split(data_path)
    return os.path.join(d, KEYS_DIR, name + ".keys")


def indexable(key_type: pa.DataType) -> bool:
    """Whether keys of this type are indexed (Milvus's Int64 keys; VarChar keys are looked up from Parquet)."""
    return pa.types.is_integer(key_type)


class KeyIndex:
    """The sorted keys of one data file with their row positions and ``_seq`` (as its 16 raw bytes)."""

    def __init__(self, keys: np.ndarray, pos: np.ndarray, seq: np.ndarray) -> None:
        self.keys, self.pos, self.seq = keys, pos, seq

    @classmethod
    def build(cls, key_col: pa.ChunkedArray | pa.Array, seq_col: pa.ChunkedArray | pa.Array) -> KeyIndex:
        keys = np.asarray(key_col.to_numpy(), dtype=np.int64)  # Array and ChunkedArray alike
        seq_arr = seq_col.combine_chunks() if isinstance(seq_col, pa.ChunkedArray) else seq_col
        raw = np.frombuffer(seq_arr.buffers()[1], dtype=np.uint64)[2 * seq_arr.offset:2 * (seq_arr.offset + len(keys))]
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], order.astype(np.int64), raw.reshape(-1, 2)[order])

    def save(self, path: str) -> None:
        """Written whole to a temporary name, then renamed: a reader sees the old state or the new file."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(MAGIC + np.int64(len(self.keys)).tobytes())
            for a in (self.keys, self.pos, np.ascontiguousarray(self.seq)):
                f.write(np.ascontiguousarray(a).tobytes())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str, num_rows: int) -> KeyIndex | None:
        """The side file memory-mapped, or None when it is missing or not one of ``num_rows`` rows."""
        try:
            size = os.path.getsize(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if size != _HEADER + 32 * num_rows:
            return None
        with open(path, "rb") as f:
            head = f.read(_HEADER)
        if head[:8] != MAGIC or int(np.frombuffer(head[8:], np.int64)[0]) != num_rows:
            return None
        if num_rows == 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 2), np.uint64))
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        keys = mm[_HEADER:_HEADER + 8 * num_rows].view(np.int64)
        pos = mm[_HEADER + 8 * num_rows:_HEADER + 16 * num_rows].view(np.int64)
        seq = mm[_HEADER + 16 * num_rows:].view(np.uint64).reshape(-1, 2)
        return cls(keys, pos, seq)

    def find(self, want: np.ndarray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """(keys, row positions, ``_seq``) of every row whose key is in ``want`` (sorted, unique)."""
        lo = np.searchsorted(self.keys, want, side="left")
        hi = np.searchsorted(self.keys, want, side="right")
        counts = hi - lo
        total = int(counts.sum())
        if total == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), pa.array([], SEQ_TYPE)
        starts = np.repeat(lo, counts)
        idx = starts + (np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts))
        seq = np.ascontiguousarray(self.seq[idx])
        return (np.asarray(self.keys[idx]), np.asarray(self.pos[idx]),
                pa.Array.from_buffers(SEQ_TYPE, total, [None, pa.py_buffer(seq.tobytes())]))


_OPEN: OrderedDict[tuple[str, int], KeyIndex] = OrderedDict()  # mapped side files of this process, newest last
_OPEN_MAX = 512  # mappings kept (a data file never changes: a kept one stays right); a lookup task is reused


def key_index(path: str, pk: str, num_rows: int = 0) -> KeyIndex:
    """The index of data file ``path``: its side file, else built from the file (and its side file written)."""
    pf = None
    if num_rows <= 0:
        pf = pq.ParquetFile(path)
        num_rows = pf.metadata.num_rows
    got = _OPEN.get((path, num_rows))
    if got is not None:
        _OPEN.move_to_end((path, num_rows))
        return got
    got = KeyIndex.load(side_path(path), num_rows)
    if got is None:
        pf = pf or pq.ParquetFile(path)
        t = pf.read(columns=[pk, SEQ])
        got = KeyIndex.build(t.column(pk), t.column(SEQ).cast(SEQ_TYPE))
        try:
            got.save(side_path(path))
        except OSError as e:  # a cache: the lookup is right without it, only slower next time
            log.warning("could not write the key index of %s (%s): the next lookup reads the file again", path, e)
    _OPEN[(path, num_rows)] = got
    while len(_OPEN) > _OPEN_MAX:
        _OPEN.popitem(last=False)
    return got


def remove_side_file(data_path: str) -> None:
    """Delete the side file of a data file being removed (none: nothing to do)."""
    for k in [k for k in _OPEN if k[0] == data_path]:
        del _OPEN[k]
    try:
        os.unlink(side_path(data_path))
    except FileNotFoundError:
        pass
