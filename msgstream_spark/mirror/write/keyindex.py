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

The format describes itself, so that a reader that fetches byte ranges (an object store) needs nothing
else: the magic ``MSKEYS02``, the descriptor's length and CRC-32 (two little-endian uint32), the
descriptor (JSON: rows, the data file's name and size, each array's name, dtype, shape and offset, the
file's total size, the block size (4 KiB), the CRC-32 of each block of the arrays' bytes and the first key of
each keys block, these two as base64 of little-endian uint32 / int64 arrays; the previous release wrote
1 MiB blocks and JSON lists, read as they are), zeros up to a multiple of 64, then the arrays (keys int64,
row positions int64, ``_seq`` as its 16 raw bytes). A side file is opened only once its header matches the
data file (rows, name, size) and its size matches the header; a lookup then checks each block's CRC-32 the
first time this process reads it (:class:`.keycache.BlockedIndex`: a key's blocks are found by the first
keys and searched within, so a lookup reads, and checks, the blocks its keys touch and never the whole
file: a new executor's first batch costs what its keys cost, not what the table's indexes hold). Anything
that does not match is logged at warning level naming the file and the index is rebuilt, never answered
from. It is written whole to a temporary file and renamed into place (``Store.put_transient``: readers see
none or all of it), with no fsync (a writing task writes one per table and batch: two fsyncs each were a
quarter of a database job's; an earlier release fsync'd the file and its directory): a crash can leave it
missing, short or with stale pages, which the header and size checks and each block's checksum find where a
lookup reads it, and the index is rebuilt from its data file.

Side files live in the table's store beside their data files. A writing task writes one with each data file
it closes (it has the keys in hand); a data file written by someone else (the snapshot, delta-rs's optimize)
gets one at its first lookup. On a local store a side file is memory-mapped; on an object store a lookup
fetches the header once per process, then only the units of blocks (~1 MiB) that hold the keys it searches,
then those of their positions and ``_seq``: a batch's bytes grow with the blocks its keys touch, not with the
table. Fetched units are verified and kept in a local disk cache of the executor (:mod:`.keycache`, bounded in
bytes, valid across batches: a side file never changes).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import struct
import zlib
from collections import OrderedDict

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror.order import SEQ, SEQ_TYPE
from msgstream_spark.mirror.store import Store, StoreError, store_for, uri
from msgstream_spark.mirror.store.parquet import footer, read_parquet
from msgstream_spark.mirror.write.keycache import BlockedIndex, DamagedIndex, RemoteIndex

log = logging.getLogger(__name__)

KEYS_DIR = "_keys"
MAGIC = b"MSKEYS02"
_PREFIX = struct.Struct("<8sII")  # magic, descriptor length, descriptor CRC-32
BLOCK_BYTES = 4096  # the arrays' bytes are checksummed per block (a lookup verifies the blocks it reads)
_ARRAYS = (("keys", "<i8", 1), ("pos", "<i8", 1), ("seq", "<u8", 2))  # name, dtype, values per row


def side_path(data_path: str) -> str:
    """Where the side file of data file ``data_path`` (a URI or a local path) lives."""
    d, name = data_path.rsplit("/", 1) if "://" in data_path else os.path.split(data_path)
    return uri.join(d, KEYS_DIR, name + ".keys")


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

    def encode(self, data_file: str, data_size: int) -> bytes:
        """The side file's bytes for data file ``data_file`` of ``data_size`` bytes."""
        head, payload = _encode(len(self.keys), _name(data_file), data_size,
                                [np.ascontiguousarray(a) for a in (self.keys, self.pos, self.seq)])
        return head + payload

    @staticmethod
    def load(path: str, data_file: str, num_rows: int, data_size: int) -> MappedIndex | None:
        """The side file memory-mapped, or None when it is missing or its header does not match the data file
        (``num_rows`` rows, ``data_size`` bytes) or its checksum (logged: the caller rebuilds it); its blocks are
        checked as lookups read them (``find``: DamagedIndex)."""
        try:
            got = _open_checked(path, _name(data_file), num_rows, data_size)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:  # unreadable, or not what it says
            got = f"unreadable ({e})"
        if isinstance(got, str):
            log.warning("the key index %s does not match its data file %s (%s): rebuilding it from the data file",
                        path, data_file, got)
            return None
        return got

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


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1] if "://" in path else os.path.basename(path)


