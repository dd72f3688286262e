"""The search of a key index by blocks, a key index read by range from an object store, and the executor's local
disk cache of what it fetched.

A side file (:mod:`.keyindex`) is a header and three arrays checksummed per block of ``block_bytes`` (4 KiB); its
descriptor lists the first key of each block of the sorted keys. :class:`BlockedIndex` is the search a mapped
side file and a ranged one share: the keys blocks a key can be in (by those first keys), each block's CRC-32
checked the first time the process reads it, a binary search that stays inside them, then the blocks of the
found rows' positions and ``_seq``. :class:`RemoteIndex` reads the header once per process and fetches units
of ``FETCH_BYTES`` (whole blocks, ~1 MiB: few large GETs) holding the blocks a lookup needs, every block of a
fetched unit checked as it arrives: a lookup's bytes grow with the blocks its keys touch, never with the file
or the table. Fetched units are kept in :class:`BlockCache`, a directory on the executor's local disk
(``MSGSTREAM_KEY_CACHE_DIR``, default ``<tmp>/msgstream-key-cache-<uid>``) bounded in bytes
(``MSGSTREAM_KEY_CACHE_MB``, default 1024; the least recently used go first; set them on executors with
``spark.executorEnv.*``), shared by the executor's Python workers and valid across batches: a side file never
changes, and a rebuilt one has another header checksum, which names its units. Units are memory-mapped from
there, each block checked when this process first reads it (a damaged copy is fetched again).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror.order import SEQ_TYPE
from msgstream_spark.mirror.store import NotFound, Store

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "MSGSTREAM_KEY_CACHE_DIR"
CACHE_MB_ENV = "MSGSTREAM_KEY_CACHE_MB"
DEFAULT_CACHE_MB = 1024
HEAD_BYTES = 16 * 1024  # the first read of a side file: its descriptor (a larger one costs a second read)
FETCHERS = 8  # units fetched at once (object stores answer ranged GETs in parallel)
FETCH_BYTES = 1 << 20  # a ranged read fetches whole units of blocks of about this size (fewer, larger GETs)
_PREFIX = struct.Struct("<8sII")


class DamagedIndex(ValueError):
    """A side file's block does not match its checksum, or is short: the index is rebuilt from the data file."""


class BlockCache:
    """Blocks of side files on this machine's disk, least recently used evicted past ``max_bytes``."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.dir, self.max_bytes = directory, max_bytes
        self._total: int | None = None
        self._lock = threading.Lock()

    def _scan(self) -> list[tuple[float, int, str]]:
        out = []
        for e in os.scandir(self.dir):
            if e.name.endswith(".blk"):
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue  # evicted by another worker meanwhile
                out.append((st.st_mtime, st.st_size, e.path))
        return out

    def get(self, name: str) -> np.ndarray | None:
        """The cached unit ``name`` memory-mapped, if it is there (its blocks are checked by the reader, each
        the first time this process reads it: :meth:`RemoteIndex._ensure`)."""
        path = os.path.join(self.dir, name)
        try:
            got = np.memmap(path, dtype=np.uint8, mode="r")
            os.utime(path)  # recently used
        except (FileNotFoundError, ValueError):  # absent, or empty
            return None
        return got

    def drop(self, name: str) -> None:
        """Forget a cached unit found damaged (it is fetched again)."""
        log.warning("key index cache block %s is damaged: fetched again", os.path.join(self.dir, name))
        try:
            os.unlink(os.path.join(self.dir, name))
        except FileNotFoundError:
            pass  # another worker dropped it first

    def put(self, name: str, data: bytes) -> None:
        """Keep a verified block (written whole under a temporary name, then renamed); evict past the bound."""
        os.makedirs(self.dir, exist_ok=True)
        tmp = os.path.join(self.dir, f".{name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(self.dir, name))
        with self._lock:
            if self._total is None:
                self._total = sum(s for _, s, _ in self._scan())
            else:
                self._total += len(data)
            if self._total > self.max_bytes:
                self._evict()

    def _evict(self) -> None:
        entries = sorted(self._scan())
        total = sum(s for _, s, _ in entries)
        for _, size, path in entries:
            if total <= self.max_bytes * 0.8:
                break
            try:
                os.unlink(path)
                total -= size
            except FileNotFoundError:
                total -= size  # another worker evicted it
        self._total = total


_CACHE: list[BlockCache] = []


def block_cache() -> BlockCache:
    """This process's view of the executor's block cache (settings from its environment)."""
    if not _CACHE:
        d = os.environ.get(CACHE_DIR_ENV) or os.path.join(tempfile.gettempdir(), f"msgstream-key-cache-{os.getuid()}")
        mb = float(os.environ.get(CACHE_MB_ENV) or DEFAULT_CACHE_MB)
        _CACHE.append(BlockCache(d, int(mb * (1 << 20))))
    return _CACHE[0]


def _header(store: Store, side: str) -> tuple[dict, int, int] | None:
    """(descriptor, its CRC-32, where the arrays start) of a side file; None if there is none; ValueError if it
    is not a side file of this format."""
    try:
        raw = store.read_range(side, 0, HEAD_BYTES)
    except NotFound:
        return None
    if len(raw) < _PREFIX.size or raw[:8] != b"MSKEYS02":
        raise ValueError("written by an earlier release (no checksums)" if raw[:7] == b"MSKEYS0" else
                         "not a key index")
    _, n, crc = _PREFIX.unpack_from(raw)
    if _PREFIX.size + n > len(raw):
        raw += store.read_range(side, len(raw), _PREFIX.size + n - len(raw))
    body = raw[_PREFIX.size:_PREFIX.size + n]
    if len(body) != n or zlib.crc32(body) != crc:
        raise ValueError("its header's checksum")
    desc = json.loads(body)
    return desc, crc, desc["arrays"][0]["offset"]




def desc_array(desc: dict, name: str, dtype: str) -> np.ndarray:
    """A per-block list of a descriptor: base64 of its little-endian values (this release) or a JSON list."""
    v = desc[name]
    return np.frombuffer(base64.b64decode(v), dtype) if isinstance(v, str) else np.asarray(v, dtype=dtype)


def _runs(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The block ids of every run ``lo[i]..hi[i]`` (a key repeated across a block boundary spans two), sorted."""
    wide = np.nonzero(hi > lo)[0]
    extra = [np.arange(lo[i], hi[i] + 1) for i in wide]
    return np.unique(np.concatenate([lo, *extra]) if extra else lo)