def _encode(rows: int, data_name: str, data_size: int, arrays: list[np.ndarray]) -> tuple[bytes, bytes]:
    """(header with its padding, the arrays' bytes) of a side file. ``block_first_key``: the first key of each
    block of the keys array (the arrays start at a block boundary): a ranged reader finds a key's block by it."""
    payload = b"".join(a.tobytes() for a in arrays)
    view, step = memoryview(payload), BLOCK_BYTES
    crcs = np.array([zlib.crc32(view[i:i + step]) for i in range(0, len(payload), step)], "<u4")
    first = np.ascontiguousarray(arrays[0][::step // 8], "<i8")
    desc: dict = {"rows": rows, "data_file": data_name, "data_file_size": data_size, "block_bytes": step,
                  "block_crc32": base64.b64encode(crcs.tobytes()).decode(),
                  "block_first_key": base64.b64encode(first.tobytes()).decode()}
    start = 64
    while True:  # the arrays' offsets depend on the descriptor's length: grow the room until it fits
        at, desc["arrays"] = start, []
        for (name, dtype, width), a in zip(_ARRAYS, arrays):
            desc["arrays"].append({"name": name, "dtype": dtype, "shape": [rows, width] if width > 1 else [rows],
                                   "offset": at})
            at += a.nbytes
        desc["file_size"] = at
        raw = json.dumps(desc, separators=(",", ":")).encode()
        if _PREFIX.size + len(raw) <= start:
            break
        start = -(-(_PREFIX.size + len(raw)) // 64) * 64
    head = _PREFIX.pack(MAGIC, len(raw), zlib.crc32(raw)) + raw
    return head + b"\0" * (start - len(head)), payload


_VERIFIED: OrderedDict[tuple, np.ndarray] = OrderedDict()  # per side file (by identity): its blocks checked
_VERIFIED_MAX = 65536


class MappedIndex(BlockedIndex):
    """A side file on the local disk, memory-mapped; each block checked the first time this process reads it."""

    def __init__(self, desc: dict, mm: np.ndarray, ident: tuple) -> None:
        super().__init__(desc, int(desc["arrays"][0]["offset"]))
        self.raw = mm.view(np.ndarray)  # (a plain array over the mapping: faster to slice and index)
        self.words = self.raw[self.start:].view("<u8")
        ok = _VERIFIED.get(ident)
        if ok is None:
            ok = _VERIFIED[ident] = np.zeros(len(self.crcs), bool)
            while len(_VERIFIED) > _VERIFIED_MAX:
                _VERIFIED.popitem(last=False)
        self._ok = ok

    def _ensure(self, ids: np.ndarray, held: dict) -> None:
        todo = ids[~self._ok[ids]]
        if not len(todo):
            return
        raw, step, start = self.raw, self.block, self.start  # the file's size matched its header on open
        for j, crc in zip(todo.tolist(), self.crcs[todo].tolist()):
            if zlib.crc32(raw[start + j * step:start + (j + 1) * step]) != crc:
                raise DamagedIndex(f"the checksum of block {j}")
        self._ok[todo] = True

    def _words(self, offsets: np.ndarray, width: int, held: dict) -> np.ndarray:
        w = offsets // 8
        return self.words[w] if width == 8 else np.stack([self.words[w], self.words[w + 1]], axis=1)


def _open_checked(path: str, data_name: str, num_rows: int, data_size: int) -> MappedIndex | str:
    """The side file mapped if its header matches (its blocks are checked as lookups read them), else what does
    not match."""
    st = os.stat(path)
    with open(path, "rb") as f:
        prefix = f.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
            if prefix[:7] == MAGIC[:7]:
                return f"written by an earlier release ({prefix[:8]!r}: no checksums)"
            return "not a key index"
        _, n, crc = _PREFIX.unpack(prefix)
        raw = f.read(n)
    if len(raw) != n or zlib.crc32(raw) != crc:
        return "its header's checksum"
    desc = json.loads(raw)
    want = {"rows": num_rows, "data_file": data_name, "data_file_size": data_size, "file_size": st.st_size}
    wrong = [f"{k} {desc.get(k)} != {v}" for k, v in want.items() if desc.get(k) != v]
    if wrong:
        return ", ".join(wrong)
    arrays = desc["arrays"]
    if [(a["name"], a["dtype"], a["shape"][0]) for a in arrays] != [(n_, d, num_rows) for n_, d, _ in _ARRAYS]:
        return f"arrays {arrays}"
    if "block_first_key" not in desc:
        return "no first key per block (written before ranged reads)"
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    return MappedIndex(desc, mm, (path, st.st_ino, st.st_mtime_ns, st.st_size))


_OPEN: OrderedDict[tuple[str, int], KeyIndex | BlockedIndex] = OrderedDict()  # this process's, newest last
_OPEN_MAX = 512  # mapped indexes kept (a data file never changes: a kept one stays right); a lookup task is reused
_REMOTE_MAX = 16384  # headers of indexes read by range kept (a few KB each: a table's files, not its rows)


def key_index(store: Store, path: str, pk: str, num_rows: int = 0, size: int = 0) -> KeyIndex | BlockedIndex:
    """The index of data file ``path``: its side file (when it matches the file's rows and size; mapped on a
    local store, read by range on an object store), else built from the file's key and ``_seq`` columns (and
    its side file written)."""
    if size <= 0:
        meta = store.head(path)
        if meta is None:
            raise StoreError(f"data file {path} is gone from the table's store (removed by another writer?)")
        size = meta.size
    if num_rows <= 0:
        num_rows = footer(store, path, size)[1].num_rows
    got = _OPEN.get((path, num_rows))
    if got is not None:
        _OPEN.move_to_end((path, num_rows))
        return got
    got = _load(store, path, num_rows, size)
    if got is None:
        t = read_parquet(store, path, [pk, SEQ])
        got = KeyIndex.build(t.column(pk), t.column(SEQ).cast(SEQ_TYPE))
        save_index(store, path, size, got)
        if store.kind != "local":
            return got  # held for this lookup only: later ones read the side file by range
    _OPEN[(path, num_rows)] = got
    while len(_OPEN) > (_REMOTE_MAX if isinstance(got, RemoteIndex) else _OPEN_MAX):
        _OPEN.popitem(last=False)
    return got


def find_keys(store: Store, path: str, pk: str, num_rows: int, size: int,
              want: np.ndarray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """``key_index(...).find(want)``; a side file found damaged while it is read by range is logged, rebuilt
    from the data file and searched again."""
    idx = key_index(store, path, pk, num_rows, size)
    try:
        return idx.find(want)
    except DamagedIndex as e:
        log.warning("the key index %s does not match its data file %s (%s): rebuilding it from the data file",
                    side_path(path), path, e)
        _OPEN.pop((path, idx.rows), None)
        t = read_parquet(store, path, [pk, SEQ])
        built = KeyIndex.build(t.column(pk), t.column(SEQ).cast(SEQ_TYPE))
        save_index(store, path, idx.desc["data_file_size"], built)
        return built.find(want)


def _load(store: Store, path: str, num_rows: int, size: int) -> KeyIndex | BlockedIndex | None:
    side = side_path(path)
    if store.kind == "local":
        return KeyIndex.load(uri.parse(side).key, path, num_rows, size)
    try:
        return RemoteIndex.open(store, side, _name(path), num_rows, size, _ARRAYS)
    except ValueError as e:
        log.warning("the key index %s does not match its data file %s (%s): rebuilding it from the data file",
                    side, path, e)
        return None


def save_index(store: Store, data_path: str, data_size: int, index: KeyIndex) -> None:
    """Write the side file of ``data_path`` (one put: readers see none or all of it); a failure is logged (a
    cache: the lookup is right without it, only slower next time)."""
    try:
        store.put_transient(side_path(data_path), index.encode(data_path, data_size))
    except (OSError, StoreError) as e:
        log.warning("could not write the key index of %s (%s): the next lookup reads the file again", data_path, e)


def remove_side_file(data_path: str, store: Store | None = None) -> None:
    """Delete the side file of a data file being removed (none: nothing to do)."""
    for k in [k for k in _OPEN if k[0] == data_path]:
        del _OPEN[k]
    (store if store is not None else store_for(data_path)).delete(side_path(data_path))