class BlockedIndex:
    """The search a mapped side file and one read by range share. The keys blocks a key can be in are found by
    each block's first key (from the descriptor, checked on open); those blocks are checked (``_ensure``: each
    block's CRC-32 the first time this process reads it) and binary-searched, never a byte outside them; then
    the blocks of the found rows' positions and ``_seq`` are checked and read. A lookup reads and verifies the
    blocks its keys touch: a new process's first lookup costs what its keys cost, not what the file holds."""

    def __init__(self, desc: dict, start: int) -> None:
        self.desc, self.start = desc, start
        self.rows, self.block = int(desc["rows"]), int(desc["block_bytes"])
        self.fences = desc_array(desc, "block_first_key", "<i8")
        self.crcs = desc_array(desc, "block_crc32", "<u4")
        self.payload = int(desc["file_size"]) - start
        at = [int(a["offset"]) - start for a in desc["arrays"]]
        self.pos_at, self.seq_at = at[1], at[2]
        blocks = -(-self.payload // self.block)
        if (at != [0, 8 * self.rows, 16 * self.rows] or self.payload != 32 * self.rows or start % 64
                or self.block <= 0 or self.block % 64 or len(self.crcs) != blocks
                or len(self.fences) != -(-8 * self.rows // self.block)):
            raise ValueError(f"its layout (arrays at {at}, {self.payload} bytes of arrays, blocks of {self.block} "
                             f"bytes, {len(self.crcs)} checksums, {len(self.fences)} first keys)")

    def _ensure(self, ids: np.ndarray, held: dict) -> None:
        """Make payload blocks ``ids`` readable by ``_words`` and checked (DamagedIndex if one is not right)."""
        raise NotImplementedError

    def _words(self, offsets: np.ndarray, width: int, held: dict) -> np.ndarray:
        """``width`` bytes (8 or 16) at each payload offset, as uint64 words (one or two per offset)."""
        raise NotImplementedError

    def _block_ok(self, data: np.ndarray | bytes, j: int) -> bool:
        want = min(self.block, self.payload - j * self.block)
        return len(data) == want and zlib.crc32(data) == int(self.crcs[j])

    def _first_at_least(self, want: np.ndarray, lo: np.ndarray, hi: np.ndarray, held: dict) -> np.ndarray:
        """Per key, the first row in ``[lo, hi)`` (never empty) whose key is >= it, else ``hi``: a binary search
        of all keys at once that reads only rows inside those ranges."""
        first, size = lo.copy(), hi - lo
        while True:
            act = size > 0
            if not act.any():
                return first
            half = size >> 1
            mid = first + half
            v = self._words(8 * np.where(act, mid, lo), 8, held).view(np.int64)
            go = act & (v < want)
            first = np.where(go, mid + 1, first)
            size = np.where(go, size - half - 1, np.where(act, half, 0))

    def _equal_run(self, want: np.ndarray, left: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                   held: dict) -> np.ndarray:
        """Per key, the end of its rows from ``left`` (a key is mostly once in a file: one step, rarely more)."""
        right = left.copy()
        while True:
            more = right < hi
            eq = more & (self._words(8 * np.where(more, right, lo), 8, held).view(np.int64) == want)
            if not eq.any():
                return right
            right += eq

    def find(self, want: np.ndarray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """(keys, row positions, ``_seq``) of every row whose key is in ``want`` (sorted, unique)."""
        want = np.asarray(want, dtype=np.int64)
        if self.rows == 0 or len(want) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), pa.array([], SEQ_TYPE)
        held: dict = {}
        per = self.block // 8
        lo = np.maximum(np.searchsorted(self.fences, want, "left") - 1, 0)
        hi = np.maximum(np.searchsorted(self.fences, want, "right") - 1, 0)
        self._ensure(_runs(lo, hi), held)
        end = np.minimum((hi + 1) * per, self.rows)  # a key's rows start and end inside its run of blocks
        left = self._first_at_least(want, lo * per, end, held)
        right = self._equal_run(want, left, lo * per, end, held)
        counts = right - left
        total = int(counts.sum())
        if total == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), pa.array([], SEQ_TYPE)
        idx = np.repeat(left, counts) + (np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts))
        keys = np.ascontiguousarray(self._words(8 * idx, 8, held)).view(np.int64)
        pos_off, seq_off = self.pos_at + 8 * idx, self.seq_at + 16 * idx
        self._ensure(np.unique(np.concatenate([pos_off // self.block, seq_off // self.block])), held)
        pos = np.ascontiguousarray(self._words(pos_off, 8, held)).view(np.int64)
        seq = np.ascontiguousarray(self._words(seq_off, 16, held))
        return keys, pos, pa.Array.from_buffers(SEQ_TYPE, total, [None, pa.py_buffer(seq.tobytes())])


class RemoteIndex(BlockedIndex):
    """A side file on an object store, searched by fetching units of ``FETCH_BYTES`` (whole blocks; every block
    of a fetched unit checked as it arrives) kept in the executor's :class:`BlockCache`; a unit mapped from the
    cache has each block checked the first time this process reads it (a damaged one is fetched again)."""

    def __init__(self, store: Store, side: str, desc: dict, crc: int, start: int) -> None:
        super().__init__(desc, start)
        self.store, self.side = store, side
        self.k = max(1, FETCH_BYTES // self.block)  # blocks per fetched unit
        self.unit = self.k * self.block
        self.tag = hashlib.sha1(f"{side}\0{desc['file_size']}\0{crc}\0{self.unit}".encode()).hexdigest()[:24]
        self._ok = np.zeros(len(self.crcs), bool)  # blocks this process has checked

    @classmethod
    def open(cls, store: Store, side: str, data_name: str, num_rows: int, data_size: int,
             arrays: tuple) -> RemoteIndex | None:
        """The side file's index, None if there is none; ValueError naming what does not match the data file."""
        got = _header(store, side)
        if got is None:
            return None
        desc, crc, start = got
        want = {"rows": num_rows, "data_file": data_name, "data_file_size": data_size}
        wrong = [f"{k} {desc.get(k)} != {v}" for k, v in want.items() if desc.get(k) != v]
        if wrong:
            raise ValueError(", ".join(wrong))
        if [(a["name"], a["dtype"], a["shape"][0]) for a in desc["arrays"]] != [(n, d, num_rows) for n, d, _ in arrays]:
            raise ValueError(f"arrays {desc['arrays']}")
        if "block_first_key" not in desc:
            raise ValueError("no first key per block (written before ranged reads)")
        return cls(store, side, desc, crc, start)

    def _ensure(self, ids: np.ndarray, held: dict) -> None:
        cache, missing = block_cache(), []
        for u in {int(j) // self.k for j in ids} - set(held):
            got = cache.get(f"{self.tag}-{u}.blk")
            if got is None:
                missing.append(u)
            else:
                held[u] = got
        for j in ids[~self._ok[ids]]:
            u = int(j) // self.k
            if u in held and u not in missing:
                at = (int(j) - u * self.k) * self.block
                if self._block_ok(held[u][at:at + self.block], int(j)):
                    self._ok[j] = True
                else:  # the cache's copy is damaged (not the side file): fetched again, checked then
                    cache.drop(f"{self.tag}-{u}.blk")
                    del held[u]
                    missing.append(u)
        if missing:
            with ThreadPoolExecutor(min(FETCHERS, len(missing))) as pool:
                for u, data in zip(missing, pool.map(self._fetch, missing)):
                    cache.put(f"{self.tag}-{u}.blk", data)
                    held[u] = np.frombuffer(data, np.uint8)
                    self._ok[u * self.k:(u + 1) * self.k] = True

    def _fetch(self, u: int) -> bytes:
        """Unit ``u`` read from the store, every block of it checked (DamagedIndex naming the first bad one)."""
        want = min(self.unit, self.payload - u * self.unit)
        data = self.store.read_range(self.side, self.start + u * self.unit, want)
        if len(data) != want:
            raise DamagedIndex("short")
        view = memoryview(data)
        for j in range(u * self.k, min((u + 1) * self.k, len(self.crcs))):
            at = (j - u * self.k) * self.block
            if not self._block_ok(view[at:at + self.block], j):
                raise DamagedIndex(f"the checksum of block {j}")
        return data

    def _words(self, offsets: np.ndarray, width: int, held: dict) -> np.ndarray:
        """Read in place from each held unit (values never cross a block: their offsets are multiples of their
        widths, and so is ``block_bytes``); joining the units first copied every touched one each batch."""
        units = offsets // self.unit
        uniq, counts = np.unique(units, return_counts=True)
        out = np.empty((len(offsets), width // 8), np.uint64)
        order, at = np.argsort(units, kind="stable"), 0
        for u, n in zip(uniq, counts):
            sel, at = order[at:at + n], at + n
            words, first = held[int(u)].view("<u8"), (offsets[sel] % self.unit) // 8
            for k in range(width // 8):
                out[sel, k] = words[first + k]
        return out[:, 0] if width == 8 else out
